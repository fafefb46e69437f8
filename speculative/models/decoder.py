"""Decoder-only transformer LM with the LLaMA / Qwen2 / SmolLM layout.

Pre-norm RMSNorm blocks, rotary position embeddings (rotate-half convention, as in the Hugging Face
checkpoints), grouped-query attention, SwiGLU MLP, optional QKV bias (Qwen2), tied or untied output
embedding. Parameter names follow T5X's decoder naming; every parameter carries logical axis names
(`vocab`, `embed`, `heads`, `kv_heads`, `kv`, `mlp`) for SPMD partitioning rules.

Parameter tree (E = emb_dim, H = num_heads, K = num_kv_heads, D = head_dim, M = mlp_dim, V = vocab):
    token_embedder/embedding                        [V, E]
    layers_{i}/pre_self_attention_layer_norm/scale  [E]
    layers_{i}/self_attention/query/kernel          [H, D, E]   (+ bias [H, D] if qkv_bias)
    layers_{i}/self_attention/{key,value}/kernel    [K, D, E]   (+ bias [K, D] if qkv_bias)
    layers_{i}/self_attention/out/kernel            [E, H, D]
    layers_{i}/pre_mlp_layer_norm/scale             [E]
    layers_{i}/mlp/{wi_0 (gate), wi_1 (up)}/kernel  [M, E]
    layers_{i}/mlp/wo/kernel                        [E, M]
    decoder_norm/scale                              [E]
    logits_dense/kernel                             [V, E]      (absent when tie_word_embeddings)
    logits_dense/{kernel [S, E], token_ids [S]}                 (a shortlist head, head_tokens = S)

Kernels are stored output-major, [out..., in...] (the layout of PyTorch's Linear and of GGUF), the
transpose of T5X's [in..., out...]: every projection contracts the kernel's LAST axes. XLA:CPU streams
an output-major weight at GEMV speed for a few rows (a speculative verify block), where an input-major
one costs 2-3x more per call beyond one row (docs/benchmarks.md). The names stay T5X's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from speculative.models import attention, base, int8, rope
from speculative.models.base import DecodeState


@dataclasses.dataclass(frozen=True)
class DecoderOnlyConfig:
    """The fields every decoder-only family's config starts with, in this order: configs are built
    positionally too (`DecoderConfig(vocab, emb, layers, heads, kv_heads, head_dim, mlp)`)."""

    vocab_size: int
    emb_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    rope_theta: float = 10000.0
    # () plain RoPE, else sorted (key, value) pairs of a scaled variant (models.rope: linear,
    # llama3, yarn), as a Hugging Face config names it.
    rope_scaling: tuple[tuple[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class DecoderConfig(DecoderOnlyConfig):
    norm_eps: float = 1e-6
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    max_seq_len: int = 4096  # model context: prompt + generated tokens must fit
    # Weights' dtype as loaded (ModelSpec.dtype), matmul inputs and the KV cache. The residual
    # stream, norms, RoPE, attention and logits are float32 whatever it is: in bfloat16 the only
    # roundings are the explicit ones feeding a product or the cache, so a verify block and plain
    # steps compute the same numbers (docs/design.md §9).
    dtype: str = "float32"
    embedding_init_std: float = 1.0
    # > 0: the output head scores only this many tokens (a draft's shortlist, `restrict_head`);
    # every other token gets logit -inf. 0: the whole vocabulary.
    head_tokens: int = 0

    def __post_init__(self):
        check_attention_config(self, (self.rope_scaling,))
        if not 0 <= self.head_tokens <= self.vocab_size:
            raise ValueError(
                f"DecoderConfig.head_tokens must be in [0, vocab_size={self.vocab_size}], "
                f"got {self.head_tokens}"
            )


def check_attention_config(cfg: Any, scalings: tuple[tuple[tuple[str, Any], ...], ...]) -> None:
    """ValueError naming the config class for sizes a decoder-only family's attention cannot take:
    non-positive sizes, query heads not a multiple of the kv heads, an odd head_dim (RoPE), an
    unknown RoPE scaling among `scalings`."""
    name = type(cfg).__name__
    base.require_positive(
        cfg, ("vocab_size", "emb_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim")
    )
    if cfg.num_heads % cfg.num_kv_heads:
        raise ValueError(
            f"{name}.num_heads ({cfg.num_heads}) must be a multiple of "
            f"num_kv_heads ({cfg.num_kv_heads})"
        )
    if cfg.head_dim % 2:
        raise ValueError(f"{name}.head_dim must be even for RoPE, got {cfg.head_dim}")
    for scaling in scalings:
        if scaling:
            rope.check_scaling(scaling)


def _param(module: nn.Module, name: str, shape, axes, std: float, dtype=jnp.float32):
    init = nn.with_logical_partitioning(nn.initializers.normal(stddev=std), axes)
    return module.param(name, init, shape, dtype)


def int8_scale(module: nn.Module) -> jax.Array | None:
    """The `kernel_scale` beside an int8 kernel in the module's parameters (`models.int8`; a
    quantised draft's), flattened to [N]; None for a float kernel."""
    if not module.has_variable("params", int8.SCALE):
        return None
    return module.get_variable("params", int8.SCALE).reshape(-1)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float, scaling: tuple = ()) -> jax.Array:
    """Rotary embedding, rotate-half convention. x: [B, L, H, D]; positions: [B, L].

    scaling: a DecoderConfig.rope_scaling (models.rope); () is plain RoPE.
    """
    half = x.shape[-1] // 2
    factor = 1.0
    if scaling:
        inv_np, factor = rope.frequencies(x.shape[-1], theta, scaling)
        inv_freq = jnp.asarray(inv_np)
    else:
        inv_freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, L, D/2]
    sin = jnp.sin(angles)[:, :, None, :]
    cos = jnp.cos(angles)[:, :, None, :]
    if factor != 1.0:  # YaRN's attention factor scales both
        sin, cos = sin * factor, cos * factor
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


