"""Plain and speculative decoding: the whole decode loop lives in this file.

Both decoders are one jitted function around `lax.while_loop`; nothing returns to the host until the
batch is finished (docs/design.md §4). Every row keeps its own position, acceptance count, EOS and
length limit; shapes are static (batch, cache length, gamma) and finished rows keep computing with
their results masked.

The file reads top to bottom:
  1. `DecodeConfig`, the loop state and the outputs (typed, documented fields);
  2. shared pieces: prefill, emitting a block of tokens;
  3. plain decoding, one target call per token (`autoregressive_loop`);
  4. speculative decoding: `ModelDrafter` (the paper's draft: a smaller model; other drafts
     implement the same `drafts.base.Drafter` interface in their own files), `_speculative_round`
     (one round in one screen) and `speculative_loop`;
  5. the public calls `autoregressive_decode` / `speculative_decode`, input validation and the NaN
     check.

For ahead-of-time compilation use JAX's own API on the jitted loops, e.g.
`decoding.speculative_loop.lower(target, tp, draft, dp, batch, rng, config=cfg).compile()`, after
`validate_batch` (and, with a partitioner, `place_inputs`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from speculative import inputs
from speculative.drafts.base import DraftContext, Drafter, StatelessDrafter, draft_confidence
from speculative.models.base import DecodeState, LanguageModel, write_rows
from speculative.sampling import SamplingConfig, sample, verify_detailed

# ------------------------------------------------------------------------------------------------
# 1. Configuration, loop state and outputs.


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


@dataclasses.dataclass(frozen=True)
class GammaPolicy:
    """How many of the gamma draft slots each row uses per round (DecodeConfig.gamma is the most).

    kind:
      "fixed": every row drafts gamma tokens every round (the paper's algorithm).
      "confidence": a row stops drafting after a token whose draft confidence max_x q(x) is below
        `threshold` (Hugging Face's assistant confidence stop; `drafts.base.draft_confidence`).
      "schedule": each row's length starts at `initial` and moves by +2 after a round that accepted
        every drafted token, by -1 otherwise, within 1..gamma (Hugging Face's heuristic schedule,
        per row here).
    Shapes stay static: the target always scores gamma + 1 positions and the unused slots are never
    accepted. Exact: a row's length depends only on its draft and on earlier rounds.
    """

    kind: str = "fixed"
    threshold: float = 0.4
    initial: int = 4

    def __post_init__(self):
        if self.kind not in ("fixed", "confidence", "schedule"):
            raise ValueError(
                f"gamma policy must be 'fixed', 'confidence' or 'schedule', got {self.kind!r}"
            )
        if not 0.0 <= self.threshold < 1.0:
            raise ValueError(f"confidence threshold must be in [0, 1), got {self.threshold!r}")
        if not _is_int(self.initial) or self.initial < 1:
            raise ValueError(
                f"schedule initial gamma must be an integer >= 1, got {self.initial!r}"
            )

    @property
    def adaptive(self) -> bool:
        return self.kind != "fixed"


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Everything static about one decode; hashable, so it is a static `jax.jit` argument.

    max_decode_len: tokens generated at most per row (>= 1).
    stop_ids: a row stops after emitting any of these (an int is accepted and becomes a 1-tuple).
    sampling: temperature / top-k / top-p, shared by the draft and the target.
    gamma: draft tokens proposed per speculative round (>= 1); None for plain decoding.
    lenience: l in (0, 1], the acceptance rule's factor (`sampling.verify_detailed`). 1 (the
      default) is exact; l < 1 is the paper's lossy lenient acceptance, and every output made with
      it says so (`DecodeOutput.exact` is False).
    gamma_policy: `GammaPolicy`, how many of the gamma slots each row drafts (default: all).
    """

    max_decode_len: int
    stop_ids: tuple[int, ...]
    sampling: SamplingConfig = SamplingConfig()
    gamma: int | None = None
    lenience: float = 1.0
    gamma_policy: GammaPolicy = GammaPolicy()

    def __post_init__(self):
        ids = self.stop_ids
        ids = (ids,) if isinstance(ids, (int, np.integer)) else tuple(ids)
        if not ids or not all(isinstance(i, (int, np.integer)) for i in ids):
            raise ValueError(
                f"eos_id must be an int or a non-empty sequence of ints, got {self.stop_ids!r}"
            )
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in ids))
        if not isinstance(self.sampling, SamplingConfig):
            raise ValueError(
                f"sampling must be a SamplingConfig, got {type(self.sampling).__name__}"
            )
        if not _is_int(self.max_decode_len) or self.max_decode_len < 1:
            raise ValueError(f"max_decode_len must be an integer >= 1, got {self.max_decode_len!r}")
        object.__setattr__(self, "max_decode_len", int(self.max_decode_len))
        if self.gamma is not None:
            if not _is_int(self.gamma) or self.gamma < 1:
                raise ValueError(f"gamma must be an integer >= 1, got {self.gamma!r}")
            object.__setattr__(self, "gamma", int(self.gamma))
        if isinstance(self.lenience, bool) or not 0.0 < float(self.lenience) <= 1.0:
            raise ValueError(f"lenience must be in (0, 1], got {self.lenience!r}")
        object.__setattr__(self, "lenience", float(self.lenience))
        if not isinstance(self.gamma_policy, GammaPolicy):
            raise ValueError(f"gamma_policy must be a GammaPolicy, got {self.gamma_policy!r}")

    @property
    def exact(self) -> bool:
        """Whether outputs follow the target's distribution (no lenience)."""
        return self.lenience == 1.0

    @property
    def block(self) -> int:
        """Tokens fed to the target per call: gamma + 1 speculative, 1 plain."""
        return 1 if self.gamma is None else self.gamma + 1

    def cache_length(self, model: LanguageModel, batch: dict[str, jax.Array]) -> int:
        """The static cache length `model` needs for this decode of `batch`."""
        return model.cache_length(
            inputs.input_tokens(batch).shape[1], self.max_decode_len, self.block
        )


