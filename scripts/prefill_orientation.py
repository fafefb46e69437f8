#!/usr/bin/env python
"""Which operand order a product of many rows wants, and what it does to a prompt's prefill.

`models.base.dense` multiplies a few bfloat16 rows with the weight as the left operand
(W [N, K] . x^T -> [N, M], then transposed): the faster order for a decode step and a verify
block, and one that rounds a row alike at any row count. A prefill has a prompt's worth of rows,
and there the transpose back to [M, N] fuses into the elementwise work that reads the product
(SiLU, the residual add). This measures, on a quiet machine:

1. `mlp`: 28 unrolled MLP blocks at Qwen2.5-1.5B's widths (1536 -> 8960 -> 1536; bfloat16
   weights, float32 accumulation) with the weight left and with the rows left, for 2 to 256 rows,
   interleaved, median of 5: where `base.WIDE_ROWS` should switch.
2. `bits`: whether the first row's sums are the same bits in both orders at every row count, for
   the models' projection shapes (the switch must not change what a row computes).
3. `models`: the 1.5B target's and the 0.5B draft's (32,768-id shortlist head; bfloat16 and int8)
   prefill of the first HumanEval prompt at 128 and 256 padded rows, and the draft's one-row step
   and four-row block, each under three routings, interleaved:
   - `weight_left`: every product weight-left (the routing before the switch; `WIDE_ROWS` set
     past any row count);
   - `now`: the repository's routing (rows left past `WIDE_ROWS`, bfloat16 and int8);
   - `int8_widened` (int8 draft only): the int8 draft's earlier prefill route, every kernel of a
     call of more than 64 rows widened to bfloat16 (weight-left) on each call.

    .venv/bin/python scripts/prefill_orientation.py --out benchmarks/prefill_orientation
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from speculative import decoding
from speculative.measure import timing
from speculative.models import base, int8, precision

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from draft_anatomy import load_draft  # noqa: E402  (as the anatomy loads them)
from matrix_units import cpu_model, write_report  # noqa: E402  (the scripts' shared pieces)
from step_profile import load_target  # noqa: E402

F32, BF16 = jnp.float32, jnp.bfloat16
NEVER = 1 << 30  # a WIDE_ROWS no call reaches: every product weight-left
ROUTINGS = ("weight_left", "now", "int8_widened")


def ordered(order: str):
    """`base.dense` with every product in one operand order ('weight_left' or 'rows_left'),
    whatever the row count: `WIDE_ROWS` is set while the call is traced."""
    wide = NEVER if order == "weight_left" else 0

    def dense(x: jax.Array, w: jax.Array) -> jax.Array:
        saved, base.WIDE_ROWS = base.WIDE_ROWS, wide
        try:
            return base.dense(x, w)
        finally:
            base.WIDE_ROWS = saved

    return dense


weight_left, rows_left = ordered("weight_left"), ordered("rows_left")


def median_interleaved(fns: dict, *args, repeats: int = 5) -> dict[str, float]:
    """name -> median ms of fn(*args), the names interleaved run by run, compiled apart."""
    for fn in fns.values():
        jax.block_until_ready(fn(*args))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            samples[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(v) for name, v in samples.items()}


def mlp_blocks(row_counts: list[int], layers: int = 28, emb: int = 1536, mlp: int = 8960) -> list:
    key = jax.random.PRNGKey(0)
    shapes = ((mlp, emb), (mlp, emb), (emb, mlp))
    weights = [
        [
            jax.random.normal(jax.random.fold_in(key, 3 * i + j), s, BF16) * 0.02
            for j, s in enumerate(shapes)
        ]
        for i in range(layers)
    ]

    def stack(dense):
        def run(weights, x):
            for gate, up, down in weights:
                x = x + dense(jax.nn.silu(dense(x, gate)) * dense(x, up), down)
            return x

        return jax.jit(run)

    fns = {"weight_left": stack(weight_left), "rows_left": stack(rows_left)}
    rows = []
    for m in row_counts:
        x = jax.random.normal(key, (m, emb), F32)
        ms = median_interleaved(fns, weights, x)
        rows.append({"rows": m, **{f"{k}_ms": v for k, v in ms.items()}})
        print(
            f"mlp  {m:4d} rows: weight left {ms['weight_left']:7.1f} ms, rows left {ms['rows_left']:7.1f} ms",
            flush=True,
        )
    return rows


def bits(row_counts: list[int]) -> list[dict]:
    """Per shape: row counts whose first row differs from two weight-left rows, per order."""
    key = jax.random.PRNGKey(1)
    out = []
    for n, k in ((8960, 1536), (1536, 8960), (256, 1536), (4864, 896), (32768, 896)):
        w = (jax.random.normal(key, (n, k), F32) * 0.02).astype(BF16)
        x = jax.random.normal(jax.random.fold_in(key, 5), (max(row_counts), k), F32)
        reference = np.asarray(weight_left(x[:2], w))[0]
        differs = {"weight_left": [], "rows_left": []}
        for m in row_counts:
            for name, dense in (("weight_left", weight_left), ("rows_left", rows_left)):
                if not np.array_equal(np.asarray(jax.jit(dense)(x[:m], w))[0], reference):
                    differs[name].append(m)
        out.append({"shape": [n, k], "rows_checked": row_counts, "differs_at": differs})
        print(
            f"bits [{n}, {k}]: first row differs from 2 weight-left rows at {differs}", flush=True
        )
    return out


def widened_int8(rows, kernel, scale, rows_left=False):
    """The int8 draft's earlier prefill route: past 64 rows the kernel widened to bfloat16."""
    if rows.shape[0] > 64:
        return weight_left(rows, kernel.astype(BF16)) * scale
    return ORIGINAL_INT8(rows, kernel, scale)


