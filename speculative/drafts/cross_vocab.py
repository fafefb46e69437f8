"""A draft model with its own tokenizer, still exact: the token-level intersection (TLI) of Timor
et al., "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for
Heterogeneous Vocabularies" (ICML 2025), run as gathers inside the compiled round
(docs/design.md §6, "Drafts with another tokenizer").

The tables (vocab/cross_tables.py, built once on the host) say which draft tokens are exactly one
target token (to_draft: target id -> that draft id, or -1) and how each target token is spelled
in draft tokens (spelling [Vt, K], spelling_lengths [Vt]). Each round, per row:

1. catch-up: the draft is fed [anchor, spelling of `last`] at the anchor's slot, where `last` is
   the target's correction or bonus token and the anchor the newest draft token already
   committed (x_n when the target kept n >= 1 proposals, else the previous catch-up's last
   token; re-feeding it also fills the slot of a fully accepted round's x_gamma, as §3). Rows
   are ragged: each reads its logits after its own 1 + len(spelling) tokens;
2. q_i: the draft's logits restricted to the intersection, gathered into target ids (-inf
   elsewhere), so sampling renormalises over the intersection; x_i is drawn from exactly that q
   and fed back to the draft by its draft id.

q over target ids is a distribution that is zero outside the intersection's image, so the
paper's rule (and the block and tree rules) verifies it unchanged: the output follows the target exactly,
whatever the tables. The draft's own prompt is the prompt text in its own tokens where the batch
carries it (`with_draft_prompts`: draft_prompt, draft_prompt_lengths), else the target prompt
spelled through the same table, inside the compiled loop (a row whose prompt spells to nothing
starts from the draft's EOS).
Chains and trees of first children (tree widths, as the model draft grows them: only first
children are fed, so a tree's accepted path is in the draft's cache up to its last node, the
next anchor); decoder-only pairs. The draft model's probability outside the intersection
(softmax of its raw logits) is reported per proposal (`outside_mass`).

Cache: sized so that no row outgrows it unless the draft's context caps it. The prompt takes
its spelling (the draft prompts' width, else the longest spelling of the prompts the drafter was
fitted to, `fit_prompts`, as the jobs do; unfitted, K per prompt token); the generation K *
(max_decode_len + gamma + 2) slots (no spelling is longer), plus K + gamma of slack. Where the draft model's context caps the cache below that, the
draft is fed the last draft tokens of its prompt that fit, and a row whose text outgrows the cache
stops feeding the draft (`stalled`): its proposals are still drawn from the q returned with them,
so the output stays exact, with fewer acceptances. Neither is silent: `validate` logs a warning
when a batch needs more than the cache (computed on the host from the tables' spelling lengths),
and the loop counts each row's stalled rounds (`DecodeStats.draft_stalls`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp
import numpy as np

from speculative.data import inputs
from speculative.decoding.checks import to_host, validate_batch
from speculative.decoding.config import DecodeConfig
from speculative.decoding.drafter import DraftContext, DraftRequest, StatelessDrafter
from speculative.decoding.sampling import sample
from speculative.decoding.state import constrain, prefill
from speculative.decoding.tree import grow_first_child_tree
from speculative.models.base import DecodeState, LanguageModel
from speculative.vocab.cross_tables import CrossTables

log = logging.getLogger(__name__)


@flax.struct.dataclass
class CrossState:
    """The draft's state between rounds (B rows, G = gamma).

    cache: the draft model's DecodeState.
    base: [B] draft slot of this round's first proposal x_1 (the catch-up block ends before it).
    tail: [B] the draft token at slot base - 1 (the anchor of a round that kept no proposal).
    pos: [B] the target position of `last` when the draft last proposed.
    fresh: [B] bool, no round yet: the draft's prompt already ends the text.
    outside: [B, G] float32, the draft's probability outside the intersection at each proposal.
    stalled: [B] bool, the row's text outgrew a capped cache: the draft is fed nothing more.
    """

    cache: DecodeState
    base: jax.Array
    tail: jax.Array
    pos: jax.Array
    fresh: jax.Array
    outside: jax.Array
    stalled: jax.Array


def restrict(logits: jax.Array, to_draft: jax.Array) -> jax.Array:
    """[..., Vd] draft logits -> [..., Vt] float32: the logit of each target id's draft token,
    -inf outside the intersection (a softmax of it is q restricted and renormalised)."""
    gathered = jnp.take(logits.astype(jnp.float32), jnp.maximum(to_draft, 0), axis=-1)
    return jnp.where(to_draft >= 0, gathered, -jnp.inf)


def outside_mass(logits: jax.Array, to_draft: jax.Array) -> jax.Array:
    """[..., Vd] -> [...]: the draft model's probability (softmax of its logits) on tokens outside
    the intersection: where acceptance is lost."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    inside = jnp.sum(jnp.where(to_draft >= 0, jnp.take(probs, jnp.maximum(to_draft, 0), -1), 0), -1)
    return jnp.clip(1.0 - inside, 0.0, 1.0)