@flax.struct.dataclass
class DecodeStats:
    """Per-row counters, accumulated inside the loop and returned as they are.

    B = batch, G = gamma (0 for plain decoding). Every field is [B] unless noted.
      target_calls: target forward calls after the prefill (one per round / per plain step).
      draft_calls: draft forward steps (gamma per round, or the row's proposed length under an
        adaptive GammaPolicy; 0 for plain decoding).
      drafted / accepted: draft tokens proposed / accepted.
      emitted: generated tokens (EOS included); equals DecodeOutput.lengths.
      beta_sum: float32 sum of beta = sum_x min(p(x), q(x)) over verified positions.
      accepted_at / verified_at: [B, G] how often draft position i was accepted / tested.
      nan_logits: bool, the target produced a NaN logit for this row while it was active.
      nan_draft_logits: bool, the draft did (its q would be NaN: the round's output garbage).
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

    @classmethod
    def zeros(cls, batch_size: int, gamma: int) -> DecodeStats:
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
        fields = tuple(f.name for f in dataclasses.fields(self))
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
    """

    tokens: jax.Array
    lengths: jax.Array
    stats: DecodeStats
    lenience: float = flax.struct.field(pytree_node=False, default=1.0)

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
    lengths: jax.Array
    done: jax.Array
    budget: jax.Array
    stats: DecodeStats


# ------------------------------------------------------------------------------------------------
# 2. Shared pieces: prefill, emitting a block of tokens.


def prefill(
    model: LanguageModel, params: Any, batch: dict[str, jax.Array], cache_len: int
) -> tuple[DecodeState, jax.Array, jax.Array, jax.Array]:
    """Builds the initial state: (state, pos [B], last [B], prev [B]).

    Decoder-only: the whole right-padded prompt is written once; the last prompt token becomes `last`
    (its cache slot is rewritten by the first round). Encoder-decoder: encode, start from the
    model's decoder start token.
    """
    state = model.init_state(params, batch, cache_len)
    if model.is_encoder_decoder:
        zeros = jnp.zeros((_batch_size(batch),), jnp.int32)
        start = jnp.full_like(zeros, model.decoder_start_id)
        return state.replace(index=zeros), zeros, start, start
    prompt = batch["prompt"].astype(jnp.int32)
    _, state = model.extend(params, state, prompt)  # logits unused: XLA drops the projection
    pos = batch["prompt_lengths"].astype(jnp.int32) - 1
    last = jnp.take_along_axis(prompt, pos[:, None], axis=1)[:, 0]
    prev = jnp.take_along_axis(prompt, jnp.maximum(pos - 1, 0)[:, None], axis=1)[:, 0]
    return state.replace(index=pos), pos, last, prev