ORIGINAL_INT8 = int8.dense


def routed(routing: str, fn, *args):
    """fn(*args) traced under `routing` (module constants read at trace time)."""
    wide, product = base.WIDE_ROWS, int8.dense
    base.WIDE_ROWS = wide if routing == "now" else NEVER
    int8.dense = widened_int8 if routing == "int8_widened" else ORIGINAL_INT8
    try:
        return fn(*args)
    finally:
        base.WIDE_ROWS, int8.dense = wide, product


def prefill_ms(model, params, batch: dict, width: int, routings, repeats: int = 5) -> dict:
    padded = dict(
        batch, prompt=jnp.pad(batch["prompt"], ((0, 0), (0, width - batch["prompt"].shape[1])))
    )

    def compiled(routing):
        fn = jax.jit(lambda p, b: decoding.prefill(model, p, b, width + 160)[0],
                     compiler_options=precision.COMPILER_OPTIONS)  # fmt: skip
        return routed(routing, lambda: fn.lower(params, padded).compile())

    return median_interleaved({r: compiled(r) for r in routings}, params, padded, repeats=repeats)


def model_rows(widths: list[int]) -> list[dict]:
    out = []
    draft, draft_params, batch, cache_len = load_draft()
    target, target_params, _, _ = load_target()
    cases = (
        ("1.5B target, bfloat16", target, target_params, ROUTINGS[:2]),
        ("0.5B draft, bfloat16", draft, draft_params, ROUTINGS[:2]),
        ("0.5B draft, int8", draft, int8.quantize_params(draft_params), ROUTINGS),
    )
    for label, model, params, routings in cases:
        for width in widths:
            ms = prefill_ms(model, params, batch, width, routings)
            out.append(
                {
                    "model": label,
                    "call": f"prefill, {width} rows",
                    **{f"{r}_ms": v for r, v in ms.items()},
                }
            )
            print(f"{label}: prefill of {width} rows {ms}", flush=True)
        if model is draft:
            for length in (1, 4):
                ms = {
                    r: routed(
                        r, timing.decode_step_time, model, params, batch, cache_len, 5, length
                    )
                    * 1e3
                    for r in routings[:2]
                }
                out.append(
                    {
                        "model": label,
                        "call": f"extend by {length}",
                        **{f"{r}_ms": v for r, v in ms.items()},
                    }
                )
                print(f"{label}: extend by {length} {ms}", flush=True)
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/prefill_orientation")
    parser.add_argument("--rows", type=int, nargs="+", default=[2, 8, 16, 32, 40, 48, 64, 128, 256])
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 256])
    args = parser.parse_args(argv)
    report = {
        "cpu": cpu_model(),
        "jax": jax.__version__,
        "wide_rows": base.WIDE_ROWS,
        "mlp": mlp_blocks(args.rows),
        "bits": bits([2, 4, 6, 8, 16, 32, 33, 48, 64, 128, 256]),
        "models": model_rows(args.widths),
    }
    print(f"wrote {write_report(args.out, 'prefill_orientation.json', report)}")
    return report


if __name__ == "__main__":
    main()
