"""The benchmark's points: one gamma of a variant in a cell against the cell's plain baseline
(benchmark.json's "points"), made from the harness's timings and the batch size's costs."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from speculative.jobs.benchmark.harness import Timed
from speculative.jobs.benchmark.settings import round_key, verify_tokens
from speculative.jobs.config import Variant
from speculative.measure import bootstrap, metrics


@dataclasses.dataclass(frozen=True)
class Point:
    """One gamma of a cell against the cell's plain baseline (benchmark.json's points).

    *_s: seconds summed over the batches; *_batch_s: per batch (median of the repeats);
    speculative_batch_repeat_s: every timed run, [batches][repeats]; speculative_batch_tokens:
    tokens per batch; speculative_mean_output_tokens: tokens per example (the cell holds the same
    three of its plain baseline). speedup_mean, speedup_ci95: the bootstrap mean and 95% interval
    of the speedup over inputs and repeats (`measure.bootstrap`, paired with the plain baseline;
    the interval None below 2 batches x 2 repeats).
    decode_speedup: both prefills subtracted (the draft's too), the decode loops alone, as Thm 3.8
    models them. cost_model_speedup: Thm 3.8 with the measured verify cost.
    round_s: measured seconds per speculative round (decode time without the prefills / rounds,
    a batch's rounds being its slowest row's target calls); round_parts_s: what its parts cost
    alone, draft_calls_per_round draft steps + one verify call + the round's sampling work
    (round_sampling_s: its draft samples and its own rule's verification, a tree's included,
    timed alone). draft_calls_per_round: the draft's model calls per row and round as the decode
    counted them (gamma for a model draft; fewer for a staged one, whose lookup saves calls).
    greedy_identical_to_plain: None unless greedy and exact.
    variant / draft / lenience / exact / gamma_policy / acceptance / tree: the speculative setting
      (`Variant`; tree: its nodes' parents, gamma its depth, acceptance_by_position per depth,
      predicted_speedup Thm 3.8's accounting with the measured tau);
    c / draft_step_s: its draft's. target_mean_logprob: the target's mean log-probability per
    generated token of these outputs (None unless BenchmarkConfig.score_outputs).
    draft_mass_outside: a draft with another tokenizer's probability (softmax of its own logits)
    outside the token-level intersection per drafted token, pooled over every output
    (`metrics.summarize`), where acceptance is lost; draft_mass_outside_rows: the same per example
    (row), in batch order. Both None for a draft of the target's tokenizer.
    """

    gamma: int
    alpha: float
    tau: float
    acceptance_by_position: list[float]
    plain_tokens: int
    plain_s: float
    plain_batch_s: list[float]
    plain_tok_s: float
    plain_compile_s: float
    target_prefill_s: float
    draft_prefill_s: float
    speculative_tokens: int
    speculative_s: float
    speculative_batch_s: list[float]
    speculative_tok_s: float
    speculative_compile_s: float
    speculative_batch_repeat_s: list[list[float]]
    speculative_batch_tokens: list[int]
    speculative_mean_output_tokens: float
    speedup: float
    speedup_mean: float
    speedup_ci95: list[float] | None
    decode_speedup: float
    predicted_speedup: float
    cost_model_speedup: float
    round_s: float
    round_parts_s: float
    draft_calls_per_round: float
    round_sampling_s: float
    greedy_identical_to_plain: bool | None
    variant: str = "default"
    draft: str = ""
    lenience: float = 1.0
    exact: bool = True
    gamma_policy: dict[str, Any] = dataclasses.field(default_factory=dict)
    acceptance: str = "token"
    tree: list[int] | None = None
    c: float = float("nan")
    draft_step_s: float = float("nan")
    target_mean_logprob: float | None = None
    draft_mass_outside: float | None = None
    draft_mass_outside_rows: list[float] | None = None


def pooled(timed: Timed) -> dict[str, Any]:
    """`metrics.summarize` over every output of one program (a variant at one gamma)."""
    outputs = timed.outputs
    stats = metrics.concat_rows([o.stats for o in outputs])
    lengths = np.concatenate([np.asarray(o.lengths) for o in outputs])
    return metrics.summarize(stats, lengths)


def outside_rows(timed: Timed) -> list[float] | None:
    """Per example (row, in batch order): the draft's mass outside the intersection per drafted
    token (`DecodeStats.outside_mass` / drafted); None unless the draft reports it."""
    stats = [o.stats for o in timed.outputs]
    if not stats or any(st.outside_mass is None for st in stats):
        return None
    mass = np.concatenate([np.asarray(st.outside_mass, np.float64) for st in stats])
    drafted = np.concatenate([np.asarray(st.drafted) for st in stats])
    return [float(m) for m in mass / np.maximum(drafted, 1)]


def greedy_identical(plain: Timed, spec: Timed, greedy: bool, variant: Variant) -> bool | None:
    """Whether greedy speculative outputs equal the plain ones; None unless greedy and exact (a
    lossy rule may change greedy tokens)."""
    if not greedy or variant.lenience != 1.0:
        return None
    return all(
        np.array_equal(np.asarray(p.tokens), np.asarray(s.tokens))
        for p, s in zip(plain.outputs, spec.outputs)
    )


def _round_costs(
    variant: Variant, gamma: int, summary: Mapping[str, Any], costs: Mapping[str, Any]
) -> tuple[float, float, float]:
    """(verify call seconds, Thm 3.8's predicted speedup, the round's sampling seconds: its own
    rule's and tree's, `harness.sampling_round_costs`)."""
    verify_s = costs["target_extend_s"][verify_tokens(variant, gamma)]
    sampling_s = costs.get("sampling_round_s", {}).get(round_key(variant, gamma), 0.0)
    if variant.tree is None:
        predicted = metrics.predicted_speedup(summary["alpha"], gamma, costs["c"])
    else:  # a tree: no closed form in alpha
        predicted = metrics.speedup_from_tau(summary["tau"], gamma, costs["c"])
    return verify_s, predicted, sampling_s


def _cost_model(
    summary: Mapping[str, Any], costs: Mapping[str, Any], verify_s: float, sampling_s: float
) -> dict[str, float]:
    """The Point fields of Thm 3.8's accounting with measured parts: the draft's calls per row
    and round as counted, the cost model's speedup and what a round's parts cost alone."""
    calls = metrics.draft_calls_per_round(summary)
    step_s = costs["draft_step_s"]
    return {
        "cost_model_speedup": metrics.cost_model_speedup(
            summary["tau"], calls, costs["target_step_s"], step_s, verify_s
        ),
        "round_parts_s": calls * step_s + verify_s + sampling_s,
        "draft_calls_per_round": calls,
    }


def speedup_spread(plain: Timed, spec: Timed) -> dict[str, Any]:
    """The Point fields behind a speedup's interval: the speculative program's every run
    [batches][repeats], tokens per batch and per example, and the bootstrap mean and 95% interval
    of its speedup over the plain baseline's runs (paired by batch)."""
    interval = bootstrap.speedup_interval(
        bootstrap.Runs(plain.batch_repeat_seconds, plain.batch_tokens),
        bootstrap.Runs(spec.batch_repeat_seconds, spec.batch_tokens),
    )
    return {
        "speculative_batch_repeat_s": spec.batch_repeat_seconds,
        "speculative_batch_tokens": spec.batch_tokens,
        "speculative_mean_output_tokens": spec.mean_output_tokens,
        "speedup_mean": interval.mean,
        "speedup_ci95": interval.ci95,  # None (null) below 2 batches x 2 repeats
    }


def make_point(
    gamma: int,
    plain: Timed,
    spec: Timed,
    prefill_s: tuple[float, float],
    costs: Mapping[str, Any],
    greedy: bool,
    variant: Variant | None = None,
    draft: str = "",
    logprob: float | None = None,
) -> Point:
    """A gamma's point from its timings, the plain baseline's and the (target, draft) prefills'.

    costs: the cell's, with c / draft_step_s of this variant's draft; variant None: "default"."""
    variant = variant or Variant("default")
    target_prefill_s, draft_prefill_s = prefill_s
    summary = pooled(spec)
    plain_tok_s, spec_tok_s = plain.tokens / plain.seconds, spec.tokens / spec.seconds
    plain_decode_s = plain.seconds - target_prefill_s
    spec_decode_s = spec.seconds - target_prefill_s - draft_prefill_s
    rounds = sum(int(np.max(np.asarray(o.stats.target_calls))) for o in spec.outputs)
    verify_s, predicted, sampling_s = _round_costs(variant, gamma, summary, costs)
    return Point(
        gamma=gamma,
        alpha=summary["alpha"],
        tau=summary["tau"],
        acceptance_by_position=summary["acceptance_by_position"],
        plain_tokens=plain.tokens,
        plain_s=plain.seconds,
        plain_batch_s=plain.batch_seconds,
        plain_tok_s=plain_tok_s,
        plain_compile_s=plain.compile_s,
        target_prefill_s=target_prefill_s,
        draft_prefill_s=draft_prefill_s,
        speculative_tokens=spec.tokens,
        speculative_s=spec.seconds,
        speculative_batch_s=spec.batch_seconds,
        speculative_tok_s=spec_tok_s,
        speculative_compile_s=spec.compile_s,
        speedup=spec_tok_s / plain_tok_s,
        **speedup_spread(plain, spec),
        decode_speedup=(plain_decode_s / plain.tokens) / (spec_decode_s / spec.tokens),
        predicted_speedup=predicted,
        **_cost_model(summary, costs, verify_s, sampling_s),
        round_s=spec_decode_s / max(rounds, 1),
        round_sampling_s=sampling_s,
        greedy_identical_to_plain=greedy_identical(plain, spec, greedy, variant),
        variant=variant.name,
        draft=draft,
        lenience=float(variant.lenience),
        exact=float(variant.lenience) == 1.0,
        gamma_policy=dataclasses.asdict(variant.gamma_policy),
        acceptance=variant.acceptance,
        tree=None if variant.tree is None else list(variant.tree.parents),
        c=costs["c"],
        draft_step_s=costs["draft_step_s"],
        target_mean_logprob=logprob,
        draft_mass_outside=summary.get("draft_mass_outside"),
        draft_mass_outside_rows=outside_rows(spec),
    )