def _initial_loop_state(
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
        lengths=jnp.zeros((size,), jnp.int32),
        done=jnp.zeros((size,), jnp.bool_),
        budget=jnp.full((size,), _initial_budget(config), jnp.int32),
        stats=DecodeStats.zeros(size, config.gamma or 0),
    )


def _initial_budget(config: DecodeConfig) -> int:
    gamma, policy = config.gamma or 0, config.gamma_policy
    return min(policy.initial, gamma) if policy.kind == "schedule" else gamma


def _emit(
    s: LoopState, block: jax.Array, count: jax.Array, config: DecodeConfig
) -> tuple[LoopState, jax.Array]:
    """Appends the first count[b] tokens of block[b] to each active row, stopping at a stop id or
    at max_decode_len.

    Args:
      s: loop state (its tokens [B, T + slack], lengths [B], done [B] are read).
      block: [B, K] candidate tokens; count [B] how many of them the round produced (1..K).
    Returns:
      (s with tokens, lengths and done after the append, emitted [B]).
    """
    limit = config.max_decode_len
    in_block = jnp.arange(block.shape[1])[None, :] < count[:, None]
    is_stop = jnp.isin(block, jnp.asarray(config.stop_ids, jnp.int32)) & in_block
    has_stop = jnp.any(is_stop, axis=1)
    count = jnp.where(has_stop, jnp.argmax(is_stop, axis=1) + 1, count)
    count = jnp.minimum(count, limit - s.lengths)
    count = jnp.where(s.done, 0, count)
    # Writing the whole block is safe: slots past the new length are overwritten or masked later.
    tokens = write_rows(s.tokens, block, jnp.where(s.done, limit, s.lengths))
    lengths = s.lengths + count
    done = s.done | has_stop | (lengths >= limit)
    return s.replace(tokens=tokens, lengths=lengths, done=done), count


def _output(s: LoopState, config: DecodeConfig, partitioner: Any) -> DecodeOutput:
    """Final loop state -> DecodeOutput (tokens [B, T], zeros after each row's length)."""
    limit = config.max_decode_len
    tokens = s.tokens[:, :limit]
    tokens = jnp.where(jnp.arange(limit)[None, :] < s.lengths[:, None], tokens, 0)
    out = DecodeOutput(tokens, s.lengths, s.stats, config.lenience)
    return out if partitioner is None else partitioner.constrain_rows(out)


def _has_nan(logits: jax.Array) -> jax.Array:
    """[B, L, V] -> [B] bool: any NaN logit in the row."""
    return jnp.any(jnp.isnan(logits), axis=(1, 2))


def _constrain(partitioner: Any, model: LanguageModel, state: Any, role: str) -> Any:
    """Pins a decode state to its shardings (batch on 'data', heads as the rules say), so GSPMD
    keeps the cache split through the loop instead of choosing a layout of its own."""
    return state if partitioner is None else partitioner.constrain_state(model, state, role)


def _while_not_done(body, state: LoopState) -> LoopState:
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)


# ------------------------------------------------------------------------------------------------
# 3. Plain autoregressive decoding (the baseline).


@functools.partial(jax.jit, static_argnames=("model", "config", "partitioner"))
def autoregressive_loop(
    model: LanguageModel,
    params: Any,
    batch: dict[str, jax.Array],
    rng: jax.Array,
    config: DecodeConfig,
    partitioner: Any = None,
) -> DecodeOutput:
    """Plain decoding, jitted: one target call per token. Inputs must pass `validate_batch`."""
    block = dataclasses.replace(config, gamma=None, lenience=1.0)
    state, pos, last, prev = prefill(model, params, batch, block.cache_length(model, batch))
    state = _constrain(partitioner, model, state, "target")

    def step(s: LoopState) -> LoopState:
        active = ~s.done
        rng, step_rng = jax.random.split(s.rng)
        logits, target = model.extend(params, s.target.replace(index=s.pos), s.last[:, None])
        token, _ = sample(step_rng, logits[:, 0], config.sampling)
        emitted_state, emitted = _emit(s, token[:, None], jnp.ones_like(token), block)
        stats = s.stats.replace(
            target_calls=s.stats.target_calls + active,
            emitted=s.stats.emitted + emitted,
            nan_logits=s.stats.nan_logits | (active & _has_nan(logits)),
        )
        return emitted_state.replace(
            target=_constrain(partitioner, model, target, "target"),
            pos=s.pos + emitted,
            last=jnp.where(active, token, s.last),
            rng=rng,
            stats=stats,
        )

    s = _while_not_done(step, _initial_loop_state(state, None, pos, last, prev, rng, block))
    return _output(s, block, partitioner)


