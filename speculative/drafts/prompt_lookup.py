"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the text's tail.

Code edits, summaries and translations copy long spans of their input, and a copied span is
guessed exactly by finding where the last n tokens appeared before and reading on (the n-gram /
prompt-lookup drafts of vLLM and llama.cpp). The draft needs no model and no params: c ≈ 0.

Per row, inside the jitted loop, over the committed text (prompt + generated tokens; for an
encoder-decoder, source + generated):
1. for n = max_ngram down to min_ngram, find the latest start j < len - n whose n tokens equal the
   last n tokens of the text; the longest n that matches wins;
2. propose x_k = text[j + n + (k mod P)], P = len - j - n: the continuation, repeated periodically
   once it reaches the present (a repeating pattern keeps repeating);
3. with no match at any n, propose the last token repeated: still a valid block, and the target
   call still yields its one token.

q is one-hot on each proposal, so a proposal x is accepted with probability p(x) (always, in
greedy decoding, when it is the target's argmax).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from speculative.decoding.drafter import DraftRequest, StatelessDrafter, one_hot_logits
from speculative.decoding.tree import TreeShape, by_node
from speculative.drafts import registry
from speculative.errors import JobError


def latest_match(ids: jax.Array, length: jax.Array, n: int) -> jax.Array:
    """[B, L] texts of [B] lengths -> [B] the latest start j with ids[j:j+n] == the last n tokens
    and j + n < length (at least one token follows the match); -1 where there is none."""
    starts = jnp.arange(ids.shape[1])[None, :]
    return jnp.max(jnp.where(_matches(ids, length, n), starts, -1), axis=1)


def latest_matches(ids: jax.Array, length: jax.Array, n: int, count: int) -> jax.Array:
    """[B, count] the `count` latest starts `latest_match` would consider, latest first; -1 pads."""
    starts = jnp.arange(ids.shape[1])[None, :]
    found = jnp.where(_matches(ids, length, n), starts, -1)
    return jax.lax.top_k(found, min(count, ids.shape[1]))[0]


def continuation(
    ids: jax.Array, length: jax.Array, last: jax.Array, count: int, max_ngram: int, min_ngram: int
) -> jax.Array:
    """[B, count] int32: what followed the latest match of each text's tail (ids [B, L] of
    lengths [B]; the longest n-gram of max_ngram..min_ngram wins), repeated periodically once it
    reaches the present; `last` [B] repeated where nothing matches (module doc)."""
    found = jnp.full(length.shape, -1)
    follow = jnp.zeros_like(length)  # j + n of the winning match
    for n in range(max_ngram, min_ngram - 1, -1):
        j = latest_match(ids, length, n)
        take = (found < 0) & (j >= 0)
        follow = jnp.where(take, j + n, follow)
        found = jnp.where(take, j, found)
    period = jnp.maximum(length - follow, 1)
    offsets = follow[:, None] + jnp.arange(count)[None, :] % period[:, None]
    tokens = jnp.take_along_axis(ids, jnp.clip(offsets, 0, ids.shape[1] - 1), axis=1)
    return jnp.where((found >= 0)[:, None], tokens, last[:, None]).astype(jnp.int32)


def _matches(ids: jax.Array, length: jax.Array, n: int) -> jax.Array:
    """[B, L] bool: the n tokens from each start equal the text's last n, and a token follows."""
    width = ids.shape[1]
    starts = jnp.arange(width)[None, :]
    tail = jnp.take_along_axis(ids, jnp.maximum(length[:, None] - n + jnp.arange(n), 0), axis=1)
    match = starts + n < length[:, None]
    match &= length[:, None] >= n
    for t in range(n):
        shifted = jnp.take_along_axis(ids, jnp.minimum(starts + t, width - 1), axis=1)
        match &= shifted == tail[:, t : t + 1]
    return match


@dataclasses.dataclass(frozen=True)
class PromptLookupDrafter(StatelessDrafter):
    """Prompt lookup over a vocabulary of vocab_size ids, n-grams of min_ngram..max_ngram tokens.
    Its params are empty: pass `()`."""

    vocab_size: int
    max_ngram: int = 3
    min_ngram: int = 1
    grows_trees: ClassVar[bool] = True

    def __post_init__(self):
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(
                f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}"
            )

    def propose(
        self, params: tuple, state: tuple, request: DraftRequest
    ) -> tuple[jax.Array, jax.Array, tuple]:
        """gamma tokens per row read off the latest match of the text's tail (see module doc):
        (tokens [B, G], logits [B, G, V], state)."""
        del params  # deterministic proposals, no key: q is one-hot on them
        ids, length = request.context.history()
        tokens = continuation(
            ids, length, request.context.last, request.gamma, self.max_ngram, self.min_ngram
        )
        return tokens, one_hot_logits(tokens, self.vocab_size), state

    def propose_tree(
        self, params: tuple, state: tuple, request: DraftRequest
    ) -> tuple[jax.Array, jax.Array, tuple]:
        """A lookup tree: the first children follow the best match (as `propose`); their
        siblings are the next tokens of the other matches that agree with the first children so
        far (up to the widest depth's count of latest matches per n-gram length), best first.
        q is one-hot on each node. Returns (tokens [B, N], log_q [B, N, V], state)."""
        del params
        ids, length = request.context.history()
        tokens = _lookup_tree(
            ids, length, request.context.last, request.tree, self.max_ngram, self.min_ngram
        )
        return tokens, one_hot_logits(tokens, self.vocab_size), state


