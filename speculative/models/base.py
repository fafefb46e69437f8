"""The model interface every family implements, and the KV-cache helpers they share.

A model is a small Python object (hashable, so it can be a static argument of `jax.jit`) that wraps a
flax.linen module. Decoding only ever calls the four members of `LanguageModel`:

    params = model.init_params(rng)
    state = model.init_state(params, batch, max_len)    # allocate cache (and encode, for enc-dec)
    logits, state = model.extend(params, state, tokens)  # tokens [B, L] -> logits [B, L, V] float32

`extend(..., ancestors=A)` scores a token tree in one call (docs/design.md §1, token trees): A is
a static [L, L] bool matrix, A[i, j] when token j is token i or one of its ancestors (token 0 is
the root). Token i sits at position index + depth(i) and sees the cache before `index` and its
ancestors only; `keep_path` then moves the accepted path's keys and values into place.

`DecodeState.index[b]` is the number of valid cache positions of row b. `extend` writes its L new keys
and values at index[b] .. index[b] + L - 1 of each row and attends causally by absolute position, so a
rollback after a rejected draft is just `state.replace(index=...)`: stale slots beyond the index are
hidden by the causal mask and overwritten by the next write (docs/design.md §2).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import flax
import jax
import jax.numpy as jnp
import numpy as np

from speculative.models import int8

Params = Any
Batch = dict[str, jax.Array]
# `extend`'s tree: a static [L, L] bool ancestor matrix (module docstring); None, a causal block.
Ancestors = np.ndarray | None


@flax.struct.dataclass
class DecodeState:
    """Explicit decode state of one model.

    Attributes:
      cache: per-layer dict {"key": [B, K, S, D], "value": [B, K, S, D]} (heads-major, see `attend`).
      index: [B] int32, number of valid positions in each row's cache.
      extras: model-specific constants computed once in `init_state` (e.g. T5's encoder outputs and
        cross-attention keys/values); None for decoder-only models. Every leaf is per row (leading
        axis B); 4-D leaves are heads-major keys/values [B, H, S, D] (`decode_state_axes` relies
        on both).
    """

    cache: dict[str, dict[str, jax.Array]]
    index: jax.Array
    extras: Any = None

    @property
    def max_len(self) -> int:
        """Static cache length S."""
        first = next(iter(self.cache.values()))
        return first["key"].shape[2]


def decode_state_axes(state: DecodeState, cache_heads: str = "kv_heads") -> DecodeState:
    """Logical axis names of every array of `state` (a PartitionSpec per leaf), for SPMD rules.

    cache [B, K, S, D] -> ("batch", cache_heads, "length", "kv"); index [B] -> ("batch",);
    extras: 4-D leaves [B, H, S, D] -> ("batch", "heads", "length", "kv"), others ("batch", None...).
    Works on real arrays and on `jax.ShapeDtypeStruct`s (only ranks are read).
    """

    def extra(leaf):
        if leaf.ndim == 4:
            return jax.sharding.PartitionSpec("batch", "heads", "length", "kv")
        return jax.sharding.PartitionSpec("batch", *(None,) * (leaf.ndim - 1))

    cache_spec = jax.sharding.PartitionSpec("batch", cache_heads, "length", "kv")
    return DecodeState(
        cache=jax.tree_util.tree_map(lambda _: cache_spec, state.cache),
        index=jax.sharding.PartitionSpec("batch"),
        extras=jax.tree_util.tree_map(extra, state.extras),
    )


@runtime_checkable
class LanguageModel(Protocol):
    """What decoding needs from a model family (decoder-only or encoder-decoder)."""

    config: Any
    is_encoder_decoder: bool
    # Token the decoder starts from when it has no prompt (T5: 0); None for decoder-only models.
    decoder_start_id: int | None

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_length(self) -> int | None:
        """Longest decoder sequence (prompt + generated tokens) the model supports; None: no limit."""
        ...

    def cache_length(self, prompt_width: int, max_decode_len: int, block: int) -> int:
        """Static decoder cache length for prompts padded to prompt_width, max_decode_len new
        tokens and decode blocks of `block` tokens (1 plain, gamma + 1 speculative)."""
        ...

    def init_params(self, rng: jax.Array) -> Params: ...

    def init_state(self, params: Params, batch: Batch, max_len: int) -> DecodeState: ...

    def extend(
        self, params: Params, state: DecodeState, tokens: jax.Array, ancestors: Ancestors = None
    ) -> tuple[jax.Array, DecodeState]: ...


class Configured:
    """A frozen config plus its flax module, hashable by config so that the object can be a
    static `jax.jit` argument. Subclasses define `make_module`."""

    def __init__(self, config: Any):
        self.config = config
        self.module = self.make_module(config)

    def make_module(self, config: Any) -> Any:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.config == self.config

    def __hash__(self) -> int:
        return hash((type(self), self.config))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"


class ConfiguredModel(Configured):
    """Shared plumbing of model families (`Configured`, plus the LanguageModel members every
    family shares)."""

    is_encoder_decoder: bool = False
    decoder_start_id: int | None = None

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_length(self) -> int | None:
        return getattr(self.config, "max_seq_len", None)

    def cache_length(self, prompt_width: int, max_decode_len: int, block: int) -> int:
        # Prompt (decoder-only) + generated tokens + a block of slack (the last round may write a
        # whole block past the limit), at least CACHE_SLACK: design §2 and §9.
        prompt = 0 if self.is_encoder_decoder else prompt_width
        return prompt + max_decode_len + max(block, CACHE_SLACK)

    def extend(
        self, params: Params, state: DecodeState, tokens: jax.Array, ancestors: Ancestors = None
    ) -> tuple[jax.Array, DecodeState]:
        """Appends tokens [B, L] at each row's index; returns logits [B, L, V] float32.

        ancestors: None for a causal block; a static [L, L] bool tree (module docstring) to score
        a token tree, each token at index + its depth.
        """
        positions = block_positions(state, tokens.shape[1], ancestors)
        logits, cache = self.apply_decoder(params, state, tokens, positions, ancestors)
        return logits, state.replace(cache=cache, index=state.index + tokens.shape[1])

    def extend_features(
        self, params: Params, state: DecodeState, tokens: jax.Array, ancestors: Ancestors = None
    ) -> tuple[jax.Array, jax.Array, DecodeState]:
        """`extend`, also returning the hidden state the output head reads: (logits [B, L, V],
        features [B, L, E] float32, state). For drafts that read the target's features (a
        feature-level head, docs/design.md §1); families without it raise NotImplementedError."""
        positions = block_positions(state, tokens.shape[1], ancestors)
        logits, cache, features = self.apply_decoder_features(
            params, state, tokens, positions, ancestors
        )
        return logits, features, state.replace(cache=cache, index=state.index + tokens.shape[1])

    def apply_decoder_features(self, params, state, tokens, positions, ancestors=None):
        """`apply_decoder` plus the final hidden states [B, L, E]: (logits, cache, features)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its hidden states")

    def apply_decoder(
        self,
        params: Params,
        state: DecodeState,
        tokens: jax.Array,
        positions: jax.Array,
        ancestors: Ancestors = None,
    ) -> tuple[jax.Array, Any]:
        """One decoder pass: tokens and absolute positions [B, L] -> (logits [B, L, V], cache);
        attention through `cache_mask(positions, state.index, S, ancestors)`."""
        raise NotImplementedError