# ------------------------------------------------------------------------------------------------
# 4. Speculative decoding.


@dataclasses.dataclass(frozen=True)
class ModelDrafter(StatelessDrafter):
    """The paper's draft: a smaller LanguageModel sampled autoregressively (drafts/base.Drafter).

    Its state is the model's DecodeState. Each round re-feeds [prev, last] at pos - 1, which both
    rewinds past rejected tokens and writes the cache slot of the target's replacement token
    (docs/design.md §3), then samples gamma tokens.
    """

    model: LanguageModel

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def check_target(self, target: LanguageModel) -> None:
        check_pair(target, self.model)

    def validate(self, batch: dict[str, jax.Array], config: DecodeConfig) -> None:
        validate_batch(self.model, batch, config)

    def place_params(self, partitioner: Any, params: Any) -> Any:
        return partitioner.place_params(self.model, params, "draft")

    def model_params(self, params: Any) -> Any:
        """The draft model's parameters within `params` (all of them; a self-draft takes a part)."""
        return params

    def init(self, params: Any, batch: dict[str, jax.Array], config: DecodeConfig) -> DecodeState:
        params = self.model_params(params)
        state, _, _, _ = prefill(self.model, params, batch, config.cache_length(self.model, batch))
        return state

    def constrain(self, partitioner: Any, state: DecodeState) -> DecodeState:
        return _constrain(partitioner, self.model, state, "draft")

    def propose(
        self,
        params: Any,
        state: DecodeState,
        context: DraftContext,
        rng: jax.Array,
        gamma: int,
        sampling: SamplingConfig,
    ) -> tuple[jax.Array, jax.Array, DecodeState]:
        """gamma tokens per row: (tokens [B, G], logits [B, G, V] they were drawn from, state with
        index pos + G)."""
        params = self.model_params(params)
        draft, pos, last, prev = self.model, context.pos, context.last, context.prev
        # Catch-up block [prev, last] at pos - 1 (docs/design.md §3); rows at position 0 (nothing
        # before `last`) feed [last, last] at 0 and read the first logits (slot 1 is overwritten
        # next).
        start = jnp.maximum(pos - 1, 0)
        first = jnp.where(pos > 0, prev, last)
        block = jnp.stack([first, last], 1)
        logits2, state = draft.extend(params, state.replace(index=start), block)
        logits = jnp.take_along_axis(logits2, (pos - start)[:, None, None], axis=1)[:, 0]
        state = state.replace(index=pos + 1)
        rngs = jax.random.split(rng, gamma)
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


def _draft_context(s: LoopState, batch: dict[str, jax.Array], config: DecodeConfig) -> DraftContext:
    if "prompt" in batch:
        prompt, prompt_lengths = batch["prompt"], batch["prompt_lengths"]
    else:
        prompt = batch["encoder_input_tokens"]
        prompt_lengths = jnp.sum(prompt != 0, axis=1)
    return DraftContext(
        pos=s.pos,
        last=s.last,
        prev=s.prev,
        tokens=s.tokens,
        lengths=s.lengths,
        prompt=prompt.astype(jnp.int32),
        prompt_lengths=prompt_lengths.astype(jnp.int32),
        done=s.done,
        budget=s.budget,
        min_confidence=_min_confidence(config),
        adaptive=config.gamma_policy.adaptive,
    )


def _min_confidence(config: DecodeConfig) -> float:
    policy = config.gamma_policy
    return policy.threshold if policy.kind == "confidence" else 0.0


def _draft_lengths(
    context: DraftContext, draft_logits: jax.Array, sampling: SamplingConfig
) -> jax.Array:
    """[B] tokens each row proposes: its budget, cut after the first draft token whose confidence
    is below the threshold (the token itself stays: it was proposed)."""
    if not context.adaptive:
        return context.budget
    lengths = context.budget
    if context.min_confidence > 0:
        unsure = draft_confidence(draft_logits, sampling) < context.min_confidence  # [B, G]
        gamma = unsure.shape[1]
        first_unsure = jnp.where(jnp.any(unsure, axis=1), jnp.argmax(unsure, axis=1) + 1, gamma)
        lengths = jnp.minimum(lengths, first_unsure)
    return lengths


