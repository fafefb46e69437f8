"""TREE = 'auto': a chain, a token tree or plain decoding, chosen from the positional acceptance
measured on a probe tree and the verify cost measured per node count (`planner`'s cost model).

Positional acceptance (Sequoia's acceptance vector). A warm-up decode proposes the probe tree,
widths (W,) * D (`decoding.tree`: depth d's W nodes are all children of the first node of depth
d - 1), with `DecodeConfig.count_ranks`; rates[d - 1, r] is the share of the rounds that tried
depth d whose accepted path took sibling rank r there. Rank r's chance given that ranks < r were
rejected does not depend on how many siblings come after it, so a tree of w_d <= W siblings at
depth d accepts one of them at rate a_d(w_d) = Σ_{r < w_d} rates[d - 1, r].

Expected tokens per round of the widths tree (w_1..w_D). Only the first node of a depth has
children, so the walk reaches depth d exactly when it accepted rank 0 at every depth above (in
the probe as in the candidate), and

    E = 1 + Σ_d a_d(w_d) Π_{i<d} rates[i - 1, 0]      (the 1: the token the target adds)

A chain of γ is the tree (1,) * γ. The probe's conditional rates telescope, so over the probe's
rounds this is exact; the assumption is that they are a property of the depth alone, the same in
rounds of another tree and on other batches as on batch 0 (independence across rounds).

Cost of a candidate with N nodes and depth D: D draft steps (a model draft's catch-up call and
D - 1 steps, as for a chain of D; `decoding.tree.grow_first_child_tree`) plus one target call on
N + 1 tokens. The call is timed at a handful of lengths (every chain's, and up to three more up
to the widest candidate's) and linearly interpolated between them; a tree's call is timed as an
extend by as many tokens (its mask changes which keys a query sees, not the work).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from speculative import decoding
from speculative.measure import metrics, planner, timing

PROBE_WIDTH = 4  # W: siblings per depth in the probe; candidates use up to this many


def probe_config(config: decoding.DecodeConfig, depth: int, width: int = PROBE_WIDTH):
    """The warm-up decode's config: `config` proposing the probe tree (width,) * depth and
    counting the accepted ranks."""
    tree = decoding.TreeShape.from_widths((width,) * depth)
    return dataclasses.replace(config, gamma=None, tree=tree, count_ranks=True)


def rank_rates(counts: np.ndarray, tested: np.ndarray) -> np.ndarray:
    """[D, W] rates[d, r]: counts[d, r] (rounds that accepted rank r at depth d + 1) over tested[d]
    (rounds that tried that depth); 0 at a depth never tried."""
    counts, tested = np.asarray(counts, np.float64), np.asarray(tested, np.float64)
    return counts / np.where(tested > 0, tested, 1.0)[:, None]


def expected_tokens(widths: Sequence[int], rates: np.ndarray) -> float:
    """E[tokens per round] of the widths tree (module docstring); widths within rates' [D, W]."""
    reach, total = 1.0, 1.0
    for depth, width in enumerate(widths):
        total += reach * float(np.sum(rates[depth, :width]))
        reach *= float(rates[depth, 0])
    return total


def candidates(gammas: Sequence[int], width: int = PROBE_WIDTH) -> list[tuple[int, ...]]:
    """The trees scored, at every depth in gammas: (w, 1, ..., 1) and (w, w2, 1, ..., 1) for
    2 <= w2 <= w <= width (alternatives where acceptance is likeliest, at the top)."""
    shapes = []
    for depth in sorted(set(gammas)):
        tail = (1,) * (depth - 1)
        shapes += [(w, *tail) for w in range(2, width + 1)]
        if depth >= 2:
            wide = range(2, width + 1)
            shapes += [(w, w2, *tail[1:]) for w in wide for w2 in range(2, w + 1)]
    return shapes


def timed_lengths(gammas: Sequence[int], shapes: Sequence[Sequence[int]], extra: int = 3):
    """The verify lengths to time: every chain's (γ + 1) and up to `extra` more, evenly spaced up
    to the largest candidate's N + 1 (the others are interpolated, `verify_cost`)."""
    chains = {timing.verify_tokens(g) for g in gammas}
    top = max(chains)
    need = max([sum(s) + 1 for s in shapes], default=top)
    more = np.linspace(top, need, extra + 1).round().astype(int)[1:] if need > top else []
    return sorted(chains | {int(n) for n in more})


