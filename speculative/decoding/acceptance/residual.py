"""The residual every acceptance rule resamples from after a rejection: what a rejected draw from q
leaves of p, norm(max(0, p - q)).

`rejection_residual` and `renormalised` live in `sampling` (the token rule, `sampling.
verify_detailed`, sits below the decoding layer and uses them); every rule of this package reaches
them through this module.
"""

from __future__ import annotations

import jax

from speculative.decoding.sampling import rejection_residual, renormalised

__all__ = ["rejection_residual", "renormalised", "residual_after_rejection"]


def residual_after_rejection(p: jax.Array, q: jax.Array) -> jax.Array:
    """[B, V] norm(max(0, p - q)); p itself where that is empty (p == q: never rejected)."""
    return renormalised(*rejection_residual(p, q), p)
