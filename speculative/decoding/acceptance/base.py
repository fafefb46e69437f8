"""The interface every acceptance rule implements: `Support` (what it can verify), `Rule` (its name,
supports and functions) and `Verdict` (what one round's verification decided).

A rule verifies chains, token trees or both, each through a function with a fixed signature:
  chains: `sampling.verify_detailed`'s (rng, target_logits [B, G+1, V], draft_logits [B, G, V],
    draft_tokens [B, G], cfg, lenience, draft_lengths [B] | None) -> (num_accepted [B],
    next_token [B], beta [B, G]);
  trees: `tree.verify_tree`'s (rng, target_logits [B, N+1, V], node_log_q [B, N, V],
    node_tokens [B, N], cfg, children [N+1, W], depth) -> (path [B, D], num_accepted [B],
    next_token [B], beta [B, D], tested [B, D]).
`acceptance.verify` turns either into a `Verdict`, so the loop makes one call for both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax
import jax

ChainVerify = Callable[..., tuple[jax.Array, jax.Array, jax.Array]]
TreeVerify = Callable[..., tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class Support:
    """What a rule accepts for one kind of draft (a chain or a tree).

    lenient: lenience l < 1 (the paper's lossy rule) is defined for it.
    adaptive: rows may propose fewer than gamma tokens (an adaptive `GammaPolicy`).
    greedy / sampled: it verifies at temperature 0 / at temperature > 0.
    """

    lenient: bool = False
    adaptive: bool = False
    greedy: bool = True
    sampled: bool = True


@dataclasses.dataclass(frozen=True)
class Rule:
    """An acceptance rule: its name (`DecodeConfig.acceptance`, gin ACCEPTANCE), what it supports
    for chains and for trees (None: not at all), and getters of its functions.

    The getters are called when the loop is traced, not at import: a function patched in its
    module (the mutation tests do) is the one the loop runs.
    """

    name: str
    summary: str
    chains: Support | None = None
    trees: Support | None = None
    chain: Callable[[], ChainVerify] | None = None
    tree: Callable[[], TreeVerify] | None = None

    def __post_init__(self):
        if (self.chains is None) != (self.chain is None) or (self.trees is None) != (
            self.tree is None
        ):
            raise ValueError(f"rule {self.name!r}: a support needs its function and back")

    def support(self, tree: bool) -> Support | None:
        """What it supports for a tree (tree=True) or a chain."""
        return self.trees if tree else self.chains


@flax.struct.dataclass
class Verdict:
    """What one round's verification decided (B rows, G = gamma or a tree's depth).

    path: [B, G] int32 node ids (1-based; the draft token at slot path - 1) along the accepted
      path: a chain's is 1..G, a tree's is 0 past num_accepted;
    num_accepted: [B] how many of them are kept; next_token: [B] the token after them;
    beta: [B, G] acceptance probabilities; tested: [B, G] positions tried against the target.
    """

    path: jax.Array
    num_accepted: jax.Array
    next_token: jax.Array
    beta: jax.Array
    tested: jax.Array
