"""Unigram and bigram drafts (the paper's Table 3): token statistics instead of a draft model.

Proposing costs a table lookup and one [B, V] softmax per token, so c ≈ 0 and any accepted token is
nearly free. The tables are fitted from token sequences: a corpus, or the target's own samples
(which is what the drafts should imitate).

- Unigram: q(x) = (count(x) + k) / (N + k V), add-k smoothing; every proposal uses the same q.
- Bigram: q(x | a) = (count_K(a, x) + β q_uni(x)) / (count_K(a) + β), the top-K successors of
  each token a kept with their counts (count_K(a) is their sum) and the unigram as the backoff with
  weight β. The stored arrays are [V, K], never [V, V], so a 152k vocabulary stays small.

`NgramTables` is the drafter's params pytree; `save` / `load` store it as .npz (no pickle).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import zipfile
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp
import numpy as np

from speculative.decoding.drafter import DraftRequest, StatelessDrafter
from speculative.decoding.sampling import sample
from speculative.decoding.tree import grow_first_child_tree
from speculative.drafts import registry
from speculative.errors import (
    LOADER_ERRORS,
    MALFORMED_ERRORS,
    JobError,
    check_path,
    expand,
    loader_error,
)

log = logging.getLogger(__name__)


@flax.struct.dataclass
class NgramTables:
    """unigram: [V] float32 probabilities; successors: [V, K] int32 ids; successor_counts: [V, K]
    float32 (0 in unused slots); backoff: float32 scalar β (weight of the unigram in the bigram)."""

    unigram: jax.Array
    successors: jax.Array
    successor_counts: jax.Array
    backoff: jax.Array

    @property
    def vocab_size(self) -> int:
        return int(self.unigram.shape[0])


def fit(
    sequences: Iterable[Sequence[int]],
    vocab_size: int,
    top_k: int = 8,
    add_k: float = 0.1,
    backoff: float = 1.0,
) -> NgramTables:
    """Counts unigrams and bigrams of token-id sequences (each sequence is one text).

    Args:
      sequences: token ids, e.g. a tokenised corpus or the target's sampled outputs.
      vocab_size: V, the target's vocabulary size.
      top_k: successors kept per token for the bigram.
      add_k: unigram smoothing (every id keeps a nonzero probability).
      backoff: β, the unigram's weight in each bigram row.
    """
    if add_k <= 0 or backoff <= 0 or top_k < 1:
        raise ValueError(
            f"need add_k > 0, backoff > 0, top_k >= 1; got {add_k}, {backoff}, {top_k}"
        )
    unigram = np.zeros(vocab_size, np.float64)
    pairs: dict[tuple[int, int], int] = {}
    for seq in sequences:
        ids = np.asarray(seq, np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(
                f"token ids must be in 0..{vocab_size - 1}, got {ids.min()}..{ids.max()}"
            )
        np.add.at(unigram, ids, 1)
        for a, b in zip(ids[:-1].tolist(), ids[1:].tolist()):
            pairs[(a, b)] = pairs.get((a, b), 0) + 1
    unigram = (unigram + add_k) / (unigram.sum() + add_k * vocab_size)
    successors = np.zeros((vocab_size, top_k), np.int32)
    counts = np.zeros((vocab_size, top_k), np.float32)
    by_first: dict[int, list[tuple[int, int]]] = {}
    for (a, b), n in pairs.items():
        by_first.setdefault(a, []).append((n, b))
    for a, nexts in by_first.items():
        nexts.sort(key=lambda nb: (-nb[0], nb[1]))  # most frequent first, ties by id
        for slot, (n, b) in enumerate(nexts[:top_k]):
            successors[a, slot], counts[a, slot] = b, n
    return NgramTables(
        unigram=jnp.asarray(unigram, jnp.float32),
        successors=jnp.asarray(successors),
        successor_counts=jnp.asarray(counts),
        backoff=jnp.asarray(backoff, jnp.float32),
    )


def save(tables: NgramTables, path: str | os.PathLike) -> None:
    """Writes the tables as an .npz, atomically: a temporary file, fsynced, renamed into place
    (a killed write leaves the old file or none, never a torn one)."""
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            np.savez(
                f,
                **{x.name: np.asarray(getattr(tables, x.name)) for x in dataclasses.fields(tables)},
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load(path: str | os.PathLike) -> NgramTables:
    """Reads tables written by `save`; raises ValueError naming the file and the first problem:
    a missing array, a shape, dtype or value out of place (probabilities that are negative, not
    finite or do not sum to 1; successor ids outside the vocabulary; negative counts)."""
    with np.load(path, allow_pickle=False) as data:
        try:
            arrays = {f.name: np.asarray(data[f.name]) for f in dataclasses.fields(NgramTables)}
        except KeyError as e:
            raise ValueError(f"{path}: not an n-gram table file (missing {e})") from e
    problem = _table_problem(**arrays)
    if problem:
        raise ValueError(f"{path}: {problem}")
    return NgramTables(
        unigram=jnp.asarray(arrays["unigram"], jnp.float32),
        successors=jnp.asarray(arrays["successors"], jnp.int32),
        successor_counts=jnp.asarray(arrays["successor_counts"], jnp.float32),
        backoff=jnp.asarray(arrays["backoff"], jnp.float32),
    )


def _table_problem(
    unigram: np.ndarray, successors: np.ndarray, successor_counts: np.ndarray, backoff: np.ndarray
) -> str | None:
    """What is wrong with a set of tables read from a file, or None."""
    v, k = successors.shape if successors.ndim == 2 else (-1, -1)
    if unigram.shape != (v,) or successor_counts.shape != (v, k) or backoff.ndim or v < 1:
        return "inconsistent n-gram table shapes"
    kinds = {"unigram": unigram, "successor_counts": successor_counts, "backoff": backoff}
    for name, array in kinds.items():
        if not np.issubdtype(array.dtype, np.floating):
            return f"{name} must be floating point, got {array.dtype}"
        if not np.all(np.isfinite(array)) or np.any(array < 0):
            return f"{name} has negative or non-finite values"
    if not np.issubdtype(successors.dtype, np.integer):
        return f"successors must be integer ids, got {successors.dtype}"
    if successors.size and (successors.min() < 0 or successors.max() >= v):
        return f"successor ids must be in 0..{v - 1}, got {successors.min()}..{successors.max()}"
    if abs(float(unigram.sum(dtype=np.float64)) - 1.0) > 1e-3 or float(backoff) == 0:
        return "unigram probabilities must sum to 1 and the backoff weight be > 0"
    return None


def bigram_probs(tables: NgramTables, previous: jax.Array) -> jax.Array:
    """[B] previous tokens -> [B, V] float32 q(x | previous)."""
    rows = jnp.arange(previous.shape[0])[:, None]
    counts = tables.successor_counts[previous]  # [B, K]
    probs = jnp.broadcast_to(
        tables.backoff * tables.unigram, (previous.shape[0], tables.vocab_size)
    )
    probs = probs.at[rows, tables.successors[previous]].add(counts)
    return probs / (jnp.sum(counts, axis=1) + tables.backoff)[:, None]


@dataclasses.dataclass(frozen=True)
class NgramDrafter(StatelessDrafter):
    """order 1 (unigram) or 2 (bigram) draft over a vocabulary of vocab_size ids; its params are an
    `NgramTables` of that size."""

    vocab_size: int
    order: int = 2
    grows_trees: ClassVar[bool] = True

    def __post_init__(self):
        if self.order not in (1, 2):
            raise ValueError(f"n-gram order must be 1 or 2, got {self.order!r}")

    def propose(
        self, params: NgramTables, state: tuple, request: DraftRequest
    ) -> tuple[jax.Array, jax.Array, tuple]:
        """gamma tokens per row, each drawn from q(· | the token before it): (tokens [B, G],
        logits [B, G, V], state)."""

        def step(previous, step_rng):
            logits = self._logits(params, previous)
            token, _ = sample(step_rng, logits, request.sampling)
            return token, (token, logits)

        rngs = jax.random.split(request.rng, request.gamma)
        _, (tokens, logits) = jax.lax.scan(step, request.context.last, rngs)
        return tokens.T, jnp.swapaxes(logits, 0, 1), state

    def propose_tree(
        self, params: NgramTables, state: tuple, request: DraftRequest
    ) -> tuple[jax.Array, jax.Array, tuple]:
        """A tree of first children: each depth's siblings drawn without replacement from
        q(· | the first child above). Returns (tokens [B, N], log_q [B, N, V], state)."""

        def step(carry, token):
            return self._logits(params, token), carry

        root = self._logits(params, request.context.last)
        tree, rng, sampling = request.tree, request.rng, request.sampling
        tokens, log_q, _ = grow_first_child_tree(step, (), root, tree, rng, sampling)
        return tokens, log_q, state

    def _logits(self, params: NgramTables, previous: jax.Array) -> jax.Array:
        """[B] previous tokens -> [B, V] log q(x | previous) (unigram: previous is ignored)."""
        if self.order == 1:
            return jnp.log(jnp.broadcast_to(params.unigram, (previous.shape[0], self.vocab_size)))
        return jnp.log(bigram_probs(params, previous))


# ------------------------------------------------------------------------------------------------
# The 'unigram' and 'bigram' draft kinds (DraftSpec.tables: an .npz of `speculative.fit_ngram`).


def _validate(spec: registry.DraftSpec, role: str) -> None:
    check_path(role, f"a {spec.kind} draft's tables", expand(spec.tables))


def _describe(spec: registry.DraftSpec) -> str:
    return f"{spec.kind} (tables {spec.tables})"


def _build(spec: registry.DraftSpec, target_model: Any, target_params: Any, role: str):
    """(NgramDrafter, its tables) for the target's vocabulary; a file that cannot be read, or
    tables of another size, is a one-line JobError naming the role and the file."""
    del target_params
    vocab_size = target_model.vocab_size
    try:
        tables = load(expand(spec.tables))
    except JobError:
        raise
    except LOADER_ERRORS + MALFORMED_ERRORS + (zipfile.BadZipFile, EOFError) as e:
        raise loader_error(e, role, spec.tables) from e
    if tables.unigram.shape[0] != vocab_size:
        raise JobError(
            f"n-gram tables have {tables.unigram.shape[0]} ids but the target has {vocab_size}",
            role=role,
            path=spec.tables,
        )
    log.info(f"{role}: {_describe(spec)}")
    return NgramDrafter(vocab_size, 1 if spec.kind == "unigram" else 2), tables


def _kind(name: str, q: str) -> registry.DraftKind:
    description = f"proposes from {q} of n-gram tables (tables: a speculative.fit_ngram .npz)"
    return registry.DraftKind(name, description, _build, _validate, _describe)


registry.register(_kind("unigram", "q(x)"))
registry.register(_kind("bigram", "q(x | the token before)"))