def spell_prompt(
    tables: dict[str, jax.Array], prompt: jax.Array, lengths: jax.Array, eos: int, window: int
) -> tuple[jax.Array, jax.Array]:
    """Target prompts [B, P] (valid up to lengths [B]) -> the draft's prompts [B, W], left
    aligned (the last W = window draft tokens of a longer spelling), and their lengths [B] (>= 1:
    an empty spelling becomes the draft's EOS)."""
    rows, width = prompt.shape
    count = jnp.where(
        jnp.arange(width)[None, :] < lengths[:, None], tables["spelling_lengths"][prompt], 0
    )  # [B, P]
    spelled = tables["spelling"][prompt]  # [B, P, K]
    valid = jnp.arange(spelled.shape[2])[None, None, :] < count[:, :, None]
    flat, valid = spelled.reshape(rows, -1), valid.reshape(rows, -1)
    order = jnp.argsort(~valid, axis=1, stable=True)  # the valid slots first, in order
    ids = jnp.take_along_axis(flat, order, axis=1)
    return keep_end(ids, jnp.sum(valid, axis=1).astype(jnp.int32), eos, window)


def keep_end(
    ids: jax.Array, length: jax.Array, eos: int, window: int
) -> tuple[jax.Array, jax.Array]:
    """Left-aligned draft prompts [B, W'] of lengths [B] -> their last W = window tokens [B, W],
    left aligned, and their lengths [B] (>= 1: an empty prompt becomes the draft's EOS)."""
    if ids.shape[1] < window:
        ids = jnp.pad(ids, ((0, 0), (0, window - ids.shape[1])))
    start = jnp.maximum(length - window, 0)  # a prompt past the window keeps its end
    ids = jnp.take_along_axis(ids, start[:, None] + jnp.arange(window)[None, :], axis=1)
    length = jnp.minimum(length, window)
    ids = ids.at[:, 0].set(jnp.where(length == 0, eos, ids[:, 0]))
    length = jnp.maximum(length, 1)
    return jnp.where(jnp.arange(ids.shape[1])[None, :] < length[:, None], ids, 0), length


DRAFT_PROMPT, DRAFT_LENGTHS = "draft_prompt", "draft_prompt_lengths"


def with_draft_prompts(
    batch: dict[str, jax.Array], vocabulary: Any, texts: Sequence[str], pad_to: int | None = None
) -> dict[str, jax.Array]:
    """The batch (target prompts [B, P], the encodings of `texts`) plus each row's text in the
    draft's own tokens: draft_prompt [B, W] (W: the longest, or pad_to) and draft_prompt_lengths
    [B]; an empty encoding is the draft's EOS. Only q changes: the output stays exact. The texts
    must be what the target prompts spell (untruncated); where only ids are known, leave it out
    and the draft is fed their spelling through the tables."""
    if len(texts) != batch["prompt"].shape[0]:
        raise ValueError(f"{len(texts)} texts for a batch of {batch['prompt'].shape[0]} rows")
    own = inputs.decoder_batch(
        [vocabulary.encode(t) or [vocabulary.eos_id] for t in texts], 0, pad_to
    )
    return {**batch, DRAFT_PROMPT: own["prompt"], DRAFT_LENGTHS: own["prompt_lengths"]}


