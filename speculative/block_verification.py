"""Block verification (Sun, Mendlovic, Leviathan et al., ICLR 2025): the 'block' acceptance rule.

It lives in `speculative/decoding/acceptance/block.py` with the other rules; this module keeps
the public names it had.
"""

from speculative.decoding.acceptance.block import prefix_weights, stop_probabilities, verify_block

__all__ = ["prefix_weights", "stop_probabilities", "verify_block"]