class RMSNorm(nn.Module):
    eps: float
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param(
            "scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (x.shape[-1],)
        )
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (normed * scale.astype(jnp.float32)).astype(self.dtype)


class Projection(nn.Module):
    """Output-major projection: kernel [out..., in...]; contracts the last `in_dims` axes of x with
    the kernel's last `in_dims` axes: x [..., in...] -> [..., out...] (+ bias [out...])."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]
    in_dims: int = 1
    use_bias: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        split = len(self.shape) - self.in_dims
        out_shape, in_shape = self.shape[:split], self.shape[split:]
        fan_in = math.prod(in_shape)
        kernel = _param(self, "kernel", self.shape, self.axes, fan_in**-0.5)
        # One 2-D dot [rows, in] x [out, in]: reshaping a row-major kernel is free, whereas a
        # multi-axis einsum let XLA:CPU copy the whole kernel into another layout on every call.
        rows = x.reshape(*x.shape[: x.ndim - self.in_dims], fan_in)
        # The kernel keeps its dtype: `base.dense` takes bfloat16 kernels through the matrix units.
        flat = kernel.reshape(math.prod(out_shape), fan_in)
        y = (
            base.dense(rows, flat, int8_scale(self))
            .astype(x.dtype)
            .reshape(*rows.shape[:-1], *out_shape)
        )
        if self.use_bias:
            y = y + _param(self, "bias", out_shape, self.axes[:split], 0.0).astype(x.dtype)
        return y


class SelfAttention(nn.Module):
    config: DecoderConfig

    @nn.compact
    def __call__(self, x, positions, layer_cache, index, mask):
        cfg = self.config
        e, h, k, d = cfg.emb_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_proj = Projection(
            (h, d, e), ("heads", "kv", "embed"), use_bias=cfg.qkv_bias, name="query"
        )
        k_proj = Projection(
            (k, d, e), ("kv_heads", "kv", "embed"), use_bias=cfg.qkv_bias, name="key"
        )
        v_proj = Projection(
            (k, d, e), ("kv_heads", "kv", "embed"), use_bias=cfg.qkv_bias, name="value"
        )
        query = apply_rope(q_proj(x), positions, cfg.rope_theta, cfg.rope_scaling)
        key = apply_rope(k_proj(x), positions, cfg.rope_theta, cfg.rope_scaling)
        value = v_proj(x)
        keys = base.write_kv(layer_cache["key"], base.heads_major(key), index)
        values = base.write_kv(layer_cache["value"], base.heads_major(value), index)
        attended = attention.attend(query, keys, values, mask, scale=d**-0.5)
        out = Projection((e, h, d), ("embed", "heads", "kv"), in_dims=2, name="out")(attended)
        return out, {"key": keys, "value": values}


class MLP(nn.Module):
    config: DecoderConfig

    @nn.compact
    def __call__(self, x):
        e, m = self.config.emb_dim, self.config.mlp_dim
        gate = Projection((m, e), ("mlp", "embed"), name="wi_0")(x)
        up = Projection((m, e), ("mlp", "embed"), name="wi_1")(x)
        return Projection((e, m), ("embed", "mlp"), name="wo")(nn.silu(gate) * up)


class DecoderLayer(nn.Module):
    config: DecoderConfig

    @nn.compact
    def __call__(self, x, positions, layer_cache, index, mask):
        cfg = self.config
        normed = RMSNorm(cfg.norm_eps, jnp.float32, name="pre_self_attention_layer_norm")(x)
        attn, layer_cache = SelfAttention(cfg, name="self_attention")(
            normed, positions, layer_cache, index, mask
        )
        x = x + attn
        normed = RMSNorm(cfg.norm_eps, jnp.float32, name="pre_mlp_layer_norm")(x)
        return x + MLP(cfg, name="mlp")(normed), layer_cache


def token_embedder(cfg: Any) -> nn.Embed:
    """The [V, E] token table `token_embedder` of a decoder-only stack (called inside its
    compact __call__, so the stack owns it); cfg: any family's config."""
    return nn.Embed(
        cfg.vocab_size,
        cfg.emb_dim,
        embedding_init=nn.with_logical_partitioning(
            nn.initializers.normal(stddev=cfg.embedding_init_std), ("vocab", "embed")
        ),
        name="token_embedder",
    )


