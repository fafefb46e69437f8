"""Staged drafting (Spector & Ré, "Accelerating LLM Inference with Staged Speculative Decoding",
2023): the draft model's own gamma tokens are proposed by prompt lookup and checked by the draft
model in one call, so the draft pays about one call per few tokens instead of one per token.

Each round, per row, until the row holds gamma draft tokens x_1..x_n (n >= gamma):
1. prompt lookup proposes y_1..y_k (k = `lookahead`) continuing the committed text and x_1..x_n;
2. the draft model scores [x_{n-1}, x_n, y_1..y_k] in one `extend` at x_{n-1}'s slot (x_0 is the
   round's `last`, x_{-1} the token before it): logits l_0 after x_n and l_j after y_j. Feeding
   x_{n-1} again writes the one slot a fully accepted round left unwritten (the paper draft's
   catch-up, docs/design.md §3) and costs one row, which the matrix units do for free;
3. the paper's rule with the draft model as the target and the lookup's one-hot q accepts
   y_1..y_m and draws one more token from l_m's residual (or l_k itself when m = k), so each
   call adds m + 1 tokens, each x drawn exactly from the draft model's distribution given the
   tokens before it. Those distributions (l_0..l_m) are what `propose` returns.

Exact by construction: the outer rule sees each token with the q it was drawn from, which is the
draft model's own q (docs/design.md §6), so the output follows the target whatever the lookup
proposes; the lookup only changes how many draft calls a round costs. Chains only: a tree round
is grown by the draft model's own steps (`ModelDrafter.propose_tree`). Calls beyond gamma tokens
are not made; tokens past gamma from the last call are dropped.

What a round cost is reported, not assumed (`Drafter.reported_stats`): the state carries each
row's draft-model calls in its last proposal (`DecodeStats.draft_calls` counts those, not gamma)
and the lookup tokens the model scored and kept (`DecodeStats.lookup_proposed` /
`lookup_accepted`: how often the draft model agreed with the lookup).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp

from speculative.decoding.config import DecodeConfig
from speculative.decoding.drafter import DraftRequest, one_hot_logits
from speculative.decoding.model_drafter import ModelDrafter
from speculative.decoding.sampling import verify
from speculative.drafts.prompt_lookup import continuation
from speculative.models.base import DecodeState, write_rows


@flax.struct.dataclass
class StagedState:
    """The draft model's cache and what the row's last proposal cost, each [B] int32: calls
    (draft-model calls it took part in), scored / kept (lookup tokens the model scored / kept)."""

    model: DecodeState
    calls: jax.Array
    scored: jax.Array
    kept: jax.Array

    @classmethod
    def fresh(cls, model: DecodeState, calls: Any = 0) -> StagedState:
        zeros = jnp.zeros(model.index.shape, jnp.int32)
        return cls(model, zeros + calls, zeros, zeros)


@dataclasses.dataclass(frozen=True)
class StagedDrafter(ModelDrafter):
    """A draft model whose tokens prompt lookup proposes and the model verifies (module doc).

    lookahead: tokens the lookup proposes per draft-model call (k; a call scores k + 2 rows).
    max_ngram, min_ngram: the lookup's n-gram lengths (drafts/prompt_lookup.py).
    """

    lookahead: int = 3
    max_ngram: int = 3
    min_ngram: int = 1

    reported_stats: ClassVar[tuple[str, ...]] = ("model_calls", "lookup_accepted")

    def __post_init__(self):
        if self.lookahead < 1:
            raise ValueError(f"staged drafting needs lookahead >= 1, got {self.lookahead}")
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(
                f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}"
            )

    def cache_slack(self) -> int:
        # A call may start up to gamma + lookahead - 1 slots past `last` and writes lookahead + 2.
        return 2 * self.lookahead + 2

    def init(self, params: Any, batch: dict[str, jax.Array], config: DecodeConfig) -> StagedState:
        return StagedState.fresh(super().init(params, batch, config))

    def constrain(self, partitioner: Any, state: StagedState) -> StagedState:
        return state.replace(model=super().constrain(partitioner, state.model))

    def model_calls(self, state: StagedState) -> jax.Array:
        return state.calls

    def lookup_accepted(self, state: StagedState) -> tuple[jax.Array, jax.Array]:
        return state.scored, state.kept

    def propose_tree(
        self, params: Any, state: StagedState, request: DraftRequest
    ) -> tuple[jax.Array, jax.Array, StagedState]:
        """The draft model's own tree (`ModelDrafter.propose_tree`): one call per depth."""
        tokens, log_q, model = super().propose_tree(params, state.model, request)
        return tokens, log_q, StagedState.fresh(model, calls=request.tree.depth)

    def propose(
        self, params: Any, state: StagedState, request: DraftRequest
    ) -> tuple[jax.Array, jax.Array, StagedState]:
        """gamma tokens per row (tokens [B, G], logits [B, G, V] they were drawn from, state)."""
        tokens, logits, model, counts = self._propose(params, state.model, request)
        return tokens, logits, StagedState(model, *counts)

    def _propose(self, params: Any, state: DecodeState, request: DraftRequest):
        """(tokens, logits, model state, (calls, scored, kept) [B] each) of `propose`."""
        params = self.model_params(params)
        context, rng, gamma, k = request.context, request.rng, request.gamma, self.lookahead
        rows, pos = context.last.shape[0], context.pos
        slots = gamma + k + 1  # a call starting at n = gamma - 1 fills up to n + k + 1
        ids, length = context.history()
        ids = jnp.concatenate([ids, jnp.zeros((rows, slots), ids.dtype)], axis=1)

        def call(carry):
            i, n, tokens, logits, state, counts = carry
            # x_{n-1}, x_n: drafted tokens, or the round's prev / last before any.
            drafted = jnp.concatenate([context.prev[:, None], context.last[:, None], tokens], 1)
            before, current = (
                jnp.take_along_axis(drafted, n[:, None] + j, 1)[:, 0] for j in (0, 1)
            )
            text = write_rows(ids, tokens, length)  # committed text + x_1..x_n
            guesses = continuation(text, length + n, current, k, self.max_ngram, self.min_ngram)
            # At position 0 nothing precedes `last`: feed [x_n, y_1..y_k, y_k] from slot 0.
            start = jnp.maximum(pos + n - 1, 0)
            offset = pos + n - start  # 1, or 0 at position 0
            full = jnp.concatenate([before[:, None], current[:, None], guesses, guesses[:, -1:]], 1)
            block = jnp.take_along_axis(full, (1 - offset)[:, None] + jnp.arange(k + 2), axis=1)
            scored, state = self.model.extend(params, state.replace(index=start), block)
            scored = jnp.take_along_axis(
                scored, (offset[:, None] + jnp.arange(k + 1))[:, :, None], axis=1
            )  # [B, k + 1, V]: after x_n, y_1 .. y_k
            accepted, extra = verify(
                jax.random.fold_in(rng, i),
                scored,
                one_hot_logits(guesses, self.vocab_size),
                guesses,
                request.sampling,
            )
            j = jnp.arange(k + 1)[None, :]
            new = jnp.where(
                j < accepted[:, None], jnp.pad(guesses, ((0, 0), (0, 1))), extra[:, None]
            )
            wants = (n < gamma) & ~context.done
            tokens = jnp.where(wants[:, None], write_rows(tokens, new, n), tokens)
            logits = jnp.where(wants[:, None, None], write_rows(logits, scored, n), logits)
            # kept: the accepted guesses that land inside the row's gamma tokens
            used = (1, k, jnp.minimum(accepted, gamma - n))
            counts = tuple(c + jnp.where(wants, u, 0) for c, u in zip(counts, used, strict=True))
            n = jnp.where(wants, n + accepted + 1, n)
            return i + 1, n, tokens, logits, state, counts

        def more(carry):
            return jnp.any((carry[1] < gamma) & ~context.done)

        tokens = jnp.zeros((rows, slots), jnp.int32)
        logits = jnp.zeros((rows, slots, self.vocab_size), jnp.float32)
        zeros = jnp.zeros(rows, jnp.int32)
        carry = (0, zeros, tokens, logits, state, (zeros, zeros, zeros))
        _, _, tokens, logits, state, counts = jax.lax.while_loop(more, call, carry)
        return tokens[:, :gamma], logits[:, :gamma], state.replace(index=pos + gamma), counts