def _check_own_prompts(batch: dict[str, jax.Array]) -> None:
    """Raises ValueError unless draft_prompt is [B, W] and draft_prompt_lengths [B] in 1..W."""
    ids, lengths = batch[DRAFT_PROMPT], to_host(batch.get(DRAFT_LENGTHS, np.zeros(0)))
    if (
        ids.ndim != 2
        or lengths.shape != (batch["prompt"].shape[0],)
        or ids.shape[0] != len(lengths)
    ):
        raise ValueError(
            f"draft_prompt must be [B, W] and draft_prompt_lengths [B] for the batch's B rows; "
            f"got {ids.shape} and {lengths.shape}"
        )
    if np.any(lengths < 1) or np.any(lengths > ids.shape[1]):
        raise ValueError(
            f"draft_prompt_lengths must be in 1..{ids.shape[1]}; got {lengths.tolist()}"
        )


@functools.cache
def _warn_short(cache: int, need: int, capped: bool) -> None:
    """One warning per cache size and need (each batch is validated): capped, the draft model's
    context is what limits the cache, else the prompts `fit_prompts` saw were shorter."""
    if capped:
        log.warning(
            f"cross-vocabulary draft cache capped at {cache} slots by the draft's context (needs "
            f"{need}): rows may stop feeding the draft; output stays exact"
        )
    else:
        log.warning(
            f"cross-vocabulary draft cache of {cache} slots is sized for the prompts it was "
            f"fitted to (`fit_prompts`); this batch needs {need}: the draft is fed the end of "
            "its prompt; output stays exact"
        )