def verify_cost(verify_s: Mapping[int, float], tokens: int) -> float:
    """Seconds of a verify call on `tokens` tokens: measured, or interpolated linearly between the
    nearest measured lengths (held at the ends)."""
    if tokens in verify_s:
        return float(verify_s[tokens])
    lengths = sorted(verify_s)
    return float(np.interp(tokens, lengths, [verify_s[n] for n in lengths]))


def _speedup(widths, rates, target_step_s, draft_step_s, verify_s) -> float:
    tokens = expected_tokens(widths, rates)
    # A call does at least one step's work (as in `planner.plan`: faster readings are noise).
    verify = max(verify_cost(verify_s, sum(widths) + 1), target_step_s)
    return metrics.cost_model_speedup(tokens, len(widths), target_step_s, draft_step_s, verify)


def plan_trees(
    counts: np.ndarray,
    tested: np.ndarray,
    target_step_s: float,
    draft_step_s: float,
    verify_s: Mapping[int, float],
    gammas: Sequence[int],
    min_speedup: float = 1.0,
) -> planner.Plan:
    """The best of the chains γ in gammas and `candidates(gammas, W)`, or plain decoding when none
    predicts more than min_speedup. Ties go to the chain, then to the tree with fewer nodes.

    Args:
      counts: [D, W] accepted ranks by depth summed over the probe's rows (`accepted_rank`).
      tested: [D] rounds that tried each depth (`verified_at` summed); D >= max(gammas).
      verify_s: {tokens: seconds} of the target's call, at least the lengths 2 and the largest
        candidate's (`timed_lengths`).
    """
    counts, tested = np.asarray(counts), np.asarray(tested)
    if counts.ndim != 2 or counts.shape[0] < max(gammas) or tested.shape != counts.shape[:1]:
        raise ValueError(f"counts [D >= {max(gammas)}, W] and tested [D], got {counts.shape}")
    rates = rank_rates(counts, tested)
    costs = (target_step_s, draft_step_s, verify_s)
    chains = {g: _speedup((1,) * g, rates, *costs) for g in sorted(set(gammas))}
    trees = {w: _speedup(w, rates, *costs) for w in candidates(gammas, counts.shape[1])}
    best, choice = max(chains.values()), (1,) * max(chains, key=chains.get)
    for widths in sorted(trees, key=sum):
        if trees[widths] > best:
            best, choice = trees[widths], widths
    chosen = best > min_speedup
    is_tree = chosen and max(choice) > 1
    return planner.Plan(
        gamma=len(choice) if chosen else None,
        predicted_speedup=best if chosen else 1.0,
        alpha=float(counts[:, 0].sum() / max(tested.sum(), 1)),  # rank 0 is the chain's token
        target_step_s=target_step_s,
        draft_step_s=draft_step_s,
        candidates=chains,
        tree=decoding.TreeShape.from_widths(choice).parents if is_tree else None,
        tree_candidates=trees,
        rank_acceptance=tuple(tuple(float(x) for x in row) for row in rates),
    )


def measure_and_plan(
    work: planner.Workload,
    decode: Callable[[decoding.DecodeConfig], decoding.DecodeOutput],
    gammas: Sequence[int] = (1, 2, 3, 4, 5, 6, 7),
    min_speedup: float = 1.0,
) -> planner.Plan:
    """Decodes `work.batch` with the probe tree (`decode`, given its config: the job's runner, its
    real rows only), times the costs on it and `plan_trees`. work.draft: a LanguageModel or a
    `Drafter` that grows trees of first children."""
    out = decode(probe_config(work.config, max(gammas)))
    lengths = timed_lengths(gammas, candidates(gammas))
    chain = dataclasses.replace(work.config, tree=None, count_ranks=False, gamma=max(gammas))
    costs = planner.measure_costs(dataclasses.replace(work, config=chain), gammas, lengths)
    counts = np.asarray(out.stats.accepted_rank).sum(0)
    tested = np.asarray(out.stats.verified_at).sum(0)
    return plan_trees(
        counts, tested, costs["target_step_s"], costs["draft_step_s"], costs["target_extend_s"],
        gammas, min_speedup,
    )  # fmt: skip
