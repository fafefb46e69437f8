"""scripts/accelerator_benchmark.py end to end at toy sizes on the CPU (seconds)."""

import importlib.util
import json
import pathlib

import pytest

from speculative.measure import metrics

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "accelerator_benchmark.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("accelerator_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # a measurement script's smoke run: scripts/test.sh --slow
def test_tiny_run_writes_json_and_markdown(bench, tmp_path):
    argv = ["--tiny", "--dtype", "float32", "--lengths", "1", "3", "--batches", "1", "2"]
    result = bench.main(argv + ["--out", str(tmp_path)])
    on_disk = json.loads((tmp_path / "benchmark.json").read_text())
    assert on_disk["t5"]["verify_over_step"]["1"] == 1.0
    assert set(on_disk["t5"]["drafts"]) == {"small", "base", "large"}
    assert len(on_disk["t5"]["table_2"]) == 12
    # Every Table 2 row's Thm 3.8 figure is the theorem at the paper's alpha and our measured c.
    for row in result["t5"]["table_2"]:
        assert row["thm_3_8"] == pytest.approx(
            metrics.predicted_speedup(row["alpha"], row["gamma"], row["c"])
        )
        assert (row["cost_model"] is None) == (row["gamma"] + 1 not in (1, 3))
    assert [r["batch"] for r in result["qwen"]["batches"]] == [1, 2]
    for r in result["qwen"]["batches"]:
        assert r["best_gamma"] == 2  # gamma + 1 must be a measured length
    table = (tmp_path / "benchmark.md").read_text()
    assert "| EnDe | small | 0 | 7 | 0.75 | 3.4x |" in table
    assert "| CNNDM | large | 1 | 3 | 0.56 | 1.7x |" in table
    assert "Crossover" in table


def test_best_cost_model_speedup_prefers_a_cheap_verify(bench):
    # A free draft (c = 0) and alpha 0.9: a verify call that costs one step whatever its length
    # favours the longest block; one whose cost grows with the length stops earlier.
    flat = {1: 1.0, 2: 1.0, 3: 1.0, 5: 1.0, 9: 1.0}
    steep = {1: 1.0, 2: 1.1, 3: 2.0, 5: 4.0, 9: 9.0}
    assert bench.best_cost_model_speedup(0.9, 1.0, 0.0, flat)[0] == 8
    assert bench.best_cost_model_speedup(0.9, 1.0, 0.0, steep)[0] == 1
