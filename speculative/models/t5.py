"""T5 encoder-decoder (T5 v1.0, v1.1, mT5, ByT5) with T5X's parameter tree, decoding with a KV cache.

The network is T5X's `t5x/examples/t5/network.py` re-expressed for cached, multi-token decoding:
pre-norm blocks with T5's RMS layer norm (no mean, no bias, eps 1e-6), relative position biases
(one table per stack, shared by its layers; bidirectional buckets in the encoder, causal in the
decoder), no 1/sqrt(head_dim) at attention time (T5X folds it into the query initialiser, and trained
checkpoints carry it in their weights), ReLU MLP (v1.0) or gated GELU (v1.1, tanh approximation) and
either tied output embeddings with logits scaled by 1/sqrt(emb_dim) (v1.0) or an untied
`logits_dense` (v1.1).

Parameter tree, stored shapes exactly as T5X's DenseGeneral writes them (E = emb_dim, H = num_heads,
D = head_dim, M = mlp_dim, V = vocab_size, R = num_buckets):
    token_embedder/embedding                                      [V, E]     (vocab, embed)
    encoder/relpos_bias/rel_embedding                             [H, R]     (heads, relpos_buckets)
    encoder/layers_{i}/pre_attention_layer_norm/scale             [E]        (embed)
    encoder/layers_{i}/attention/{query,key,value}/kernel         [E, H*D]   (embed, joined_kv)
    encoder/layers_{i}/attention/out/kernel                       [H*D, E]   (joined_kv, embed)
    encoder/layers_{i}/pre_mlp_layer_norm/scale                   [E]
    encoder/layers_{i}/mlp/{wi | wi_0, wi_1}/kernel               [E, M]     (embed, mlp)
    encoder/layers_{i}/mlp/wo/kernel                              [M, E]     (mlp, embed)
    encoder/encoder_norm/scale                                    [E]
    decoder/relpos_bias/rel_embedding                             [H, R]
    decoder/layers_{i}/pre_self_attention_layer_norm/scale        [E]
    decoder/layers_{i}/self_attention/{query,key,value,out}/kernel
    decoder/layers_{i}/pre_cross_attention_layer_norm/scale       [E]
    decoder/layers_{i}/encoder_decoder_attention/{query,key,value,out}/kernel
    decoder/layers_{i}/pre_mlp_layer_norm/scale                   [E]
    decoder/layers_{i}/mlp/...                                    (as in the encoder)
    decoder/decoder_norm/scale                                    [E]
    decoder/logits_dense/kernel                                   [E, V]     (embed, vocab); absent
                                                                  when logits_via_embedding

Decoding (docs/design.md §2): `init_state` encodes once and stores the encoder padding mask and every
decoder layer's cross-attention keys/values in `DecodeState.extras`; `extend` appends L decoder tokens
at each row's own cache index. T5X's cache is single-token with a scalar index; ours is neither.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from speculative.models import base
from speculative.models.base import DecodeState

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": nn.relu,
    "gelu": nn.gelu,  # tanh approximation, as T5X's getattr(nn, 'gelu') and HF's gelu_new
    "silu": nn.silu,
    "linear": lambda x: x,
}


@dataclasses.dataclass(frozen=True)
class T5Config:
    """T5X's `network.T5Config` fields (minus training-only ones) plus the relative-position constants."""

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
        """query_positions [B, L] (absolute) against key slots 0..key_len-1 -> bias [B, H, L, S]."""
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
        relative = jnp.arange(key_len)[None, None, :] - query_positions[:, :, None]  # [B, L, S]
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
        """x [B, S, E] -> keys, values [B, H, S, D] (heads-major, the layout base.attend reads)."""
        return base.heads_major(self.key(x)), base.heads_major(self.value(x))

    def __call__(self, x, keys, values, mask, bias=None):
        """x [B, L, E] attends to keys/values [B, H, S, D]; mask [B|1, 1, L|1, S] -> [B, L, E]."""
        attended = base.attend(self.query(x), keys, values, mask, bias, scale=1.0)
        return self.out(attended)


class MlpBlock(nn.Module):
    config: T5Config

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
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
        return DenseGeneral(
            (cfg.mlp_dim,), (cfg.emb_dim,), ("mlp", "embed"), dtype=dtype, name="wo"
        )(hidden)


class EncoderLayer(nn.Module):
    config: T5Config

    @nn.compact
    def __call__(self, x, mask, bias):
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        h = LayerNorm(cfg.layer_norm_eps, dtype, name="pre_attention_layer_norm")(x)
        attention = Attention(cfg, name="attention")
        keys, values = attention.project_kv(h)
        x = x + attention(h, keys, values, mask, bias)
        h = LayerNorm(cfg.layer_norm_eps, dtype, name="pre_mlp_layer_norm")(x)
        return x + MlpBlock(cfg, name="mlp")(h)


