"""The benchmark report's batch-size curve: best gamma per batch and the crossover point; reading
a benchmark.json through the result-file boundary (torn, foreign or partial files refused)."""

import json
import math

import pytest

from speculative.errors import JobError
from speculative.measure import report as benchmark_report
from tests import helpers


def _cell(batch: int, speedups: dict[int, float], temperature: float = 0.0) -> dict:
    points = [
        {"gamma": g, "speedup": s, "decode_speedup": s + 0.1, "alpha": 0.9}
        for g, s in speedups.items()
    ]
    return {"batch_size": batch, "temperature": temperature, "top_p": 1.0, "points": points}


def test_batch_curve_takes_the_best_gamma_of_each_batch():
    result = {"cells": [_cell(4, {2: 1.3, 4: 1.1}), _cell(1, {2: 1.5, 4: 1.7})]}
    curve = benchmark_report.batch_curve(result)["0"]
    assert [(r["batch"], r["gamma"], r["speedup"]) for r in curve] == [(1, 4, 1.7), (4, 2, 1.3)]


def test_crossover_is_interpolated_in_log_batch():
    # 1.4x at batch 4, 0.8x at batch 16: log2 batch 2 -> 4, the 1.0 line at 2 + 2 * 0.4 / 0.6.
    curve = [
        {"batch": 1, "speedup": 1.8},
        {"batch": 4, "speedup": 1.4},
        {"batch": 16, "speedup": 0.8},
    ]
    assert benchmark_report.crossover_batch(curve) == pytest.approx(2 ** (2 + 2 * 0.4 / 0.6))


def test_crossover_none_when_speculation_always_wins_and_first_batch_when_never():
    assert (
        benchmark_report.crossover_batch(
            [{"batch": 1, "speedup": 1.2}, {"batch": 8, "speedup": 1.01}]
        )
        is None
    )
    assert (
        benchmark_report.crossover_batch(
            [{"batch": 2, "speedup": 0.9}, {"batch": 8, "speedup": 0.5}]
        )
        == 2.0
    )


def test_batch_curve_table_names_the_crossover():
    result = {"cells": [_cell(1, {3: 1.6}), _cell(8, {3: 0.9})]}
    table = benchmark_report.batch_curve_table(result)
    assert "| 0 | 8 | 3 |" in table
    batch = 2 ** (3 * 0.6 / 0.7)
    assert f"crossover (best speedup = 1.0) at batch ≈ {batch:.1f}" in table
    assert not math.isnan(batch)


def _write(path, value) -> str:
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return str(path)


def test_read_benchmark_returns_a_complete_sweep(tmp_path):
    result = {"cells": [_cell(1, {2: 1.5})], "complete": True}
    path = _write(tmp_path / "benchmark.json", result)
    assert benchmark_report.read_benchmark(path) == result
    assert benchmark_report.partial_reason(result) is None


@pytest.mark.parametrize(
    ("complete", "why"),
    [(False, '"complete": false (a sweep still running, or cut short)'), (None, "not marked")],
)
def test_read_benchmark_refuses_a_partial_sweep_unless_allowed(tmp_path, complete, why):
    result = {"cells": [_cell(1, {2: 1.5})]}
    if complete is not None:
        result["complete"] = complete
    path = _write(tmp_path / "benchmark.json", result)
    with pytest.raises(JobError, match="--allow_partial") as refused:
        benchmark_report.read_benchmark(path)
    assert str(refused.value).startswith(f"{path}: is ") and why in str(refused.value)
    assert benchmark_report.read_benchmark(path, allow_partial=True) == result
    assert why in benchmark_report.partial_reason(result)


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ('{"cells": [{"batch_size": 1, "tempera', "is not valid JSON: "),
        ("", "is empty"),
        ('{"complete": true}', "has no 'cells'"),
        ('{"cells": {}, "complete": true}', "'cells' is not a list"),
        ("[]", "holds a JSON list, not an object"),
    ],
)
def test_read_benchmark_names_the_file_of_a_torn_or_foreign_one(tmp_path, text, what):
    path = _write(tmp_path / "benchmark.json", text)
    with pytest.raises(JobError) as error:
        benchmark_report.read_benchmark(path)
    assert str(error.value).startswith(f"{path}: ") and what in str(error.value)
    assert "\n" not in str(error.value)


def test_read_benchmark_of_a_missing_file(tmp_path):
    with pytest.raises(JobError, match="benchmark.json: does not exist"):
        benchmark_report.read_benchmark(tmp_path / "benchmark.json")


def test_a_point_without_an_interval_prints_n_a_not_a_zero_width_one():
    assert benchmark_report.ci_text({"speedup_mean": 1.04, "speedup_ci95": None}) == "1.04x [n/a]"
    point = {"speedup_mean": 1.04, "speedup_ci95": [0.98, 1.1]}
    assert benchmark_report.ci_text(point) == "1.04x [0.98, 1.10]"
    assert benchmark_report.ci_text({"speedup": 1.0}) == ""  # recorded before intervals


def test_the_table_prints_the_cost_models_gamma_beside_the_theorems(capsys):
    """The batch-8 run: the theorem charges one step per verify call and says gamma 5; the cost
    model charges the measured 48-row call (2.06 steps) and says 3, the run's best."""
    path = helpers.ROOT / "benchmarks/issue39_batch8/benchmark.json"
    benchmark_report.print_table(benchmark_report.read_benchmark(path))
    lines = [line for line in capsys.readouterr().out.splitlines() if "optimal gamma" in line]
    assert len(lines) == 1
    assert lines[0].endswith(
        "optimal gamma (Thm 3.8) 5; with the measured verify calls (cost model) 3"
    )
