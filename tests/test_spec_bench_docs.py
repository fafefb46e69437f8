"""docs/spec_bench.md's measured tables are what `scripts/spec_bench_report.py` generates from the
committed run and cost files: a figure edited by hand, or a run replaced without regenerating the
page, fails here. Pure Python on files in the repository."""

from __future__ import annotations

import json
import pathlib

from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNS = ["benchmarks/spec_bench_qwen_cpu"]
COSTS = ROOT / "benchmarks/spec_bench_costs/costs.json"


def _report():
    return helpers.load_script("spec_bench_report")


def test_docs_tables_are_generated_from_the_committed_runs():
    page = (ROOT / "docs/spec_bench.md").read_text()
    costs = json.loads(COSTS.read_text())
    for run in RUNS:
        table = _report().table(ROOT / run, costs)
        assert table in page, f"docs/spec_bench.md lacks the table of {run}; regenerate it"
        assert f"`{run}/summary.json`" in page
    assert _report().ceiling_table(costs) in page, "the cost ceiling table: regenerate it"


def test_each_run_records_a_clean_commit_and_its_machine():
    for run in RUNS:
        summary = json.loads((ROOT / run / "summary.json").read_text())
        assert summary["provenance"]["git_commit"] and summary["provenance"]["git_dirty"] is False
        assert summary["environment"]["cpu"] and summary["environment"]["jax"]
