"""scripts/ende_report.py's provenance and paper columns: which code every run ran, read from the
runs' own result files, and the paper's Table 3 alphas (the n-gram drafts included)."""

from __future__ import annotations

import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("ende_report", ROOT / "scripts" / "ende_report.py")
ende_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ende_report)


def _result(path: pathlib.Path, provenance: dict | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({} if provenance is None else {"provenance": provenance}))


def test_run_commits_names_every_commit_and_every_dirty_or_unknown_run(tmp_path):
    a, b = "a" * 40, "b" * 40
    _result(tmp_path / "target/summary.json", {"git_commit": a, "git_dirty": False})
    _result(tmp_path / "alpha/t0_small/summary.json", {"git_commit": a, "git_dirty": True})
    _result(tmp_path / "benchmark_t0/benchmark.json", {"git_commit": b, "git_dirty": False})
    _result(tmp_path / "rows/t0_plain/summary.json", None)  # an old run, no provenance
    code = ende_report.run_commits(tmp_path)
    assert code["commits"] == {a: ["alpha/t0_small", "target"], b: ["benchmark_t0"]}
    assert code["dirty"] == ["alpha/t0_small"] and code["unknown"] == ["rows/t0_plain"]
    line = ende_report.code_line(code)
    assert "aaaaaaaaaaaa, bbbbbbbbbbbb" in line and line.endswith("(not one clean commit).")
    clean = ende_report.run_commits(tmp_path / "target")
    assert ende_report.code_line(clean) == f"Runs from commit {a[:12]}."


def test_paper_alpha_covers_the_model_and_ngram_drafts():
    assert (
        ende_report.paper_alpha("small", 0.0) == 0.75
        and ende_report.paper_alpha("large", 1) == 0.71
    )
    assert (
        ende_report.paper_alpha("unigram", 0) == 0.08
        and ende_report.paper_alpha("bigram", 1) == 0.19
    )
    assert ende_report.paper_alpha("small_distilled", 0) is None  # not in the paper
