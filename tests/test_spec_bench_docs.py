"""docs/spec_bench.md's measured tables are what `scripts/spec_bench_report.py` generates from the
committed run and cost files: a figure edited by hand, or a run replaced without regenerating the
page, fails here. Pure Python on files in the repository."""

from __future__ import annotations

import json
import pathlib

from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNS = ["benchmarks/spec_bench_qwen_cpu", "benchmarks/spec_bench_lookup"]
REPLAY = ROOT / "benchmarks/spec_bench_replay/replay.json"
ROUND_COSTS = ROOT / "benchmarks/loop_round_costs/round_costs.json"
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


def test_the_replay_table_is_generated_from_its_file_of_a_clean_commit():
    replay = helpers.load_script("spec_bench_replay")
    report = json.loads(REPLAY.read_text())
    page = (ROOT / "docs/spec_bench.md").read_text()
    assert replay.table(report["summary"], replay.DOC_ROWS) in page, "regenerate the replay table"
    assert report["provenance"]["git_commit"] and report["provenance"]["git_dirty"] is False
    costs = json.loads(ROUND_COSTS.read_text())
    # recorded dirty (docs/spec_bench.md says why: the script imported the main checkout's package
    # while its docs were being edited); its commit and machine are recorded all the same
    assert costs["provenance"]["git_commit"] and costs["environment"]["cpu"]
    # the replay was priced by those round costs
    assert report["verify_in_steps"]["8"] == costs["rounds"]["7"]["in_steps"]


def test_the_hugging_face_table_is_generated_from_its_file_of_a_clean_commit(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # it imports scripts/hf_generate.py
    script = helpers.load_script("spec_bench_hf")
    summary = json.loads((ROOT / "benchmarks/spec_bench_hf/summary.json").read_text())
    page = (ROOT / "docs/spec_bench.md").read_text()
    assert script.doc_table(summary) in page, "regenerate the Hugging Face table"
    assert summary["provenance"]["git_commit"] and summary["provenance"]["git_dirty"] is False
    assert summary["this_run"]["stopped"] and summary["this_run"]["questions"] == 6
