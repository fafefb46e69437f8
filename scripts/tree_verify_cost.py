#!/usr/bin/env python
"""What a token tree's verify call costs the bfloat16 target, beside a plain step and chains.

Issue 39 asks for the verify call of 3 / 6 / 8 tokens and of a 7- and a 16-node tree in ms and
in plain steps. Each tree token attends through its own path view of the cache (models/attention.py,
exact greedy identity), so a tree pays more than a chain of as many tokens; this measures how
much. Qwen2.5-Coder 1.5B from GGUF in bfloat16, the first HumanEval prompt in the cache (with room
for 160 more tokens), batch 1; each call timed in a jitted loop as the decode loops compile it
(`measure.timing.decode_step_time`), the variants interleaved round by round, medians. Prints a
table and writes JSON (--out). Run on a quiet machine.

    .venv/bin/python scripts/tree_verify_cost.py --out benchmarks/tree_verify_cost
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import statistics
import sys

import jax
import jax.numpy as jnp

from speculative import checkpoints, vocab
from speculative.data import inputs
from speculative.decoding.tree import TreeShape
from speculative.loading import fetch
from speculative.measure import timing
from speculative.models import decoder

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from matrix_units import cpu_model  # noqa: E402  (one CPU-name reader for the scripts)

# Trees by their drafted nodes; the verify call scores them with the root: 8 and 16 tokens, as the
# chains of 8 and 16 beside them.
TREES = {
    "7-node tree 2-1-1-1-1-1 (8 tokens)": (2, 1, 1, 1, 1, 1),
    "15-node tree 4-3-2-2-1-1-1-1 (16 tokens)": (4, 3, 2, 2, 1, 1, 1, 1),
}
CHAINS = (1, 3, 6, 8, 16)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/tree_verify_cost")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per variant")
    args = parser.parse_args(argv)
    path = fetch.ensure_model("qwen2.5-coder-1.5b")
    config, params = checkpoints.load_gguf(path, dtype=jnp.bfloat16)
    model = decoder.DecoderLM(config)
    ids = inputs.tokenize(inputs.read_examples("humaneval", limit=1), vocab.from_gguf(path), False)
    batch = inputs.decoder_batch(ids[:1])
    cache_len = batch["prompt"].shape[1] + 160
    time = functools.partial(timing.decode_step_time, model, params, batch, cache_len)
    variants = {
        f"chain of {n}" if n > 1 else "plain step": functools.partial(time, n) for n in CHAINS
    }
    nodes = {}
    for name, widths in TREES.items():
        ancestors = TreeShape.from_widths(widths).ancestors
        nodes[name] = int(ancestors.shape[0])
        variants[name] = functools.partial(time, 1, ancestors=ancestors)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, run in variants.items():
            samples[name].append(run())
    ms = {name: statistics.median(s) * 1e3 for name, s in samples.items()}
    step = ms["plain step"]
    report = {
        "cpu": cpu_model(),
        "jax": jax.__version__,
        "target": "qwen2.5-coder-1.5b, bfloat16",
        "batch": 1,
        "cache_len": cache_len,
        "tree_nodes": nodes,
        "ms": ms,
        "plain_steps": {name: v / step for name, v in ms.items()},
        "samples_ms": {name: [v * 1e3 for v in s] for name, s in samples.items()},
    }
    print(f"{report['cpu']}, jax {report['jax']}, {report['target']}, batch 1, cache {cache_len}")
    print("| call | ms | plain steps |\n| --- | --- | --- |")
    for name, value in ms.items():
        print(f"| {name} | {value:.1f} | {value / step:.2f} |")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tree_verify_cost.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
