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
  int32, then rescaled (dynamic quantisation, as int8 CPU inference runtimes do).

    python scripts/probe_weight_dtypes.py --out benchmarks/weight_dtypes.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

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


def measure(dtype: str, formulation: str, repeats: int = 10) -> dict:
    """Median ms of one product over every matrix, and the weight bytes per second it implies."""
    fn = {"dot": _dot, "upcast-reduce": _upcast_reduce, "int8-dot": _int8_dot}[formulation]
    rng = np.random.default_rng(0)
    weights = [
        jnp.asarray(rng.standard_normal((ROWS, COLS), np.float32)).astype(dtype)
        for _ in range(MATRICES)
    ]
    x = jnp.ones((1, COLS), jnp.float32)
    program = jax.jit(lambda ws, x: sum(jnp.sum(fn(w, x)) for w in ws))
    jax.block_until_ready(program(weights, x))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(program(weights, x))
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    nbytes = sum(w.nbytes for w in weights)
    return {
        "dtype": dtype,
        "formulation": formulation,
        "ms": 1e3 * seconds,
        "weight_gb_s": nbytes / seconds / 1e9,
        "weight_mb": nbytes / 1e6,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
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
    rows = [measure(dtype, formulation) for dtype, formulation in cases]
    f32 = rows[0]["ms"]
    print(f"{jax.devices()[0].device_kind}: one-row product over {MATRICES} x [{ROWS}, {COLS}]")
    print("| weights | formulation | MB | ms | GB/s of weight bytes | time vs float32 dot |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['dtype']} | {r['formulation']} | {r['weight_mb']:.0f} | {r['ms']:.1f} | "
            f"{r['weight_gb_s']:.1f} | {r['ms'] / f32:.2f}x |"
        )
    if args.out:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(
            json.dumps({"device": jax.devices()[0].device_kind, "rows": rows}, indent=1)
        )
    return rows


if __name__ == "__main__":
    main()
