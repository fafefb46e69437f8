"""The benchmark report's batch-size curve: best gamma per batch and the crossover point."""

import math

import pytest

from speculative import benchmark_report


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
