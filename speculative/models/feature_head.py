"""A feature-level draft head (EAGLE-style): one transformer layer that reads the target's hidden
state at a position and the embedding of the token after it, and predicts the target's next
hidden state. The target's own output head (or a shortlist of it) turns a predicted state into
a draft distribution (docs/design.md §1, "A draft that reads the target").

Entry j of the head's sequence is (f_j, e(t_{j+1})): f_j the target's final normed hidden state
after token t_j (what its head reads to score t_{j+1}), e the target's token embedding. Its output
f̂_{j+1} stands in for f_{j+1}, so lm_head(f̂_{j+1}) is q for t_{j+2}; drafting feeds (f̂, sampled
token) back as the next entry. The head keeps a KV cache like any decoder (index, rollback by
index reset, tree attention through `ancestors`), so it sees the whole text, not one position.

Parameter tree (E = emb_dim; the layer is a `models.decoder.DecoderLayer`, T5X names):
    fc/kernel [E, 2E], fc/bias [E]     input [e(t_{j+1}); f_j] -> E
    layers_0/...                       one pre-norm decoder layer (attention, SwiGLU MLP)
The token embedding and the output head are the target's, passed in, not trained here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from speculative.models import attention, base
from speculative.models.base import DecodeState
from speculative.models.decoder import DecoderConfig, DecoderLayer, Projection


@dataclasses.dataclass(frozen=True)
class FeatureHeadConfig:
    """The head's shape. Attention heads, RoPE and norm follow the target (`for_target`); the
    MLP width is the head's own choice (its cost per draft step)."""

    emb_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    qkv_bias: bool = False
    dtype: str = "float32"

    def __post_init__(self):
        base.require_positive(self, ("emb_dim", "num_heads", "num_kv_heads", "head_dim", "mlp_dim"))

    @classmethod
    def for_target(cls, target: DecoderConfig, mlp_dim: int | None = None) -> FeatureHeadConfig:
        """A head matching a DecoderLM target's width and attention (mlp_dim: the target's)."""
        return cls(
            emb_dim=target.emb_dim,
            num_heads=target.num_heads,
            num_kv_heads=target.num_kv_heads,
            head_dim=target.head_dim,
            mlp_dim=mlp_dim or target.mlp_dim,
            rope_theta=target.rope_theta,
            norm_eps=target.norm_eps,
            qkv_bias=target.qkv_bias,
            dtype=target.dtype,
        )

    def layer_config(self) -> DecoderConfig:
        return DecoderConfig(
            vocab_size=1,
            emb_dim=self.emb_dim,
            num_layers=1,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            mlp_dim=self.mlp_dim,
            rope_theta=self.rope_theta,
            norm_eps=self.norm_eps,
            qkv_bias=self.qkv_bias,
            dtype=self.dtype,
        )


class FeatureHeadStack(nn.Module):
    """(features [B, L, E], next-token embeddings [B, L, E]) at positions [B, L] ->
    (predicted next features [B, L, E] float32, updated cache)."""

    config: FeatureHeadConfig

    @nn.compact
    def __call__(self, features, embeddings, positions, cache, index, ancestors=None):
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        e = cfg.emb_dim
        joined = jnp.concatenate([embeddings, features], axis=-1).astype(dtype)
        x = Projection((e, 2 * e), ("embed", "mlp"), use_bias=True, name="fc")(joined)
        mask = attention.cache_mask(positions, index, cache["layers_0"]["key"].shape[2], ancestors)
        x, layer_cache = DecoderLayer(cfg.layer_config(), name="layers_0")(
            x, positions, cache["layers_0"], index, mask
        )
        return x.astype(jnp.float32), {"layers_0": layer_cache}


class FeatureHead(base.Configured):
    """The head as a model object: hashable by config (a static jit argument), pure functions of
    explicit params and cache."""

    def make_module(self, config: FeatureHeadConfig) -> FeatureHeadStack:
        return FeatureHeadStack(config)

    def init_cache(self, batch_size: int, max_len: int) -> DecodeState:
        """An empty head cache of max_len positions, index 0."""
        cfg = self.config
        cache = base.init_kv_cache(
            1, batch_size, max_len, cfg.num_kv_heads, cfg.head_dim, jnp.dtype(cfg.dtype)
        )
        return DecodeState(cache=cache, index=jnp.zeros((batch_size,), jnp.int32))

    def _dummy_inputs(self):
        e = self.config.emb_dim
        zeros = jnp.zeros((1, 1, e), jnp.float32)
        state = self.init_cache(1, 1)
        return zeros, zeros, jnp.zeros((1, 1), jnp.int32), state.cache, state.index

    def init_params(self, rng: jax.Array) -> base.Params:
        """Random parameters (float32), the tree in the module docstring."""
        return nn.unbox(self.module.init(rng, *self._dummy_inputs())["params"])

    def param_shapes(self) -> base.Params:
        return jax.eval_shape(self.init_params, jax.random.PRNGKey(0))

    def extend(
        self,
        params: base.Params,
        state: DecodeState,
        features: jax.Array,
        embeddings: jax.Array,
        ancestors: base.Ancestors = None,
    ) -> tuple[jax.Array, DecodeState]:
        """Appends L entries at each row's index: features, embeddings [B, L, E] -> (predicted
        features [B, L, E], state with index + L). A tree of entries with `ancestors`, as
        `LanguageModel.extend`."""
        length = features.shape[1]
        positions = base.block_positions(state, length, ancestors)
        predicted, cache = self.module.apply(
            {"params": params}, features, embeddings, positions, state.cache, state.index, ancestors
        )
        return predicted, state.replace(cache=cache, index=state.index + length)

    def forward(self, params: base.Params, features: jax.Array, embeddings: jax.Array) -> jax.Array:
        """Training and evaluation: whole sequences [B, L, E] from position 0 -> [B, L, E]."""
        state = self.init_cache(features.shape[0], features.shape[1])
        predicted, _ = self.extend(params, state, features, embeddings)
        return predicted


def output_logits(
    features: jax.Array, lm_head: dict[str, jax.Array], vocab_size: int, used: int | None = None
) -> jax.Array:
    """The target's output head on (predicted) features [..., E] -> logits [..., V] float32.

    lm_head: {"kernel": [V', E]} (the whole head: the target's untied head or its embedding table)
    or {"kernel": [S, E], "token_ids": [S]} (a shortlist: the other ids get -inf). Ids from
    `used` on (a padded table's padding rows) get -inf, as the fitted target gives them.
    """
    # The kernel keeps its dtype: a bfloat16 table takes the matrix-unit route (base.dense)
    # instead of being widened to float32 on every call.
    scores = base.dense(features.astype(jnp.float32), lm_head["kernel"]).astype(jnp.float32)
    if "token_ids" in lm_head:
        logits = jnp.full((*features.shape[:-1], vocab_size), -jnp.inf, jnp.float32)
        logits = logits.at[..., lm_head["token_ids"]].set(
            scores, unique_indices=True, indices_are_sorted=True
        )
    else:
        logits = scores[..., :vocab_size]
    if used is not None and used < vocab_size:
        ids = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
        logits = jnp.where(ids < used, logits, -jnp.inf)
    return logits


def target_lm_head(target_config: DecoderConfig, target_params: Any) -> dict[str, Any]:
    """The part of a DecoderLM's params that scores features: {"kernel"} or, for a shortlist
    head, {"kernel", "token_ids"} (shared arrays, not copies)."""
    if target_config.tie_word_embeddings and not target_config.head_tokens:
        return {"kernel": target_params["token_embedder"]["embedding"]}
    return dict(target_params["logits_dense"])
