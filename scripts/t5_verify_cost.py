"""How much does verifying gamma+1 tokens cost a T5 target, and what is c = draft step / target step?

Random weights at the real T5 v1.1 dimensions (configs/models/t5_1_1/*.gin), batch 1, float32 on
this CPU. For each size: one jitted `extend` of L decoder tokens (L = 1 and gamma+1 in {2, 4, 8})
against a cache already holding `--context` tokens, encoder input of `--encoder-len` tokens.
Compile time is measured apart (lower + compile); run times are medians over `--repeats` calls.
c for draft -> target pairs is the ratio of their 1-token extend times (Leviathan et al. section 3).

    .venv/bin/python scripts/t5_verify_cost.py --sizes small base large --out t5_verify_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import gin
import jax
import jax.numpy as jnp

from speculative.config import configurables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LENGTHS = (1, 2, 4, 8)


def build(size: str):
    gin.clear_config()
    try:
        return configurables.build_model(
            [f"configs/models/t5_1_1/{size}.gin"], ["t5.T5Config.dtype = 'float32'"], ROOT
        )
    finally:
        gin.clear_config()


def measure_size(size: str, args) -> dict:
    model = build(size)
    params = jax.jit(model.init_params)(jax.random.PRNGKey(0))
    encoder = jnp.ones((1, args.encoder_len), jnp.int32)
    state = jax.jit(model.init_state, static_argnums=2)(
        params, {"encoder_input_tokens": encoder}, args.context + max(LENGTHS)
    )
    state = state.replace(index=jnp.full((1,), args.context, jnp.int32))
    extend = jax.jit(model.extend)
    result = {
        "config": {
            k: getattr(model.config, k)
            for k in (
                "emb_dim",
                "num_heads",
                "num_encoder_layers",
                "num_decoder_layers",
                "head_dim",
                "mlp_dim",
                "vocab_size",
            )
        },
        "extend": {},
    }
    for length in LENGTHS:
        tokens = jnp.ones((1, length), jnp.int32)
        start = time.perf_counter()
        compiled = extend.lower(params, state, tokens).compile()
        compile_s = time.perf_counter() - start
        jax.block_until_ready(compiled(params, state, tokens))  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            jax.block_until_ready(compiled(params, state, tokens))
            times.append(time.perf_counter() - start)
        result["extend"][length] = {
            "median_s": statistics.median(times),
            "compile_s": compile_s,
            "min_s": min(times),
            "max_s": max(times),
        }
    del params, state
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["small", "base"])
    parser.add_argument("--draft", default="small")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--context", type=int, default=32, help="decoder tokens already cached")
    parser.add_argument("--encoder-len", type=int, default=64)
    parser.add_argument("--out", default="t5_verify_cost.json")
    args = parser.parse_args()

    report = {
        "device": str(jax.devices()[0]),
        "batch": 1,
        "dtype": "float32",
        "context": args.context,
        "encoder_len": args.encoder_len,
        "repeats": args.repeats,
        "sizes": {},
    }
    for size in args.sizes:
        report["sizes"][size] = measure_size(size, args)
        print(f"measured {size}", flush=True)

    print(
        f"\nT5 v1.1, random weights, batch 1, float32, {report['device']}, "
        f"context {args.context}, encoder {args.encoder_len} tokens, median of {args.repeats}"
    )
    print(
        f"{'size':<6} "
        + " ".join(f"{f'L={n} ms':>9}" for n in LENGTHS)
        + " "
        + " ".join(f"{f'L={n}/L=1':>8}" for n in LENGTHS[1:])
        + f" {'compile s':>10}"
    )
    for size, r in report["sizes"].items():
        ms = [r["extend"][n]["median_s"] * 1e3 for n in LENGTHS]
        compile_s = sum(r["extend"][n]["compile_s"] for n in LENGTHS)
        r["ratio_to_one_token"] = {n: ms[i] / ms[0] for i, n in enumerate(LENGTHS)}
        print(
            f"{size:<6} "
            + " ".join(f"{m:9.2f}" for m in ms)
            + " "
            + " ".join(f"{m / ms[0]:8.2f}" for m in ms[1:])
            + f" {compile_s:10.1f}"
        )
    report["c"] = {}
    if args.draft in report["sizes"]:
        draft_step = report["sizes"][args.draft]["extend"][1]["median_s"]
        for size, r in report["sizes"].items():
            if size != args.draft:
                c = draft_step / r["extend"][1]["median_s"]
                report["c"][f"{args.draft}->{size}"] = c
                print(f"c ({args.draft} draft step / {size} target step) = {c:.3f}")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
