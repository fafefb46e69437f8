"""Attention over the KV cache, and what a block of query tokens sees of it.

A chain of L tokens written at `index` attends causally by absolute position. A token tree
(docs/design.md §1, token trees) is written in tree order at index .. index + L - 1, but each of
its tokens attends through its own *path view* of the cache: the slots before `index` as they
are, then its ancestors root first at index, index + 1, ..., itself at index + depth, and nothing
after. That is exactly the cache a plain step at position index + depth reads, slot for slot, so
a tree token's sums (the softmax's and the weights-times-values product) run in the same order as
a plain step's and round alike; attending over the tree-ordered slots with an ancestor mask gives
the same values mathematically but regroups those sums around the masked sibling slots, and in
bfloat16 that last-bit difference flipped a greedy near-tie (docs/design.md §9).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from speculative.models import base


class TreeMask(NamedTuple):
    """A token tree's view of the cache (module docstring).

    mask: [B, 1, L, S] bool, causal at each token's position index + depth.
    sources: [B, L, S] int32, the cache slot each of a token's S key slots reads.
    """

    mask: jax.Array
    sources: jax.Array


def causal_cache_mask(positions: jax.Array, cache_len: int) -> jax.Array:
    """Boolean mask [B, 1, L, S]: query at absolute position t sees cache slots 0..t."""
    slots = jnp.arange(cache_len, dtype=jnp.int32)
    return slots[None, None, None, :] <= positions[:, None, :, None]


def cache_mask(
    positions: jax.Array, index: jax.Array, cache_len: int, ancestors: base.Ancestors = None
) -> jax.Array | TreeMask:
    """What the L tokens written at index [B] see: a causal mask [B, 1, L, S] for a chain, or for
    a tree (`ancestors` [L, L], models/base.py) a `TreeMask` of path views."""
    mask = causal_cache_mask(positions, cache_len)
    if ancestors is None:
        return mask
    path = jnp.asarray(path_offsets(ancestors))  # [L, L]
    length = path.shape[0]
    slots = jnp.arange(cache_len, dtype=jnp.int32)[None, :]
    offset = slots - index[:, None]  # [B, S]
    in_block = (offset >= 0) & (offset < length)
    read = index[:, None, None] + jnp.swapaxes(path[:, jnp.clip(offset, 0, length - 1)], 0, 1)
    sources = jnp.where(in_block[:, None, :], read, slots[:, None, :])  # [B, L, S]
    return TreeMask(mask, sources.astype(jnp.int32))


def path_offsets(ancestors: np.ndarray) -> np.ndarray:
    """[L, L] int: row i holds token i's ancestors root first then i itself (its path, depth
    0 .. depth(i)), and beyond its depth the identity (slots its mask hides).

    Raises ValueError unless every path lists parents before children (trees are breadth-first)."""
    tree = np.asarray(ancestors, bool)
    length = tree.shape[0]
    depth = tree.sum(axis=1) - 1
    path = np.tile(np.arange(length), (length, 1))
    for i in range(length):
        on_path = np.nonzero(tree[i])[0]
        if not np.array_equal(depth[on_path], np.arange(on_path.size)):
            raise ValueError(f"tree token {i}'s ancestors are not in depth order: {on_path}")
        path[i, : on_path.size] = on_path
    return path


def path_views(buffer: jax.Array, sources: jax.Array) -> jax.Array:
    """buffer [B, K, S, D] -> each token's view [B, K, L, S, D] (sources [B, L, S]).

    A bfloat16 buffer is gathered as its uint16 bits, as `base.embed` does (XLA:CPU widens a
    bfloat16 gather's operand to float32)."""
    low = buffer.dtype in base.LOW_PRECISION
    bits = jax.lax.bitcast_convert_type(buffer, jnp.uint16) if low else buffer
    views = jax.vmap(lambda rows, src: rows[:, src])(bits, sources)
    return jax.lax.bitcast_convert_type(views, buffer.dtype) if low else views


def attend(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array | TreeMask,
    bias: jax.Array | None = None,
    scale: float = 1.0,
    drop_weights: Callable[[jax.Array], jax.Array] | None = None,
    logit_cap: float = 0.0,
) -> jax.Array:
    """Grouped-query dot-product attention with softmax in float32.

    Keys and values are heads-major so that both contractions are plain batched matmuls over
    (B, K): with [B, S, K, D] XLA:CPU transposes the whole cache on every decode step (15x slower
    at S = 1024 in our measurement).

    Args:
      query: [B, L, H, D].
      key, value: [B, K, S, D] with H a multiple of K (GQA; K == H is plain multi-head).
        Query head h uses kv head h // (H // K), as in Hugging Face's repeat_kv.
      mask: boolean, broadcastable to [B, H, L, S]; False positions are excluded. A `TreeMask`:
        each query token attends through its own path view of key and value.
      bias: optional additive bias broadcastable to [B, H, L, S] (T5 relative positions).
      scale: multiplier on query.key (1/sqrt(D) for LLaMA; 1 for T5, folded into the query kernel).
      drop_weights: training only (T5's attention dropout): maps the weights [B, H, L, S] to
        their dropped-out values; None (every decoding path) leaves them untouched.
      logit_cap: Gemma 2's soft-cap, scores -> cap * tanh(scores / cap) before the mask; 0: none.
    Returns:
      [B, L, H, D] in the query dtype.
    """
    if isinstance(mask, TreeMask):
        return _attend_along_paths(query, key, value, mask, bias, scale, logit_cap)
    batch, length, heads, head_dim = query.shape
    kv_heads, key_len = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    # [B, L, K, G, D] -> [B, K, G*L, D]
    q = query.reshape(batch, length, kv_heads, groups, head_dim)
    q = q.transpose(0, 2, 3, 1, 4).reshape(batch, kv_heads, groups * length, head_dim)
    # Both products take the cache's dtype and accumulate in float32 (a bfloat16 cache: the
    # matrix-unit route, and the only roundings are these explicit ones; docs/design.md §9).
    q = q.astype(key.dtype)
    scores = jnp.einsum("bkqd,bksd->bkqs", q, key, preferred_element_type=jnp.float32)
    scores = scores.reshape(batch, heads, length, key_len) * scale
    scores = logit_cap * jnp.tanh(scores / logit_cap) if logit_cap else scores
    if bias is not None:
        scores = scores + bias.astype(jnp.float32)
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(value.dtype)
    if drop_weights is not None:
        weights = drop_weights(weights)
    weights = weights.reshape(batch, kv_heads, groups * length, key_len)
    out = jnp.einsum("bkqs,bksd->bkqd", weights, value, preferred_element_type=jnp.float32)
    out = out.reshape(batch, kv_heads, groups, length, head_dim).transpose(0, 3, 1, 2, 4)
    return out.reshape(batch, length, heads, head_dim).astype(query.dtype)


def _attend_along_paths(query, key, value, tree: TreeMask, bias, scale, logit_cap) -> jax.Array:
    """`attend` for a tree: each token [B, L] becomes a row of its own, one query against its
    path view, so every product has a plain step's shapes (batching the tokens as another
    product dimension instead changed XLA:CPU's summation order in the last bit)."""
    batch, length, heads, head_dim = query.shape
    rows = batch * length

    def per_token(buffer):  # [B, K, S, D] -> [B*L, K, S, D]
        views = path_views(buffer, tree.sources)  # [B, K, L, S, D]
        return views.swapaxes(1, 2).reshape(rows, *buffer.shape[1:])

    mask = tree.mask.reshape(rows, 1, 1, -1)
    if bias is not None:  # [B, H, L, S] (or broadcastable) -> [B*L, H, 1, S]
        bias = jnp.broadcast_to(bias, (batch, heads, length, mask.shape[-1]))
        bias = bias.swapaxes(1, 2).reshape(rows, heads, 1, -1)
    out = attend(
        query.reshape(rows, 1, heads, head_dim),
        per_token(key),
        per_token(value),
        mask,
        bias,
        scale,
        logit_cap=logit_cap,
    )
    return out.reshape(batch, length, heads, head_dim)