class DecoderLayer(nn.Module):
    config: T5Config

    def setup(self):
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        self.pre_self_attention_layer_norm = LayerNorm(cfg.layer_norm_eps, dtype)
        self.self_attention = Attention(cfg)
        self.pre_cross_attention_layer_norm = LayerNorm(cfg.layer_norm_eps, dtype)
        self.encoder_decoder_attention = Attention(cfg)
        self.pre_mlp_layer_norm = LayerNorm(cfg.layer_norm_eps, dtype)
        self.mlp = MlpBlock(cfg)

    def cross_kv(self, encoded: jax.Array) -> dict[str, jax.Array]:
        """encoded [B, S, E] -> {"key", "value": [B, H, S, D]} for this layer's cross-attention."""
        keys, values = self.encoder_decoder_attention.project_kv(encoded)
        return {"key": keys, "value": values}

    def __call__(self, x, self_mask, self_bias, layer_cache, index, cross, cross_mask):
        """x [B, L, E]. layer_cache None: attend within the block (teacher forcing, no cache)."""
        h = self.pre_self_attention_layer_norm(x)
        keys, values = self.self_attention.project_kv(h)
        if layer_cache is not None:
            keys = base.write_kv(layer_cache["key"], keys, index)
            values = base.write_kv(layer_cache["value"], values, index)
            layer_cache = {"key": keys, "value": values}
        x = x + self.self_attention(h, keys, values, self_mask, self_bias)
        h = self.pre_cross_attention_layer_norm(x)
        x = x + self.encoder_decoder_attention(h, cross["key"], cross["value"], cross_mask)
        h = self.pre_mlp_layer_norm(x)
        return x + self.mlp(h), layer_cache


class _Stack(nn.Module):
    """What the encoder and decoder stacks share: `relpos_bias`, `layers_{i}`, then a final norm."""

    config: T5Config
    embedder: nn.Module

    def _setup_stack(self, layer: type[nn.Module], num_layers: int, bidirectional: bool):
        """Called from `setup`: creates relpos_bias and the layers; returns the final norm, which the
        subclass names (encoder_norm / decoder_norm, as in T5X)."""
        cfg = self.config
        self.relpos_bias = RelativePositionBias(cfg, bidirectional=bidirectional)
        self.layers = [layer(cfg) for _ in range(num_layers)]  # layers_{i}
        return LayerNorm(cfg.layer_norm_eps, jnp.dtype(cfg.dtype))


class Encoder(_Stack):
    def setup(self):
        num_layers = self.config.num_encoder_layers
        self.encoder_norm = self._setup_stack(EncoderLayer, num_layers, bidirectional=True)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """tokens [B, S] (0 = pad) -> encoded [B, S, E]."""
        length = tokens.shape[1]
        x = self.embedder(tokens)
        bias = self.relpos_bias(jnp.arange(length)[None, :], length)  # [1, H, S, S]
        # Keys at padding are masked; queries at padding compute garbage nobody reads (their
        # outputs only ever serve as masked keys).
        mask = (tokens > 0)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask, bias)
        return self.encoder_norm(x)


class Decoder(_Stack):
    def setup(self):
        cfg = self.config
        num_layers = cfg.num_decoder_layers
        self.decoder_norm = self._setup_stack(DecoderLayer, num_layers, bidirectional=False)
        if not cfg.logits_via_embedding:
            self.logits_dense = DenseGeneral(
                (cfg.emb_dim,), (cfg.vocab_size,), ("embed", "vocab"), dtype=jnp.float32
            )

    def cross_kv(self, encoded: jax.Array) -> dict[str, dict[str, jax.Array]]:
        return {f"layers_{i}": layer.cross_kv(encoded) for i, layer in enumerate(self.layers)}

    def __call__(self, tokens, positions, encoder_mask, cross, cache, index):
        """tokens, positions [B, L] -> logits [B, L, V] float32 and the updated cache (or None).

        cache None: the L tokens are the whole decoder sequence at positions 0..L-1.
        """
        cfg = self.config
        key_len = tokens.shape[1] if cache is None else cache["layers_0"]["key"].shape[2]
        self_mask = base.causal_cache_mask(positions, key_len)  # [B, 1, L, S]
        self_bias = self.relpos_bias(positions, key_len)  # [B, H, L, S]
        cross_mask = encoder_mask[:, None, None, :]
        x = self.embedder(tokens)
        new_cache = None if cache is None else {}
        for i, layer in enumerate(self.layers):
            name = f"layers_{i}"
            layer_cache = None if cache is None else cache[name]
            x, layer_cache = layer(
                x, self_mask, self_bias, layer_cache, index, cross[name], cross_mask
            )
            if cache is not None:
                new_cache[name] = layer_cache
        y = self.decoder_norm(x).astype(jnp.float32)
        if cfg.logits_via_embedding:
            logits = self.embedder.attend(y) / jnp.sqrt(jnp.float32(cfg.emb_dim))
        else:
            logits = self.logits_dense(y)
        return logits.astype(jnp.float32), new_cache


