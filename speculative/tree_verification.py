"""The token-tree form of the 'token' acceptance rule (recursive rejection sampling down a tree).

It lives in `speculative/decoding/acceptance/tree.py`, and its residual in `.../residual.py`,
with the other rules; this module keeps the public names it had.
"""

from speculative.decoding.acceptance.residual import residual_after_rejection
from speculative.decoding.acceptance.tree import verify_tree

__all__ = ["residual_after_rejection", "verify_tree"]
