"""GAMMA = 'auto': the planner's choice (`measure.planner.measure_and_plan` on the job's batch 0;
with TREE = 'auto' `measure.tree_planner`'s, chains and trees), made once per output directory and
kept in plan.json for a resumed run."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from speculative import decoding
from speculative.errors import JobError
from speculative.jobs.infer.batches import JobBatch, invalid_batch, job_batches
from speculative.jobs.infer.settings import Settings
from speculative.measure import planner, runner, tree_planner
from speculative.outputs.storage import OutputDir

PLAN = "plan.json"


def _output_dir(out: OutputDir | str | os.PathLike) -> OutputDir:
    return out if isinstance(out, OutputDir) else OutputDir(out)


def load_plan(out: OutputDir | str | os.PathLike, job: Mapping[str, Any]) -> planner.Plan | None:
    """The plan an earlier run of this same job made (None if there is none).

    out: OUTPUT_DIR (a local path, or an `OutputDir`, which may be on an object store).
    Raises JobError for a plan.json that is not this job's plan (unreadable, truncated, edited
    out of range, or written by another job): rows already written used the plan, so guessing
    again could mix two γs in one output."""
    out = _output_dir(out)
    path = out.where(PLAN)
    if not out.exists(PLAN):
        return None
    fix = "delete it to plan again (and the predictions made with it)"
    try:
        record = json.loads(out.read_text(PLAN))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise JobError(f"not a readable plan ({e}); {fix}", role="plan", path=path) from None
    if not isinstance(record, dict) or "plan" not in record:
        raise JobError(f"not a plan (no 'plan' object); {fix}", role="plan", path=path)
    if record.get("fingerprint") != json.loads(json.dumps(job)):
        raise JobError(
            f"written by another job (its fingerprint differs); {fix}", role="plan", path=path
        )
    try:
        return planner.Plan.from_json(record["plan"])
    except ValueError as e:
        raise JobError(f"{e}; {fix}", role="plan", path=path) from None


def save_plan(
    out: OutputDir | str | os.PathLike, job: Mapping[str, Any], plan: planner.Plan
) -> None:
    """Written whole (temp file + rename, or one put) before any row, so every row of the job
    uses the same choice."""
    text = json.dumps({"fingerprint": job, "plan": plan.to_json()}, indent=2)
    _output_dir(out).write_text(PLAN, text)


def plan_gamma(
    s: Settings,
    decoder_for: Callable[[decoding.DecodeConfig], runner.Decoder],
    config: decoding.DecodeConfig,
    ids: Sequence[Sequence[int]],
    nan_error: Callable[[FloatingPointError, Sequence[int]], JobError],
) -> planner.Plan:
    """`planner.measure_and_plan` with alpha from batch 0 decoded at planner_warmup_gamma (its rows
    are not kept: batch 0 is decoded again with the choice) and the costs timed on that batch.
    With TREE = 'auto', `tree_planner.measure_and_plan`: batch 0 decoded with the probe tree.

    decoder_for: the job's decoder for a DecodeConfig; config: the job's, gamma unset."""
    planning = s.speculation.planning
    if planning.trees:
        warmup = tree_planner.probe_config(config, max(planning.gammas))
    else:
        warmup = planner.warmup_config(config, planning.warmup_gamma)
    decoder = decoder_for(warmup)
    first = next(job_batches(s, ids, [0], decoder))

    def decode(_: decoding.DecodeConfig) -> decoding.DecodeOutput:
        return _decode_rows(decoder, first, nan_error)

    work = planner.Workload(
        decoder.target, decoder.target_params, decoder.draft, decoder.draft_params,
        first.batch, config,
    )  # fmt: skip
    if planning.trees:
        return tree_planner.measure_and_plan(work, decode, planning.gammas)
    return planner.measure_and_plan(work, planning.gammas, planning.warmup_gamma, decode=decode)


def _decode_rows(
    decoder: runner.Decoder,
    first: JobBatch,
    nan_error: Callable[[FloatingPointError, Sequence[int]], JobError],
) -> decoding.DecodeOutput:
    """The warm-up decode of batch 0, its real rows only (a short batch 0 repeats its last row)."""
    try:
        result = next(runner.run_batches({"warmup": decoder}, [(first.batch, first.rng)]))
    except FloatingPointError as e:
        raise nan_error(e, first.members) from e
    except ValueError as e:
        raise invalid_batch(first.number, e) from e
    rows = len(first.members)
    return jax.tree.map(lambda x: np.asarray(x)[:rows], result.outputs["warmup"])


def plan_costs(plan: planner.Plan) -> dict[str, Any]:
    """The step costs the plan measured, as `measure_cost` reports them (not timed twice)."""
    fields = plan.to_json()
    return {k: fields[k] for k in ("target_step_s", "draft_step_s", "c")}
