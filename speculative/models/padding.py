"""A model wrapper that keeps ids past the real vocabulary out of every distribution.

Released checkpoints often pad their embedding table past the tokenizer (Qwen2.5: 151,936 rows over
151,665 tokens). `model_loading.fit_vocabulary` wraps target and draft alike so that p and q both
give the padding ids probability 0; a draft built from the target (`drafts.layer_skip`) wraps its
shallow model the same way. Kept apart from `model_loading` so that drafts can use it without
importing the loaders.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from speculative.models.base import DecodeState, LanguageModel, Params


@dataclasses.dataclass(frozen=True)
class PaddingMasked:
    """`model` whose output ids past the vocabulary never come out: logits are cut to `width`
    columns and the ids from `used` on set to -inf, inside the jitted loop.

    Draft and target are wrapped alike, so p and q both give the padding ids probability 0 and
    the acceptance rule stays exact over the ids that remain. Hashable (a static jit argument);
    everything but `vocab_size` and `extend` is the wrapped model's.
    """

    model: LanguageModel
    used: int
    width: int

    def __getattr__(self, name: str) -> Any:
        if name == "model":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)

    @property
    def vocab_size(self) -> int:
        return self.width

    def extend(
        self, params: Params, state: DecodeState, tokens: jax.Array
    ) -> tuple[jax.Array, DecodeState]:
        logits, state = self.model.extend(params, state, tokens)
        logits = logits[..., : self.width]
        ids = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
        return jnp.where(ids < self.used, logits, -jnp.inf), state
