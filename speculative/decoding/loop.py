"""The decode loop, whole: plain decoding (`autoregressive_loop`) and speculative decoding
(`speculative_loop`, one round in `_speculative_round`), each one jitted `lax.while_loop`.

Nothing returns to the host until the batch is finished (docs/design.md §4). Every row keeps its
own position, acceptance count, EOS and length limit; shapes are static (batch, cache length,
gamma) and finished rows keep computing with their results masked. The draft is any `Drafter`
(decoding/drafter.py); a LanguageModel becomes the paper's `ModelDrafter`.

Inputs must pass `checks.validate_batch` (the public calls in decoding/api.py do that). For
ahead-of-time compilation use JAX's own API on the jitted loops, e.g.
`speculative_loop.lower(target, tp, draft, dp, batch, rng, config=cfg).compile()`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp

from speculative.decoding import acceptance
from speculative.decoding.config import DecodeConfig
from speculative.decoding.drafter import DraftContext, Drafter, DraftRequest, draft_confidence
from speculative.decoding.model_drafter import as_drafter
from speculative.decoding.sampling import SamplingConfig, sample
from speculative.decoding.state import (
    DecodeOutput,
    LoopState,
    constrain,
    initial_loop_state,
    prefill,
)
from speculative.models import precision
from speculative.models.base import LanguageModel, keep_path, write_rows

# ------------------------------------------------------------------------------------------------
# Shared pieces: emitting a block of tokens, the final output, the loop itself.


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
    start = jnp.where(s.done, limit, s.lengths)
    tokens = write_rows(s.tokens, block, start)
    places = jnp.broadcast_to(jnp.arange(block.shape[1], dtype=jnp.int32), block.shape)
    offsets = write_rows(s.offsets, places, start)
    lengths = s.lengths + count
    done = s.done | has_stop | (lengths >= limit)
    return s.replace(tokens=tokens, offsets=offsets, lengths=lengths, done=done), count


def _output(s: LoopState, config: DecodeConfig, partitioner: Any) -> DecodeOutput:
    """Final loop state -> DecodeOutput (tokens [B, T], zeros after each row's length)."""
    limit = config.max_decode_len
    counted = jnp.arange(limit)[None, :] < s.lengths[:, None]
    tokens = jnp.where(counted, s.tokens[:, :limit], 0)
    offsets = jnp.where(counted, s.offsets[:, :limit], 0)
    out = DecodeOutput(tokens, s.lengths, s.stats, config.lenience, offsets)
    return out if partitioner is None else partitioner.constrain_rows(out)


def _has_nan(logits: jax.Array) -> jax.Array:
    """[B, L, V] -> [B] bool: any NaN logit in the row."""
    return jnp.any(jnp.isnan(logits), axis=(1, 2))


def _while_not_done(body, state: LoopState) -> LoopState:
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)


# The loops compile with library dots only: reductions then sum in one order for every row count
# (models/precision.COMPILER_OPTIONS, docs/design.md §9).
_jit = functools.partial(jax.jit, compiler_options=precision.COMPILER_OPTIONS)


# ------------------------------------------------------------------------------------------------
# Plain autoregressive decoding (the baseline).


@functools.partial(_jit, static_argnames=("model", "config", "partitioner"))
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
    state = constrain(partitioner, model, state, "target")

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
            target=constrain(partitioner, model, target, "target"),
            pos=s.pos + emitted,
            last=jnp.where(active, token, s.last),
            rng=rng,
            stats=stats,
        )

    s = _while_not_done(step, initial_loop_state(state, None, pos, last, prev, rng, block))
    return _output(s, block, partitioner)


# ------------------------------------------------------------------------------------------------
# Speculative decoding.


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


@flax.struct.dataclass
class _Verdict:
    """What one round's verification decided (B rows, G = gamma or a tree's depth).

    tokens: [B, G] the draft tokens along the accepted path (a chain: all of them);
    num_accepted: [B] how many of them are kept; next_token: [B] the token after them;
    beta: [B, G] acceptance probabilities; tested: [B, G] positions tried against the target;
    kept: [B, G + 1] the verify block's offsets along the accepted path (the root first).
    """

    tokens: jax.Array
    num_accepted: jax.Array
    next_token: jax.Array
    beta: jax.Array
    tested: jax.Array
    kept: jax.Array


def _propose(s, drafter, draft_params, context, rng, config):
    """(tokens [B, N], logits or log q [B, N, V], draft state, proposed [B]): a chain of gamma
    tokens (N = gamma), or the nodes of config.tree."""
    request = DraftRequest(context, rng, config.sampling, config.gamma, config.tree)
    if config.tree is None:
        tokens, logits, state = drafter.propose(draft_params, s.draft, request)
        return tokens, logits, state, _draft_lengths(context, logits, config.sampling)
    tokens, log_q, state = drafter.propose_tree(draft_params, s.draft, request)
    return tokens, log_q, state, jnp.full_like(s.pos, config.gamma)


