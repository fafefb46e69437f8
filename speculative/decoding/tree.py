"""Static token-tree shapes (`TreeShape`) and how a sampled draft grows one (`grow_first_child_tree`).

A speculative round may propose a tree of candidates instead of a chain (docs/design.md §1, token
trees): the target scores every node in one call (`models.base` tree attention), the tree rule
(`acceptance.tree.verify_tree`) walks the longest accepted path, and the loop keeps that path's
cache entries. Shapes are static, so a tree is part of the compiled program.

Nodes are numbered 1..N in breadth-first order (node 0 is the root: the round's `last` token);
`parents[j - 1]` is node j's parent, and siblings are ranked by number: the rule tries the
lower-numbered sibling first. Two ways to write one (gin TREE):
  widths (4, 2, 2, 1, 1): depth d has widths[d - 1] nodes, all children of the first node of the
    depth above (a chain of first children with alternatives beside it; 10 nodes, depth 5);
  parents (0, 0, 1, 1, 2, 3): any tree, e.g. a Sequoia-style shape, as each node's parent.
A chain of gamma drafts is the tree of widths (1,) * gamma.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from speculative.decoding.sampling import SamplingConfig, greedy_tokens, process_logits


@dataclasses.dataclass(frozen=True)
class TreeShape:
    """A static tree of N draft nodes under the root (hashable: part of a DecodeConfig).

    parents: N ints; parents[j - 1] < j is the parent of node j (0 = the root).
    """

    parents: tuple[int, ...]

    def __post_init__(self):
        parents = tuple(self.parents)
        if not parents or not all(isinstance(p, (int, np.integer)) for p in parents):
            raise ValueError(f"a tree needs at least one node given by its parent, got {parents!r}")
        for node, parent in enumerate(parents, start=1):
            if not 0 <= parent < node:
                raise ValueError(
                    f"tree node {node}'s parent must be an earlier node (0..{node - 1}), "
                    f"got {parent}"
                )
        depths = _depths(parents)
        if list(depths) != sorted(depths):
            raise ValueError(f"tree nodes must be numbered depth by depth, got parents {parents}")
        object.__setattr__(self, "parents", tuple(int(p) for p in parents))

    @classmethod
    def from_widths(cls, widths: Sequence[int]) -> TreeShape:
        """widths[d - 1] nodes at depth d, all children of the first node of depth d - 1."""
        widths = tuple(widths)
        if not widths or not all(isinstance(w, (int, np.integer)) and w >= 1 for w in widths):
            raise ValueError(f"tree widths must be integers >= 1, got {widths!r}")
        parents, first = [], 0
        for width in widths:
            parents += [first] * int(width)
            first = len(parents) - int(width) + 1
        return cls(tuple(parents))

    @classmethod
    def parse(cls, value: Any) -> TreeShape:
        """A gin value: a TreeShape, {'widths': (...)} / {'parents': (...)}, or a widths tuple."""
        if isinstance(value, TreeShape):
            return value
        if isinstance(value, dict) and set(value) == {"widths"}:
            return cls.from_widths(value["widths"])
        if isinstance(value, dict) and set(value) == {"parents"}:
            return cls(tuple(value["parents"]))
        if isinstance(value, (tuple, list)):
            return cls.from_widths(value)
        raise ValueError(
            f"a tree is a tuple of widths per depth, e.g. (4, 2, 2, 1, 1), or "
            f"{{'parents': (0, 0, 1, ...)}}; got {value!r}"
        )

    @property
    def size(self) -> int:
        """N, draft nodes (the root excluded)."""
        return len(self.parents)

    @functools.cached_property
    def depths(self) -> tuple[int, ...]:
        """N + 1 depths, the root's (0) first."""
        return _depths(self.parents)

    @property
    def depth(self) -> int:
        """D, the most draft tokens one round can accept."""
        return max(self.depths)

    @functools.cached_property
    def ancestors(self) -> np.ndarray:
        """[N + 1, N + 1] bool: [i, j] when node j is node i or an ancestor of it."""
        size = self.size + 1
        table = np.eye(size, dtype=bool)
        for node, parent in enumerate(self.parents, start=1):
            table[node] |= table[parent]
        return table

    @functools.cached_property
    def children(self) -> np.ndarray:
        """[N + 1, W] int32: each node's children by rank, -1 past the last (W = widest node)."""
        kids: list[list[int]] = [[] for _ in range(self.size + 1)]
        for node, parent in enumerate(self.parents, start=1):
            kids[parent].append(node)
        width = max(len(k) for k in kids)
        return np.array([k + [-1] * (width - len(k)) for k in kids], np.int32)

    @functools.cached_property
    def first_child_chain(self) -> bool:
        """Whether only first children have children: the tree is a chain of first children with
        leaves beside it (every `from_widths` tree), which a sampled draft grows in D steps."""
        first = {int(k[0]) for k in self.children if k[0] >= 0}
        return all(parent == 0 or parent in first for parent in self.parents)

    @functools.cached_property
    def ranks(self) -> np.ndarray:
        """[N + 1] int32: each node's rank among its siblings (0 = first child; the root 0)."""
        rank = np.zeros(self.size + 1, np.int32)
        for row in self.children:
            for r, node in enumerate(row):
                if node > 0:
                    rank[node] = r
        return rank

    @property
    def widths(self) -> tuple[int, ...]:
        """Nodes per depth 1..D."""
        return tuple(self.depths[1:].count(d) for d in range(1, self.depth + 1))

    def describe(self) -> str:
        if self.first_child_chain:
            return f"tree widths {self.widths} ({self.size} nodes)"
        return f"tree parents {self.parents} ({self.size} nodes)"


