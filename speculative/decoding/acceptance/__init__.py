"""Acceptance rules: how a speculative round decides, from the target's verify call, which draft
tokens to keep and which token follows them (docs/design.md §1 and §6). Rules are plug-ins.

Each rule is one module here holding a `base.Rule`: its name (`DecodeConfig.acceptance`, gin
ACCEPTANCE), what it supports for chains and for token trees (`base.Support`: lenience, adaptive
draft lengths, temperatures) and its functions. Rules by name:
  'token'  the paper's Algorithm 1, token by token (token.py; the default): chains
           (`sampling.verify_detailed`, through `token.verify_chain`) and trees (tree.py,
           recursive rejection sampling);
  'block'  block verification (block.py): chains, exact, never fewer tokens accepted;
  'traversal'  traversal verification (traversal.py): trees, exact, sequence-level and leaf
           first; block verification's generalisation (on a chain it is block verification).
Every rule must emit tokens distributed exactly as sampling the target (lenience aside), and
resamples from the shared residual (residual.py). A new rule is one module with its `RULE` and one
entry in `RULES`; `DecodeConfig` asks `RULES` what it supports, and the loop calls `verify`, which
hands the rule the round as one bundle (`base.ChainRound`, `base.TreeRound`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from speculative.decoding.acceptance import block, token, traversal
from speculative.decoding.acceptance.base import ChainRound, Rule, Support, TreeRound, Verdict
from speculative.decoding.sampling import SamplingConfig
from speculative.decoding.tree import TreeShape

__all__ = [
    "NAMES",
    "RULES",
    "ChainRound",
    "Rule",
    "Support",
    "TreeRound",
    "Verdict",
    "names",
    "rule",
    "verify",
]

RULES: dict[str, Rule] = {r.name: r for r in (token.RULE, block.RULE, traversal.RULE)}
NAMES = tuple(RULES)  # the built-in rules; `names()` reads RULES as it is now


def rule(name: str) -> Rule:
    """The acceptance rule called `name` (one of `names()`)."""
    if name not in RULES:
        raise ValueError(f"acceptance must be one of {names()}, got {name!r}")
    return RULES[name]


def names(tree: bool | None = None, **needs: bool) -> tuple[str, ...]:
    """The rules (all; or those that verify trees, tree=True, or chains, tree=False) that support
    every `Support` field given True, e.g. names(False, lenient=True)."""
    found = []
    for r in RULES.values():
        if tree is None:
            found.append(r.name)
            continue
        support = r.support(tree)
        if support is not None and all(getattr(support, k) for k, v in needs.items() if v):
            found.append(r.name)
    return tuple(found)


def verify(
    name: str,
    rng: jax.Array,
    target_logits: jax.Array,
    draft_logits: jax.Array,
    draft_tokens: jax.Array,
    proposed: jax.Array | None = None,
    *,
    sampling: SamplingConfig,
    lenience: float = 1.0,
    adaptive: bool = False,
    tree: TreeShape | None = None,
) -> Verdict:
    """One round's verification by rule `name`, for a chain or a token tree alike.

    Args:
      target_logits: [B, N+1, V] at [last, drafts or tree nodes]; draft_logits: [B, N, V] the
        draft's logits (a chain) or the log q each node was drawn from (a tree); draft_tokens:
        [B, N] int32; proposed: [B] tokens each row proposed, 1..N (a chain; None: all N; a
        tree's round is its whole tree, so a tree ignores it).
      sampling, lenience: as `token.verify_chain`; adaptive: rows may propose fewer than
        N tokens (`GammaPolicy.adaptive`); tree: the static shape, None for a chain.
    Returns:
      Verdict with G = N for a chain, the tree's depth for a tree.
    """
    chosen = rule(name)
    if tree is not None:
        if chosen.tree is None:
            raise ValueError(f"acceptance {name!r} does not verify token trees")
        nodes = TreeRound(target_logits, draft_logits, draft_tokens, tree.children, tree.depth)
        path, n, next_token, beta, tested = chosen.tree()(rng, nodes, sampling)
        return Verdict(path, n, next_token, beta, tested)
    if chosen.chain is None:
        raise ValueError(f"acceptance {name!r} does not verify chains")
    batch, gamma = draft_tokens.shape
    if proposed is None:
        proposed = jnp.full((batch,), gamma, jnp.int32)
    lengths = proposed if adaptive else None
    chain = ChainRound(target_logits, draft_logits, draft_tokens, lengths)
    n, next_token, beta = chosen.chain()(rng, chain, sampling, lenience)
    # Positions 1..min(n+1, proposed) were tested against the target; later ones never were.
    position = jnp.arange(gamma)[None, :]
    tested = (position <= n[:, None]) & (position < proposed[:, None])
    path = jnp.broadcast_to(jnp.arange(1, gamma + 1, dtype=jnp.int32), (batch, gamma))
    return Verdict(path, n, next_token, beta, tested)
