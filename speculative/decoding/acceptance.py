"""Acceptance rules: how a speculative round decides, from the target's verify call, which draft
tokens to keep and which token follows them (docs/design.md §1 and §6).

A rule is a function with the signature of `sampling.verify_detailed`:
    (rng, target_logits [B, G+1, V], draft_logits [B, G, V], draft_tokens [B, G], sampling,
     lenience, draft_lengths [B] | None) -> (num_accepted [B], next_token [B], beta [B, G])
and must emit tokens distributed exactly as sampling the target (the tests of
tests/test_block_verification.py and tests/test_decoding.py show how to prove it). Rules by name
(`DecodeConfig.acceptance`, gin ACCEPTANCE):
  'token'  the paper's Algorithm 1, token by token (`sampling.verify_detailed`; the default);
  'block'  block verification (`block_verification.verify_block`): never fewer tokens accepted.
A new rule is a function in its own module and one entry in `_RULES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from speculative import block_verification, sampling

# Module attributes are read when the loop is traced, not bound at import: a rule patched in its
# module (the mutation tests do) is the rule the loop runs.
_RULES: dict[str, Callable[[], Callable[..., Any]]] = {
    "token": lambda: sampling.verify_detailed,
    "block": lambda: block_verification.verify_block,
}
NAMES = tuple(_RULES)


def rule(name: str) -> Callable[..., Any]:
    """The acceptance rule called `name` (one of NAMES)."""
    if name not in _RULES:
        raise ValueError(f"acceptance must be one of {NAMES}, got {name!r}")
    return _RULES[name]()
