"""int8 projection weights for a cheaper draft (docs/design.md §9, "int8 drafts").

A draft's q only has to be the distribution the draft samples from: any q is exact under the
acceptance rule, so a draft may trade accuracy for speed. On a CPU the draft's step streams its
weights, and XLA:CPU's int8 x int8 -> int32 product of two or more rows reads int8 weights at
about the bfloat16 byte rate, so half the bytes cost roughly half the time
(docs/benchmarks.md, "int8 drafts"). A float32 or bfloat16 activation times an int8 weight has no
such route (the weight is widened on every call), so the rows are quantised too:

- weights: symmetric, per output channel, `kernel` int8 [N, ...] beside `kernel_scale` float32
  [N, ...] (the kernel's output axes), written once at load (`quantize_params`);
- rows: symmetric, per row, on every call (`dense`): scale = max |x| / 127.

The int32 sums are exact integers, so a row's result does not depend on how many rows share the
call: the draft's steps, staged blocks and prefill compute the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

SCALE = "kernel_scale"  # the parameter beside an int8 `kernel`
LEVELS = 127.0  # symmetric int8: -127..127 (-128 unused, so negation is exact)
# Parameter scopes whose `kernel` is a projection (models.decoder.Projection) or the output head
# (LogitsDense / ShortlistHead): output-major [out..., in...] kernels. Embedding tables are
# gathered, not multiplied, and stay as they are (a tied head reads the table in its dtype).
PROJECTIONS = ("query", "key", "value", "out", "wi_0", "wi_1", "wo", "logits_dense")


def quantize_kernel(kernel: jax.Array, out_dims: int = 1) -> tuple[jax.Array, jax.Array]:
    """kernel [out..., in...] (any float dtype) -> (int8 kernel [out..., in...], float32 scale
    [out...]) with kernel ~= q * scale per output channel; an all-zero channel gets scale 1."""
    flat = kernel.astype(jnp.float32).reshape(*kernel.shape[:out_dims], -1)
    peak = jnp.max(jnp.abs(flat), axis=-1)
    scale = jnp.where(peak > 0, peak / LEVELS, 1.0)
    q = jnp.round(flat / scale[..., None]).astype(jnp.int8)
    return q.reshape(kernel.shape), scale


def quantize_params(params: Mapping[str, Any], out_dims: Mapping[str, int] | None = None) -> dict:
    """A decoder-only parameter tree with every projection and head kernel (`PROJECTIONS`) in
    int8 beside its `kernel_scale`; every other array is shared, not copied.

    out_dims: scope name -> number of output axes of its kernel (default 1; the attention output
    projection's [E, H, D] kernel has one output axis like the rest, query/key/value's [H, D, E]
    have two). A tree already quantised is refused (ValueError)."""
    out_dims = {"query": 2, "key": 2, "value": 2, **(out_dims or {})}

    def walk(tree: Mapping[str, Any]) -> dict:
        result = {}
        for name, value in tree.items():
            if not isinstance(value, Mapping):
                result[name] = value
            elif name in PROJECTIONS and "kernel" in value:
                if SCALE in value:
                    raise ValueError(f"{name}: the kernel is already int8")
                q, scale = quantize_kernel(value["kernel"], out_dims.get(name, 1))
                result[name] = {**value, "kernel": q, SCALE: scale}
            else:
                result[name] = walk(value)
        return result

    return walk(params)


def is_quantized(params: Any) -> bool:
    """Whether a parameter tree holds an int8 kernel (a `kernel_scale` anywhere in its nested
    mappings); False for any other params (a drafter's tables, an empty tuple)."""
    if not isinstance(params, Mapping):
        return False
    return any(name == SCALE or is_quantized(value) for name, value in params.items())


def quantize_rows(rows: jax.Array) -> tuple[jax.Array, jax.Array]:
    """rows [M, K] float -> (int8 rows [M, K], float32 scale [M]); an all-zero row gets scale 1."""
    rows = rows.astype(jnp.float32)
    peak = jnp.max(jnp.abs(rows), axis=-1)
    scale = jnp.where(peak > 0, peak / LEVELS, 1.0)
    return jnp.round(rows / scale[:, None]).astype(jnp.int8), scale


def dense(
    rows: jax.Array, kernel: jax.Array, scale: jax.Array, rows_left: bool = False
) -> jax.Array:
    """rows [M, K] float times an int8 output-major kernel [N, K] with its scale [N] -> [M, N]
    float32: the rows quantised, an int8 x int8 -> int32 product.

    The rows are padded to an even count of at least two (XLA:CPU's int8 product of one row takes
    a slow loop, about 20x the two-row time, as bfloat16 does). The weight is the left operand,
    as `base.dense` keeps it for a few bfloat16 rows (the real draft's step was slower with the
    rows left); rows_left=True (a prefill's many rows, `base.WIDE_ROWS`) puts the rows left
    instead, 2-3x faster there (docs/benchmarks.md, "Prefill orientation"). The sums are exact
    integers, so the orientation cannot change a result."""
    m = rows.shape[0]
    padded = max(2, -(-m // 2) * 2)
    q, row_scale = quantize_rows(jnp.pad(rows, ((0, padded - m), (0, 0))))
    contract = (((1,), (1,)), ((), ()))
    if rows_left:
        product = jax.lax.dot_general(q, kernel, contract, preferred_element_type=jnp.int32)
    else:  # [N, padded]: the barrier keeps XLA from folding the transpose back into the dot
        product = jax.lax.dot_general(kernel, q, contract, preferred_element_type=jnp.int32)
        product = jax.lax.optimization_barrier(product).T
    return product[:m].astype(jnp.float32) * row_scale[:m, None] * scale[None, :]