def _verify(rng, target_logits, target_state, draft_tokens, draft_logits, proposed, pos, config):
    """(_Verdict, target state with the accepted path's cache entries in place)."""
    v = acceptance.verify(
        config.acceptance, rng, target_logits, draft_logits, draft_tokens, proposed,
        sampling=config.sampling, lenience=config.lenience,
        adaptive=config.gamma_policy.adaptive, tree=config.tree,
    )  # fmt: skip
    root_and_path = jnp.concatenate([jnp.zeros_like(v.path[:, :1]), v.path], axis=1)
    if config.tree is None:  # a chain's path is 1..G: the drafts, their cache entries in place
        tokens = draft_tokens
    else:
        tokens = jnp.take_along_axis(draft_tokens, jnp.maximum(v.path - 1, 0), axis=1)
        target_state = keep_path(target_state, pos, root_and_path)
    verdict = _Verdict(tokens, v.num_accepted, v.next_token, v.beta, v.tested, root_and_path)
    return verdict, target_state


def _reads_features(drafter: Drafter) -> bool:
    """Whether the drafter asks for the target's hidden states (`observe_target`), as declared."""
    return drafter.reads_target_features


def _score(target, target_params, state, block, ancestors, drafter: Drafter):
    """The verify call: (logits [B, K, V], hidden states [B, K, E] for a draft that reads them
    or None, state)."""
    if _reads_features(drafter):
        return target.extend_features(target_params, state, block, ancestors)
    logits, state = target.extend(target_params, state, block, ancestors)
    return logits, None, state


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

    1. draft: x_1..x_G ~ q_1..q_G (a model draft first re-feeds [prev, last]), or a token tree;
    2. target: one call on [last, x_1..x_G] (or [last, tree nodes]) at pos -> p at every token;
    3. verify: n accepted, the next token from the residual or p after the last accepted;
    4. emit x_1..x_n, next (a tree: its accepted path, whose cache entries move into place); the
       target index moves to pos + n + 1 (rollback = index reset).
    """
    active = ~s.done
    rng, draft_rng, verify_rng = jax.random.split(s.rng, 3)
    context = _draft_context(s, batch, config)
    draft_tokens, draft_logits, draft_state, proposed = _propose(
        s, drafter, draft_params, context, draft_rng, config
    )
    block = jnp.concatenate([s.last[:, None], draft_tokens], axis=1)  # [B, N+1]
    ancestors = None if config.tree is None else config.tree.ancestors
    target_logits, features, target_state = _score(
        target, target_params, s.target.replace(index=s.pos), block, ancestors, drafter
    )
    v, target_state = _verify(
        verify_rng, target_logits, target_state, draft_tokens, draft_logits, proposed, s.pos, config
    )
    n = v.num_accepted

    # Emit x_1..x_n then next_token: put next_token at block position n.
    rows = jnp.arange(n.shape[0])
    candidates = jnp.concatenate([v.tokens, jnp.zeros_like(s.last)[:, None]], axis=1)
    candidates = candidates.at[rows, n].set(v.next_token)
    emitted_state, emitted = _emit(s, candidates, n + 1, config)
    if features is not None:  # a draft that reads the target: the kept path's hidden states
        kept = jnp.take_along_axis(features, v.kept[:, :, None], axis=1)
        draft_state = drafter.observe_target(
            draft_params, draft_state, kept, candidates, s.pos, n + 1
        )

    pos = jnp.where(active, s.pos + n + 1, s.pos)
    prev = jnp.where(n > 0, v.tokens[rows, jnp.maximum(n - 1, 0)], s.last)
    # the draft's model calls: as it reports them (a staged draft), else one per proposed token
    calls = (
        drafter.model_calls(draft_state) if "model_calls" in drafter.reported_stats else proposed
    )
    stats = _count_round(
        s.stats, active, v, proposed, calls, emitted, target_logits, draft_logits, config
    )
    stats = _count_reported(stats, drafter, draft_state, proposed, active)
    return emitted_state.replace(
        target=target_state.replace(index=pos),
        draft=draft_state,
        pos=pos,
        last=jnp.where(active, v.next_token, s.last),
        prev=jnp.where(active, prev, s.prev),
        rng=rng,
        budget=jnp.where(active, _next_budget(s.budget, n, proposed, config), s.budget),
        stats=stats,
    )


def _count_round(
    st, active, v: _Verdict, proposed, calls, emitted, target_logits, draft_logits, config
):
    """The DecodeStats after one round (inactive rows unchanged)."""
    n = v.num_accepted
    verified = v.tested & active[:, None]
    accepted_at = (jnp.arange(config.gamma)[None, :] < n[:, None]) & active[:, None]
    drafted = proposed if config.tree is None else config.tree.size
    return st.replace(
        target_calls=st.target_calls + active,
        draft_calls=st.draft_calls + calls * active,
        drafted=st.drafted + drafted * active,
        accepted=st.accepted + jnp.where(active, n, 0),
        emitted=st.emitted + emitted,
        beta_sum=st.beta_sum + jnp.sum(jnp.where(verified, v.beta, 0.0), axis=1),
        accepted_at=st.accepted_at + accepted_at,
        verified_at=st.verified_at + verified,
        nan_logits=st.nan_logits | (active & _has_nan(target_logits)),
        nan_draft_logits=st.nan_draft_logits | (active & _has_nan(draft_logits)),
        accepted_rank=_count_ranks(st.accepted_rank, active, v, config),
    )


def _count_reported(st, drafter: Drafter, draft_state: Any, proposed, active):
    """The optional stats a drafter reports (`Drafter.reported_stats`), added for active rows:
    its probability outside what it may propose ([B, G], over each row's proposed positions),
    its stalled catch-ups and its lookup tokens scored / kept (its model calls: `_count_round`)."""
    reported = drafter.reported_stats
    if "outside_mass" in reported:
        mass = drafter.outside_mass(draft_state)  # [B, G]
        counted = jnp.arange(mass.shape[1])[None, :] < proposed[:, None]
        added = jnp.sum(jnp.where(counted, mass, 0.0), axis=1)
        st = st.replace(outside_mass=st.outside_mass + jnp.where(active, added, 0.0))
    if "draft_stalls" in reported:
        stalled = drafter.draft_stalls(draft_state) & active
        st = st.replace(draft_stalls=st.draft_stalls + stalled.astype(jnp.int32))
    if "lookup_accepted" in reported:
        scored, kept = drafter.lookup_accepted(draft_state)
        st = st.replace(
            lookup_proposed=st.lookup_proposed + jnp.where(active, scored, 0),
            lookup_accepted=st.lookup_accepted + jnp.where(active, kept, 0),
        )
    return st


def _count_ranks(counts, active, v: _Verdict, config: DecodeConfig):
    """[B, D, W] counts plus this round's accepted path's sibling rank at each depth it
    reached (None stays None: only `DecodeConfig.count_ranks` asks for the counter)."""
    if counts is None:
        return None
    path = v.kept[:, 1:]  # [B, D] node ids, 0 past the accepted length
    rank = jnp.asarray(config.tree.ranks)[path]
    hit = jax.nn.one_hot(rank, counts.shape[-1], dtype=jnp.int32)
    return counts + hit * ((path > 0) & active[:, None])[..., None]


def _next_budget(
    budget: jax.Array, n: jax.Array, proposed: jax.Array, config: DecodeConfig
) -> jax.Array:
    """[B] next round's draft budget: +2 after a fully accepted block, -1 otherwise (schedule)."""
    if config.gamma_policy.kind != "schedule":
        return budget
    return jnp.clip(jnp.where(n >= proposed, budget + 2, budget - 1), 1, config.gamma)


@functools.partial(_jit, static_argnames=("target", "draft", "config", "partitioner"))
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
    reads = _reads_features(drafter)
    started = prefill(target, target_params, batch, config.cache_length(target, batch), reads)
    target_state, pos, last, prev = started[:4]
    draft_state = drafter.init(draft_params, batch, config)
    if reads:  # the prompt's hidden states, each with the prompt token after it
        prompt = batch["prompt"].astype(jnp.int32)
        after = jnp.concatenate([prompt[:, 1:], jnp.zeros_like(prompt[:, :1])], axis=1)
        draft_state = drafter.observe_target(
            draft_params, draft_state, started[4], after, jnp.zeros_like(pos), pos
        )

    def body(s: LoopState) -> LoopState:
        s = _speculative_round(s, target, target_params, drafter, draft_params, batch, config)
        return s.replace(
            target=constrain(partitioner, target, s.target, "target"),
            draft=drafter.constrain(partitioner, s.draft),
        )

    init = initial_loop_state(
        constrain(partitioner, target, target_state, "target"),
        drafter.constrain(partitioner, draft_state),
        pos,
        last,
        prev,
        rng,
        config,
    )
    if "outside_mass" in drafter.reported_stats:  # counted only for a draft that reports it
        zeros = jnp.zeros(pos.shape, jnp.float32)
        init = init.replace(stats=init.stats.replace(outside_mass=zeros))
    counts = jnp.zeros(pos.shape, jnp.int32)
    if "draft_stalls" in drafter.reported_stats:  # a draft whose catch-up can stall
        init = init.replace(stats=init.stats.replace(draft_stalls=counts))
    if "lookup_accepted" in drafter.reported_stats:  # a staged draft's lookup
        init = init.replace(
            stats=init.stats.replace(lookup_proposed=counts, lookup_accepted=counts)
        )
    return _output(_while_not_done(body, init), config, partitioner)
