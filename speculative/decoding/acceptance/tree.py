"""The 'token' rule on token trees (`token.RULE`): the longest path the target accepts, exactly.

At each node the rule tries the node's children in rank order with recursive rejection sampling
(multi-candidate speculative sampling; Yang et al. 2024, Jeon et al. 2024 "RSD-S"): child c_i,
drawn from q_i, is accepted with probability min(1, p(c_i) / q_i(c_i)); on rejection the target's
distribution becomes the residual p <- norm(max(0, p - q_i)) and the next child is tried. After
an accepted child the walk moves down; when every child is rejected (or the node has none) the
next token is drawn from the current p. Each sibling's q_i is the distribution it was drawn
from given its earlier siblings: for a sampled draft, q without the earlier siblings (drawn
without replacement, `decoding.tree.siblings`); for a lookup draft, one-hot on the proposal.

Why it is exact (docs/design.md §1, token trees): given the siblings before it, c_i ~ q_i, and
the residual after rejecting c_i does not depend on c_i, so each try is one step of the paper's
rule with the residual as its target; by induction from the last sibling (where the next token
is drawn from the residual itself) the token that leaves a node follows p, and then the next
node's p, and so on down the path. A candidate with q_i(c_i) = 0 (past q's support) is skipped.
At temperature 0 the rule keeps the longest path of target argmaxes (any draft is exact).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from speculative.decoding.acceptance import residual
from speculative.decoding.acceptance.base import TreeRound
from speculative.decoding.sampling import SamplingConfig, categorical, greedy_tokens, process_logits


def verify_tree(
    rng: jax.Array, round: TreeRound, cfg: SamplingConfig
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """Walks each row's tree from the root and returns what it accepted.

    Args:
      rng: PRNG key.
      round: target_logits [B, N+1, V], node_log_q [B, N, V] (log q_i each node was drawn from),
        node_tokens [B, N] int32, and the static children [N+1, W] and depth D (`TreeRound`).
      cfg: sampling configuration shared by draft and target.
    Returns:
      path [B, D] int32 accepted node ids by depth (0 past the accepted length),
      num_accepted [B] int32 in 0..D, next_token [B] int32,
      beta [B, D] float32 the probability that the depth accepted one of the candidates it
        tried, given those candidates (its mean over rounds is the depth's acceptance rate),
      tested [B, D] bool whether the walk tried candidates at that depth.
    """
    node_tokens = round.node_tokens
    if cfg.greedy:
        return _verify_tree_greedy(round.target_logits, node_tokens, round.children, round.depth)
    batch, nodes = node_tokens.shape
    rows = jnp.arange(batch)
    kids_of = jnp.asarray(round.children)
    p_all = jnp.exp(process_logits(round.target_logits, cfg))  # [B, N+1, V]
    accept_rng, resample_rng = jax.random.split(rng)
    uniform = jax.random.uniform(accept_rng, (batch, nodes), dtype=jnp.float32)

    cur = jnp.zeros((batch,), jnp.int32)
    alive = jnp.ones((batch,), jnp.bool_)
    next_dist = p_all[:, 0]
    path, beta, tested = [], [], []
    for _ in range(round.depth):
        kids = kids_of[cur]  # [B, W]
        p = p_all[rows, cur]  # [B, V]
        chosen = jnp.full((batch,), -1, jnp.int32)
        none_kept = jnp.ones((batch,), jnp.float32)
        for rank in range(kids.shape[1]):
            kid = kids[:, rank]
            slot = jnp.maximum(kid - 1, 0)
            token = node_tokens[rows, slot]
            q = jnp.exp(round.node_log_q[rows, slot])  # [B, V]
            p_x, q_x = p[rows, token], q[rows, token]
            tried = alive & (kid >= 0) & (q_x > 0)
            keep = tried & (chosen < 0) & (uniform[rows, slot] * q_x < p_x)
            chosen = jnp.where(keep, kid, chosen)
            ratio = jnp.minimum(p_x / jnp.where(q_x > 0, q_x, 1.0), 1.0)
            none_kept = none_kept * jnp.where(tried, 1.0 - ratio, 1.0)
            # p as it would be after rejecting this child: read only if no child is kept.
            p = jnp.where(tried[:, None], residual.residual_after_rejection(p, q), p)
        moved = chosen >= 0
        tried_here = alive & (kids[:, 0] >= 0)
        next_dist = jnp.where((alive & ~moved)[:, None], p, next_dist)
        tested.append(tried_here)
        beta.append(jnp.where(tried_here, 1.0 - none_kept, 0.0))
        path.append(jnp.where(moved, chosen, 0))
        cur = jnp.where(moved, chosen, cur)
        alive = alive & moved
    next_dist = jnp.where(alive[:, None], p_all[rows, cur], next_dist)
    next_token = categorical(resample_rng, jnp.log(next_dist))
    path = jnp.stack(path, axis=1)
    return path, jnp.sum(path > 0, axis=1).astype(jnp.int32), next_token, *_stack(beta, tested)


def _verify_tree_greedy(target_logits, node_tokens, children, depth):
    """`verify_tree` at temperature 0: follow the child equal to the target's argmax."""
    batch = node_tokens.shape[0]
    rows = jnp.arange(batch)
    kids_of = jnp.asarray(children)
    best = greedy_tokens(target_logits)  # [B, N+1]
    cur = jnp.zeros((batch,), jnp.int32)
    alive = jnp.ones((batch,), jnp.bool_)
    path, beta, tested = [], [], []
    for _ in range(depth):
        kids = kids_of[cur]  # [B, W]
        tokens = jnp.take_along_axis(node_tokens, jnp.maximum(kids - 1, 0), axis=1)
        match = (kids >= 0) & (tokens == best[rows, cur][:, None]) & alive[:, None]
        moved = jnp.any(match, axis=1)
        chosen = kids[rows, jnp.argmax(match, axis=1)]
        tested.append(alive & (kids[:, 0] >= 0))
        beta.append(moved.astype(jnp.float32))
        path.append(jnp.where(moved, chosen, 0))
        cur = jnp.where(moved, chosen, cur)
        alive = alive & moved
    path = jnp.stack(path, axis=1)
    num_accepted = jnp.sum(path > 0, axis=1).astype(jnp.int32)
    return path, num_accepted, best[rows, cur], *_stack(beta, tested)


def _stack(beta: list[jax.Array], tested: list[jax.Array]) -> tuple[jax.Array, jax.Array]:
    return jnp.stack(beta, axis=1), jnp.stack(tested, axis=1)