def _speculative_round(
    s: LoopState,
    target: LanguageModel,
    target_params: Any,
    drafter: Drafter,
    draft_params: Any,
    batch: dict[str, jax.Array],
    config: DecodeConfig,
) -> LoopState:
    """One draft-verify-emit round over the whole batch; inactive rows are left unchanged.

    1. draft: x_1..x_G ~ q_1..q_G (a model draft first re-feeds [prev, last]);
    2. target: one call on [last, x_1..x_G] at pos -> p_1..p_{G+1};
    3. verify: n accepted, the next token from the residual or p_{G+1};
    4. emit x_1..x_n, next; the target index moves to pos + n + 1 (rollback = index reset).
    """
    gamma, active = config.gamma, ~s.done
    rng, draft_rng, verify_rng = jax.random.split(s.rng, 3)
    context = _draft_context(s, batch, config)
    draft_tokens, draft_logits, draft_state = drafter.propose(
        draft_params, s.draft, context, draft_rng, gamma, config.sampling
    )
    proposed = _draft_lengths(context, draft_logits, config.sampling)  # [B] (gamma when fixed)
    block = jnp.concatenate([s.last[:, None], draft_tokens], axis=1)  # [B, G+1]
    target_logits, target_state = target.extend(target_params, s.target.replace(index=s.pos), block)
    n, next_token, beta = verify_detailed(
        verify_rng, target_logits, draft_logits, draft_tokens, config.sampling, config.lenience,
        proposed if config.gamma_policy.adaptive else None,
    )  # fmt: skip

    # Emit x_1..x_n then next_token: put next_token at block position n.
    rows = jnp.arange(n.shape[0])
    candidates = jnp.concatenate([draft_tokens, jnp.zeros_like(s.last)[:, None]], axis=1)
    candidates = candidates.at[rows, n].set(next_token)
    emitted_state, emitted = _emit(s, candidates, n + 1, config)

    pos = jnp.where(active, s.pos + n + 1, s.pos)
    prev = jnp.where(n > 0, draft_tokens[rows, jnp.maximum(n - 1, 0)], s.last)
    # Positions 1..min(n+1, proposed) were tested against the target; later ones never were.
    position = jnp.arange(gamma)[None, :]
    verified = (position <= n[:, None]) & (position < proposed[:, None]) & active[:, None]
    accepted_at = (position < n[:, None]) & active[:, None]
    st = s.stats
    stats = st.replace(
        target_calls=st.target_calls + active,
        draft_calls=st.draft_calls + proposed * active,
        drafted=st.drafted + proposed * active,
        accepted=st.accepted + jnp.where(active, n, 0),
        emitted=st.emitted + emitted,
        beta_sum=st.beta_sum + jnp.sum(jnp.where(verified, beta, 0.0), axis=1),
        accepted_at=st.accepted_at + accepted_at,
        verified_at=st.verified_at + verified,
        nan_logits=st.nan_logits | (active & _has_nan(target_logits)),
        nan_draft_logits=st.nan_draft_logits | (active & _has_nan(draft_logits)),
    )
    return emitted_state.replace(
        target=target_state.replace(index=pos),
        draft=draft_state,
        pos=pos,
        last=jnp.where(active, next_token, s.last),
        prev=jnp.where(active, prev, s.prev),
        rng=rng,
        budget=jnp.where(active, _next_budget(s.budget, n, proposed, config), s.budget),
        stats=stats,
    )


def _next_budget(
    budget: jax.Array, n: jax.Array, proposed: jax.Array, config: DecodeConfig
) -> jax.Array:
    """[B] next round's draft budget: +2 after a fully accepted block, -1 otherwise (schedule)."""
    if config.gamma_policy.kind != "schedule":
        return budget
    return jnp.clip(jnp.where(n >= proposed, budget + 2, budget - 1), 1, config.gamma)


