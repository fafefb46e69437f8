"""The loop's typed state and results: `DecodeStats`, `DecodeOutput`, `LoopState`, and how a
decode starts (`prefill`, `initial_loop_state`).

Shapes: B = batch, G = gamma (0 for plain decoding), T = max_decode_len.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp

from speculative.data import inputs
from speculative.decoding.config import DecodeConfig
from speculative.models.base import DecodeState, LanguageModel


@flax.struct.dataclass
class DecodeStats:
    """Per-row counters, accumulated inside the loop and returned as they are.

    B = batch, G = gamma (0 for plain decoding). Every field is [B] unless noted.
      target_calls: target forward calls after the prefill (one per round / per plain step).
      draft_calls: draft-model calls (gamma per round, or the row's proposed length under an
        adaptive GammaPolicy; what a draft reports with `model_calls`, e.g. a staged draft's
        lookup-checking calls; 0 for plain decoding).
      drafted / accepted: draft tokens proposed / accepted.
      emitted: generated tokens (EOS included); equals DecodeOutput.lengths.
      beta_sum: float32 sum of beta = sum_x min(p(x), q(x)) over verified positions.
      accepted_at / verified_at: [B, G] how often draft position i was accepted / tested.
      nan_logits: bool, the target produced a NaN logit for this row while it was active.
      nan_draft_logits: bool, the draft did (its q would be NaN: the round's output garbage).
      accepted_rank: [B, D, W] int32, rounds whose accepted path took sibling rank r at depth d
        (a tree decode with `DecodeConfig.count_ranks`, the planner's probe); None otherwise, so
        every other decode carries, compiles and returns what it did before.
      outside_mass: float32, the draft's probability outside the tokens it may propose, summed
        over its proposals (a cross-vocabulary draft's `outside_mass`; divide by `drafted` for
        the share); None for every other draft.
      draft_stalls: int32, rounds whose catch-up the draft skipped because the row's text had
        outgrown its capped cache (a cross-vocabulary draft's `draft_stalls`; still exact, fewer
        acceptances); None for every other draft.
      lookup_proposed / lookup_accepted: int32, the prompt-lookup tokens a staged draft's model
        scored / kept (`drafts/staged.py`); None for every other draft.
    Derived: `alpha`, `tokens_per_call` (tau), `verified`. Fields can also be read by name,
    `stats["alpha"]`, as earlier releases returned a dict.
    """

    target_calls: jax.Array
    draft_calls: jax.Array
    drafted: jax.Array
    accepted: jax.Array
    emitted: jax.Array
    beta_sum: jax.Array
    accepted_at: jax.Array
    verified_at: jax.Array
    nan_logits: jax.Array
    nan_draft_logits: jax.Array
    accepted_rank: jax.Array | None = None
    outside_mass: jax.Array | None = None
    draft_stalls: jax.Array | None = None
    lookup_proposed: jax.Array | None = None
    lookup_accepted: jax.Array | None = None

    @classmethod
    def zeros(
        cls, batch_size: int, gamma: int, ranks: tuple[int, int] | None = None
    ) -> DecodeStats:
        """ranks: (D, W) to count the accepted sibling ranks (None: no counter)."""
        count = jnp.zeros((batch_size,), jnp.int32)
        return cls(
            target_calls=count,
            draft_calls=count,
            drafted=count,
            accepted=count,
            emitted=count,
            beta_sum=jnp.zeros((batch_size,), jnp.float32),
            accepted_at=jnp.zeros((batch_size, gamma), jnp.int32),
            verified_at=jnp.zeros((batch_size, gamma), jnp.int32),
            nan_logits=jnp.zeros((batch_size,), jnp.bool_),
            nan_draft_logits=jnp.zeros((batch_size,), jnp.bool_),
            accepted_rank=None if ranks is None else jnp.zeros((batch_size, *ranks), jnp.int32),
        )

    @property
    def verified(self) -> jax.Array:
        """[B] draft positions tested against the target."""
        return jnp.sum(self.verified_at, axis=-1)

    @property
    def alpha(self) -> jax.Array:
        """[B] mean beta over verified positions (the paper's alpha, per row)."""
        return self.beta_sum / jnp.maximum(self.verified, 1)

    @property
    def tokens_per_call(self) -> jax.Array:
        """[B] tau: generated tokens per target call (prefill excluded)."""
        return self.emitted / jnp.maximum(self.target_calls, 1)

    @property
    def is_speculative(self) -> bool:
        return self.accepted_at.shape[-1] > 0

    def __getitem__(self, name: str) -> jax.Array:
        if name not in self.names():
            raise KeyError(name)
        return getattr(self, name)

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def names(self) -> tuple[str, ...]:
        """Field and derived names readable with `stats[name]`."""
        fields = tuple(
            f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None
        )
        return fields + ("verified", "alpha", "tokens_per_call")

    def keys(self) -> tuple[str, ...]:
        return self.names()

    def items(self) -> list[tuple[str, jax.Array]]:
        return [(name, self[name]) for name in self.names()]


@flax.struct.dataclass
class DecodeOutput:
    """Result of a decode.

    tokens: [B, max_decode_len] int32 generated tokens, EOS included, 0 after it.
    lengths: [B] int32 generated tokens per row (EOS included).
    stats: `DecodeStats`, per row.
    lenience: the acceptance rule's factor; `exact` is False when it was below 1 (lossy output).
    round_offsets: [B, max_decode_len] int32, each token's place in the round that emitted it (0
      the round's first token, n the token after n accepted drafts; plain decoding: all 0), 0
      after each row's length; the exactness certificate tests each place apart.
    """

    tokens: jax.Array
    lengths: jax.Array
    stats: DecodeStats
    lenience: float = flax.struct.field(pytree_node=False, default=1.0)
    round_offsets: jax.Array | None = None

    @property
    def exact(self) -> bool:
        return self.lenience == 1.0


@flax.struct.dataclass
class LoopState:
    """The `lax.while_loop` carry (B = batch, G = gamma, T = max_decode_len).

    target / draft: the models' decode states (draft is None for plain decoding).
    pos: [B] absolute position of `last`, the newest token not yet fed to the target.
    last: [B] that token (the last prompt token, or the decoder start token, at first).
    prev: [B] the token at pos - 1, which the draft re-feeds each round (docs/design.md §3).
    rng: PRNG key, split once per step / round.
    tokens: [B, T + G + 1] output buffer (slack for a whole block written past the limit).
    offsets: [B, T + G + 1] each written token's place in its round (`DecodeOutput.round_offsets`).
    lengths: [B] generated tokens so far;  done: [B] bool, EOS emitted or T reached.
    budget: [B] draft tokens each row wants next round (gamma, unless a GammaPolicy adapts it).
    stats: `DecodeStats`.
    """

    target: DecodeState
    draft: DecodeState | None
    pos: jax.Array
    last: jax.Array
    prev: jax.Array
    rng: jax.Array
    tokens: jax.Array
    offsets: jax.Array
    lengths: jax.Array
    done: jax.Array
    budget: jax.Array
    stats: DecodeStats


def prefill(
    model: LanguageModel,
    params: Any,
    batch: dict[str, jax.Array],
    cache_len: int,
    features: bool = False,
) -> tuple[DecodeState, jax.Array, jax.Array, jax.Array]:
    """Builds the initial state: (state, pos [B], last [B], prev [B]).

    Decoder-only: the whole right-padded prompt is written once; the last prompt token becomes `last`
    (its cache slot is rewritten by the first round). Encoder-decoder: encode, start from the
    model's decoder start token. features=True (decoder-only) appends the prompt's hidden states
    [B, P, E] (`LanguageModel.extend_features`) to the tuple, for a draft that reads them.
    """
    state = model.init_state(params, batch, cache_len)
    if model.is_encoder_decoder:
        zeros = jnp.zeros((_batch_size(batch),), jnp.int32)
        start = jnp.full_like(zeros, model.decoder_start_id)
        return state.replace(index=zeros), zeros, start, start
    prompt = batch["prompt"].astype(jnp.int32)
    if features:
        _, hidden, state = model.extend_features(params, state, prompt)
    else:
        _, state = model.extend(params, state, prompt)  # logits unused: XLA drops the projection
    pos = batch["prompt_lengths"].astype(jnp.int32) - 1
    last = jnp.take_along_axis(prompt, pos[:, None], axis=1)[:, 0]
    prev = jnp.take_along_axis(prompt, jnp.maximum(pos - 1, 0)[:, None], axis=1)[:, 0]
    start = (state.replace(index=pos), pos, last, prev)
    return (*start, hidden) if features else start


def teacher_forced_logits(
    model: LanguageModel, params: Any, batch: dict[str, jax.Array], tokens: jax.Array
) -> jax.Array:
    """The target's logits [B, T, V] float32 that predicted each of `tokens` [B, T] (outputs
    after the batch's prompts), teacher-forced: one prefill, then one extend over `last` and the
    tokens but the last. Row b's logits at t are the ones a decode reads before emitting
    tokens[b, t] (up to the last bits of a block against a one-token product)."""
    width, steps = inputs.input_tokens(batch).shape[1], tokens.shape[1]
    # prefill leaves `last` (the last prompt token, or T5's start token) unfed at `pos`
    state, _, last, _ = prefill(model, params, batch, model.cache_length(width, steps, 1))
    feed = jnp.concatenate([last[:, None], tokens[:, :-1]], axis=1).astype(jnp.int32)
    logits, _ = model.extend(params, state, feed)
    return logits.astype(jnp.float32)


def initial_loop_state(
    target_state, draft_state, pos, last, prev, rng, config: DecodeConfig
) -> LoopState:
    size = pos.shape[0]
    return LoopState(
        target=target_state,
        draft=draft_state,
        pos=pos,
        last=last,
        prev=prev,
        rng=rng,
        tokens=jnp.zeros((size, config.max_decode_len + config.block), jnp.int32),
        offsets=jnp.zeros((size, config.max_decode_len + config.block), jnp.int32),
        lengths=jnp.zeros((size,), jnp.int32),
        done=jnp.zeros((size,), jnp.bool_),
        budget=jnp.full((size,), initial_budget(config), jnp.int32),
        stats=DecodeStats.zeros(size, config.gamma or 0, rank_counter(config)),
    )


def rank_counter(config: DecodeConfig) -> tuple[int, int] | None:
    """(D, W) of `DecodeStats.accepted_rank` when config.count_ranks asks for it, else None."""
    if not config.count_ranks:
        return None
    return config.tree.depth, int(config.tree.children.shape[1])


def initial_budget(config: DecodeConfig) -> int:
    gamma, policy = config.gamma or 0, config.gamma_policy
    return min(policy.initial, gamma) if policy.kind == "schedule" else gamma


def constrain(partitioner: Any, model: LanguageModel, state: Any, role: str) -> Any:
    """Pins a decode state to its shardings (batch on 'data', heads as the rules say), so GSPMD
    keeps the cache split through the loop instead of choosing a layout of its own."""
    return state if partitioner is None else partitioner.constrain_state(model, state, role)


def _batch_size(batch: dict[str, jax.Array]) -> int:
    return inputs.input_tokens(batch).shape[0]
