"""T5's configuration and building blocks (dense, RMS norm, embedding, relative position bias,
attention, MLP), with T5X's parameter names and logical axes; `models/t5.py` assembles them into the
encoder, the decoder and the cached model."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from speculative.models import attention, base

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": nn.relu,
    "gelu": nn.gelu,  # tanh approximation, as T5X's getattr(nn, 'gelu') and HF's gelu_new
    "silu": nn.silu,
    "linear": lambda x: x,
}


@dataclasses.dataclass(frozen=True)
class T5Config:
    """T5X's `network.T5Config` fields plus the relative-position constants.

    dropout_rate: T5X's name; applied only by a training forward pass (`T5.forward` with a
    dropout rng), never when decoding. 0.0 by default (T5X's default is 0.1; its t5.1.1
    pretraining configs use 0.0, fine-tuning 0.1). Left out of the repr, so a config's repr
    (job fingerprints, caches keyed by it) is the one it had before the field existed.
    """

    vocab_size: int
    emb_dim: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    head_dim: int = 64
    mlp_dim: int = 2048
    mlp_activations: Sequence[str] = ("relu",)
    logits_via_embedding: bool = False
    dtype: str = "float32"  # activations, caches; logits and softmax are always float32
    num_buckets: int = 32
    max_distance: int = 128
    layer_norm_eps: float = 1e-6
    dropout_rate: float = dataclasses.field(default=0.0, repr=False)

    def __post_init__(self):
        # Gin and JSON give lists; a tuple keeps the config hashable (it is a static jit argument).
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        base.require_positive(
            self,
            (
                "vocab_size",
                "emb_dim",
                "num_heads",
                "num_encoder_layers",
                "num_decoder_layers",
                "head_dim",
                "mlp_dim",
                "num_buckets",
                "max_distance",
            ),
        )
        if not self.mlp_activations:
            raise ValueError("T5Config.mlp_activations must name at least one activation")
        for act in self.mlp_activations:
            if act not in ACTIVATIONS:
                raise ValueError(
                    f"T5Config.mlp_activations: unknown activation {act!r}; "
                    f"known: {sorted(ACTIVATIONS)}"
                )
        jnp.dtype(self.dtype)  # raises TypeError on an unknown dtype name
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"T5Config.dropout_rate must be in [0, 1), got {self.dropout_rate!r}")


# ------------------------------------------------------------------------------------------------
# Layers.


def _scaled(init: Callable, factor: float) -> Callable:
    return lambda *args: init(*args) * factor


class DenseGeneral(nn.Module):
    """x [..., *in_shape] -> [..., *out_shape], kernel stored 2-D [prod(in), prod(out)] like T5X."""

    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    axes: tuple[str, str]
    kernel_init: Callable = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        stored = (math.prod(self.in_shape), math.prod(self.out_shape))
        init = nn.with_logical_partitioning(self.kernel_init, self.axes)
        kernel = self.param("kernel", init, stored, jnp.float32)
        kernel = kernel.astype(self.dtype).reshape(self.in_shape + self.out_shape)
        return jnp.tensordot(x.astype(self.dtype), kernel, axes=len(self.in_shape))


class LayerNorm(nn.Module):
    """T5 layer norm: x / rms(x) * scale, statistics in float32."""

    eps: float
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.with_logical_partitioning(nn.initializers.ones, ("embed",))
        scale = self.param("scale", init, (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return y.astype(self.dtype) * scale.astype(self.dtype)


class Embed(nn.Module):
    """Shared token embedding [V, E]; `attend` is the tied output projection (float32)."""

    vocab_size: int
    emb_dim: int
    dtype: Any

    def setup(self):
        init = nn.with_logical_partitioning(nn.initializers.normal(stddev=1.0), ("vocab", "embed"))
        self.embedding = self.param("embedding", init, (self.vocab_size, self.emb_dim), jnp.float32)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return jnp.take(self.embedding, tokens, axis=0).astype(self.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        return jnp.einsum("...e,ve->...v", x.astype(jnp.float32), self.embedding)


def relative_position_bucket(
    relative_position: np.ndarray, bidirectional: bool, num_buckets: int, max_distance: int
) -> np.ndarray:
    """T5's bucket of memory_position - query_position (numpy int32, same shape).

    Exact distances below max_exact get their own bucket, larger ones share log-spaced buckets up to
    max_distance. Computed in numpy float32 with T5X's epsilon so bucket edges match T5X bit for bit.
    """
    n = -np.asarray(relative_position, np.int64)
    bucket = np.zeros(n.shape, np.int32)
    if bidirectional:
        num_buckets //= 2
        bucket += (n < 0).astype(np.int32) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = num_buckets // 2
    ratio = n.astype(np.float32) / np.float32(max_exact) + np.finfo(np.float32).eps
    scale = np.float32(num_buckets - max_exact) / np.log(np.float32(max_distance / max_exact))
    large = max_exact + (np.log(ratio) * scale).astype(np.int32)
    large = np.minimum(large, num_buckets - 1)
    return bucket + np.where(n < max_exact, n, large).astype(np.int32)


class RelativePositionBias(nn.Module):
    """Per-head additive attention bias from bucketed relative positions."""

    config: T5Config
    bidirectional: bool

    @nn.compact
    def __call__(self, query_positions: jax.Array, key_len: int) -> jax.Array:
        """query_positions [B, L] (absolute) against key slots 0..key_len-1 -> bias [B, H, L, S]
        (a key's position is its slot's, a token tree's too: models/attention.py)."""
        cfg = self.config
        init = nn.with_logical_partitioning(
            nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"), ("heads", "relpos_buckets")
        )
        table = self.param("rel_embedding", init, (cfg.num_heads, cfg.num_buckets), jnp.float32)
        # Every relative position -(S-1)..S-1 bucketed once in numpy (static), then gathered by the
        # traced per-row positions.
        offsets = np.arange(-(key_len - 1), key_len)
        buckets = jnp.asarray(
            relative_position_bucket(offsets, self.bidirectional, cfg.num_buckets, cfg.max_distance)
        )
        keys = jnp.arange(key_len)[None, :]
        relative = keys[:, None, :] - query_positions[:, :, None]  # [B, L, S]
        bucket = buckets[relative + key_len - 1]
        bias = jnp.take(table, bucket, axis=1)  # [H, B, L, S]
        return jnp.moveaxis(bias, 0, 1).astype(jnp.dtype(cfg.dtype))


class Attention(nn.Module):
    """Multi-head attention with T5X's projections; keys/values are projected separately so that
    callers can cache them (decoder self-attention) or compute them once (cross-attention)."""

    config: T5Config

    def setup(self):
        cfg = self.config
        e, h, d = cfg.emb_dim, cfg.num_heads, cfg.head_dim
        dtype = jnp.dtype(cfg.dtype)
        init = nn.initializers.variance_scaling(1.0, "fan_in", "normal")
        qkv_axes = ("embed", "joined_kv")
        # 1/sqrt(head_dim) lives in the query initialiser, never in the forward pass (T5X, Mesh TF).
        self.query = DenseGeneral((e,), (h, d), qkv_axes, _scaled(init, d**-0.5), dtype)
        self.key = DenseGeneral((e,), (h, d), qkv_axes, init, dtype)
        self.value = DenseGeneral((e,), (h, d), qkv_axes, init, dtype)
        self.out = DenseGeneral((h, d), (e,), ("joined_kv", "embed"), init, dtype)

    def project_kv(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """x [B, S, E] -> keys, values [B, H, S, D] (heads-major, the layout attention.attend reads)."""
        return base.heads_major(self.key(x)), base.heads_major(self.value(x))

    def __call__(self, x, keys, values, mask, bias=None, deterministic: bool = True):
        """x [B, L, E] attends to keys/values [B, H, S, D]; mask [B|1, 1, L|1, S] -> [B, L, E].

        deterministic False (training): T5X's dropout on the attention weights [B, H, L, S], one
        mask shared by every query position."""
        rate = self.config.dropout_rate
        drop = None if deterministic or rate == 0.0 else self._drop_weights
        attended = attention.attend(self.query(x), keys, values, mask, bias, 1.0, drop)
        return self.out(attended)

    def _drop_weights(self, weights: jax.Array) -> jax.Array:
        keep_prob = 1.0 - self.config.dropout_rate
        shape = (*weights.shape[:-2], 1, weights.shape[-1])
        keep = jax.random.bernoulli(self.make_rng("dropout"), keep_prob, shape)
        return weights * (keep.astype(weights.dtype) / jnp.asarray(keep_prob, weights.dtype))


class MlpBlock(nn.Module):
    config: T5Config

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        """x [B, L, E] -> [B, L, E]; training (deterministic False) drops hidden units after the
        activations, one mask per row shared by its positions (T5X)."""
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        acts = cfg.mlp_activations
        hidden = None
        for i, act in enumerate(acts):
            name = "wi" if len(acts) == 1 else f"wi_{i}"
            h = ACTIVATIONS[act](
                DenseGeneral(
                    (cfg.emb_dim,), (cfg.mlp_dim,), ("embed", "mlp"), dtype=dtype, name=name
                )(x)
            )
            hidden = h if hidden is None else hidden * h
        hidden = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))(hidden, deterministic)
        return DenseGeneral(
            (cfg.mlp_dim,), (cfg.emb_dim,), ("mlp", "embed"), dtype=dtype, name="wo"
        )(hidden)