@functools.partial(jax.jit, static_argnames=("target", "draft", "config", "partitioner"))
def speculative_loop(
    target: LanguageModel,
    target_params: Any,
    draft: LanguageModel | Drafter,
    draft_params: Any,
    batch: dict[str, jax.Array],
    rng: jax.Array,
    config: DecodeConfig,
    partitioner: Any = None,
) -> DecodeOutput:
    """Speculative decoding, jitted. draft: a smaller LanguageModel or any `Drafter`;
    config.gamma must be set; inputs must pass `validate_batch` for the target and the draft."""
    drafter = as_drafter(draft)
    target_state, pos, last, prev = prefill(
        target, target_params, batch, config.cache_length(target, batch)
    )
    draft_state = drafter.init(draft_params, batch, config)

    def body(s: LoopState) -> LoopState:
        s = _speculative_round(s, target, target_params, drafter, draft_params, batch, config)
        return s.replace(
            target=_constrain(partitioner, target, s.target, "target"),
            draft=drafter.constrain(partitioner, s.draft),
        )

    init = _initial_loop_state(
        _constrain(partitioner, target, target_state, "target"),
        drafter.constrain(partitioner, draft_state),
        pos,
        last,
        prev,
        rng,
        config,
    )
    return _output(_while_not_done(body, init), config, partitioner)


# ------------------------------------------------------------------------------------------------
# 5. Public calls, validation and the NaN check.


def autoregressive_decode(
    model: LanguageModel,
    params: Any,
    batch: dict[str, jax.Array],
    *,
    max_decode_len: int,
    sampling: SamplingConfig = SamplingConfig(),
    eos_id: int | Sequence[int],
    rng: jax.Array | None = None,
    partitioner: Any = None,
) -> DecodeOutput:
    """Plain decoding of `model`, one target call per token.

    Args:
      batch: {"prompt": int32[B, P], "prompt_lengths": int32[B]} (decoder-only, right-padded) or
        {"encoder_input_tokens": int32[B, L]} (encoder-decoder, 0 = pad).
      max_decode_len: tokens to generate at most per row.
      eos_id: a row stops after emitting it; a sequence of ids stops at any of them (e.g. Qwen's
        <|im_end|> and <|endoftext|>).
      partitioner: optional `partitioning.Partitioner`: run SPMD on its mesh (params, batch and
        cache sharded by its rules; outputs sharded by rows over 'data').
    Returns:
      DecodeOutput with tokens [B, max_decode_len], lengths [B] and per-row `DecodeStats`.
    """
    config = DecodeConfig(max_decode_len, eos_id, sampling)
    return _run(autoregressive_loop, model, params, None, None, batch, config, rng, partitioner)


def speculative_decode(
    target: LanguageModel,
    target_params: Any,
    draft: LanguageModel | Drafter,
    draft_params: Any,
    batch: dict[str, jax.Array],
    *,
    gamma: int,
    max_decode_len: int,
    eos_id: int | Sequence[int],
    sampling: SamplingConfig = SamplingConfig(),
    rng: jax.Array | None = None,
    partitioner: Any = None,
    lenience: float = 1.0,
    gamma_policy: GammaPolicy = GammaPolicy(),
) -> DecodeOutput:
    """Exact speculative decoding: output distributed as `autoregressive_decode(target, ...)`.

    Args:
      target, draft: models sharing a vocabulary (same vocab_size; compare token lists with
        `vocab.check_compatible` when loading). draft may also be any `drafts.base.Drafter`
        (n-gram tables, prompt lookup, ...), with draft_params its arrays.
      batch: as for `autoregressive_decode`.
      gamma: draft tokens proposed per round (>= 1).
      partitioner: optional `partitioning.Partitioner`: run SPMD on its mesh, target and draft
        each sharded by their own rules (see `autoregressive_decode`).
      lenience: 1 (exact, the default) or the paper's lossy lenient acceptance factor in (0, 1);
        the output's `exact` says which.
      gamma_policy: how many of the gamma slots each row drafts per round (`GammaPolicy`; default
        all of them).
    Returns:
      DecodeOutput; its `DecodeStats` hold per row target_calls, draft_calls (a call = one draft
      forward step), drafted, accepted, alpha (mean of sum_x min(p, q) over verified positions),
      tokens_per_call (tau), accepted_at / verified_at [B, G].
    """
    config = DecodeConfig(max_decode_len, eos_id, sampling, gamma, lenience, gamma_policy)
    drafter = as_drafter(draft)
    drafter.check_target(target)
    return _run(
        speculative_loop, target, target_params, drafter, draft_params, batch, config, rng,
        partitioner,
    )  # fmt: skip