def _lookup_tree(
    ids: jax.Array,
    length: jax.Array,
    last: jax.Array,
    tree: TreeShape,
    max_ngram: int,
    min_ngram: int,
) -> jax.Array:
    """Tokens [B, N] of a tree of first children read off several matches (`LookupTree`)."""
    widest, depth = max(tree.widths), tree.depth
    follows = []  # continuation starts j + n, longest n first, latest first within an n
    for n in range(max_ngram, min_ngram - 1, -1):
        j = latest_matches(ids, length, n, widest)
        follows.append(jnp.where(j >= 0, j + n, -1))
    follow = jnp.concatenate(follows, axis=1)  # [B, M]
    period = jnp.maximum(length[:, None] - follow, 1)
    offsets = follow[:, :, None] + jnp.arange(depth)[None, None, :] % period[:, :, None]
    rows = ids.shape[0]
    read = jnp.take_along_axis(ids, jnp.clip(offsets, 0, ids.shape[1] - 1).reshape(rows, -1), 1)
    continuations = read.reshape(*offsets.shape)  # [B, M, D]
    live = follow >= 0  # candidates that agree with the first children so far
    earlier = jnp.tril(jnp.ones((follow.shape[1],) * 2, bool), -1)  # [m, m'] m' < m
    per_depth = []
    for d in range(depth):
        token = continuations[:, :, d]  # [B, M]
        same = (token[:, :, None] == token[:, None, :]) & live[:, None, :] & earlier[None]
        first = live & ~jnp.any(same, axis=2)  # the first candidate proposing this token
        rank = jnp.cumsum(first, axis=1) - 1
        chosen = [jnp.any(first & (rank == r), axis=1) for r in range(widest)]
        picks = [jnp.sum(jnp.where(first & (rank == r), token, 0), axis=1) for r in range(widest)]
        head = jnp.where(chosen[0], picks[0], last)
        # A rank with no candidate repeats the first child: proposed twice, never accepted twice.
        level = jnp.stack([jnp.where(c, t, head) for c, t in zip(chosen, picks)], axis=1)
        per_depth.append(level)
        live = live & (token == head[:, None])
    return by_node(tree, jnp.stack(per_depth, axis=0)).astype(jnp.int32)


def _validate(spec: registry.DraftSpec, role: str) -> None:
    if not (
        isinstance(spec.min_ngram, int)
        and isinstance(spec.max_ngram, int)
        and 1 <= spec.min_ngram <= spec.max_ngram
    ):
        raise JobError(
            f"{role}: prompt lookup needs 1 <= min_ngram <= max_ngram, got "
            f"{spec.min_ngram!r}..{spec.max_ngram!r}"
        )


def _describe(spec: registry.DraftSpec) -> str:
    return f"prompt_lookup (ngram {spec.max_ngram}..{spec.min_ngram})"


def _build(spec: registry.DraftSpec, target_model, target_params, role: str):
    del target_params, role
    return PromptLookupDrafter(target_model.vocab_size, spec.max_ngram, spec.min_ngram), ()


DESCRIPTION = "copies the continuation of the latest n-gram match (max_ngram..min_ngram)"
registry.register(registry.DraftKind("prompt_lookup", DESCRIPTION, _build, _validate, _describe))
