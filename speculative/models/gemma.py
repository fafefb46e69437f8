"""Gemma 2 and Gemma 3 (text) decoder-only LMs: the differences from models.decoder's layout.

Same projections (output-major kernels, T5X names, logical axes), RoPE (rotate-half), GQA and KV
cache plumbing as `models.decoder`; Gemma differs in:
  - embeddings scaled by sqrt(emb_dim), rounded to the table's dtype first (as transformers does);
  - RMSNorm scales by (1 + w), w initialised to 0;
  - a norm before AND after attention and after the MLP (four per layer);
  - GeGLU: gelu (tanh approximation) of the gate times the up projection;
  - queries scaled by query_pre_attn_scalar ** -0.5 instead of head_dim ** -0.5;
  - attention logits soft-capped (Gemma 2): cap * tanh(scores / cap), before the mask;
  - final logits soft-capped (Gemma 2; optional in Gemma 3);
  - Gemma 3: RMSNorm of each query and key head (q/k norms) before RoPE, and two RoPE bases:
    local (sliding-window layers) and global (full-attention layers, with any scaling);
  - alternating sliding-window (local) and full (global) layers: a local layer's query at position
    t sees keys at positions t - W < p <= t. A key's position is its slot's, in a verify block and
    in a token tree's path views too (models/attention.py), so both see exactly the keys a plain
    step at that position sees.

Parameter tree (beyond models.decoder's, which it shares except logits_dense's shortlist):
    layers_{i}/post_self_attention_layer_norm/scale  [E]
    layers_{i}/post_mlp_layer_norm/scale             [E]
    layers_{i}/self_attention/{query,key}_norm/scale [D]   (qk_norm, Gemma 3)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from speculative.models import attention, base
from speculative.models.decoder import (
    DecoderOnly,
    DecoderOnlyConfig,
    LogitsDense,
    Projection,
    apply_rope,
    check_attention_config,
    token_embedder,
)


@dataclasses.dataclass(frozen=True)
class GemmaConfig(DecoderOnlyConfig):
    # rope_theta / rope_scaling: the full-attention (global) layers' RoPE; sliding-window (local)
    # layers use local_rope_*.
    local_rope_theta: float = 10000.0
    local_rope_scaling: tuple[tuple[str, Any], ...] = ()
    norm_eps: float = 1e-6
    query_pre_attn_scalar: float = 256.0
    attn_softcap: float = 0.0  # 0: none (Gemma 3)
    final_softcap: float = 0.0  # 0: none
    qk_norm: bool = False  # Gemma 3
    sliding_window: int = 0  # W of the local layers (0: none)
    # Per layer, True for a local (sliding-window) layer; () = every layer global.
    local_layers: tuple[bool, ...] = ()
    tie_word_embeddings: bool = True
    max_seq_len: int = 8192
    dtype: str = "float32"  # as DecoderConfig.dtype: weights, matmul inputs and the KV cache
    embedding_init_std: float = 1.0

    def __post_init__(self):
        check_attention_config(self, (self.rope_scaling, self.local_rope_scaling))
        if self.local_layers and len(self.local_layers) != self.num_layers:
            raise ValueError(
                f"GemmaConfig.local_layers has {len(self.local_layers)} entries, not "
                f"num_layers={self.num_layers}"
            )
        if any(self.local_layers) and self.sliding_window < 1:
            raise ValueError("GemmaConfig.sliding_window must be >= 1 when a layer is local")

    def is_local(self, layer: int) -> bool:
        return bool(self.local_layers) and self.local_layers[layer]


class GemmaNorm(nn.Module):
    """RMSNorm scaling by (1 + w), w initialised to 0; x [..., N] -> float32 [..., N]."""

    eps: float
    axis: str = "embed"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param(
            "scale",
            nn.with_logical_partitioning(nn.initializers.zeros, (self.axis,)),
            (x.shape[-1],),
        )
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return normed * (1.0 + scale.astype(jnp.float32))


def softcap(x: jax.Array, cap: float) -> jax.Array:
    """cap * tanh(x / cap) (cap 0: x unchanged)."""
    return cap * jnp.tanh(x / cap) if cap else x


class GemmaAttention(nn.Module):
    """x [B, L, E] float32 at positions [B, L] -> (out [B, L, E], the layer's updated cache);
    `local` picks the local RoPE (the caller passes the windowed mask)."""

    config: GemmaConfig
    local: bool

    @nn.compact
    def __call__(self, x, positions, layer_cache, index, mask):
        cfg = self.config
        e, h, k, d = cfg.emb_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        query = Projection((h, d, e), ("heads", "kv", "embed"), name="query")(x)
        key = Projection((k, d, e), ("kv_heads", "kv", "embed"), name="key")(x)
        value = Projection((k, d, e), ("kv_heads", "kv", "embed"), name="value")(x)
        if cfg.qk_norm:  # per head, over head_dim (Gemma 3)
            query = GemmaNorm(cfg.norm_eps, "kv", name="query_norm")(query).astype(x.dtype)
            key = GemmaNorm(cfg.norm_eps, "kv", name="key_norm")(key).astype(x.dtype)
        theta, scaling = (
            (cfg.local_rope_theta, cfg.local_rope_scaling)
            if self.local
            else (cfg.rope_theta, cfg.rope_scaling)
        )
        query = apply_rope(query, positions, theta, scaling)
        key = apply_rope(key, positions, theta, scaling)
        keys = base.write_kv(layer_cache["key"], base.heads_major(key), index)
        values = base.write_kv(layer_cache["value"], base.heads_major(value), index)
        scale = cfg.query_pre_attn_scalar**-0.5
        attended = attention.attend(
            query, keys, values, mask, scale=scale, logit_cap=cfg.attn_softcap
        )
        out = Projection((e, h, d), ("embed", "heads", "kv"), in_dims=2, name="out")(attended)
        return out, {"key": keys, "value": values}


class GemmaLayer(nn.Module):
    """Residual x [B, L, E] float32 -> (x, cache): a norm before and after attention and the MLP."""

    config: GemmaConfig
    local: bool

    @nn.compact
    def __call__(self, x, positions, layer_cache, index, mask):
        cfg = self.config
        normed = GemmaNorm(cfg.norm_eps, name="pre_self_attention_layer_norm")(x)
        attn, layer_cache = GemmaAttention(cfg, self.local, name="self_attention")(
            normed, positions, layer_cache, index, mask
        )
        x = x + GemmaNorm(cfg.norm_eps, name="post_self_attention_layer_norm")(attn)
        normed = GemmaNorm(cfg.norm_eps, name="pre_mlp_layer_norm")(x)
        mlp = GeGLU(cfg.emb_dim, cfg.mlp_dim, name="mlp")(normed)
        return x + GemmaNorm(cfg.norm_eps, name="post_mlp_layer_norm")(mlp), layer_cache


class GeGLU(nn.Module):
    """x [..., E] -> wo(gelu_tanh(wi_0 x) * wi_1 x) [..., E]."""

    emb_dim: int
    mlp_dim: int

    @nn.compact
    def __call__(self, x):
        e, m = self.emb_dim, self.mlp_dim
        gate = Projection((m, e), ("mlp", "embed"), name="wi_0")(x)
        up = Projection((m, e), ("mlp", "embed"), name="wi_1")(x)
        return Projection((e, m), ("embed", "mlp"), name="wo")(nn.gelu(gate, approximate=True) * up)


def window_mask(
    mask: jax.Array | attention.TreeMask, positions: jax.Array, window: int
) -> jax.Array | attention.TreeMask:
    """A cache mask ([B, 1, L, S] or a tree's `attention.TreeMask`) cut to the keys less than
    `window` positions back; positions [B, L] (a tree's: index + depth). A key's position is its
    slot's, a tree token's path view too (models/attention.py)."""
    if isinstance(mask, attention.TreeMask):
        return mask._replace(mask=window_mask(mask.mask, positions, window))
    keys = jnp.arange(mask.shape[-1], dtype=jnp.int32)
    return mask & (keys[None, None, None, :] > positions[:, None, :, None] - window)


class GemmaStack(nn.Module):
    """tokens [B, L] at absolute positions [B, L] -> (logits [B, L, V] float32, updated cache,
    features [B, L, E] float32), as models.decoder.DecoderStack."""

    config: GemmaConfig

    @nn.compact
    def __call__(self, tokens, positions, cache, index, ancestors=None):
        cfg = self.config
        embedder = token_embedder(cfg)
        table = embedder.embedding
        rows = base.embed(table, tokens)
        # The scale rounded to the table's dtype, the product in it (transformers' order).
        x = (rows * jnp.asarray(cfg.emb_dim**0.5, rows.dtype)).astype(jnp.float32)
        full = attention.cache_mask(positions, index, cache["layers_0"]["key"].shape[2], ancestors)
        local = window_mask(full, positions, cfg.sliding_window) if any(cfg.local_layers) else full
        new_cache = {}
        for i in range(cfg.num_layers):
            name, is_local = f"layers_{i}", cfg.is_local(i)
            x, new_cache[name] = GemmaLayer(cfg, is_local, name=name)(
                x, positions, cache[name], index, local if is_local else full
            )
        x = GemmaNorm(cfg.norm_eps, name="decoder_norm")(x)
        if cfg.tie_word_embeddings:
            logits = base.dense(x, table)
        else:
            logits = LogitsDense(cfg.vocab_size, name="logits_dense")(x)
        return softcap(logits.astype(jnp.float32), cfg.final_softcap), new_cache, x


class GemmaLM(DecoderOnly):
    """Gemma 2 / Gemma 3 text LM implementing `base.LanguageModel` (hashable by config)."""

    def make_module(self, config: GemmaConfig) -> GemmaStack:
        return GemmaStack(config)