@dataclasses.dataclass(frozen=True)
class CrossVocabDrafter(StatelessDrafter):
    """A draft model over its own vocabulary proposing target tokens (module doc).

    model: the draft LanguageModel (decoder-only; padding ids masked for its own vocabulary).
    target_vocab_size: the target model's output ids (what proposals and q range over).
    width: K, the most draft tokens a target token is spelled with.
    draft_eos: the draft's EOS id (the prompt of a row that spells to nothing).
    prompt_slots: the most draft tokens a prompt it decodes spells to (`fit_prompts`); 0: K per
      target prompt token (module doc).
    spelling_lengths: the tables' spelling_lengths [Vt] on the host (`make_drafter`), for
      `fit_prompts` and `validate`'s check of a batch's need; not part of the jit key.
    Its params: {"model": the draft's weights, "tables": `CrossTables.arrays()`}.
    """

    model: LanguageModel
    target_vocab_size: int
    width: int
    draft_eos: int
    prompt_slots: int = 0
    spelling_lengths: Any = dataclasses.field(default=None, compare=False, repr=False)
    grows_trees: ClassVar[bool] = True
    reported_stats: ClassVar[tuple[str, ...]] = ("outside_mass", "draft_stalls")

    @property
    def vocab_size(self) -> int:
        return self.target_vocab_size

    def check_target(self, target: LanguageModel) -> None:
        if target.vocab_size != self.target_vocab_size:
            raise ValueError(
                f"cross-vocabulary tables are for a target with {self.target_vocab_size} output "
                f"ids, this target has {target.vocab_size}"
            )
        if target.is_encoder_decoder or self.model.is_encoder_decoder:
            raise ValueError("a cross-vocabulary draft needs a decoder-only target and draft")

    def validate(self, batch: dict[str, jax.Array], config: DecodeConfig) -> None:
        super().validate(batch, config)  # a tree: one of first children (tree widths)
        validate_batch(self.model, batch, config)  # decoder-only inputs, as the target's
        if DRAFT_PROMPT in batch:
            _check_own_prompts(batch)
        gamma = config.gamma or 1
        cache, window = self.cache_length(batch, config), self.prompt_window(batch, config)
        if cache - window < self.width + gamma + 2:
            raise ValueError(
                f"the cross-vocabulary draft's context max_seq_len={cache} is too small for "
                f"K = {self.width} draft tokens per target token and gamma {gamma}"
            )
        need = self.need(batch, config)
        if cache < need:  # capped by the context (named with what it would hold), or fitted short
            uncapped = self._prompt_tokens(batch) + self._reserve(config)
            capped = cache < uncapped
            _warn_short(cache, uncapped if capped else need, capped)

    def fit_prompts(self, prompts: Sequence[Sequence[int]]) -> CrossVocabDrafter:
        """This drafter with its cache sized for `prompts` (target ids; every prompt it will
        decode, on the host): `prompt_slots` is their longest spelling in draft tokens (at least
        1). Unchanged without the tables' lengths (`make_drafter` gives them) or prompts."""
        if self.spelling_lengths is None or not prompts:
            return self
        lengths = np.asarray(self.spelling_lengths)
        longest = max(int(np.sum(lengths[np.asarray(p, np.int64)])) for p in prompts)
        return dataclasses.replace(self, prompt_slots=max(longest, 1))

    def _reserve(self, config: DecodeConfig) -> int:
        """The slots the generation takes: K for each of max_decode_len + gamma + 2 target
        tokens (no spelling is longer), K + gamma more."""
        gamma = config.gamma or 1
        return self.width * (config.max_decode_len + gamma + 2) + self.width + gamma

    def _prompt_tokens(self, batch: dict[str, jax.Array]) -> int:
        """The draft tokens a row's prompt is given room for: the width of the draft's own
        prompts (`with_draft_prompts`), else K per target prompt token, at most the fitted
        prompts' longest spelling (`prompt_slots`)."""
        if DRAFT_PROMPT in batch:
            return int(batch[DRAFT_PROMPT].shape[1])
        worst = self.width * int(batch["prompt"].shape[1])
        return min(worst, self.prompt_slots) if self.prompt_slots else worst

    def need(self, batch: dict[str, jax.Array], config: DecodeConfig) -> int:
        """Draft cache slots this batch needs so that no row stalls (host, concrete batch): its
        longest prompt in draft tokens (spelled through the tables' lengths where the drafter has
        them, else K per prompt token) plus the generation's reserve."""
        if DRAFT_PROMPT in batch:
            prompt = int(np.max(to_host(batch[DRAFT_LENGTHS])))
        elif self.spelling_lengths is None:  # unfitted: K per prompt token
            prompt = self._prompt_tokens(batch)
        else:
            ids, lengths = to_host(batch["prompt"]), to_host(batch["prompt_lengths"])
            valid = np.arange(ids.shape[1])[None, :] < lengths[:, None]
            spelled = np.asarray(self.spelling_lengths)[np.asarray(ids, np.int64)]
            prompt = max(int(np.max(np.sum(np.where(valid, spelled, 0), axis=1))), 1)
        return prompt + self._reserve(config)

    def cache_length(self, batch: dict[str, jax.Array], config: DecodeConfig) -> int:
        """Draft cache slots for this decode (module doc), capped at the draft's context."""
        want, limit = self._prompt_tokens(batch) + self._reserve(config), self.model.max_length
        return want if limit is None else min(want, limit)

    def prompt_window(self, batch: dict[str, jax.Array], config: DecodeConfig) -> int:
        """Draft tokens of the prompt's spelling the draft is fed (its last ones): what the
        generation leaves of the cache, at least half of it."""
        cache, reserve = self.cache_length(batch, config), self._reserve(config)
        return max(1, min(self._prompt_tokens(batch), max(cache - reserve, cache // 2)))

    def place_params(self, partitioner: Any, params: Any) -> Any:
        return {
            "model": partitioner.place_params(self.model, params["model"], "draft"),
            "tables": jax.device_put(params["tables"], partitioner.replicated()),
        }

    def init(self, params: Any, batch: dict[str, jax.Array], config: DecodeConfig) -> CrossState:
        tables = params["tables"]
        prompt = batch["prompt"].astype(jnp.int32)
        lengths = batch["prompt_lengths"].astype(jnp.int32)
        window = self.prompt_window(batch, config)
        if DRAFT_PROMPT in batch:  # the text in the draft's own tokens (`with_draft_prompts`)
            own = batch[DRAFT_PROMPT].astype(jnp.int32), batch[DRAFT_LENGTHS].astype(jnp.int32)
            ids, count = keep_end(*own, self.draft_eos, window)
        else:
            ids, count = spell_prompt(tables, prompt, lengths, self.draft_eos, window)
        spelled = {"prompt": ids, "prompt_lengths": count}
        cache, last_pos, last, _ = prefill(
            self.model, params["model"], spelled, self.cache_length(batch, config)
        )
        rows = prompt.shape[0]
        return CrossState(
            cache=cache,
            base=last_pos + 1,
            tail=last,
            pos=lengths - 1,
            fresh=jnp.ones((rows,), jnp.bool_),
            outside=jnp.zeros((rows, config.gamma or 1), jnp.float32),
            stalled=jnp.zeros((rows,), jnp.bool_),
        )

    def constrain(self, partitioner: Any, state: CrossState) -> CrossState:
        return state.replace(cache=constrain(partitioner, self.model, state.cache, "draft"))

    def outside_mass(self, state: CrossState) -> jax.Array:
        """[B, G] the draft's probability outside the intersection at this round's proposals."""
        return state.outside

    def draft_stalls(self, state: CrossState) -> jax.Array:
        """[B] bool: rows whose catch-up this round was skipped (a capped cache; module doc)."""
        return state.stalled

    def propose(
        self, params: Any, state: CrossState, request: DraftRequest
    ) -> tuple[jax.Array, jax.Array, CrossState]:
        """gamma target ids per row: (tokens [B, G], q's logits [B, G, Vt], state)."""
        weights, to_draft = params["model"], params["tables"]["to_draft"]
        context, gamma = request.context, request.gamma
        logits, cache, base, tail, stalled = self._catch_up(params, state, context, gamma)
        rngs = jax.random.split(request.rng, gamma)

        def draw(step_rng, step_logits):  # [B, Vd] -> target ids [B], q [B, Vt], outside [B]
            q = restrict(step_logits, to_draft)
            token, _ = sample(step_rng, q, request.sampling)
            return token, q, outside_mass(step_logits, to_draft)

        first = draw(rngs[0], logits)

        def step(carry, step_rng):
            cache, token = carry
            step_logits, cache = self.model.extend(weights, cache, to_draft[token][:, None])
            drawn = draw(step_rng, step_logits[:, 0])
            return (cache, drawn[0]), drawn

        (cache, _), rest = jax.lax.scan(step, (cache, first[0]), rngs[1:])
        tokens, q, outside = (
            jnp.concatenate([a[:, None], jnp.moveaxis(b, 0, 1)], axis=1)
            for a, b in zip(first, rest)
        )
        fresh = jnp.zeros_like(state.fresh)
        new = CrossState(cache, base, tail, context.pos, fresh, outside, stalled)
        return tokens, q, new

    def propose_tree(
        self, params: Any, state: CrossState, request: DraftRequest
    ) -> tuple[jax.Array, jax.Array, CrossState]:
        """A tree of first children (decoding/tree.py) over target ids, each depth's siblings
        drawn without replacement from the restricted q at the first child above: (tokens
        [B, N], log_q [B, N, Vt], state). Only first children are fed to the draft, so the
        accepted path's nodes are in its cache but the last, the anchor of the next catch-up."""
        weights, to_draft = params["model"], params["tables"]["to_draft"]
        context, tree = request.context, request.tree
        logits, cache, base, tail, stalled = self._catch_up(params, state, context, tree.depth)
        outside = jnp.zeros((logits.shape[0], tree.depth), jnp.float32)
        outside = outside.at[:, 0].set(outside_mass(logits, to_draft))

        def step(carry, token):  # feeds a first child; its depth's mass outside, by depth
            cache, depth, outside = carry
            step_logits, cache = self.model.extend(weights, cache, to_draft[token][:, None])
            outside = outside.at[:, depth].set(outside_mass(step_logits[:, 0], to_draft))
            return restrict(step_logits[:, 0], to_draft), (cache, depth + 1, outside)

        carry = (cache, jnp.asarray(1, jnp.int32), outside)
        root = restrict(logits, to_draft)
        tokens, log_q, (cache, _, outside) = grow_first_child_tree(
            step, carry, root, tree, request.rng, request.sampling
        )
        # Siblings share their depth's q: the mass outside counted once per node.
        outside = outside * jnp.asarray(tree.widths, jnp.float32)[None, :]
        fresh = jnp.zeros_like(state.fresh)
        new = CrossState(cache, base, tail, context.pos, fresh, outside, stalled)
        return tokens, log_q, new

    def _catch_up(
        self, params: Any, state: CrossState, context: DraftContext, gamma: int
    ) -> tuple[jax.Array, DecodeState, jax.Array, jax.Array, jax.Array]:
        """Feeds [anchor, spelling of `last`] at the anchor's slot (module doc): (logits [B, Vd]
        after the block's last valid token, cache at x_1's slot, that slot [B], the token before
        it [B], stalled [B]). A first round, a finished row, or a row whose next round would
        write past a capped cache (stalled from then on) feeds its tail alone again."""
        tables = params["tables"]
        quiet = state.fresh | context.done | state.stalled
        kept = jnp.where(quiet, 0, jnp.maximum(context.pos - state.pos - 1, 0))  # n kept
        length = jnp.where(quiet, 0, tables["spelling_lengths"][context.last])
        # This round writes up to start + K and x_1's slot + gamma - 2; a stalled round after
        # it, up to x_1's slot + K - 1: all below the cache's end, or the row stalls now.
        fits = state.base + kept + length + max(self.width, gamma) <= state.cache.max_len
        stalled = state.stalled | (~quiet & ~fits)
        kept, length = jnp.where(stalled, 0, kept), jnp.where(stalled, 0, length)
        anchor = jnp.where(kept > 0, tables["to_draft"][context.prev], state.tail)
        start = state.base + kept - 1
        block = jnp.concatenate([anchor[:, None], tables["spelling"][context.last]], axis=1)
        logits, cache = self.model.extend(params["model"], state.cache.replace(index=start), block)
        logits = jnp.take_along_axis(logits, length[:, None, None], axis=1)[:, 0]
        tail = jnp.take_along_axis(block, length[:, None], axis=1)[:, 0]
        base = start + 1 + length
        return logits, cache.replace(index=base), base, tail, stalled


def make_drafter(
    model: LanguageModel, params: Any, tables: CrossTables
) -> tuple[CrossVocabDrafter, dict[str, Any]]:
    """(drafter, its params) for a draft model, its weights and the tables for a target."""
    size = tables.to_draft.shape[0]
    if tables.to_target.shape[0] != model.vocab_size:
        raise ValueError(
            f"cross-vocabulary tables are for {tables.to_target.shape[0]} draft ids, the draft "
            f"model has {model.vocab_size}"
        )
    drafter = CrossVocabDrafter(
        model, size, tables.width, tables.draft_eos, spelling_lengths=tables.spelling_lengths
    )
    arrays = {k: jnp.asarray(np.asarray(v, np.int32)) for k, v in tables.arrays().items()}
    return drafter, {"model": params, "tables": arrays}
