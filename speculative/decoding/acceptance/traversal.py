"""The 'traversal' rule for token trees: traversal verification (Weng, Hu, Chen et al., "Traversal
Verification for Speculative Tree Decoding", NeurIPS 2025). Exact, sequence-level, bottom up.

Where the 'token' rule walks down from the root and gives up a node's whole subtree once the node
is rejected, this rule tries the tree's nodes leaf first (post-order: children in rank order, each
subtree before its parent) and accepts a node together with its whole path from the root. Each
node k carries a weight w_k (how much of the target's mass on its path is not yet claimed by the
draft) and a distribution p_k for the token after it, starting at the target's p at k:

    on entering child c of node k:  w_c = min(1, w_k p_k(c) / q_c(c)),  p_c = target p at c
    on trying node k:               accept root..k with probability w_k, then y ~ p_k; else
    on rejecting child c of k:      r = max(0, w_k p_k - q_c), R = sum r,
                                    w_k <- R / (R + 1 - w_k),  p_k <- r / R

with q_c the distribution c was drawn from given its earlier siblings (`tree.verify_tree`'s q_i).
The root's weight stays 1, so the walk always ends. On a chain it is block verification
(`block.verify_block`: the same weights w_i and stopping probabilities h_i), so it accepts as many
tokens in expectation; on a tree, a rejected node's subtree is not lost (its paths were tried first).

Why it is exact (docs/design.md §1): by induction over the post-order, a node entered with weight
w and distribution p emits its path followed by a continuation s with probability w p(s) and is
rejected with probability 1 - w, whatever its subtree holds. For a leaf that is the try itself. For
a node whose first child c ~ q_c: the child's subtree emits c.s with probability
min(q_c(c), w p(c)) p_c(s); it is rejected with probability 1 - w + R, after which the node, with
weight R / (R + 1 - w) and distribution r / R, emits t with probability max(0, w p(t) - q_c(t)),
and the two add up to w p. The residual does not depend on which c was drawn, so the later
siblings, drawn given c, see the same argument. At temperature 0 it is the token rule's greedy
walk (the longest path of target argmaxes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from speculative.decoding.acceptance import residual, tree
from speculative.decoding.acceptance.base import Rule, Support, TreeRound
from speculative.decoding.sampling import SamplingConfig, categorical, process_logits


def post_order(children: np.ndarray) -> list[tuple[int, int]]:
    """[(node, parent)] in the order the rule enters subtrees (parent -1 for the root) and, for
    each node, (-1 - node, parent) where it is tried, after its whole subtree."""
    events = []

    def visit(node: int, parent: int) -> None:
        events.append((node, parent))
        for kid in children[node]:
            if kid >= 0:
                visit(int(kid), node)
        events.append((-1 - node, parent))

    visit(0, -1)
    return events


def paths_by_node(children: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """([N+1, D] each node's path by depth, 0 past its own depth; [N+1] each node's depth)."""
    paths = np.zeros((children.shape[0], depth), np.int32)
    depths = np.zeros(children.shape[0], np.int32)
    for node, parent in post_order(children):
        if node > 0:
            depths[node] = depths[parent] + 1
            paths[node] = paths[parent]
            paths[node, depths[node] - 1] = node
    return paths, depths


def after_rejection(w: jax.Array, p: jax.Array, q: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A node's (w [B], p [B, V]) once a child drawn from q [B, V] is rejected."""
    res, mass = residual.rejection_residual(w[:, None] * p, q)
    denominator = mass[:, 0] + 1.0 - w
    # denominator 0 means w = 1 and R = 0 (p = q): the rejection had no mass; keep w = 1.
    new_w = residual.renormalised(mass[:, 0], denominator, 1.0)
    return new_w, residual.renormalised(res, mass, p)


def verify_traversal(
    rng: jax.Array, round: TreeRound, cfg: SamplingConfig
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """Traversal verification; arguments and returns as `tree.verify_tree`.

    Args:
      round: target_logits [B, N+1, V], node_log_q [B, N, V] (log q each node was drawn from,
        given its earlier siblings), node_tokens [B, N] int32, static children [N+1, W], depth D.
    Returns:
      path [B, D], num_accepted [B], next_token [B], beta [B, D] (1 where the depth was accepted,
      0 where it was tested and not: the realised rate, as a sequence-level rule has no per-depth
      probability), tested [B, D] (the depths up to one past the accepted path that have nodes).
    """
    if cfg.greedy:  # one-hot p: the only path with weight is the argmax walk
        return tree.verify_tree(rng, round, cfg)
    node_tokens, node_log_q = round.node_tokens, round.node_log_q
    batch, nodes = node_tokens.shape
    rows = jnp.arange(batch)
    p_all = jnp.exp(process_logits(round.target_logits, cfg))  # [B, N+1, V]
    try_rng, next_rng = jax.random.split(rng)
    uniform = jax.random.uniform(try_rng, (batch, nodes + 1), dtype=jnp.float32)
    w = {0: jnp.ones((batch,), jnp.float32)}
    dist = {0: p_all[:, 0]}
    q, drawn = {}, {}
    chosen = jnp.full((batch,), -1, jnp.int32)
    next_dist = p_all[:, 0]
    for node, parent in post_order(round.children):
        if node > 0:  # entering: the child's weight from its parent's current state
            token = node_tokens[:, node - 1]
            q[node] = jnp.exp(node_log_q[:, node - 1])
            q_x, p_x = q[node][rows, token], dist[parent][rows, token]
            # A candidate with q = 0 was not drawn from q: weight 0, and its rejection is no news.
            drawn[node] = q_x > 0
            ratio = p_x / jnp.where(drawn[node], q_x, 1.0)
            w[node] = jnp.where(drawn[node], jnp.minimum(w[parent] * ratio, 1.0), 0.0)
            dist[node] = p_all[:, node]
        elif node < 0:  # trying: its subtree was rejected
            node = -1 - node
            # The root's weight is 1 up to rounding: reaching it always ends the walk.
            keep = (chosen < 0) & ((uniform[:, node] < w[node]) | (node == 0))
            chosen = jnp.where(keep, node, chosen)
            next_dist = jnp.where(keep[:, None], dist[node], next_dist)
            if node > 0:
                new_w, new_p = after_rejection(w[parent], dist[parent], q[node])
                w[parent] = jnp.where(drawn[node], new_w, w[parent])
                dist[parent] = jnp.where(drawn[node][:, None], new_p, dist[parent])
    next_token = categorical(next_rng, jnp.log(next_dist))
    return _outcome(chosen, next_token, round.children, round.depth)


def _outcome(chosen, next_token, children, depth):
    """(path, num_accepted, next_token, beta, tested) from the accepted node [B]."""
    paths, depths = paths_by_node(children, depth)
    path = jnp.asarray(paths)[chosen]  # [B, D]
    n = jnp.asarray(depths)[chosen]
    # The node at depth d - 1 on the accepted path (the root for d = 1), and whether it has children.
    above = jnp.concatenate([jnp.zeros_like(path[:, :1]), path[:, :-1]], axis=1)
    has_kids = jnp.asarray(children[:, 0] >= 0)[above]
    position = jnp.arange(depth)[None, :]
    tested = (position <= n[:, None]) & has_kids
    beta = jnp.where(tested & (position < n[:, None]), 1.0, 0.0)
    return path, n, next_token, beta, tested


RULE = Rule(
    "traversal",
    "traversal verification (Weng et al. 2025): token trees, exact, sequence-level, leaf first",
    trees=Support(),
    tree=lambda: verify_traversal,  # read when traced: a patched function is the one run
)
