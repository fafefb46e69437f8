"""The paper's analysis (Leviathan et al. 2023, section 3) and pooled decode statistics.

alpha: expected acceptance rate E[beta], beta = sum_x min(p(x), q(x)).
c: cost of one draft step divided by one target step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from speculative.measure import timing


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """E[tokens per target call] = (1 - alpha^(gamma+1)) / (1 - alpha)  (Eq. 1)."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """Expected wall-time improvement (Theorem 3.8): (1 - a^(g+1)) / ((1 - a)(g c + 1))."""
    return expected_tokens_per_call(alpha, gamma) / (gamma * c + 1.0)


def speedup_from_tau(tau: float, gamma: int, c: float) -> float:
    """Theorem 3.8's accounting with measured tokens per call tau in place of Eq. 1: a token
    tree's tau has no closed form in alpha. gamma: draft steps per round (a tree's depth)."""
    return tau / (gamma * c + 1.0)


def draft_calls_per_round(summary: Mapping[str, Any]) -> float:
    """The draft's calls per row and round as the decode counted them (`summarize`'s totals)."""
    return summary["draft_calls"] / max(summary["target_calls"], 1)


def cost_model_speedup(
    tau: float, draft_calls: float, target_step_s: float, draft_step_s: float, verify_s: float
) -> float:
    """Theorem 3.8's accounting with the verify call's measured cost in place of one step.

    A round is `draft_calls` draft calls (gamma for a model draft; the measured mean for a draft
    that reports its calls, such as a staged one, each call costed as one step) plus one target
    call scoring gamma + 1 tokens (verify_s) and yields tau tokens, against tau plain steps:
    tau * target_step / (draft_calls * draft_step + verify). With verify_s = target_step_s,
    draft_calls = gamma and tau from Eq. 1 this is `predicted_speedup`.
    """
    return tau * target_step_s / (draft_calls * draft_step_s + verify_s)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 64) -> int:
    """Integer gamma in 1..max_gamma maximising `predicted_speedup` (no closed form)."""
    gammas = np.arange(1, max_gamma + 1)
    speedups = [predicted_speedup(alpha, int(g), c) for g in gammas]
    return int(gammas[int(np.argmax(speedups))])


def cost_model_optimal_gamma(
    alpha: float, target_step_s: float, draft_step_s: float, verify_s: Mapping[int, float]
) -> int:
    """The gamma maximising `cost_model_speedup` with Eq. 1's tau, over the gammas whose verify
    call was measured: verify_s maps tokens scored (gamma + 1) to seconds. Where a verify call of
    many rows costs more than a step (a batch of 8 on a CPU), this is the gamma to run, and it
    can be far below `optimal_gamma`, which charges one step for any verify call."""
    # keys are ints in memory, strings once read back from benchmark.json
    by_gamma = {timing.verify_gamma(int(n)): t for n, t in verify_s.items() if int(n) > 1}
    if not by_gamma:
        raise ValueError("cost_model_optimal_gamma needs a verify call of 2 or more tokens")

    def speedup(g: int) -> float:
        tau = expected_tokens_per_call(alpha, g)
        return cost_model_speedup(tau, g, target_step_s, draft_step_s, by_gamma[g])

    return max(sorted(by_gamma), key=speedup)


def position_betas(
    target_logits: jax.Array, draft_logits: jax.Array, temperature: float, vocab_size: int
) -> jax.Array:
    """beta = sum_x min(p(x), q(x)) at every position: [B, L, V] x2 -> [B, L] float32.

    Teacher-forced on one token sequence (e.g. the target's own outputs), this measures alpha at
    every position alike. A decode loop's pooled alpha is taken over the positions it verified,
    and those depend on gamma: a block's later positions are verified only after easy ones were
    accepted. temperature 0 compares the arg-maxes (beta is 1 or 0); ids >= vocab_size (padding
    rows of the model tables) are excluded, as the decoders exclude them.
    """
    width = min(target_logits.shape[-1], draft_logits.shape[-1], vocab_size)
    p_logits = target_logits[..., :width].astype(jax.numpy.float32)
    q_logits = draft_logits[..., :width].astype(jax.numpy.float32)
    if temperature == 0:
        same = jax.numpy.argmax(p_logits, -1) == jax.numpy.argmax(q_logits, -1)
        return same.astype(jax.numpy.float32)
    p = jax.nn.softmax(p_logits / temperature, axis=-1)
    q = jax.nn.softmax(q_logits / temperature, axis=-1)
    return jax.numpy.sum(jax.numpy.minimum(p, q), axis=-1)


def summarize(stats: Any, lengths: Any) -> dict[str, Any]:
    """The one pooling of per-row decode statistics into batch- or run-level numbers.

    Args:
      stats: per-row arrays readable by name: a `decoding.DecodeStats` (or several concatenated
        with `concat_rows`), or a mapping such as the infer job's output rows turned into columns.
        Needs "target_calls"; speculative stats add "alpha", "accepted", "drafted",
        "draft_calls", "accepted_at" / "verified_at" [B, G] (G = 0 or absent: plain decoding).
      lengths: [B] generated tokens per row.
    Returns:
      tokens, target_calls, tau (generated tokens per target call); speculative stats add alpha
      (beta pooled over every verified position, i.e. rows weighted by their verified count),
      draft_calls, accepted, drafted and acceptance_by_position (accepted / verified per draft
      position); stats with "outside_mass" (a cross-vocabulary draft) add draft_mass_outside, the
      draft's probability outside the intersection per drafted token; stats with
      "lookup_proposed" (a staged draft) add lookup_proposed, lookup_accepted and
      lookup_acceptance, the share of the lookup's tokens the draft model kept.
    """
    lengths = np.asarray(lengths)
    target_calls = int(np.sum(np.asarray(stats["target_calls"])))
    out: dict[str, Any] = {
        "tokens": int(lengths.sum()),
        "target_calls": target_calls,
        "tau": float(lengths.sum() / max(target_calls, 1)),
    }
    if "verified_at" not in stats or np.asarray(stats["verified_at"]).shape[-1] == 0:
        return out
    verified_at = np.asarray(stats["verified_at"])
    verified = verified_at.sum(1)
    out["alpha"] = float((np.asarray(stats["alpha"]) * verified).sum() / max(verified.sum(), 1))
    for name in ("draft_calls", "accepted", "drafted"):
        out[name] = int(np.sum(np.asarray(stats[name])))
    per_position = np.asarray(stats["accepted_at"]).sum(0) / np.maximum(verified_at.sum(0), 1)
    out["acceptance_by_position"] = [float(x) for x in per_position]
    if "outside_mass" in stats:  # a cross-vocabulary draft: its mass outside the intersection
        outside = float(np.sum(np.asarray(stats["outside_mass"])))
        out["draft_mass_outside"] = outside / max(out["drafted"], 1)
    if "lookup_proposed" in stats:  # a staged draft
        for name in ("lookup_proposed", "lookup_accepted"):
            out[name] = int(np.sum(np.asarray(stats[name])))
        out["lookup_acceptance"] = out["lookup_accepted"] / max(out["lookup_proposed"], 1)
    return out


def concat_rows(trees: Sequence[Any]) -> Any:
    """Concatenates per-row pytrees (e.g. `DecodeStats` of several batches) along the row axis,
    as numpy arrays on the host. Per-position counts [B, G] of different gammas are zero-padded
    to the widest G (a position a smaller gamma never had was never verified), so the stats of a
    whole gamma sweep pool in one `summarize`."""

    def rows_of(*parts: Any) -> np.ndarray:
        parts = [np.asarray(x) for x in parts]
        if parts[0].ndim == 2:
            width = max(x.shape[1] for x in parts)
            parts = [np.pad(x, ((0, 0), (0, width - x.shape[1]))) for x in parts]
        return np.concatenate(parts)

    return jax.tree.map(rows_of, *trees)
