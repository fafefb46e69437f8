"""The gin-configured benchmark job (speculative.benchmark) on tiny random-weight models.

Checks the bookkeeping (JSON, plots, Theorem 3.8 numbers, greedy identity, memory skipping), not
speed: timings on tiny models are noise.
"""

from __future__ import annotations

import json
import math
import os
import pathlib

import jax
import numpy as np
import pytest

from speculative import benchmark
from speculative.jobs.benchmark import settings as bench_settings
from speculative.jobs.benchmark import setup as bench_setup
from speculative.loading import specs as ml
from speculative.measure import bootstrap, memory, metrics, plots
from speculative.measure import report as benchmark_report
from speculative.outputs import summaries
from speculative.parallel import partitioning
from tests.helpers import tiny_decoder

ROOT = pathlib.Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def test_benchmark_job_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    # Free memory fixed at 8 GiB: batch 1000000 needs ~70 GiB and must be skipped on any host (a CI
    # host with more free memory than that would otherwise try to run it).
    monkeypatch.setattr(bench_setup, "available_bytes", lambda: 8 * 2**30)
    inputs = tmp_path / "in.jsonl"
    # Byte vocabulary: 5, 5 and 14 tokens, so the two batches of 2 pad to widths 8 and 16.
    inputs.write_text('{"inputs": "Hello"}\n{"inputs": "x = 1"}\n{"inputs": "def add(a, b):"}\n')
    out = tmp_path / "bench"
    result = benchmark.main(
        [
            "--gin_file=configs/runs/benchmark.gin",
            "--gin_file=configs/demo/tiny_random_models.gin",
            f"--gin.INPUT_FILE='{inputs}'",
            f"--gin.OUTPUT_DIR='{out}'",
            "--gin.GAMMAS=[2, 3]",
            "--gin.TEMPERATURES=[0.0]",
            "--gin.BATCH_SIZES=[2, 1000000]",  # the second cannot fit and must be skipped
            "--gin.REPEATS=2",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
        ]
    )
    on_disk = json.loads((out / "benchmark.json").read_text())
    assert on_disk["cells"] == json.loads(json.dumps(result["cells"])) and on_disk["complete"]
    assert [s["batch_size"] for s in result["skipped"]] == [1000000]
    assert [(c["batch_size"], c["temperature"]) for c in result["cells"]] == [(2, 0.0)]
    assert result["stop_ids"] == [1]  # the byte vocabulary's EOS
    assert result["xla_flags"] == os.environ.get("XLA_FLAGS", "")
    assert result["stream_floor_s_per_step"] == pytest.approx(
        result["target_weight_bytes"] / result["read_bandwidth_bytes_s"]
    )
    for cell in result["cells"]:
        assert cell["input_widths"] == [8, 16]
        # The plain baseline's every timed run [batches][repeats] and its tokens, once per cell.
        plain_runs = cell["plain_batch_repeat_s"]
        assert [len(r) for r in plain_runs] == [2, 2] and min(map(min, plain_runs)) > 0
        assert sum(cell["plain_batch_tokens"]) == cell["points"][0]["plain_tokens"]
        # 3 inputs in batches of 2 -> 2 batches, 4 rows (the third input cycled to fill)
        assert cell["plain_mean_output_tokens"] == sum(cell["plain_batch_tokens"]) / 4
        assert cell["c"] == pytest.approx(cell["draft_step_s"] / cell["target_step_s"])
        assert cell["optimal_gamma"] == metrics.optimal_gamma(cell["alpha"], cell["c"])
        assert cell["cost_model_optimal_gamma"] == metrics.cost_model_optimal_gamma(
            cell["alpha"], cell["target_step_s"], cell["draft_step_s"], cell["target_extend_s"]
        )
        assert [p["gamma"] for p in cell["points"]] == [2, 3]
        for p in cell["points"]:
            assert p["speedup"] == pytest.approx(p["speculative_tok_s"] / p["plain_tok_s"])
            assert len(p["plain_batch_s"]) == len(p["speculative_batch_s"]) == 2
            assert p["plain_s"] == pytest.approx(sum(p["plain_batch_s"]))
            # every repeat kept; the per-batch time is their median (of 2: the mean)
            runs = p["speculative_batch_repeat_s"]
            assert [len(r) for r in runs] == [2, 2]
            assert p["speculative_batch_s"] == pytest.approx([sum(r) / 2 for r in runs])
            assert p["plain_batch_s"] == pytest.approx([sum(r) / 2 for r in plain_runs])
            assert sum(p["speculative_batch_tokens"]) == p["speculative_tokens"]
            assert p["speculative_mean_output_tokens"] == p["speculative_tokens"] / 4
            # the bootstrap over those runs (paired with the plain baseline's), recomputable
            interval = bootstrap.speedup_interval(
                bootstrap.Runs(plain_runs, cell["plain_batch_tokens"]),
                bootstrap.Runs(runs, p["speculative_batch_tokens"]),
            )
            assert p["speedup_mean"] == pytest.approx(interval.mean)
            assert p["speedup_ci95"] == pytest.approx([interval.lo, interval.hi])
            assert p["speedup_ci95"][0] <= p["speedup_mean"] <= p["speedup_ci95"][1]
            plain_decode = (p["plain_s"] - p["target_prefill_s"]) / p["plain_tokens"]
            spec_decode = (p["speculative_s"] - p["target_prefill_s"] - p["draft_prefill_s"]) / p[
                "speculative_tokens"
            ]
            assert p["decode_speedup"] == pytest.approx(plain_decode / spec_decode)
            verify_s = cell["target_extend_s"][p["gamma"] + 1]
            assert p["cost_model_speedup"] == pytest.approx(
                p["tau"] * cell["target_step_s"] / (p["gamma"] * cell["draft_step_s"] + verify_s)
            )
            assert p["predicted_speedup"] == pytest.approx(
                metrics.predicted_speedup(p["alpha"], p["gamma"], cell["c"])
            )
            assert len(p["acceptance_by_position"]) == p["gamma"]
            # Per round: measured time beside what its parts cost alone.
            sampling_s = p["round_sampling_s"]
            assert sampling_s > 0 and "sampling_round_s" not in cell
            assert p["round_parts_s"] == pytest.approx(
                p["gamma"] * cell["draft_step_s"] + verify_s + sampling_s
            )
            # Decode time less both prefills timed alone, per round: noise can make it <= 0 on a
            # loaded machine (tiny models), so only its bound is checked, not its sign.
            assert math.isfinite(p["round_s"]) and p["round_s"] < p["speculative_s"]
            # 3 inputs in batches of 2 -> 2 batches, inputs cycled to fill the second.
            assert p["plain_tokens"] <= 4 * 8 and p["speculative_tokens"] <= 4 * 8
            assert p["plain_compile_s"] > 0 and p["speculative_compile_s"] > 0
            assert p["greedy_identical_to_plain"] is True  # temperature 0
            assert p["speculative_tokens"] == p["plain_tokens"]
    for name in plots.PLOTS:
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000
    table = benchmark_report.markdown_table(on_disk)  # the report reads the JSON alone
    assert table.count("\n") == 2 + 2 - 1  # header, rule, one row per gamma
    first = on_disk["cells"][0]["points"][0]
    lo, hi = first["speedup_ci95"]
    assert f"| {first['speedup_mean']:.2f}x [{lo:.2f}, {hi:.2f}] |" in table  # the CI column
    made = on_disk["provenance"]
    assert "GAMMAS = [2, 3]" in made["gin_config"] and "git_commit" in made and "git_dirty" in made
    where = on_disk["environment"]  # where it was measured (issue 57: was missing)
    assert where["jax"] and where["jaxlib"] and where["argv"] and "cpu_flags" in where
    # TensorBoard: speedup, alpha and tau of the cell's points, one curve over gamma each
    scalars = summaries.read_scalars(out / "tensorboard")
    points = result["cells"][0]["points"]
    assert scalars == {
        f"{name}/b2_t0/default": [(p["gamma"], pytest.approx(p[name])) for p in points]
        for name in ("speedup", "alpha", "tau")
    }


