"""The paper's draft: a smaller `LanguageModel` sampled autoregressively (`ModelDrafter`), and
`as_drafter`, which turns a LanguageModel into one (any other `Drafter` passes as it is)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from speculative.decoding.checks import check_pair, validate_batch
from speculative.decoding.config import DecodeConfig
from speculative.decoding.drafter import (
    DraftContext,
    Drafter,
    DraftRequest,
    StatelessDrafter,
    draft_confidence,
)
from speculative.decoding.sampling import sample
from speculative.decoding.state import constrain, prefill
from speculative.decoding.tree import grow_first_child_tree
from speculative.models.base import DecodeState, LanguageModel


@dataclasses.dataclass(frozen=True)
class ModelDrafter(StatelessDrafter):
    """The paper's draft: a smaller LanguageModel sampled autoregressively (decoding/drafter.Drafter).

    Its state is the model's DecodeState. Each round re-feeds [prev, last] at pos - 1, which both
    rewinds past rejected tokens and writes the cache slot of the target's replacement token
    (docs/design.md §3), then samples gamma tokens.
    """

    model: LanguageModel
    grows_trees: ClassVar[bool] = True

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def check_target(self, target: LanguageModel) -> None:
        check_pair(target, self.model)

    def validate(self, batch: dict[str, jax.Array], config: DecodeConfig) -> None:
        super().validate(batch, config)
        validate_batch(self.model, batch, config)

    def place_params(self, partitioner: Any, params: Any) -> Any:
        return partitioner.place_params(self.model, params, "draft")

    def model_params(self, params: Any) -> Any:
        """The draft model's parameters within `params` (all of them; a self-draft takes a part)."""
        return params

    def cache_slack(self) -> int:
        """Cache slots past the decode's own (`DecodeConfig.cache_length`) that this draft writes
        ahead of a round's tokens: none for the paper's draft."""
        return 0

    def init(self, params: Any, batch: dict[str, jax.Array], config: DecodeConfig) -> DecodeState:
        params = self.model_params(params)
        length = config.cache_length(self.model, batch) + self.cache_slack()
        state, _, _, _ = prefill(self.model, params, batch, length)
        return state

    def constrain(self, partitioner: Any, state: DecodeState) -> DecodeState:
        return constrain(partitioner, self.model, state, "draft")

    def propose(
        self, params: Any, state: DecodeState, request: DraftRequest
    ) -> tuple[jax.Array, jax.Array, DecodeState]:
        """gamma tokens per row: (tokens [B, G], logits [B, G, V] they were drawn from, state with
        index pos + G)."""
        params = self.model_params(params)
        draft, context, sampling = self.model, request.context, request.sampling
        logits, state = self._catch_up(params, state, context)
        rngs = jax.random.split(request.rng, request.gamma)
        token, _ = sample(rngs[0], logits, sampling)
        if context.adaptive:
            return self._propose_until_stopped(
                params, state, token, logits, rngs, context, sampling
            )

        def step(carry, step_rng):
            state, token = carry
            logits, state = draft.extend(params, state, token[:, None])
            next_token, _ = sample(step_rng, logits[:, 0], sampling)
            return (state, next_token), (next_token, logits[:, 0])

        (state, _), (tokens, rest) = jax.lax.scan(step, (state, token), rngs[1:])
        tokens = jnp.concatenate([token[:, None], tokens.T], axis=1)
        all_logits = jnp.concatenate([logits[:, None], jnp.swapaxes(rest, 0, 1)], axis=1)
        return tokens, all_logits, state

    def propose_tree(
        self, params: Any, state: DecodeState, request: DraftRequest
    ) -> tuple[jax.Array, jax.Array, DecodeState]:
        """A tree of first children (decoding/tree.py): each depth's siblings drawn without
        replacement from q at the first child above; D - 1 draft steps after the catch-up.
        Returns (tokens [B, N], log_q [B, N, V], state with index pos + D)."""
        params = self.model_params(params)
        logits, state = self._catch_up(params, state, request.context)

        def step(state, token):
            step_logits, state = self.model.extend(params, state, token[:, None])
            return step_logits[:, 0], state

        return grow_first_child_tree(
            step, state, logits, request.tree, request.rng, request.sampling
        )

    def _catch_up(
        self, params: Any, state: DecodeState, context: DraftContext
    ) -> tuple[jax.Array, DecodeState]:
        """Re-feeds [prev, last] at pos - 1 (docs/design.md §3): (logits [B, V] after `last`,
        state with index pos + 1). Rows at position 0 (nothing before `last`) feed [last, last]
        at 0 and read the first logits (slot 1 is overwritten next)."""
        pos = context.pos
        start = jnp.maximum(pos - 1, 0)
        first = jnp.where(pos > 0, context.prev, context.last)
        block = jnp.stack([first, context.last], 1)
        logits2, state = self.model.extend(params, state.replace(index=start), block)
        logits = jnp.take_along_axis(logits2, (pos - start)[:, None, None], axis=1)[:, 0]
        return logits, state.replace(index=pos + 1)

    def _propose_until_stopped(self, params, state, token, logits, rngs, context, sampling):
        """The same proposals as the fixed path (same keys), in a while loop that ends as soon as
        every active row has its budget or has hit an unsure token: an adaptive policy saves the
        draft steps no row wants. Slots after the exit hold token 0 and zero logits (unused)."""
        gamma = rngs.shape[0]
        tokens = jnp.zeros((token.shape[0], gamma), jnp.int32).at[:, 0].set(token)
        all_logits = jnp.zeros((*tokens.shape, logits.shape[-1]), logits.dtype).at[:, 0].set(logits)

        def wants_more(i, step_logits):
            confident = draft_confidence(step_logits, sampling) >= context.min_confidence
            return (i + 1 < context.budget) & confident & ~context.done

        def more(carry):
            i, _, _, _, _, going = carry
            return (i < gamma) & jnp.any(going)

        def step(carry):
            i, state, token, tokens, all_logits, going = carry
            step_logits, state = self.model.extend(params, state, token[:, None])
            token, _ = sample(rngs[i], step_logits[:, 0], sampling)
            tokens = tokens.at[:, i].set(token)
            all_logits = all_logits.at[:, i].set(step_logits[:, 0])
            return i + 1, state, token, tokens, all_logits, going & wants_more(i, step_logits[:, 0])

        carry = (1, state, token, tokens, all_logits, wants_more(0, logits))
        _, state, _, tokens, all_logits, _ = jax.lax.while_loop(more, step, carry)
        return tokens, all_logits, state


def as_drafter(draft: LanguageModel | Drafter) -> Drafter:
    """A Drafter as it is, a LanguageModel as the paper's `ModelDrafter`."""
    return draft if isinstance(draft, Drafter) else ModelDrafter(draft)
