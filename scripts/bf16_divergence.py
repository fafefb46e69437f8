#!/usr/bin/env python
"""How often bfloat16 greedy speculative decoding leaves bfloat16 plain greedy decoding, and why.

The rejection rule makes speculative output identical to plain output only if the target's logits
are the same numbers in both programs. They are not quite: plain decoding scores one position per
call (a GEMV), the verify call scores γ + 1 positions in one pass (a GEMM over γ + 1 rows, padded
to a multiple of 4), and the two kernels sum in different orders. In float32 the difference is
~1e-6 of a logit and flips no argmax in practice; with bfloat16 weights and activations every
intermediate is rounded to 8 mantissa bits, the difference grows to ~1e-2, and an argmax whose top
two logits are that close can flip. After a flip the two outputs are different texts.

This measures it on real weights: SmolLM2-135M-Instruct (the registry GGUF) drafting for ITSELF.
Its one-token draft steps compute exactly plain decoding's numbers, so every divergence comes from
the verify call's block numerics alone. For each dtype and γ it reports the fraction of prompts
whose output differs from plain, the mean position of the first difference, and the largest
|logit| gap between a verify block and the same positions scored one at a time.

    python scripts/bf16_divergence.py --prompts 8 --max_new_tokens 64 --out benchmarks/bf16_divergence
    python scripts/bf16_divergence.py --tiny     # random toy model, seconds (the test suite)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from speculative import checkpoints, decoding, vocab
from speculative.data import inputs
from speculative.loading import fetch
from speculative.models import decoder

MODEL = "smollm2-135m"


def block_gap(model, params, prompt: jax.Array, block: int) -> float:
    """max |logit| difference between scoring `block` tokens in one extend and one at a time."""
    width = prompt.shape[1]
    cache = width + block
    tokens = jnp.tile(prompt[:, -1:], (1, block))

    @jax.jit
    def both(params):
        state = model.init_state(params, {"prompt": prompt}, cache)
        _, state = model.extend(params, state, prompt[:, :-1])
        together, _ = model.extend(params, state, tokens)
        singles, s = [], state
        for i in range(block):
            logits, s = model.extend(params, s, tokens[:, i : i + 1])
            singles.append(logits)
        return together, jnp.concatenate(singles, axis=1)

    together, singles = both(params)
    return float(jnp.max(jnp.abs(together - singles)))


def first_difference(a: np.ndarray, b: np.ndarray) -> int | None:
    """Index of the first differing token of two rows, or None when they are equal."""
    diff = np.flatnonzero(a != b)
    return int(diff[0]) if diff.size else None


def measure(model, params, prompts, stop_ids, max_new: int, gammas) -> dict[str, Any]:
    """Per γ: prompts whose speculative output differs from plain, and where it first does."""
    config, rng = decoding.DecodeConfig(max_new, stop_ids), jax.random.PRNGKey(0)
    plain = [
        np.asarray(decoding.autoregressive_loop(model, params, batch, rng, config).tokens[0])
        for batch in prompts
    ]
    result: dict[str, Any] = {
        "block_logit_gap": {
            g: block_gap(model, params, prompts[0]["prompt"], g + 1) for g in gammas
        }
    }
    for gamma in gammas:
        spec_config = decoding.DecodeConfig(max_new, stop_ids, gamma=gamma)
        firsts = []
        for batch, ref in zip(prompts, plain):
            out = decoding.speculative_loop(model, params, model, params, batch, rng, spec_config)
            firsts.append(first_difference(np.asarray(out.tokens[0]), ref))
        diverged = [f for f in firsts if f is not None]
        result[f"gamma_{gamma}"] = {
            "diverged": len(diverged),
            "prompts": len(firsts),
            "rate": len(diverged) / len(firsts),
            "first_difference": firsts,
            "mean_first_difference": float(np.mean(diverged)) if diverged else None,
        }
    return result


def load(tiny: bool, dtype: str):
    """(model, params, vocabulary or None) in `dtype` (weights, activations and cache)."""
    if tiny:
        config = decoder.DecoderConfig(
            vocab_size=256, emb_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
            mlp_dim=128, dtype=dtype,
        )  # fmt: skip
        model = decoder.DecoderLM(config)
        params = jax.tree.map(lambda x: x.astype(dtype), model.init_params(jax.random.PRNGKey(0)))
        return model, params, None
    path = fetch.ensure_model(MODEL)
    config, params = checkpoints.load_gguf(path, dtype=jnp.dtype(dtype))
    return decoder.DecoderLM(config), params, vocab.from_gguf(path)


def prompt_batches(vocabulary, count: int) -> list[dict[str, jax.Array]]:
    """Batch-1 prompts padded to one width (one compilation per program): HumanEval, or random
    ids for the toy model."""
    if vocabulary is None:
        rng = np.random.default_rng(0)
        ids = [[int(t) for t in rng.integers(1, 256, 8)] for _ in range(count)]
    else:
        examples = inputs.read_examples("humaneval", limit=count)
        ids = inputs.tokenize(examples, vocabulary, encoder_decoder=False)
    width = inputs.bucket(max(len(x) for x in ids), 4096)
    return [inputs.decoder_batch([x], pad_to=width) for x in ids]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8, help="first N HumanEval prompts")
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--gammas", type=int, nargs="+", default=[1, 4, 7])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--tiny", action="store_true", help="random toy model (seconds)")
    parser.add_argument("--out", default=None, help="write bf16_divergence.json here")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "model": "tiny random decoder" if args.tiny else MODEL,
        "draft": "the target itself (its one-token steps are plain decoding's numbers)",
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
    }
    for dtype in args.dtypes:
        start = time.perf_counter()
        model, params, vocabulary = load(args.tiny, dtype)
        stop_ids = vocab.stop_ids(vocabulary) if vocabulary is not None else (0,)
        prompts = prompt_batches(vocabulary, args.prompts)
        report[dtype] = measure(model, params, prompts, stop_ids, args.max_new_tokens, args.gammas)
        report[dtype]["seconds"] = time.perf_counter() - start
        print(f"{dtype}: {json.dumps(report[dtype])}", flush=True)
    print("| dtype | γ | prompts diverged | mean first differing token | max block logit gap |")
    print("|---|---|---|---|---|")
    for dtype in args.dtypes:
        for gamma in args.gammas:
            r = report[dtype][f"gamma_{gamma}"]
            mean = "" if r["mean_first_difference"] is None else f"{r['mean_first_difference']:.1f}"
            gap = report[dtype]["block_logit_gap"][gamma]
            print(f"| {dtype} | {gamma} | {r['diverged']}/{r['prompts']} | {mean} | {gap:.2e} |")
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bf16_divergence.json").write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
