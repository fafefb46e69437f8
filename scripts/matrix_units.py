#!/usr/bin/env python
"""What bfloat16 through the CPU's matrix units does to every cost speculative decoding pays.

On real weights (Qwen2.5-Coder 1.5B target, 0.5B draft with its 32,768-id shortlist head, GGUF
dequantised to float32, and the same weights cast to bfloat16), float32 and bfloat16 measured
interleaved in one process, each cost a median of in-loop steps (`measure.timing`):
  1. `extend` by 1, 2, 4, 6, 8, 16 rows at batch 1 and by 1, 6, 8 rows at batch 8, both models;
  2. the plain step, the draft step, the verify call for 3 / 6 / 8 tokens and a 7- and a 16-node
     token tree, in ms and in plain steps of the same dtype;
  3. the prefill of each of the first 20 HumanEval prompts;
  4. peak RSS of loading both models in each dtype (a fresh process each: dequantised straight
     into bfloat16, never a float32 copy of the whole model);
  5. which of the bfloat16 step's dots XLA:CPU hands to its library kernel (the route).
Prints tables and writes JSON (--out). Run on a quiet machine.

    .venv/bin/python scripts/matrix_units.py --out benchmarks/matrix_units
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import re
import resource
import subprocess
import sys
import time
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np

from speculative import checkpoints, vocab
from speculative.data import inputs
from speculative.decoding.tree import TreeShape
from speculative.drafts import shortlist
from speculative.loading import fetch
from speculative.measure import timing
from speculative.models import decoder, precision

DTYPES = ("float32", "bfloat16")
TREES = {"tree7": (2, 1, 1, 1, 1, 1), "tree16": (4, 3, 3, 2, 2, 1, 1)}


def load(name: str, dtype: str):
    config, params = checkpoints.load_gguf(fetch.ensure_model(name), dtype=jnp.dtype(dtype))
    return decoder.DecoderLM(config), params


def peak_rss_main(dtype: str) -> None:
    """Child process: load both models in `dtype`, print peak RSS (GiB) as JSON."""
    start = time.perf_counter()
    target, tp = load("qwen2.5-coder-1.5b", dtype)
    draft, dp = load("qwen2.5-coder-0.5b", dtype)
    jax.block_until_ready((tp, dp))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps({"dtype": dtype, "peak_rss_gib": peak, "load_s": seconds}))


def peak_rss(dtype: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--peak_rss", dtype], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_report(out_dir: str, name: str, report: dict) -> pathlib.Path:
    """Writes a script's report as out_dir/name (JSON, the directory made); returns the path."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def cpu_model() -> str:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def prefill_time(model, params, batch, cache_len: int) -> float:
    @jax.jit
    def prefill(params, batch):
        state = model.init_state(params, batch, cache_len)
        return model.extend(params, state, batch["prompt"])[0][:, -1]

    return timing.time_call(lambda: prefill(params, batch), repeats=3)[1]


