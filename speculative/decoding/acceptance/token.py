"""The 'token' rule (the default): the paper's Algorithm 1, token by token.

On a chain it is `sampling.verify_detailed` (kept in `sampling`, below the decoding layer, with the
lenient variant, l < 1); on a token tree, the same accept-or-resample step tried child by child
down the tree (recursive rejection sampling, `tree.verify_tree`), exact only (lenience 1, the
tree's fixed shape).
"""

from __future__ import annotations

from speculative.decoding import sampling
from speculative.decoding.acceptance import tree
from speculative.decoding.acceptance.base import Rule, Support

# Module attributes are read when the loop is traced, not bound here: a function patched in its
# module (tests/test_mutations.py patches sampling.verify_detailed) is the one the loop runs.
RULE = Rule(
    "token",
    "the paper's Algorithm 1, token by token (the default; lenience l < 1 on chains)",
    chains=Support(lenient=True, adaptive=True),
    trees=Support(),
    chain=lambda: sampling.verify_detailed,
    tree=lambda: tree.verify_tree,
)