def block_positions(state: DecodeState, length: int, ancestors: Ancestors = None) -> jax.Array:
    """[B, L] positions of a block of `length` entries appended at each row's index (a tree's at
    index + depth); ValueError when the block is longer than the cache."""
    if length > state.max_len:
        raise ValueError(f"cannot extend by {length} tokens: cache length is {state.max_len}")
    return query_positions(state.index, length, ancestors)


# Kernel dtypes that take the matrix-unit route in `dense` (docs/design.md §9).
LOW_PRECISION = (jnp.dtype(jnp.bfloat16),)
# Above this many rows (a prefill, a wide verify block) a bfloat16 product is faster with the rows
# as the left operand: no [N, M] -> [M, N] transpose for the elementwise work after it to read
# (docs/design.md §9; docs/benchmarks.md, "Prefill orientation").
WIDE_ROWS = 32


CACHE_SLACK = 32  # the least cache slack: plain and speculative round alike (docs/design.md §9)


def dense(x: jax.Array, kernel: jax.Array, scale: jax.Array | None = None) -> jax.Array:
    """x [..., K] times an output-major kernel [N, K] -> [..., N], streaming the kernel once.

    int8 kernel with its per-output-channel scale [N] (a draft's cheaper route; float32 result):
    `models.int8.dense`, in the orientation chosen below for bfloat16.

    float32 kernel: one row (a batch-1 decode step) is a plain GEMV. For a few rows (a verify
    block, a small batch) XLA:CPU's dot is 2-3x faster with the weight as the left operand, W [N,
    K] . x^T [K, M] -> [N, M], and with M a multiple of 4, than in the x . W^T orientation
    (docs/benchmarks.md, "Verify call"). XLA folds a transpose of the result back into the slow
    orientation, so an optimisation barrier keeps the dot as written; the [N, M] -> [M, N]
    transpose that follows touches activations only.

    bfloat16 kernel: the matrix-unit route (docs/design.md §9). The rows are cast to bfloat16 and
    the product accumulates and returns float32 (`preferred_element_type`): XLA:CPU hands such a
    dot of two or more rows to its fused library kernel (AMX / AVX512-BF16), 2-3x faster than
    float32 rows, while one row, or a bfloat16 output, falls back to converting the whole kernel
    to float32 on every call (8-10x slower). So one row is padded to two (the second is waste the
    matrix unit does for free), and the weight stays the left operand: that orientation is
    the faster one and gives every row bit-identical sums whatever the row count (2 to 16
    measured), which keeps plain steps and verify blocks rounding alike. Above `WIDE_ROWS` rows
    the rows become the left operand: the library computes the same sums bit for bit from 4 rows
    up (tests/test_matrix_units.py), and the transposed product's elementwise consumers (SiLU,
    the residual add) had cost as much as the products themselves in a prefill.
    Returns float32 on that route, else the promoted dtype of x and kernel.
    """
    lead, k = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, k)
    m = rows.shape[0]
    wide = m > WIDE_ROWS
    if scale is not None:
        return int8.dense(rows, kernel, scale, rows_left=wide).reshape(*lead, kernel.shape[0])
    low = kernel.dtype in LOW_PRECISION
    if m == 1 and not low:
        y = jnp.einsum("mk,nk->mn", rows, kernel)
    elif low and wide:
        rows = rows.astype(kernel.dtype)
        y = jnp.einsum("mk,nk->mn", rows, kernel, preferred_element_type=jnp.float32)
    else:
        padded = max(2, -(-m // 2) * 2) if low else -(-m // 4) * 4
        rows = jnp.pad(rows, ((0, padded - m), (0, 0)))
        if low:
            rows = rows.astype(kernel.dtype)
        product = jnp.einsum(
            "nk,mk->nm", kernel, rows, preferred_element_type=jnp.float32 if low else None
        )
        y = jax.lax.optimization_barrier(product).T[:m]
    return y.reshape(*lead, kernel.shape[0])


def embed(table: jax.Array, ids: jax.Array) -> jax.Array:
    """Rows of an embedding table [V, E] for integer ids [...] -> [..., E], in the table's dtype.

    A bfloat16 table is gathered as its uint16 bits: XLA:CPU widens a bfloat16 gather's whole
    operand to float32, and inside a decode loop it hoists that conversion out of the loop, so
    each decode call converted the full table (0.9 GB of float32 at Qwen2.5-1.5B) instead of
    reading one row per token (docs/design.md §9).
    """
    if table.dtype in LOW_PRECISION:
        bits = jnp.take(jax.lax.bitcast_convert_type(table, jnp.uint16), ids, axis=0)
        return jax.lax.bitcast_convert_type(bits, table.dtype)
    return jnp.take(table, ids, axis=0)


def write_rows(buffer: jax.Array, update: jax.Array, index: jax.Array) -> jax.Array:
    """Writes update[b] into buffer[b] starting at index[b] along axis 1.

    Args:
      buffer: [B, S, ...].
      update: [B, L, ...] with the same trailing dims.
      index: [B] int32 start offsets. Callers guarantee index[b] + L <= S (lax.dynamic_update_slice
        would otherwise clamp the start and write in the wrong place).
    Returns:
      [B, S, ...] buffer with the rows updated.
    """

    def one_row(buf, upd, start):
        starts = (start,) + (0,) * (buf.ndim - 1)
        return jax.lax.dynamic_update_slice(buf, upd.astype(buf.dtype), starts)

    return jax.vmap(one_row)(buffer, update, index)


def query_positions(index: jax.Array, length: int, ancestors: Ancestors = None) -> jax.Array:
    """Absolute positions [B, L] of L tokens appended at per-row offsets index [B]: consecutive,
    or index + depth for a tree (depth = number of ancestors, the token itself excluded)."""
    if ancestors is None:
        offsets = np.arange(length)
    else:
        offsets = np.asarray(ancestors, bool).sum(axis=1) - 1
    return index[:, None] + jnp.asarray(offsets, jnp.int32)[None, :]


def keep_path(state: DecodeState, start: jax.Array, path: jax.Array) -> DecodeState:
    """Moves the cache entries of an accepted tree path into consecutive slots.

    Args:
      state: a decode state whose cache holds a scored tree at slots start .. start + L - 1.
      start: [B] the tree root's slot.
      path: [B, P] offsets (within the tree) of the tokens to keep, root first (path[:, 0] = 0);
        offsets past a row's accepted length may be anything in 0..L-1 (their slots stay stale).
    Returns:
      state whose slots start + k hold what start + path[:, k] held (the index is unchanged).
    """
    slots = start[:, None] + path  # [B, P]

    def move(buffer: jax.Array) -> jax.Array:  # [B, K, S, D]
        kept = jnp.take_along_axis(buffer, slots[:, None, :, None], axis=2)
        return write_kv(buffer, kept, start)

    return state.replace(cache=jax.tree_util.tree_map(move, state.cache))


def write_kv(cache: jax.Array, new: jax.Array, index: jax.Array) -> jax.Array:
    """Writes new keys or values into a heads-major cache at per-row offsets.

    Args:
      cache: [B, K, S, D] (K = kv heads).
      new: [B, K, L, D] (see `heads_major`).
      index: [B] start positions; callers guarantee index[b] + L <= S.
    Returns:
      [B, K, S, D].
    """

    def one_row(buf, upd, start):
        return jax.lax.dynamic_update_slice(buf, upd.astype(buf.dtype), (0, start, 0))

    return jax.vmap(one_row)(cache, new, index)


def heads_major(x: jax.Array) -> jax.Array:
    """[B, S, K, D] -> [B, K, S, D], the layout `attend` reads keys and values in."""
    return jnp.swapaxes(x, 1, 2)


def init_kv_cache(
    num_layers: int, batch: int, max_len: int, kv_heads: int, head_dim: int, dtype: Any
) -> dict[str, dict[str, jax.Array]]:
    """Zeroed cache {"layers_i": {"key", "value": [B, K, S, D]}} for num_layers layers."""
    shape = (batch, kv_heads, max_len, head_dim)
    return {
        f"layers_{i}": {"key": jnp.zeros(shape, dtype), "value": jnp.zeros(shape, dtype)}
        for i in range(num_layers)
    }


def require_positive(config: Any, names: tuple[str, ...]) -> None:
    """Raises ValueError unless every named field of the config dataclass is >= 1."""
    for name in names:
        value = getattr(config, name)
        if value < 1:
            raise ValueError(f"{type(config).__name__}.{name} must be >= 1, got {value}")
