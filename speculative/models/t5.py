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

Dropout (training only, `T5Config.dropout_rate`, where T5X's network applies it): after the
embeddings, on the attention weights, after each attention and MLP block before its residual add,
inside the MLP after the activations, and after the final layer norm of each stack; every mask
but the attention weights' and the encoder output's is shared along the sequence. Only
`T5.forward` with a dropout rng turns it on (`deterministic=False`); every decoding path is
deterministic, and there a Dropout returns its input untouched (no extra work).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from speculative.models import attention, base
from speculative.models.base import DecodeState
from speculative.models.t5_layers import (
    ACTIVATIONS,
    Attention,
    DenseGeneral,
    Embed,
    LayerNorm,
    MlpBlock,
    RelativePositionBias,
    T5Config,
    relative_position_bucket,
)

__all__ = ["ACTIVATIONS", "T5", "T5Config", "T5Module", "relative_position_bucket"]


class EncoderLayer(nn.Module):
    config: T5Config

    @nn.compact
    def __call__(self, x, mask, bias, deterministic: bool = True):
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        drop = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        h = LayerNorm(cfg.layer_norm_eps, dtype, name="pre_attention_layer_norm")(x)
        attention = Attention(cfg, name="attention")
        keys, values = attention.project_kv(h)
        x = x + drop(attention(h, keys, values, mask, bias, deterministic), deterministic)
        h = LayerNorm(cfg.layer_norm_eps, dtype, name="pre_mlp_layer_norm")(x)
        return x + drop(MlpBlock(cfg, name="mlp")(h, deterministic), deterministic)


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
        self.dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))

    def cross_kv(self, encoded: jax.Array) -> dict[str, jax.Array]:
        """encoded [B, S, E] -> {"key", "value": [B, H, S, D]} for this layer's cross-attention."""
        keys, values = self.encoder_decoder_attention.project_kv(encoded)
        return {"key": keys, "value": values}

    def __call__(
        self, x, self_mask, self_bias, layer_cache, index, cross, cross_mask, deterministic=True
    ):
        """x [B, L, E]. layer_cache None: attend within the block (teacher forcing, no cache)."""
        det = deterministic
        h = self.pre_self_attention_layer_norm(x)
        keys, values = self.self_attention.project_kv(h)
        if layer_cache is not None:
            keys = base.write_kv(layer_cache["key"], keys, index)
            values = base.write_kv(layer_cache["value"], values, index)
            layer_cache = {"key": keys, "value": values}
        x = x + self.dropout(self.self_attention(h, keys, values, self_mask, self_bias, det), det)
        h = self.pre_cross_attention_layer_norm(x)
        h = self.encoder_decoder_attention(h, cross["key"], cross["value"], cross_mask, None, det)
        x = x + self.dropout(h, det)
        h = self.pre_mlp_layer_norm(x)
        return x + self.dropout(self.mlp(h, det), det), layer_cache


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
        self.embed_dropout = nn.Dropout(cfg.dropout_rate, broadcast_dims=(-2,))
        return LayerNorm(cfg.layer_norm_eps, jnp.dtype(cfg.dtype))


class Encoder(_Stack):
    def setup(self):
        num_layers = self.config.num_encoder_layers
        self.encoder_norm = self._setup_stack(EncoderLayer, num_layers, bidirectional=True)
        self.output_dropout = nn.Dropout(self.config.dropout_rate)  # T5X: not shared along S

    def __call__(self, tokens: jax.Array, deterministic: bool = True) -> jax.Array:
        """tokens [B, S] (0 = pad) -> encoded [B, S, E]."""
        length = tokens.shape[1]
        x = self.embed_dropout(self.embedder(tokens), deterministic)
        bias = self.relpos_bias(jnp.arange(length)[None, :], length)  # [1, H, S, S]
        # Keys at padding are masked; queries at padding compute garbage nobody reads (their
        # outputs only ever serve as masked keys).
        mask = (tokens > 0)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask, bias, deterministic)
        return self.output_dropout(self.encoder_norm(x), deterministic)


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

    def __call__(
        self, tokens, positions, encoder_mask, cross, cache, index, ancestors=None, det=True
    ):
        """tokens, positions [B, L] -> logits [B, L, V] float32 and the updated cache (or None).

        cache None: the L tokens are the whole decoder sequence at positions 0..L-1.
        ancestors: a static [L, L] token tree (models/base.py), or None for a causal block.
        det: deterministic (no dropout); False only for a training forward pass.
        """
        cfg = self.config
        key_len = tokens.shape[1] if cache is None else cache["layers_0"]["key"].shape[2]
        # A tree's tokens attend through path views (models/attention.py), where every key
        # sits at its own position's slot, as in a chain.
        self_mask = attention.cache_mask(positions, index, key_len, ancestors)
        self_bias = self.relpos_bias(positions, key_len)  # [B, H, L, S]
        cross_mask = encoder_mask[:, None, None, :]
        x = self.embed_dropout(self.embedder(tokens), det)
        new_cache = None if cache is None else {}
        for i, layer in enumerate(self.layers):
            name = f"layers_{i}"
            layer_cache = None if cache is None else cache[name]
            x, layer_cache = layer(
                x, self_mask, self_bias, layer_cache, index, cross[name], cross_mask, det
            )
            if cache is not None:
                new_cache[name] = layer_cache
        y = self.embed_dropout(self.decoder_norm(x), det).astype(jnp.float32)
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

    def prepare(self, encoder_tokens: jax.Array, deterministic: bool = True) -> dict[str, Any]:
        """encoder_tokens [B, S] -> {"encoder_mask": bool [B, S], "cross": per-layer keys/values}."""
        encoded = self.encoder(encoder_tokens, deterministic)
        return {"encoder_mask": encoder_tokens > 0, "cross": self.decoder.cross_kv(encoded)}

    def decode(self, tokens, positions, extras, cache, index, ancestors=None, det=True):
        mask, cross = extras["encoder_mask"], extras["cross"]
        return self.decoder(tokens, positions, mask, cross, cache, index, ancestors, det)

    def __call__(
        self, encoder_tokens: jax.Array, decoder_tokens: jax.Array, deterministic: bool = True
    ) -> jax.Array:
        """Teacher-forced logits [B, L, V] for decoder_tokens [B, L] at positions 0..L-1;
        deterministic False (training) applies dropout and needs a 'dropout' rng."""
        extras = self.prepare(encoder_tokens, deterministic)
        positions = jnp.broadcast_to(jnp.arange(decoder_tokens.shape[1]), decoder_tokens.shape)
        logits, _ = self.decode(decoder_tokens, positions, extras, None, None, None, deterministic)
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
        self,
        params: base.Params,
        encoder_tokens: jax.Array,
        decoder_tokens: jax.Array,
        dropout_rng: jax.Array | None = None,
    ) -> jax.Array:
        """Teacher-forced logits [B, L, V] float32 in one pass without a cache.

        encoder_tokens [B, S] (0 = pad); decoder_tokens [B, L] start with the decoder start token 0.
        dropout_rng: a PRNG key turns on dropout (training, `T5Config.dropout_rate`); None (the
        default) is the deterministic network.
        """
        if dropout_rng is None:
            return self.module.apply({"params": params}, encoder_tokens, decoder_tokens)
        return self.module.apply(
            {"params": params}, encoder_tokens, decoder_tokens, False, rngs={"dropout": dropout_rng}
        )

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

    def apply_decoder(self, params, state, tokens, positions, ancestors=None):
        return self.module.apply(
            {"params": params},
            tokens,
            positions,
            state.extras,
            state.cache,
            state.index,
            ancestors,
            method=T5Module.decode,
        )
