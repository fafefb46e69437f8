"""Choosing γ, or plain decoding, from what this machine measures (the paper's section 3.5 with
the real verify cost).

Theorem 3.8 assumes the target's verify call costs one step whatever its length. It does not:
`docs/benchmarks.md` measures a (γ+1)-token call at 1.2-2.4 steps on a CPU, and at large batch
the call turns compute-bound. The planner therefore scores every γ with the measured costs,

    speedup(γ) = τ(α, γ) · t_step / (γ · t_draft + t_verify(γ + 1)),   τ(α, γ) = (1 - α^(γ+1)) / (1 - α)

(`metrics.cost_model_speedup`), and picks the best γ, or plain decoding when no γ beats
`min_speedup`. α comes from a warm-up batch decoded speculatively; the costs from `timing`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from speculative import decoding
from speculative.decoding import tree as tree_shape
from speculative.decoding.drafter import Drafter
from speculative.measure import metrics, timing


@dataclasses.dataclass(frozen=True)
class Plan:
    """gamma: the chosen γ (a tree's depth), or None for plain decoding. predicted_speedup: the
    cost model's figure for that choice (1.0 for plain). candidates: γ -> predicted speedup for
    every chain scored.

    Planned with trees (`measure.tree_planner`, TREE = 'auto'): tree is the chosen token tree's
    parents (None: a chain, or plain decoding), tree_candidates maps every tree scored, by its
    widths per depth, to its predicted speedup, and rank_acceptance[d - 1][r] is the measured
    rate at which depth d's accepted node was sibling rank r. A chain plan leaves them empty."""

    gamma: int | None
    predicted_speedup: float
    alpha: float
    target_step_s: float
    draft_step_s: float
    candidates: Mapping[int, float]
    tree: tuple[int, ...] | None = None
    tree_candidates: Mapping[tuple[int, ...], float] = dataclasses.field(default_factory=dict)
    rank_acceptance: tuple[tuple[float, ...], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """JSON-able fields (summary.json's "planner"); gamma None means plain decoding. A chain
        plan has no tree fields (plan.json as it was before trees were planned)."""
        fields = {
            "gamma": self.gamma,
            "predicted_speedup": self.predicted_speedup,
            "alpha": self.alpha,
            "target_step_s": self.target_step_s,
            "draft_step_s": self.draft_step_s,
            "c": self.draft_step_s / self.target_step_s,
            "candidates": {str(g): s for g, s in sorted(self.candidates.items())},
        }
        if not self.tree_candidates:
            return fields
        return {
            **fields,
            "tree": None if self.tree is None else list(self.tree),
            "tree_candidates": {widths_key(w): s for w, s in sorted(self.tree_candidates.items())},
            "rank_acceptance": [list(row) for row in self.rank_acceptance],
        }

    @classmethod
    def from_json(cls, data: Any) -> Plan:
        """The plan `to_json` wrote; ValueError naming the first field that is missing, of the
        wrong type or out of range (a truncated, edited or foreign plan never decodes)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a plan is a JSON object, got {type(data).__name__}")
        candidates = data.get("candidates")
        if not isinstance(candidates, Mapping) or not candidates:
            raise ValueError("'candidates' must be a non-empty object {gamma: predicted speedup}")
        scored = {
            _gamma(g, "a candidate"): _number(v, f"candidates[{g}]", 0.0)
            for g, v in candidates.items()
        }
        gamma = data.get("gamma", "missing")
        if gamma is not None:
            gamma = _gamma(gamma, "'gamma'")
            if gamma not in scored:
                raise ValueError(f"'gamma' {gamma} is not among the candidates {sorted(scored)}")
        return cls(
            gamma=gamma,
            predicted_speedup=_number(data.get("predicted_speedup"), "'predicted_speedup'", 0.0),
            alpha=_number(data.get("alpha"), "'alpha'", 0.0, 1.0),
            target_step_s=_number(data.get("target_step_s"), "'target_step_s'", 0.0, strict=True),
            draft_step_s=_number(data.get("draft_step_s"), "'draft_step_s'", 0.0),
            candidates=scored,
            **_tree_fields(data, gamma),
        )

    def describe(self) -> str:
        best = max(self.candidates.items(), key=lambda gs: gs[1])
        measured = (
            f"alpha {self.alpha:.3f}, target step {1e3 * self.target_step_s:.1f} ms, "
            f"draft step {1e3 * self.draft_step_s:.1f} ms"
        )
        if self.gamma is None:
            return (
                f"planner: plain decoding ({measured}; best speculative choice gamma {best[0]} "
                f"predicted {best[1]:.2f}x)"
            )
        if self.tree is not None:
            tree = tree_shape.TreeShape(self.tree)
            return (
                f"planner: {tree.describe()}, depth {self.gamma}, predicted "
                f"{self.predicted_speedup:.2f}x ({measured})"
            )
        return f"planner: gamma {self.gamma}, predicted {self.predicted_speedup:.2f}x ({measured})"


def widths_key(widths: Sequence[int]) -> str:
    """A tree candidate's JSON key: its widths per depth, '4,2,1'."""
    return ",".join(str(w) for w in widths)


def _widths(key: Any) -> tuple[int, ...]:
    """A tree candidate's widths read back from its key ('4,2,1': integers >= 1)."""
    parts = key.split(",") if isinstance(key, str) else []
    if not parts or not all(p.isdecimal() and int(p) >= 1 for p in parts):
        raise ValueError(f"a tree candidate must be widths per depth such as '4,2,1', got {key!r}")
    return tuple(int(p) for p in parts)


def _tree_fields(data: Mapping[str, Any], gamma: int | None) -> dict[str, Any]:
    """The tree fields of a plan read back (none in a chain plan); ValueError naming the field."""
    if "tree_candidates" not in data and data.get("tree") is None:
        return {}
    scored = data.get("tree_candidates")
    if not isinstance(scored, Mapping) or not scored:
        raise ValueError("'tree_candidates' must be a non-empty object {widths: predicted speedup}")
    trees = {_widths(k): _number(v, f"tree_candidates[{k}]", 0.0) for k, v in scored.items()}
    rows = data.get("rank_acceptance")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
        raise ValueError("'rank_acceptance' must be a non-empty list of lists [depth][rank]")
    rates = tuple(
        tuple(_number(x, f"rank_acceptance[{d}]", 0.0, 1.0) for x in row)
        for d, row in enumerate(rows)
    )
    tree = data.get("tree")
    if tree is not None:
        shape = _tree(tree)
        if shape.widths not in trees or not shape.first_child_chain:
            raise ValueError(f"'tree' {list(tree)} is not among the tree candidates")
        if gamma != shape.depth:
            raise ValueError(f"'gamma' {gamma} must be the tree's depth {shape.depth}")
        tree = shape.parents
    return {"tree": tree, "tree_candidates": trees, "rank_acceptance": rates}


def _tree(value: Any) -> tree_shape.TreeShape:
    """A chosen tree read back: its parents, a list of integers that make a `TreeShape`."""
    if not isinstance(value, list) or any(isinstance(p, bool) for p in value):
        raise ValueError(f"'tree' must be a list of parents or null, got {value!r}")
    try:
        return tree_shape.TreeShape(tuple(value))
    except (TypeError, ValueError) as e:
        raise ValueError(f"'tree' is not a token tree: {e}") from None


def _gamma(value: Any, what: str) -> int:
    """A γ read back from JSON: an integer >= 1 (candidates' keys are decimal strings)."""
    if isinstance(value, str) and value.isdecimal():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be an integer gamma >= 1 or null, got {value!r}")
    return value


def _number(
    value: Any, what: str, low: float, high: float = math.inf, strict: bool = False
) -> float:
    """A finite number read back from JSON, in [low, high] (> low when strict)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    if value < low or value > high or (strict and value == low):
        bound = f"> {low}" if strict else f"in [{low}, {high}]"
        raise ValueError(f"{what} must be {bound}, got {value!r}")
    return float(value)


def plan(
    alpha: float,
    target_step_s: float,
    draft_step_s: float,
    verify_s: Mapping[int, float],
    min_speedup: float = 1.0,
) -> Plan:
    """The best γ under the cost model, or plain decoding.

    Args:
      alpha: measured acceptance rate in [0, 1].
      target_step_s / draft_step_s: one-token step of each model at the batch size that will run.
      verify_s: {tokens: seconds} of the target's call on that many tokens; every length n >= 2
        present is scored as γ = n - 1. A reading below target_step_s is taken as target_step_s.
      min_speedup: speculation must predict more than this, else plain decoding is chosen.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    candidates = {}
    for n in sorted(verify_s):
        if n >= 2:
            gamma = timing.verify_gamma(n)
            tau = metrics.expected_tokens_per_call(alpha, gamma)
            # A call on n tokens does at least one step's work; a faster reading is timing noise
            # (seen on tiny models), and would let a draft with alpha ~ 0 "beat" plain decoding.
            verify = max(verify_s[n], target_step_s)
            candidates[gamma] = metrics.cost_model_speedup(
                tau, gamma, target_step_s, draft_step_s, verify
            )
    if not candidates:
        raise ValueError("verify_s needs at least one length >= 2 (gamma >= 1)")
    gamma, best = max(candidates.items(), key=lambda gs: gs[1])
    chosen = gamma if best > min_speedup else None
    return Plan(
        gamma=chosen,
        predicted_speedup=best if chosen else 1.0,
        alpha=alpha,
        target_step_s=target_step_s,
        draft_step_s=draft_step_s,
        candidates=candidates,
    )


@dataclasses.dataclass(frozen=True)
class Workload:
    """What a planner decodes and times: the target and the draft (a LanguageModel or a `Drafter`)
    with their params, one batch, and the job's DecodeConfig (gamma unset)."""

    target: Any
    target_params: Any
    draft: Any
    draft_params: Any
    batch: dict[str, jax.Array]
    config: decoding.DecodeConfig


def measure_costs(
    work: Workload, gammas: Sequence[int], verify_lengths: Sequence[int] | None = None
) -> dict[str, Any]:
    """`timing.measure_c` on `work.batch`: the verify call at every length in `verify_lengths`
    (default every γ + 1; a tree's node counts + 1 for `tree_planner`), the draft step for a draft
    model (its one-token step) or for a `Drafter` that is not one (its `propose`, per token, at max
    γ)."""
    deepest = dataclasses.replace(work.config, gamma=max(gammas))
    if verify_lengths is None:
        verify_lengths = [timing.verify_tokens(g) for g in gammas]
    # the cache holds the longest verify call timed
    longest = dataclasses.replace(
        deepest, gamma=max(deepest.gamma, timing.verify_gamma(max(verify_lengths)))
    )
    models = [work.target] if isinstance(work.draft, Drafter) else [work.target, work.draft]
    cache_len = max(longest.cache_length(m, work.batch) for m in models)
    return timing.measure_c(
        work.target, work.target_params, work.draft, work.draft_params, work.batch, cache_len,
        verify_lengths=list(verify_lengths), draft_config=deepest,
    )  # fmt: skip


def plan_from_costs(alpha: float, costs: Mapping[str, Any], min_speedup: float = 1.0) -> Plan:
    """`plan` from `measure_costs`' result."""
    return plan(
        alpha, costs["target_step_s"], costs["draft_step_s"], costs["target_extend_s"], min_speedup
    )


def warmup_config(config: decoding.DecodeConfig, warmup_gamma: int) -> decoding.DecodeConfig:
    """The warm-up decode's config (alpha is measured on it): `config` at warmup_gamma."""
    return dataclasses.replace(config, gamma=warmup_gamma)


def measure_and_plan(
    work: Workload,
    gammas: Sequence[int] = (1, 2, 3, 4, 5, 6, 7),
    warmup_gamma: int = 4,
    rng: jax.Array | None = None,
    min_speedup: float = 1.0,
    decode: Callable[[decoding.DecodeConfig], decoding.DecodeOutput] | None = None,
) -> Plan:
    """Measures α on `work.batch` (a warm-up batch decoded at warmup_gamma) and the step and
    verify costs at its batch size, then `plan`s.

    decode: how the warm-up decode runs, given its config (default: `decoding.speculative_loop` on
    `work.batch` with `rng`); a job passes its own (compiled apart, its real rows only). α is
    pooled by `metrics.summarize` over the rows it returns."""
    warmup = warmup_config(work.config, warmup_gamma)
    if decode is None:
        rng = jax.random.PRNGKey(0) if rng is None else rng

        def decode(c: decoding.DecodeConfig) -> decoding.DecodeOutput:
            return decoding.speculative_loop(
                work.target, work.target_params, work.draft, work.draft_params, work.batch, rng, c
            )

    out = decode(warmup)
    costs = measure_costs(work, gammas)
    alpha = metrics.summarize(out.stats, out.lengths)["alpha"]
    return plan_from_costs(alpha, costs, min_speedup)