class T5Module(nn.Module):
    """The linen network. Methods: `prepare` (encode once), `decode` (cached), `__call__` (no cache)."""

    config: T5Config

    def setup(self):
        cfg = self.config
        self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, jnp.dtype(cfg.dtype))
        self.encoder = Encoder(cfg, self.token_embedder)
        self.decoder = Decoder(cfg, self.token_embedder)

    def prepare(self, encoder_tokens: jax.Array) -> dict[str, Any]:
        """encoder_tokens [B, S] -> {"encoder_mask": bool [B, S], "cross": per-layer keys/values}."""
        encoded = self.encoder(encoder_tokens)
        return {"encoder_mask": encoder_tokens > 0, "cross": self.decoder.cross_kv(encoded)}

    def decode(self, tokens, positions, extras, cache, index):
        return self.decoder(
            tokens, positions, extras["encoder_mask"], extras["cross"], cache, index
        )

    def __call__(self, encoder_tokens: jax.Array, decoder_tokens: jax.Array) -> jax.Array:
        """Teacher-forced logits [B, L, V] for decoder_tokens [B, L] at positions 0..L-1."""
        extras = self.prepare(encoder_tokens)
        positions = jnp.broadcast_to(jnp.arange(decoder_tokens.shape[1]), decoder_tokens.shape)
        logits, _ = self.decode(decoder_tokens, positions, extras, None, None)
        return logits


# ------------------------------------------------------------------------------------------------
# The model object decoding sees.


class T5(base.ConfiguredModel):
    """Encoder-decoder LM implementing `base.LanguageModel`. Hashable by config (a static jit arg)."""

    is_encoder_decoder = True
    decoder_start_id = 0  # T5X's decoder start token (the pad id)

    def make_module(self, config: T5Config) -> T5Module:
        return T5Module(config)

    @staticmethod
    def _dummy_inputs():
        tokens = jnp.ones((1, 1), jnp.int32)
        return tokens, tokens

    def init_params(self, rng: jax.Array) -> base.Params:
        """Random float32 parameters with T5X's initialisers and the tree in the module docstring."""
        return nn.unbox(self.module.init(rng, *self._dummy_inputs())["params"])

    def logical_axes(self) -> base.Params:
        """Tree of `PartitionSpec`s of logical axis names, matching `init_params`."""
        shapes = jax.eval_shape(self.module.init, jax.random.PRNGKey(0), *self._dummy_inputs())
        return nn.get_partition_spec(shapes)["params"]

    def param_shapes(self) -> base.Params:
        """Tree of `jax.ShapeDtypeStruct` matching `init_params` (no computation)."""
        return jax.eval_shape(self.init_params, jax.random.PRNGKey(0))

    def forward(
        self, params: base.Params, encoder_tokens: jax.Array, decoder_tokens: jax.Array
    ) -> jax.Array:
        """Teacher-forced logits [B, L, V] float32 in one pass without a cache.

        encoder_tokens [B, S] (0 = pad); decoder_tokens [B, L] start with the decoder start token 0.
        """
        return self.module.apply({"params": params}, encoder_tokens, decoder_tokens)

    def init_state(self, params: base.Params, batch: base.Batch, max_len: int) -> DecodeState:
        """Encodes batch["encoder_input_tokens"] [B, S] once; empty decoder cache of max_len, index 0.

        extras: {"encoder_mask": bool [B, S], "cross": {"layers_i": {"key", "value": [B, H, S, D]}}}.
        """
        tokens = jnp.asarray(batch["encoder_input_tokens"]).astype(jnp.int32)
        if tokens.ndim != 2:
            raise ValueError(f"encoder_input_tokens must be [B, S], got shape {tokens.shape}")
        if max_len < 1:
            raise ValueError(f"decoder cache length must be >= 1, got {max_len}")
        cfg = self.config
        extras = self.module.apply({"params": params}, tokens, method=T5Module.prepare)
        cache = base.init_kv_cache(
            cfg.num_decoder_layers,
            tokens.shape[0],
            max_len,
            cfg.num_heads,
            cfg.head_dim,
            jnp.dtype(cfg.dtype),
        )
        index = jnp.zeros((tokens.shape[0],), jnp.int32)
        return DecodeState(cache=cache, index=index, extras=extras)

    def apply_decoder(self, params, state, tokens, positions):
        return self.module.apply(
            {"params": params},
            tokens,
            positions,
            state.extras,
            state.cache,
            state.index,
            method=T5Module.decode,
        )