class _Recorder:
    """A program that records its compilations and runs (returns the batch's tokens)."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def compile(self, batch, rng):
        self.calls.append(("compile", self.name, batch["prompt"].shape[1]))

        def run(b, r):
            self.calls.append(("run", self.name, b["prompt"].shape[1]))
            return b["prompt"]

        return run, 0.5


def test_interleaved_timings_compile_once_per_width_and_run_in_batch_order():
    calls = []
    batches = [{"prompt": np.zeros((1, w), np.int32)} for w in (8, 8, 16, 8)]
    rngs = [jax.random.PRNGKey(j) for j in range(4)]
    programs = {"a": _Recorder("a", calls), "b": _Recorder("b", calls)}
    result = benchmark.interleaved_timings(programs, batches, rngs, repeats=2)
    assert [c for c in calls if c[0] == "compile"] == [
        ("compile", "a", 8),
        ("compile", "b", 8),
        ("compile", "a", 16),
        ("compile", "b", 16),
    ]
    timed_runs = [c[1:] for c in calls if c[0] == "run"]
    # Per batch: a's warm-up on a new width, a twice, then b likewise; a and b alternate batches.
    assert timed_runs[:6] == [("a", 8)] * 3 + [("b", 8)] * 3
    assert timed_runs[6:10] == [("a", 8)] * 2 + [("b", 8)] * 2  # a seen width: no warm-up
    assert result["a"].compile_s == 1.0 and len(result["a"].batch_seconds) == 4
    assert result["a"].seconds == pytest.approx(sum(result["a"].batch_seconds))
    assert result["a"].tokens == 0 and result["a"].outputs == []  # not a DecodeOutput
    assert [len(r) for r in result["a"].batch_repeat_seconds] == [2] * 4  # every timed run


def _setup(width: int) -> benchmark.Setup:
    target = ml.Loaded(
        *tiny_decoder(vocab=1000, emb=64, layers=3, heads=4, kv_heads=2, seed=0), "t"
    )
    draft = ml.Loaded(*tiny_decoder(vocab=1000, emb=32, layers=1, heads=4, kv_heads=2, seed=1), "d")
    return benchmark.Setup(target, draft, (1,), 1, [[5] * width], width)


def test_memory_check_uses_the_memory_model_beyond_the_loaded_weights(monkeypatch):
    setup = _setup(width=16)
    cfg = benchmark.BenchmarkConfig(
        target=None,
        draft=None,
        vocabulary=None,
        output_dir="/unused",
        gammas=(2, 5),
        feature_lengths={"inputs": 16, "targets": 8},
    )
    mesh = {"data": 1, "model": 1}

    def need(batch_size):  # caches of both models and the workspace, at the largest gamma
        args = (batch_size, 16, 8, 5)
        return (
            memory.state_bytes(setup.target.model, partitioning.TARGET_RULES, mesh, *args)
            + memory.state_bytes(setup.draft.model, partitioning.DRAFT_RULES, mesh, *args)
            + memory.workspace_bytes(setup.target.model, mesh, batch_size, 16, 5)
        )

    assert need(4) == pytest.approx(4 * need(1), rel=0.01)  # everything scales with the batch
    monkeypatch.setattr(bench_setup, "available_bytes", lambda: int(need(4) / 0.8) + 1)
    assert bench_setup.memory_shortfall(setup, bench_settings.resolve(cfg), 4) is None
    reason = bench_setup.memory_shortfall(setup, bench_settings.resolve(cfg), 5)
    assert reason.startswith("estimated ") and "> 80% of available" in reason


def test_a_sweep_cut_short_leaves_a_result_marked_partial(tmp_path, monkeypatch):
    """Killed (here: interrupted) after its first cell: benchmark.json holds that cell and says
    "complete": false, and nothing of an earlier run (its benchmark.json, its plots) is left."""
    from speculative.jobs.benchmark import cells

    monkeypatch.chdir(ROOT)
    out = tmp_path / "bench"
    out.mkdir()
    (out / "benchmark.json").write_text('{"complete": true, "cells": ["an earlier run"]}')
    for name in plots.PLOTS:
        (out / name).write_bytes(PNG)
    measured = cells.measure_cell

    def first_cell_only(*args, **kwargs):
        if (out / "benchmark.json").exists():  # written after the first cell
            raise KeyboardInterrupt
        return measured(*args, **kwargs)

    monkeypatch.setattr(cells, "measure_cell", first_cell_only)
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"inputs": "Hello"}\n')
    with pytest.raises(KeyboardInterrupt):
        benchmark.main(
            ["--gin_file=configs/runs/benchmark.gin", "--gin_file=configs/demo/tiny_random_models.gin",
             f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_DIR='{out}'", "--gin.GAMMAS=[2]",
             "--gin.TEMPERATURES=[0.0, 1.0]", "--gin.BATCH_SIZES=[1]", "--gin.REPEATS=1",
             "--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 4}"]
        )  # fmt: skip
    partial = json.loads((out / "benchmark.json").read_text())
    assert partial["complete"] is False and len(partial["cells"]) == 1
    assert partial["cells"][0]["temperature"] == 0.0
    assert not any((out / name).exists() for name in plots.PLOTS)
