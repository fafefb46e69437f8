"""Can a cheaper draft come from storing its weights in fewer bytes? A probe of XLA on this device.

The draft's numerics do not touch exactness (any q is exact), so a draft kept in bfloat16, float16
or int8 would halve or quarter its weight bytes and with them c. That pays only if the device
streams the narrow weights at (nearly) the float32 byte rate. This measures, for a stack of
`[8960, 1536]` output-major matrices (the 1.5B's MLP shape, 12 distinct ones so they do not sit
in cache), a one-row product per dtype and formulation, as ms and GB/s of weight bytes:

- `dot`: `lax.dot_general` on the stored dtype (bf16 / f16 x bf16 / f16, float32 accumulation);
- `upcast-reduce`: the weight converted to float32 inside an elementwise-multiply-and-reduce
  fusion (no float32 copy materialised), for bf16 / f16 / int8;
- `int8-dot`: the activation row quantised to int8 on the fly, an int8 x int8 dot accumulating in
  int32, then rescaled (dynamic quantisation, as int8 CPU inference runtimes do);
- `model`: the product the models run (`models.base.dense` for float32 / bfloat16 kernels, the
  matrix-unit route for bfloat16; `models.int8.dense` for an int8 kernel with its per-channel
  scales, the int8 draft's route), compiled with the decode loops' options.

`--rows 1 2 8` times each case at those row counts (1: a plain step; 2: the padded step of the
matrix-unit routes; 8: a verify block):

    python scripts/probe_weight_dtypes.py --out benchmarks/weight_dtypes.json
    python scripts/probe_weight_dtypes.py --rows 1 2 8 --model_only \
        --out benchmarks/weight_dtypes_rows/weight_dtypes.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from speculative.models import base, int8, precision

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from matrix_units import cpu_model  # noqa: E402  (the scripts' shared pieces)

ROWS, COLS, MATRICES = 8960, 1536, 12


def _dot(w, x):
    operand = x[0].astype(w.dtype) if w.dtype != jnp.float32 else x[0]
    dims = (((1,), (0,)), ((), ()))
    return jax.lax.dot_general(w, operand, dims, preferred_element_type=jnp.float32)


def _upcast_reduce(w, x):
    return jnp.sum(w.astype(jnp.float32) * x[0][None, :], axis=1)


def _int8_dot(w, x):
    # Dynamic quantisation of the activation row to int8, an s8 x s8 -> s32 dot, then the scale.
    scale = jnp.max(jnp.abs(x[0])) / 127.0
    q = jnp.round(x[0] / scale).astype(jnp.int8)
    dims = (((1,), (0,)), ((), ()))
    acc = jax.lax.dot_general(w, q, dims, preferred_element_type=jnp.int32)
    return acc.astype(jnp.float32) * scale


def _weights(dtype: str, formulation: str) -> list:
    """MATRICES distinct [ROWS, COLS] kernels of `dtype`; an int8 `model` kernel is a (kernel,
    scale) pair quantised by `models.int8` as the int8 draft's are."""
    rng = np.random.default_rng(0)
    weights = []
    for _ in range(MATRICES):
        w = jnp.asarray(rng.standard_normal((ROWS, COLS), np.float32))
        weights.append(
            int8.quantize_kernel(w)
            if formulation == "model" and dtype == "int8"
            else w.astype(dtype)
        )
    return weights


def _model(w, x):
    if isinstance(w, tuple):
        return int8.dense(x, *w)
    return base.dense(x, w)


def measure(dtype: str, formulation: str, rows: int = 1, repeats: int = 10) -> dict:
    """Median ms of one product of `rows` rows over every matrix, and the weight bytes per second
    it implies."""
    fn = {
        "dot": _dot,
        "upcast-reduce": _upcast_reduce,
        "int8-dot": _int8_dot,
        "model": _model,
    }[formulation]
    weights = _weights(dtype, formulation)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((rows, COLS), np.float32))
    options = precision.COMPILER_OPTIONS if formulation == "model" else None
    program = jax.jit(lambda ws, x: sum(jnp.sum(fn(w, x)) for w in ws), compiler_options=options)
    jax.block_until_ready(program(weights, x))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(program(weights, x))
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    nbytes = sum(leaf.nbytes for leaf in jax.tree.leaves(weights))
    return {
        "dtype": dtype,
        "formulation": formulation,
        "rows": rows,
        "ms": 1e3 * seconds,
        "weight_gb_s": nbytes / seconds / 1e9,
        "weight_mb": nbytes / 1e6,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    parser.add_argument("--rows", type=int, nargs="+", default=[1], help="rows per product")
    parser.add_argument(
        "--model_only", action="store_true", help="only the models' own products (`model`)"
    )
    args = parser.parse_args(argv)
    model_cases = [("float32", "model"), ("bfloat16", "model"), ("int8", "model")]
    cases = [
        ("float32", "dot"),
        ("bfloat16", "dot"),
        ("float16", "dot"),
        ("float32", "upcast-reduce"),
    ]
    cases += [
        ("bfloat16", "upcast-reduce"),
        ("float16", "upcast-reduce"),
        ("int8", "upcast-reduce"),
        ("int8", "int8-dot"),
    ]
    cases = model_cases if args.model_only else cases + model_cases
    rows = [measure(dtype, form, m) for m in args.rows for dtype, form in cases]
    first = {m: next(r["ms"] for r in rows if r["rows"] == m) for m in args.rows}
    print(f"{jax.devices()[0].device_kind}: products over {MATRICES} x [{ROWS}, {COLS}]")
    print("| rows | weights | formulation | MB | ms | GB/s of weight bytes | time vs the first |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['rows']} | {r['dtype']} | {r['formulation']} | {r['weight_mb']:.0f} | "
            f"{r['ms']:.1f} | {r['weight_gb_s']:.1f} | {r['ms'] / first[r['rows']]:.2f}x |"
        )
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        record = {"device": jax.devices()[0].device_kind, "cpu": cpu_model(), "rows": rows}
        pathlib.Path(args.out).write_text(json.dumps(record, indent=1))
    return rows


if __name__ == "__main__":
    main()
