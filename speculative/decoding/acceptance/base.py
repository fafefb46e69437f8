"""The interface every acceptance rule implements: `Support` (what it can verify), `Rule` (its name,
supports and functions), the round a rule is handed (`ChainRound`, `TreeRound`) and `Verdict`
(what one round's verification decided).

A rule verifies chains, token trees or both, each through a function with a fixed signature:
  chains: (rng, round: ChainRound, cfg: SamplingConfig, lenience: float) -> (num_accepted [B],
    next_token [B], beta [B, G]), e.g. `token.verify_chain`, `block.verify_block`;
  trees: (rng, round: TreeRound, cfg: SamplingConfig) -> (path [B, D], num_accepted [B],
    next_token [B], beta [B, D], tested [B, D]), e.g. `tree.verify_tree`.
`acceptance.verify` builds the round and turns either outcome into a `Verdict`, so the loop makes
one call for both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax
import jax
import numpy as np

from speculative.decoding.sampling import SamplingConfig


@flax.struct.dataclass
class ChainRound:
    """What one round hands a chain rule: B rows of G draft tokens x_1..x_G.

    target_logits: [B, G+1, V] the target's logits at [t_last, x_1..x_G];
    draft_logits: [B, G, V] the draft's logits that x_1..x_G were sampled from;
    draft_tokens: [B, G] int32 x_1..x_G;
    draft_lengths: [B] int32 in 1..G, the tokens each row proposed (an adaptive gamma), or None
      when every row proposed all G.
    """

    target_logits: jax.Array
    draft_logits: jax.Array
    draft_tokens: jax.Array
    draft_lengths: jax.Array | None = None


@flax.struct.dataclass
class TreeRound:
    """What one round hands a tree rule: B rows of one static tree of N nodes under the root.

    target_logits: [B, N+1, V] the target's logits at the root and at every node;
    node_log_q: [B, N, V] log q_i each node was drawn from, given its earlier siblings
      (normalised; -inf where q_i is 0);
    node_tokens: [B, N] int32 the nodes' tokens;
    children: static [N+1, W] numpy children by rank, -1 padded (`TreeShape.children`);
    depth: static D, the tree's depth.
    The static fields are numpy, not hashable: build a round inside jit, not as its argument.
    """

    target_logits: jax.Array
    node_log_q: jax.Array
    node_tokens: jax.Array
    children: np.ndarray = flax.struct.field(pytree_node=False)
    depth: int = flax.struct.field(pytree_node=False)


ChainVerify = Callable[
    [jax.Array, ChainRound, SamplingConfig, float], tuple[jax.Array, jax.Array, jax.Array]
]
TreeVerify = Callable[
    [jax.Array, TreeRound, SamplingConfig],
    tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array],
]


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