class DecoderStack(nn.Module):
    """tokens [B, L] at absolute positions [B, L] -> (logits [B, L, V] float32, updated cache,
    features [B, L, E] float32: the final normed hidden states the output head reads)."""

    config: DecoderConfig

    @nn.compact
    def __call__(self, tokens, positions, cache, index, ancestors=None):
        cfg = self.config
        embedder = token_embedder(cfg)
        x = base.embed(embedder.embedding, tokens).astype(jnp.float32)  # the residual stream
        mask = attention.cache_mask(positions, index, cache["layers_0"]["key"].shape[2], ancestors)
        new_cache = {}
        for i in range(cfg.num_layers):
            name = f"layers_{i}"
            x, new_cache[name] = DecoderLayer(cfg, name=name)(
                x, positions, cache[name], index, mask
            )
        x = RMSNorm(cfg.norm_eps, jnp.float32, name="decoder_norm")(x)
        if cfg.head_tokens:
            logits = ShortlistHead(cfg.vocab_size, cfg.head_tokens, name="logits_dense")(x)
        elif cfg.tie_word_embeddings:
            # An einsum contracting the table's last axis: Flax's attend (x @ table.T) made XLA:CPU
            # copy the transposed [E, V] table on every draft step inside the nested decode loop.
            logits = base.dense(x, embedder.embedding)
        else:
            logits = LogitsDense(cfg.vocab_size, name="logits_dense")(x)
        # The normed hidden state the head reads: a feature-level draft's input (unused outputs
        # are dropped by XLA, so plain extend pays nothing for it).
        return logits.astype(jnp.float32), new_cache, x


class LogitsDense(nn.Module):
    vocab_size: int

    @nn.compact
    def __call__(self, x):
        kernel = _param(
            self, "kernel", (self.vocab_size, x.shape[-1]), ("vocab", "embed"), x.shape[-1] ** -0.5
        )
        return base.dense(x, kernel, int8_scale(self)).astype(jnp.float32)


class ShortlistHead(nn.Module):
    """An output head over `head_tokens` of the vocabulary's ids (`token_ids`, sorted); the other
    ids get logit -inf, so the distribution a draft samples from is exactly zero there.

    A draft's head reads a [V, E] table on every step (a quarter of Qwen2.5-0.5B's streamed
    bytes); keeping the tokens a domain uses cuts the draft's cost c. Any q is exact under the
    acceptance rule (docs/design.md §6): a token outside the shortlist is never proposed, and the
    residual max(0, p - q) gives it the target's full probability.
    x [B, L, E] -> logits [B, L, V] float32.
    """

    vocab_size: int
    head_tokens: int

    @nn.compact
    def __call__(self, x):
        kernel = _param(
            self, "kernel", (self.head_tokens, x.shape[-1]), ("vocab", "embed"), x.shape[-1] ** -0.5
        )
        token_ids = self.param(
            "token_ids",
            nn.with_logical_partitioning(
                lambda _, shape: jnp.arange(shape[0], dtype=jnp.int32), ("vocab",)
            ),
            (self.head_tokens,),
        )
        scores = base.dense(x, kernel, int8_scale(self)).astype(jnp.float32)
        logits = jnp.full((*x.shape[:-1], self.vocab_size), -jnp.inf, jnp.float32)
        return logits.at[..., token_ids].set(scores, unique_indices=True, indices_are_sorted=True)


