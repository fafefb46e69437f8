"""The benchmark's order of work: validate and resolve the settings, then under OUTPUT_DIR's lock
load the models and run every batch size's cells (skipping a batch size that does not fit in
memory), rewriting benchmark.json after every cell and adding its scalars to OUTPUT_DIR/tensorboard,
then plot and print the table."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import gin

from speculative.errors import JobError
from speculative.jobs import common
from speculative.jobs import spmd as job_spmd
from speculative.jobs.benchmark import cells, harness, settings
from speculative.jobs.benchmark.header import header
from speculative.jobs.benchmark.settings import Settings
from speculative.jobs.benchmark.setup import Setup, batches_of, load, memory_shortfall, print_memory
from speculative.jobs.config import BenchmarkConfig
from speculative.loading import specs as ml
from speculative.measure import plots
from speculative.measure import report as benchmark_report
from speculative.outputs import provenance, summaries
from speculative.outputs.storage import OutputDir

log = logging.getLogger(__name__)


def run(cfg: BenchmarkConfig) -> dict[str, Any]:
    """Runs the sweep; returns the result also written to OUTPUT_DIR/benchmark.json (rewritten
    after every cell, so a long sweep keeps what it measured)."""
    settings.validate(cfg)
    s = settings.resolve(cfg, job_spmd.make_partitioner(cfg.partitioner))
    for batch_size in s.sweep.batch_sizes:  # refused before any weight is read
        job_spmd.check_batch(s.models.partitioner, batch_size, "BATCH_SIZES entry")
    with common.locked_output_dir(s.run.output_dir, s.run.compilation_cache_dir) as cache:
        return run_locked(s, OutputDir(s.run.output_dir), cache)


def measure_batch_size(setup: Setup, s: Settings, batch_size: int) -> Iterator[dict[str, Any]]:
    """Every temperature's cell at one batch size, one at a time; c and the verify costs are
    measured once for them all."""
    batches = batches_of(setup, s, batch_size)
    costs = harness.step_costs(setup, s, batches[0])
    for temperature in s.sweep.temperatures:
        costs["sampling_round_s"] = harness.sampling_round_costs(setup, s, batches[0], temperature)
        yield cells.measure_cell(setup, batches, s, temperature, dict(costs))


def run_locked(
    s: Settings, out_dir: OutputDir, cache: job_spmd.CacheStats | None = None
) -> dict[str, Any]:
    """`run`'s sweep while it holds OUTPUT_DIR's lock (local or on a store). With the compilation
    cache on, benchmark.json's compilation_cache says whether the compile times are warm (cache
    hits). benchmark.json is rewritten whole (temp file + rename, or one put) after every cell."""
    setup = load(s)
    print_memory(setup, s)
    for name in ("benchmark.json", *plots.PLOTS):  # an earlier run's results go first:
        if out_dir.exists(name):  # nothing of it may stand beside this run's partial results
            out_dir.delete(name)
    result = header(s, setup)
    result["provenance"] = provenance.record(gin.operative_config_str())  # models built: complete
    result["environment"] = provenance.environment()  # time, command line, jax, CPU and flags
    if cache is not None and cache.dir:
        result["compilation_cache"] = cache.to_json()
    # purge_step 0: an earlier sweep's events in this directory are hidden, as its benchmark.json
    # is rewritten
    with summaries.Scalars(out_dir.url, purge_step=0, enabled=not out_dir.remote) as tensorboard:
        for batch_size in s.sweep.batch_sizes:
            reason = memory_shortfall(setup, s, batch_size)
            if reason is not None:
                log.warning(f"batch {batch_size}: skipped ({reason})")
                result["skipped"].append({"batch_size": batch_size, "reason": reason})
                continue
            try:
                for cell in measure_batch_size(setup, s, batch_size):
                    result["cells"].append(cell)
                    if "compilation_cache" in result:
                        result["compilation_cache"] = cache.to_json()
                    out_dir.write_text("benchmark.json", json.dumps(result, indent=2))
                    write_cell(tensorboard, cell)
            except FloatingPointError as e:  # NaN logits: `runner.Decoder` checks every output
                raise nan_error(s, batch_size, e) from e
            except Exception as e:  # noqa: BLE001  only out-of-memory is expected; others re-raise
                if "RESOURCE_EXHAUSTED" not in str(e) and not isinstance(e, MemoryError):
                    raise
                log.warning(f"batch {batch_size}: skipped (out of memory: {str(e)[:200]})")
                reason = f"out of memory: {str(e)[:500]}"
                result["skipped"].append({"batch_size": batch_size, "reason": reason})
    if not result["cells"]:
        raise JobError("no batch size fitted in memory; nothing was measured")
    result["complete"] = True
    out_dir.write_text("benchmark.json", json.dumps(result, indent=2))
    plots.plot(result, out_dir)
    benchmark_report.print_table(result)
    log.info(f"wrote {out_dir}/benchmark.json and plots")
    return result


def cell_scalars(cell: dict[str, Any]) -> dict[int, dict[str, float]]:
    """{gamma: {tag: value}}: speedup, alpha and tau of every point of a benchmark.json cell,
    tagged <name>/b<batch size>_t<temperature>/<variant> (one TensorBoard curve over gamma each)."""
    where = f"b{cell['batch_size']}_t{cell['temperature']:g}"
    scalars: dict[int, dict[str, float]] = {}
    for p in cell["points"]:
        for name in ("speedup", "alpha", "tau"):
            scalars.setdefault(p["gamma"], {})[f"{name}/{where}/{p['variant']}"] = p[name]
    return scalars


def write_cell(tensorboard: summaries.Scalars, cell: dict[str, Any]) -> None:
    """A cell's scalars, flushed (a long sweep shows each cell as it ends)."""
    for gamma, values in sorted(cell_scalars(cell).items()):
        tensorboard.write(gamma, values)
    tensorboard.flush()


def nan_error(s: Settings, batch_size: int, error: FloatingPointError) -> JobError:
    """NaN logits of the target or a draft at a batch size. The program that raised it
    (`runner.run_batches` names it: (variant, gamma), or a draft's prefill) picks the draft
    named: the variant's own, not the job's first."""
    program = getattr(error, "program", None)
    draft, where = s.models.drafts[0][1], f"at batch size {batch_size}"
    if isinstance(program, tuple):  # (variant name, gamma)
        variant = next((v for v in s.sweep.variants if v.name == program[0]), None)
        draft = variant.draft if variant is not None and variant.draft is not None else draft
        where += f" (variant {program[0]!r}, gamma {program[1]})"
    paths = {"target": ml.where(s.models.target), "draft": ml.describe(draft)}
    return common.nan_error(error, where, str(error), paths)