def route_report(model, params, batch, cache_len: int) -> dict:
    """Dots of one compiled bfloat16 step: how many XLA:CPU fused into its library kernel."""

    def step(params, state, tokens):
        return model.extend(params, state, tokens)[0]

    state = jax.eval_shape(lambda p, b: model.init_state(p, b, cache_len), params, batch)
    tokens = jax.ShapeDtypeStruct((batch["prompt"].shape[0], 1), jnp.int32)
    text = jax.jit(step).lower(params, state, tokens).compile().as_text()
    return {
        "library_fusions": len(re.findall(r"%\w*ynn_fusion[.\d]* = ", text)),
        "dots": len(re.findall(r"= \S+ dot\(", text)),
        "float32_weight_copies": len(re.findall(r"f32\[\d{4,},\d{3,}\]\{[\d,]+\} convert", text)),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/matrix_units")
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--peak_rss", choices=DTYPES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peak_rss:
        peak_rss_main(args.peak_rss)
        return {}
    report: dict = {
        "cpu": cpu_model(),
        "bf16_units": [f for f in precision.BF16_UNIT_FLAGS if f in precision.cpu_flags()],
        "auto_route": precision.resolve("auto").reason,
        "jax": jax.__version__,
        "peak_rss": {d: peak_rss(d) for d in DTYPES},
    }
    print(f"{report['cpu']}, units {report['bf16_units']}, jax {report['jax']}")
    for d in DTYPES:
        print(
            f"peak RSS loading both models in {d}: {report['peak_rss'][d]['peak_rss_gib']:.2f} GiB"
        )

    vocabulary = vocab.from_gguf(fetch.ensure_model("qwen2.5-coder-1.5b"))
    examples = inputs.read_examples("humaneval", limit=args.prompts)
    ids = inputs.tokenize(examples, vocabulary, encoder_decoder=False)
    models = {}
    target32, tp32 = load("qwen2.5-coder-1.5b", "float32")
    draft32, dp32 = load("qwen2.5-coder-0.5b", "float32")
    short = shortlist.for_prompts(vocabulary, 32768, ids, vocab_size=draft32.vocab_size)
    dcfg, dp32 = decoder.restrict_head(draft32.config, dp32, short)
    for d in DTYPES:

        def cast(tree, d=d):
            return jax.tree.map(lambda x: x.astype(d) if x.dtype.kind == "f" else x, tree)

        models[d] = {
            "target": (decoder.DecoderLM(replace(target32.config, dtype=d)), cast(tp32)),
            "draft": (decoder.DecoderLM(replace(dcfg, dtype=d)), cast(dp32)),
        }
    del tp32, dp32
    one = inputs.decoder_batch(ids[:1])
    cache_len = one["prompt"].shape[1] + 160
    eight = inputs.decoder_batch([ids[0]] * 8)

    rows = []  # section 1: extend by L rows
    for role in ("target", "draft"):
        for batch_name, batch, lengths in (
            ("1", one, (1, 2, 4, 6, 8, 16)),
            ("8", eight, (1, 6, 8)),
        ):
            for length in lengths:
                row = {"model": role, "batch": int(batch_name), "rows": length}
                for d in DTYPES:  # interleaved
                    model, params = models[d][role]
                    row[d] = timing.decode_step_time(
                        model, params, batch, cache_len, repeats=5, length=length
                    )
                rows.append(row)
                print(
                    f"{role} batch {batch_name} extend {length:2d}: float32 "
                    f"{row['float32'] * 1e3:6.1f} ms  bfloat16 {row['bfloat16'] * 1e3:6.1f} ms  "
                    f"({row['float32'] / row['bfloat16']:.2f}x)",
                    flush=True,
                )
    report["extend"] = rows

    costs = {d: {} for d in DTYPES}  # section 2: the costs in plain steps
    for d in DTYPES:
        costs[d]["plain_step_s"] = next(
            r[d] for r in rows if r["model"] == "target" and r["batch"] == 1 and r["rows"] == 1
        )
        costs[d]["draft_step_s"] = next(
            r[d] for r in rows if r["model"] == "draft" and r["batch"] == 1 and r["rows"] == 1
        )
    for name, widths in TREES.items():
        for d in DTYPES:
            model, params = models[d]["target"]
            costs[d][f"{name}_verify_s"] = timing.decode_step_time(
                model, params, one, cache_len, 5, ancestors=TreeShape.from_widths(widths).ancestors
            )
    for tokens in (3, 6, 8):
        for d in DTYPES:
            model, params = models[d]["target"]
            costs[d][f"verify{tokens}_s"] = timing.decode_step_time(
                model, params, one, cache_len, repeats=5, length=tokens
            )
    for d in DTYPES:
        step = costs[d]["plain_step_s"]
        costs[d]["c"] = costs[d]["draft_step_s"] / step
        costs[d]["in_steps"] = {
            k.removesuffix("_s"): v / step for k, v in costs[d].items() if "verify" in k
        }
    report["costs"] = costs
    print("\n| cost | float32 ms | steps | bfloat16 ms | steps |\n| --- | --- | --- | --- | --- |")
    for key in costs["float32"]:
        if key.endswith("_s"):
            f, b = costs["float32"][key], costs["bfloat16"][key]
            fs, bs = f / costs["float32"]["plain_step_s"], b / costs["bfloat16"]["plain_step_s"]
            print(f"| {key[:-2]} | {f * 1e3:.1f} | {fs:.2f} | {b * 1e3:.1f} | {bs:.2f} |")
    print(f"c: float32 {costs['float32']['c']:.3f}, bfloat16 {costs['bfloat16']['c']:.3f}")

    prefill = {d: [] for d in DTYPES}  # section 3
    for prompt in ids:
        batch = inputs.decoder_batch([prompt])
        for d in DTYPES:
            model, params = models[d]["target"]
            prefill[d].append(prefill_time(model, params, batch, len(prompt) + 8))
    report["prefill"] = {
        d: {
            "mean_s": float(np.mean(v)),
            "tokens_per_s": float(sum(map(len, ids)) / sum(v)),
            "per_prompt_s": v,
        }
        for d, v in prefill.items()
    }
    for d in DTYPES:
        p = report["prefill"][d]
        print(f"prefill {d}: mean {p['mean_s']:.2f} s per prompt, {p['tokens_per_s']:.0f} tok/s")

    model, params = models["bfloat16"]["target"]
    report["route"] = route_report(model, params, one, cache_len)
    print(f"bfloat16 target step: {report['route']}")
    print(f"wrote {write_report(args.out, 'matrix_units.json', report)}")
    return report


if __name__ == "__main__":
    main()
