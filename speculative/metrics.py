"""The paper's analysis (Leviathan et al. 2023, section 3) and pooled decode statistics.

alpha: expected acceptance rate E[beta], beta = sum_x min(p(x), q(x)).
c: cost of one draft step divided by one target step.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """E[tokens per target call] = (1 - alpha^(gamma+1)) / (1 - alpha)  (Eq. 1)."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """Expected wall-time improvement (Theorem 3.8): (1 - a^(g+1)) / ((1 - a)(g c + 1))."""
    return expected_tokens_per_call(alpha, gamma) / (gamma * c + 1.0)


def cost_model_speedup(
    tau: float, gamma: int, target_step_s: float, draft_step_s: float, verify_s: float
) -> float:
    """Theorem 3.8's accounting with the verify call's measured cost in place of one step.

    A round is gamma draft steps plus one target call scoring gamma + 1 tokens (verify_s) and
    yields tau tokens, against tau plain steps: tau * target_step / (gamma * draft_step + verify).
    With verify_s = target_step_s and tau from Eq. 1 this is `predicted_speedup`.
    """
    return tau * target_step_s / (gamma * draft_step_s + verify_s)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 64) -> int:
    """Integer gamma in 1..max_gamma maximising `predicted_speedup` (no closed form)."""
    gammas = np.arange(1, max_gamma + 1)
    speedups = [predicted_speedup(alpha, int(g), c) for g in gammas]
    return int(gammas[int(np.argmax(speedups))])


def summarize(stats: Mapping[str, np.ndarray], lengths: np.ndarray) -> dict[str, float]:
    """Pools per-row decode stats into batch-level numbers.

    Args:
      stats: `DecodeOutput.stats` of a speculative decode (per-row arrays).
      lengths: [B] generated tokens per row.
    Returns:
      alpha (pooled over all verified positions), tau (generated tokens per target call), the
      acceptance rate per draft position, and totals.
    """
    stats = {k: np.asarray(v) for k, v in stats.items()}
    lengths = np.asarray(lengths)
    target_calls = int(stats["target_calls"].sum())
    out = {
        "tokens": int(lengths.sum()),
        "target_calls": target_calls,
        "tau": float(lengths.sum() / max(target_calls, 1)),
    }
    if "verified_at" in stats:
        verified = stats["verified_at"].sum(1)
        out["alpha"] = float((stats["alpha"] * verified).sum() / max(verified.sum(), 1))
        out["draft_calls"] = int(stats["draft_calls"].sum())
        out["accepted"] = int(stats["accepted"].sum())
        out["drafted"] = int(stats["drafted"].sum())
        per_position = stats["accepted_at"].sum(0) / np.maximum(stats["verified_at"].sum(0), 1)
        out["acceptance_by_position"] = [float(x) for x in per_position]
    return out