def _depths(parents: Sequence[int]) -> tuple[int, ...]:
    """Every node's depth, the root's (0) first, from the nodes' parents."""
    depths = [0]
    for parent in parents:
        depths.append(depths[parent] + 1)
    return tuple(depths)


def siblings(
    rng: jax.Array, logits: jax.Array, width: int, sampling: SamplingConfig
) -> tuple[jax.Array, jax.Array]:
    """`width` distinct candidates from the draft's q without replacement, and for each the
    distribution it was drawn from: q with the earlier candidates removed, renormalised.

    Args:
      logits: [B, V] draft logits; q = exp(process_logits(logits, sampling)).
    Returns:
      tokens [B, W] int32 and log_q [B, W, V] float32 (normalised; all -inf for a candidate past
      q's support, which the tree rule skips). Greedy: the top W logits, each q one-hot.
    Drawing by Gumbel top-k is sequential sampling without replacement (Kool et al., 2019).
    """
    if sampling.greedy:
        tokens = top_distinct(logits, width)
        hot = jax.nn.one_hot(tokens, logits.shape[-1], dtype=jnp.bool_)
        return tokens, jnp.where(hot, 0.0, -jnp.inf).astype(jnp.float32)
    log_q = process_logits(logits, sampling)  # [B, V]
    gumbel = jax.random.gumbel(rng, log_q.shape, jnp.float32)
    tokens = top_distinct(jnp.where(jnp.isfinite(log_q), log_q + gumbel, -jnp.inf), width)
    taken = jnp.cumsum(jax.nn.one_hot(tokens, log_q.shape[-1], dtype=jnp.int32), axis=1)
    earlier = jnp.concatenate([jnp.zeros_like(taken[:, :1]), taken[:, :-1]], axis=1) > 0
    remaining = jnp.where(earlier, -jnp.inf, log_q[:, None, :])  # [B, W, V]
    norm = jax.nn.logsumexp(remaining, axis=-1, keepdims=True)
    log_q_each = jnp.where(jnp.isfinite(norm), remaining - norm, -jnp.inf)
    return tokens, log_q_each.astype(jnp.float32)


def top_distinct(scores: jax.Array, width: int) -> jax.Array:
    """[B, V] -> [B, W] int32 the indices of the W largest scores, largest first (ties: lowest
    index), by W argmax passes. `lax.top_k` with k > 1 cost ~17 ms a call at V = 152k inside the
    draft's scan on XLA:CPU (0.2 ms standalone); W passes cost under 1 ms. Past the finite
    scores a row repeats indices (their q is 0, so the tree rule skips them)."""
    rows = jnp.arange(scores.shape[0])
    picked = []
    for _ in range(width):
        best = greedy_tokens(scores)
        picked.append(best)
        scores = scores.at[rows, best].set(-jnp.inf)
    return jnp.stack(picked, axis=1)


def grow_first_child_tree(
    step: Callable[[Any, jax.Array], tuple[jax.Array, Any]],
    carry: Any,
    root_logits: jax.Array,
    tree: TreeShape,
    rng: jax.Array,
    sampling: SamplingConfig,
) -> tuple[jax.Array, jax.Array, Any]:
    """A sampled draft's tree of first children: at each depth draw that depth's siblings from q
    at the first child above, then step the draft on the new first child.

    Args:
      step: (carry, token [B]) -> (logits [B, V] for the token after it, carry); one draft step.
      root_logits: [B, V] the draft's logits for depth 1.
      tree: a shape with `first_child_chain`.
    Returns:
      tokens [B, N], log_q [B, N, V] (each node's distribution given its earlier siblings), carry
      after D - 1 steps.
    """
    if not tree.first_child_chain:
        raise ValueError(
            f"this draft grows trees whose only inner nodes are first children (tree widths); "
            f"got {tree.describe()}"
        )
    widest = max(tree.widths)
    rngs = jax.random.split(rng, tree.depth)

    def depth_step(state, depth_rng):
        carry, logits = state
        tokens, log_q = siblings(depth_rng, logits, widest, sampling)
        next_logits, carry = step(carry, tokens[:, 0])
        return (carry, next_logits), (tokens, log_q)

    (carry, last_logits), (tokens, log_q) = jax.lax.scan(
        depth_step, (carry, root_logits), rngs[:-1]
    )
    tail_tokens, tail_log_q = siblings(rngs[-1], last_logits, widest, sampling)
    tokens = jnp.concatenate([tokens, tail_tokens[None]], axis=0)  # [D, B, W]
    log_q = jnp.concatenate([log_q, tail_log_q[None]], axis=0)  # [D, B, W, V]
    return by_node(tree, tokens), by_node(tree, log_q), carry


def by_node(tree: TreeShape, per_depth: jax.Array) -> jax.Array:
    """[D, B, W, ...] values by (depth - 1, sibling rank) of a first-child tree -> [B, N, ...] by
    node; W at least the widest depth."""
    rank = tree.ranks[1:]
    depth = np.asarray(tree.depths[1:], np.int32) - 1
    return jnp.moveaxis(per_depth[depth, :, rank], 0, 1)
