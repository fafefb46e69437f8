"""A model wrapper that keeps ids past the real vocabulary out of every distribution.

Released checkpoints often pad their embedding table past the tokenizer (Qwen2.5: 151,936 rows over
151,665 tokens). `model_loading.fit_vocabulary` wraps target and draft alike so that p and q both
give the padding ids probability 0. Everything that changes a fitted model (a draft built from the
target, `drafts.layer_skip`; a shortlist head, `loading.draft_forms.with_shortlist`) goes through `split`:
the bare model to work on, and the function that masks a replacement alike. Kept apart from
`model_loading` so that drafts can use it without importing the loaders.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from speculative.models.base import Ancestors, DecodeState, LanguageModel, Params


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
        self, params: Params, state: DecodeState, tokens: jax.Array, ancestors: Ancestors = None
    ) -> tuple[jax.Array, DecodeState]:
        logits, state = self.model.extend(params, state, tokens, ancestors)
        return self.mask(logits), state

    def extend_features(
        self, params: Params, state: DecodeState, tokens: jax.Array, ancestors: Ancestors = None
    ) -> tuple[jax.Array, jax.Array, DecodeState]:
        logits, features, state = self.model.extend_features(params, state, tokens, ancestors)
        return self.mask(logits), features, state

    def mask(self, logits: jax.Array) -> jax.Array:
        """[..., V'] logits -> [..., width] with the ids from `used` on at -inf."""
        logits = logits[..., : self.width]
        ids = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
        return jnp.where(ids < self.used, logits, -jnp.inf)


def split(model: Any) -> tuple[Any, Callable[[Any], Any]]:
    """(the model inside any padding mask, a function that masks another model the same way).

    For an unmasked model: (model, the identity). The one place a mask is taken off and put back,
    so a model derived from a fitted one (a shallower or shortlisted copy) never proposes the
    padding ids either.
    """
    if not isinstance(model, PaddingMasked):
        return model, lambda replacement: replacement
    return model.model, lambda replacement: dataclasses.replace(model, model=replacement)