def _run(
    loop, model, params, drafter, draft_params, batch, config, rng, partitioner
) -> DecodeOutput:
    """Validates, places (with a partitioner) and runs a jitted loop; drafter None for plain
    decoding. Raises on NaN logits after the loop."""
    validate_batch(model, batch, config)
    if drafter is not None:
        drafter.validate(batch, config)
    rng = jax.random.PRNGKey(0) if rng is None else rng
    if partitioner is not None:
        params = partitioner.place_params(model, params, "target")
        if drafter is not None:
            draft_params = drafter.place_params(partitioner, draft_params)
        batch, rng = place_inputs(partitioner, batch, rng)
    if drafter is None:
        out = loop(model, params, batch, rng, config, partitioner)
    else:
        out = loop(model, params, drafter, draft_params, batch, rng, config, partitioner)
    return check_finite(out, "model" if drafter is None else "target")


def place_inputs(partitioner: Any, batch: dict[str, jax.Array], rng: jax.Array) -> tuple:
    """Batch rows on 'data', the rng replicated: the jitted loop gets committed, sharded inputs."""
    return partitioner.place_batch(batch), jax.device_put(rng, partitioner.replicated())


def check_pair(target: LanguageModel, draft: LanguageModel) -> None:
    """Raises ValueError unless the draft can propose tokens for the target."""
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"draft and target vocabularies differ in size: draft {draft.vocab_size}, "
            f"target {target.vocab_size}"
        )
    if draft.is_encoder_decoder != target.is_encoder_decoder:
        raise ValueError("draft and target must both be decoder-only or both encoder-decoder")


def validate_batch(model: LanguageModel, batch: dict[str, jax.Array], config: DecodeConfig) -> None:
    """Raises ValueError naming what is wrong when `batch` cannot be decoded by `model`."""
    limit = model.max_length
    if model.is_encoder_decoder:
        if "encoder_input_tokens" not in batch:
            raise ValueError("encoder-decoder models need batch['encoder_input_tokens'] [B, L]")
        if limit is not None and config.max_decode_len + config.block > limit:
            raise ValueError(
                f"max_decode_len {config.max_decode_len} exceeds the model limit {limit}"
            )
        return
    if "prompt" not in batch or "prompt_lengths" not in batch:
        raise ValueError(
            "decoder-only models need batch['prompt'] [B, P] and ['prompt_lengths'] [B]"
        )
    prompt, lengths = batch["prompt"], _to_host(batch["prompt_lengths"])
    if prompt.ndim != 2 or lengths.shape != (prompt.shape[0],):
        raise ValueError(
            f"prompt must be [B, P] and prompt_lengths [B]; got {prompt.shape} and {lengths.shape}"
        )
    if np.any(lengths < 1) or np.any(lengths > prompt.shape[1]):
        raise ValueError(
            f"prompt_lengths must be in 1..{prompt.shape[1]} (the padded prompt width); "
            f"got {lengths.tolist()}"
        )
    needed = int(lengths.max()) + config.max_decode_len
    if limit is not None and needed > limit:
        raise ValueError(
            f"prompt ({int(lengths.max())} tokens) + max_decode_len ({config.max_decode_len}) = "
            f"{needed} is longer than the model context / cache limit max_seq_len={limit}"
        )


class NaNLogitsError(FloatingPointError):
    """A model produced NaN logits. role: "target", "draft" or "model"; rows: the batch rows."""

    def __init__(self, role: str, rows: list[int]):
        self.role, self.rows = role, rows
        super().__init__(
            f"the {role} produced NaN logits for batch rows {rows}; check the checkpoint "
            "(corrupt weights) or use float32 instead of a low-precision dtype"
        )


def check_finite(out: DecodeOutput, which: str) -> DecodeOutput:
    """Raises NaNLogitsError (a FloatingPointError) on NaN logits of the target (named `which`) or
    of the draft: one host check after the loop (never inside it)."""
    for role, flags in ((which, out.stats.nan_logits), ("draft", out.stats.nan_draft_logits)):
        bad = _to_host(flags)
        if bad.any():
            raise NaNLogitsError(role, np.flatnonzero(bad).tolist())
    return out


def _batch_size(batch: dict[str, jax.Array]) -> int:
    return inputs.input_tokens(batch).shape[0]


def _to_host(x: Any) -> np.ndarray:
    """numpy value of a small array; a global array spread over several hosts is all-gathered."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
