"""The 'token' rule (the default): the paper's Algorithm 1, token by token.

On a chain it is `sampling.verify_detailed` (kept in `sampling`, below the decoding layer, with the
lenient variant, l < 1), handed a `ChainRound` by `verify_chain`; on a token tree, the same
accept-or-resample step tried child by child down the tree (recursive rejection sampling,
`tree.verify_tree`), exact only (lenience 1, the tree's fixed shape).
"""

from __future__ import annotations

import jax

from speculative.decoding import sampling
from speculative.decoding.acceptance import tree
from speculative.decoding.acceptance.base import ChainRound, Rule, Support


def verify_chain(
    rng: jax.Array, round: ChainRound, cfg: sampling.SamplingConfig, lenience: float = 1.0
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`sampling.verify_detailed` on a `ChainRound`: num_accepted [B], next_token [B], beta [B, G]."""
    # Read from the module when called: a patched verify_detailed (tests/test_mutations.py) runs.
    return sampling.verify_detailed(
        rng, round.target_logits, round.draft_logits, round.draft_tokens, cfg, lenience,
        round.draft_lengths,
    )  # fmt: skip


# Module attributes are read when the loop is traced, not bound here: a function patched in its
# module is the one the loop runs.
RULE = Rule(
    "token",
    "the paper's Algorithm 1, token by token (the default; lenience l < 1 on chains)",
    chains=Support(lenient=True, adaptive=True),
    trees=Support(),
    chain=lambda: verify_chain,
    tree=lambda: tree.verify_tree,
)