def restrict_head(
    config: DecoderConfig, params: base.Params, token_ids: Any
) -> tuple[DecoderConfig, base.Params]:
    """A copy of a DecoderLM whose output head scores only `token_ids` (the rest: logit -inf).

    token_ids: ids in [0, vocab_size); duplicates are dropped and the ids sorted. The head's rows
    are the untied head's (or, when tied, the embedding table's) rows of those ids; every other
    parameter array is shared with `params`, not copied. Returns (config, params) for
    `DecoderLM(config)`, with head_tokens = the number of distinct ids.
    """
    ids = np.unique(np.asarray(token_ids, dtype=np.int64))
    if ids.size == 0 or ids[0] < 0 or ids[-1] >= config.vocab_size:
        raise ValueError(
            f"shortlist ids must be a non-empty set within [0, {config.vocab_size}), got "
            f"{ids.size} ids in [{ids.min(initial=0)}, {ids.max(initial=0)}]"
        )
    if config.head_tokens:
        raise ValueError("the model's head is already a shortlist; restrict the full model")
    table = (
        params["token_embedder"]["embedding"]
        if config.tie_word_embeddings
        else params["logits_dense"]["kernel"]
    )
    ids = ids.astype(np.int32)
    restricted = dict(params)
    head = {"kernel": jnp.asarray(table)[ids], "token_ids": jnp.asarray(ids)}
    if not config.tie_word_embeddings and int8.SCALE in params["logits_dense"]:  # an int8 head
        head[int8.SCALE] = jnp.asarray(params["logits_dense"][int8.SCALE])[ids]
    restricted["logits_dense"] = head
    new_config = dataclasses.replace(config, tie_word_embeddings=False, head_tokens=int(ids.size))
    return new_config, restricted


class DecoderOnly(base.ConfiguredModel):
    """The cache plumbing of decoder-only families whose module takes (tokens, positions, cache,
    index, ancestors) and whose config has num_layers, num_kv_heads, head_dim and dtype (this
    layout, models.gemma). Subclasses define `make_module`."""

    is_encoder_decoder = False

    def _dummy_inputs(self):
        cache = base.init_kv_cache(
            self.config.num_layers,
            1,
            1,
            self.config.num_kv_heads,
            self.config.head_dim,
            jnp.dtype(self.config.dtype),
        )
        zeros = jnp.zeros((1, 1), jnp.int32)
        return zeros, zeros, cache, jnp.zeros((1,), jnp.int32)

    def init_params(self, rng: jax.Array) -> base.Params:
        """Random parameters (float32) with the tree documented at the top of this module."""
        variables = self.module.init(rng, *self._dummy_inputs())
        return nn.unbox(variables["params"])

    def logical_axes(self) -> base.Params:
        """Tree of `PartitionSpec`s of logical axis names, matching `init_params`."""
        shapes = jax.eval_shape(self.module.init, jax.random.PRNGKey(0), *self._dummy_inputs())
        return nn.get_partition_spec(shapes)["params"]

    def init_state(self, params: base.Params, batch: base.Batch, max_len: int) -> DecodeState:
        """Empty cache of length max_len for batch["prompt"].shape[0] rows, index 0."""
        del params
        prompt = batch["prompt"]
        if prompt.shape[1] > max_len:
            raise ValueError(
                f"prompt length {prompt.shape[1]} is longer than the cache length {max_len}"
            )
        cfg = self.config
        cache = base.init_kv_cache(
            cfg.num_layers,
            prompt.shape[0],
            max_len,
            cfg.num_kv_heads,
            cfg.head_dim,
            jnp.dtype(cfg.dtype),
        )
        return DecodeState(cache=cache, index=jnp.zeros((prompt.shape[0],), jnp.int32))

    def apply_decoder(self, params, state, tokens, positions, ancestors=None):
        logits, cache, _ = self.apply_decoder_features(params, state, tokens, positions, ancestors)
        return logits, cache

    def apply_decoder_features(self, params, state, tokens, positions, ancestors=None):
        return self.module.apply(
            {"params": params}, tokens, positions, state.cache, state.index, ancestors
        )


class DecoderLM(DecoderOnly):
    """Decoder-only LM implementing `base.LanguageModel`. Hashable by config (a static jit arg)."""

    def make_module(self, config: DecoderConfig) -> DecoderStack:
        return DecoderStack(config)
