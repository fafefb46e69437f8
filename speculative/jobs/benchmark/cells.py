"""One cell of the benchmark (a batch size and a sampling setting): every program timed, a point
per variant and gamma against the one plain baseline, alpha pooled per variant, and (with
SCORE_OUTPUTS) the target's log-probability of each program's outputs, teacher-forced."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from speculative import decoding
from speculative.data import inputs
from speculative.jobs.benchmark.harness import Timed, prefill_key, time_cell
from speculative.jobs.benchmark.points import Point, make_point
from speculative.jobs.benchmark.settings import Settings
from speculative.jobs.benchmark.setup import Setup
from speculative.jobs.config import Variant
from speculative.loading import specs as ml
from speculative.measure import certificate, metrics

log = logging.getLogger(__name__)


def output_logprob_sum(
    model: Any, params: Any, batch: dict[str, jax.Array], output: decoding.DecodeOutput
) -> float:
    """The target's log-probability summed over a decode's generated tokens (teacher-forced).

    output.tokens [B, T], output.lengths [B]: tokens past a row's length (padding after its stop)
    are not counted. Untempered: log_softmax of the raw logits, whatever the sampling was.
    """
    return float(_logprob_sum(model, params, batch, output.tokens, output.lengths))


@functools.partial(jax.jit, static_argnums=0)
def _logprob_sum(model, params, batch, tokens, lengths):
    logits = decoding.teacher_forced_logits(model, params, batch, tokens)  # [B, T, V]
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]
    counted = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]
    return jnp.sum(jnp.where(counted, picked, 0.0))


def mean_logprob(target: ml.Loaded, batches: Sequence[dict[str, jax.Array]], timed: Timed) -> float:
    """The target's mean log-probability per generated token over a program's outputs."""
    total = sum(
        output_logprob_sum(target.model, target.params, b, o)
        for b, o in zip(batches, timed.outputs)
    )
    return total / max(timed.tokens, 1)


def certify_outputs(
    setup: Setup,
    batches: Sequence[dict[str, jax.Array]],
    timed: Timed,
    sampling: Any,
    noise_seed: certificate.Seed = 0,
) -> dict[str, Any]:
    """The exactness certificate's tests (`measure.certificate.tests`) of one program's outputs at
    T > 0: every emitted token scored by the target, teacher-forced, as the decoder processed it."""
    target = setup.target
    scores = certificate.Scores.concat([
        certificate.score(target.model, target.params, batch, np.asarray(out.tokens),
                          np.asarray(out.lengths), sampling, setup.stop_ids,
                          None if out.round_offsets is None else np.asarray(out.round_offsets))
        for batch, out in zip(batches, timed.outputs, strict=True)
    ])  # fmt: skip
    return certificate.tests(scores, seed=noise_seed)


def cell_certificates(
    setup: Setup,
    batches: Sequence[dict[str, jax.Array]],
    timed: Mapping[Hashable, Timed],
    sampling: Any,
    cell_seed: Sequence[int] = (),
) -> dict[str, Any]:
    """`certify_outputs` of every program of a cell that has outputs, by name ('plain', '<variant>
    gamma <g>'), each logged in one line; each program's PIT noise seeded by (cell_seed, its
    index), so no two programs or cells share it."""
    certificates = {
        k if isinstance(k, str) else f"{k[0]} gamma {k[1]}": certify_outputs(
            setup, batches, t, sampling, (*cell_seed, index)
        )
        for index, (k, t) in enumerate(timed.items())
        if t.outputs
    }
    for name, found in certificates.items():
        log.info(
            f"certificate {name}: {'pass' if found['passed'] else 'FAIL'}, {found['tokens']} "
            f"tokens ({found['informative']} informative), mid-PIT z {found['balance']['z']:+.2f}, KS p {found['uniformity']['pvalue']:.3g} (sees "
            f"{found['uniformity']['detectable_deviation']:.3f}), stops z {found['stops']['z']:+.2f}"
        )
    return certificates


def cell_points(
    timed: Mapping[Hashable, Timed],
    setup: Setup,
    s: Settings,
    variants: Sequence[Variant],
    costs: Mapping[str, Any],
    greedy: bool,
    logprobs: Mapping[Hashable, float] | None = None,
) -> list[Point]:
    """One point per (variant, gamma) against the cell's plain baseline.

    costs: the cell's, with "draft_costs" (per distinct draft: draft_step_s, c)."""
    logprobs = logprobs or {}
    points = []
    for v in variants:
        i = s.sweep.draft_of[v.name]
        draft_prefill = timed.get(prefill_key(i))  # none for a draft that is not a model
        prefill_s = (
            timed["target prefill"].seconds,
            draft_prefill.seconds if draft_prefill else 0.0,
        )
        draft_costs = {**costs, **costs["draft_costs"][i]}
        description = setup.all_drafts()[i].description
        for gamma in v.gammas:
            key = (v.name, gamma)
            p = make_point(
                gamma, timed["plain"], timed[key], prefill_s, draft_costs, greedy, v,
                description, logprobs.get(key),
            )  # fmt: skip
            print_point(v, p)
            points.append(p)
    return points


def print_point(v: Variant, p: Point) -> None:
    name = "" if v.name == "default" else f"{v.name} "
    log.info(
        f"{name}gamma {p.gamma}: alpha {p.alpha:.3f} tau {p.tau:.2f} speedup "
        f"{p.speedup:.2f}x (decode only {p.decode_speedup:.2f}x, Thm 3.8 "
        f"{p.predicted_speedup:.2f}x), plain {p.plain_tok_s:.2f} tok/s, speculative "
        f"{p.speculative_tok_s:.2f} tok/s"
        + ("" if p.target_mean_logprob is None else f", logp {p.target_mean_logprob:.3f}")
        + (
            ""
            if p.draft_mass_outside is None
            else f", draft mass outside the shared tokens {p.draft_mass_outside:.3f}"
        ),
    )


def variant_summary(
    v: Variant, points: Sequence[Point], timed: Mapping[Hashable, Timed]
) -> dict[str, Any]:
    """A variant's alpha over its gammas, its draft's c and the gamma Thm 3.8 finds best for them.

    alpha is `metrics.summarize`'s over every output of the variant at every gamma: beta pooled
    over all their verified positions (alpha does not depend on gamma)."""
    outputs = [out for g in v.gammas for out in timed[(v.name, g)].outputs]
    stats = metrics.concat_rows([out.stats for out in outputs])
    lengths = np.concatenate([np.asarray(out.lengths) for out in outputs])
    alpha = metrics.summarize(stats, lengths)["alpha"]
    c = next(p for p in points if p.variant == v.name).c
    return {"alpha": alpha, "c": c, "optimal_gamma": metrics.optimal_gamma(alpha, c)}


def print_cell_head(batches: Sequence[dict[str, jax.Array]], sampling, costs) -> None:
    extend_ms = ", ".join(f"{n}: {1e3 * t:.0f}" for n, t in costs["target_extend_s"].items())
    log.info(
        f"batch {len(inputs.input_tokens(batches[0]))}, {sampling}, c {costs['c']:.3f} (target "
        f"step {1e3 * costs['target_step_s']:.0f} ms, draft step "
        f"{1e3 * costs['draft_step_s']:.0f} ms; target extend by n tokens, ms: {extend_ms}):",
    )


def measure_cell(
    setup: Setup,
    batches: Sequence[dict[str, jax.Array]],
    s: Settings,
    temperature: float,
    costs: Mapping[str, Any],
) -> dict[str, Any]:
    """benchmark.json's cell for one batch size and temperature (with the configured filters)."""
    sampling = s.sweep.sampling(temperature)
    print_cell_head(batches, sampling, costs)
    timed = time_cell(setup, batches, s, sampling)
    variants = s.sweep.at(temperature)
    logprobs = {}
    if s.sweep.score_outputs:  # untimed: after every program of the cell has run
        logprobs = {
            k: mean_logprob(setup.target, batches, t) for k, t in timed.items() if t.outputs
        }
    certificates = {}
    if s.sweep.certify_outputs and not sampling.greedy:  # untimed, as the scores
        cell_seed = (len(inputs.input_tokens(batches[0])), round(1000 * temperature))
        certificates = cell_certificates(setup, batches, timed, sampling, cell_seed)
    points = cell_points(timed, setup, s, variants, costs, sampling.greedy, logprobs)
    summaries = {v.name: variant_summary(v, points, timed) for v in variants}
    first = summaries[variants[0].name]
    extra: dict[str, Any] = {}
    if s.sweep.named:
        extra["variants"] = summaries
    if s.sweep.score_outputs:
        extra["plain_target_mean_logprob"] = logprobs["plain"]
    if certificates:
        extra["certificates"] = certificates
    first_point = next(p for p in points if p.variant == variants[0].name)
    return {
        "batch_size": len(inputs.input_tokens(batches[0])),
        "temperature": float(temperature),
        "exact": all(p.exact for p in points),
        "lenience": float(variants[0].lenience),
        "top_k": s.sweep.top_k,
        "top_p": s.sweep.top_p,
        "input_widths": [int(inputs.input_tokens(b).shape[1]) for b in batches],
        # each point holds its own round's sampling seconds (round_sampling_s)
        **{k: v for k, v in costs.items() if k not in ("draft_costs", "sampling_round_s")},
        # Prefill included, so at batch 1 an upper bound on one plain step.
        "plain_s_per_token": points[0].plain_s / points[0].plain_tokens,
        # The one plain baseline's every timed run [batches][repeats], tokens per batch and per
        # example: what each point's speedup interval is paired with.
        "plain_batch_repeat_s": timed["plain"].batch_repeat_seconds,
        "plain_batch_tokens": timed["plain"].batch_tokens,
        "plain_mean_output_tokens": timed["plain"].mean_output_tokens,
        # alpha, c and the optimal gamma of the first variant (the only one without variants).
        "alpha": first["alpha"],
        "c": first["c"],
        "draft_step_s": first_point.draft_step_s,
        "optimal_gamma": first["optimal_gamma"],
        # The same alpha with each swept verify call's measured cost: the gamma to run where a
        # verify call costs more than a step (large batches on a CPU).
        "cost_model_optimal_gamma": metrics.cost_model_optimal_gamma(
            first["alpha"],
            costs["target_step_s"],
            first_point.draft_step_s,
            costs["target_extend_s"],
        ),  # fmt: skip
        **extra,
        "points": [dataclasses.asdict(p) for p in points],
    }
