"""scripts/ende_report.py's provenance and paper columns: which code every run ran, read from the
runs' own result files, and the paper's Table 3 alphas (the n-gram drafts included); Table 2 at
the gamma chosen on the validation sweep, with its bootstrap interval, or from runs from before
that split at Theorem 3.8's gamma."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from speculative.errors import JobError
from speculative.measure import metrics

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


def _point(variant: str, gamma: int, speedup: float, mean: float | None = None, ci=None) -> dict:
    point = {"variant": variant, "gamma": gamma, "speedup": speedup, "decode_speedup": speedup}
    if mean is not None:  # a benchmark.json from before the bootstrap has neither
        point.update(
            speedup_mean=mean, speedup_ci95=ci or [mean - 0.1, mean + 0.1],
            speculative_mean_output_tokens=12.5,
        )  # fmt: skip
    return point


def _benchmark(
    path: pathlib.Path,
    t: float,
    points: list[dict],
    plain_tokens=None,
    complete: bool | None = True,
) -> None:
    """A benchmark.json of one cell at temperature t, as speculative.benchmark writes it (marked
    complete; `complete` False: a sweep cut short; None: no mark, as before it was recorded)."""
    variants = {p["variant"]: {"alpha": 0.4, "c": 0.05} for p in points}
    cell = {
        "temperature": t, "points": points, "variants": variants, "plain_s_per_token": 0.002,
        "target_step_s": 0.001, "target_extend_s": {"2": 0.0012, "3": 0.0013, "4": 0.0014},
    }  # fmt: skip
    if plain_tokens is not None:
        cell["plain_mean_output_tokens"] = plain_tokens
    result = {"cells": [cell], "num_examples": 64}
    if complete is not None:
        result["complete"] = complete
    path.mkdir(parents=True)
    (path / "benchmark.json").write_text(json.dumps(result))


def _printed(capsys, *argv: str) -> tuple[int, str]:
    code = ende_report.main(list(argv))
    return code, capsys.readouterr().out.strip()


def test_table2_reports_on_test_the_gamma_chosen_on_validation(tmp_path, capsys):
    # Validation: small's best single run is gamma 3 (1.20x) but its best mean is gamma 2, which
    # is chosen; bigram ties at 1.02 and takes the smaller gamma.
    _benchmark(
        tmp_path / "benchmark_validation_t0", 0.0,
        [_point("small", 1, 1.0, 1.05), _point("small", 2, 1.1, 1.10, [1.04, 1.16]),
         _point("small", 3, 1.2, 1.08), _point("bigram", 1, 1.0, 1.02),
         _point("bigram", 2, 1.0, 1.02)],
    )  # fmt: skip
    assert _printed(capsys, "--runs", str(tmp_path), "--validation_gamma", "small", "0") == (0, "2")
    assert _printed(capsys, "--runs", str(tmp_path), "--validation_gamma", "bigram", "0")[1] == "1"
    code, _ = _printed(capsys, "--runs", str(tmp_path), "--validation_gamma", "small", "1")
    assert code == 2  # no validation run at T = 1
    # The test run times only those gammas, against its own plain baseline.
    _benchmark(
        tmp_path / "benchmark_test_t0", 0.0,
        [_point("small", 2, 1.07, 1.06, [0.98, 1.15]), _point("bigram", 1, 0.97, 0.96)],
        plain_tokens=12.0,
    )  # fmt: skip
    rows = {r["draft"]: r for r in ende_report.benchmark_table(tmp_path)}
    small = rows["small"]
    assert (small["gamma"], small["gamma_from"], small["speedup"]) == (2, "validation", 1.07)
    assert small["speedup_ci95"] == [0.98, 1.15] and small["validation"]["speedup_mean"] == 1.10
    assert small["verify_steps"] == pytest.approx(1.3)  # the test run's verify call, gamma 2
    assert (small["mean_output_tokens"], small["plain_mean_output_tokens"]) == (12.5, 12.0)
    assert rows["bigram"]["gamma"] == 1
    assert _printed(capsys, "--runs", str(tmp_path), "--gamma_for", "small", "0")[1] == "2"
    text = "\n".join(ende_report.table2_markdown(list(rows.values())))
    assert "γ chosen on validation" in text and "Thm 3.8's best (the nearest swept)" not in text
    line = next(x for x in text.splitlines() if x.startswith("| small |"))
    assert "| 1.07x | 1.06x [0.98, 1.15] |" in line  # measured, then bootstrap mean [95% CI]
    assert "| 12.5 / 12.0 |" in line and "| validation: 1.10x [1.04, 1.16]; Thm 3.8: " in line
    head = next(x for x in text.splitlines() if x.startswith("| draft |"))
    assert line.count("|") == head.count("|")  # as many cells as the header


def test_table2_of_runs_from_before_the_validation_split(tmp_path, capsys):
    # The one sweep on the test split, no bootstrap: Thm 3.8's gamma (alpha 0.4, c 0.05: 3 of
    # 1..4) and the sweep's best beside it; a validation run alone does not replace it.
    points = [_point("small", g, s) for g, s in ((1, 1.1), (2, 1.0), (3, 0.95), (4, 0.9))]
    _benchmark(tmp_path / "benchmark_t0", 0.0, points)
    _benchmark(tmp_path / "benchmark_validation_t0", 0.0, [_point("small", 1, 1.1, 1.1)])
    (row,) = ende_report.benchmark_table(tmp_path)
    theorem = metrics.optimal_gamma(0.4, 0.05, max_gamma=4)
    assert (row["gamma"], row["gamma_from"], row["theorem_gamma"]) == (theorem, "Thm 3.8", theorem)
    assert (row["best_gamma"], row["best_speedup"], row["speedup_ci95"]) == (1, 1.1, None)
    assert _printed(capsys, "--runs", str(tmp_path), "--gamma_for", "small", "0")[1] == str(theorem)
    text = "\n".join(ende_report.table2_markdown([row]))
    assert "γ chosen on validation" not in text
    assert "| Thm 3.8; best measured 1.10x (1) |" in text
    assert f"| {theorem} | 0.400 |" in text and "| 1.00x |  | 1.00x |" in text  # no CI recorded


def test_a_test_run_without_the_validation_gamma_is_an_error(tmp_path):
    _benchmark(tmp_path / "benchmark_validation_t0", 0.0, [_point("small", 3, 1.1, 1.1)])
    _benchmark(tmp_path / "benchmark_test_t0", 0.0, [_point("small", 2, 1.0, 1.0)])
    with pytest.raises(JobError, match="benchmark_test_t0/benchmark.json: .*gamma 3"):
        ende_report.benchmark_table(tmp_path)


def test_models_table_reports_each_models_own_test_bleu(tmp_path):
    """Each trained model's row: its validation perplexity and the BLEU of its own greedy
    translations of the test split (the target's: the plain T = 0 row; a draft's:
    runs/alone/<model>); no BLEU where that run is missing."""
    pytest.importorskip("sacrebleu", reason="the repro extra is not installed")
    summary = {"parameters": 1_000_000, "steps": 10, "loss": 2.0, "validation_loss": 2.5}
    for name in ("target_regularised", "draft_small"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    alone = tmp_path / "rows" / "t0_plain"  # the target's own greedy translations
    alone.mkdir(parents=True)
    rows = [
        {"index": 0, "output": "Das ist ein Haus .", "targets": "Das ist ein Haus .", "length": 7},
        {
            "index": 1,
            "output": "Ein Hund schläft .",
            "targets": "Eine Katze schläft .",
            "length": 5,
        },
    ]
    (alone / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _result(alone / "summary.json", None)
    models = {m["model"]: m for m in ende_report.models_table(tmp_path, {})}
    assert set(models) == {"target_regularised", "draft_small"}
    target = models["target_regularised"]
    assert 0.0 < target["test_bleu"] < 100.0  # one exact and one partly wrong translation
    assert target["test_examples"] == 2 and target["mean_output_tokens"] == 6.0
    assert "test_bleu" not in models["draft_small"]
    report = {"models": list(models.values()), "alpha": [], "benchmark": [], "rows": []}
    text = ende_report.markdown({**report, "seed_bleu": {}})
    assert f"| 2.500 (12.2) | {target['test_bleu']:.2f} | 6.0 |" in text


@pytest.mark.parametrize("runs", ["missing", "empty"])
def test_a_report_of_no_runs_is_refused_and_writes_nothing(tmp_path, capsys, runs):
    """reproduce_ende.sh report before any run (it creates the runs directory) must not replace
    the committed report with an empty one."""
    out = tmp_path / "report"
    (tmp_path / "empty").mkdir()
    assert ende_report.main(["--runs", str(tmp_path / runs), "--out", str(out)]) == 2
    assert "nothing to report in" in capsys.readouterr().err and not out.exists()


def _one_error_line(capsys, *argv: str) -> str:
    """main(argv) exits 2 after exactly one line on stderr, `error: ...`, and no traceback."""
    assert ende_report.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ")
    return err.strip()


def _validation_and_test(runs: pathlib.Path, test_complete: bool | None = True) -> None:
    """A validation sweep (small's best mean at gamma 2) and the test run at that gamma."""
    _benchmark(runs / "benchmark_validation_t0", 0.0, [_point("small", 2, 1.1, 1.1)])
    test = runs / "benchmark_test_t0"
    _benchmark(test, 0.0, [_point("small", 2, 1.05, 1.04)], complete=test_complete)


@pytest.mark.parametrize(
    ("name", "text", "what"),
    [
        (
            "benchmark_test_t0/benchmark.json",
            '{"cells": [{"temperature": 0.0, "poi',
            "not valid JSON",
        ),
        ("benchmark_test_t0/benchmark.json", "", "is empty"),
        ("benchmark_test_t0/benchmark.json", "[1, 2]", "not an object"),
        ("benchmark_test_t0/benchmark.json", '{"complete": true}', "has no 'cells'"),
        ("target/summary.json", '{"parameters": 10, "ste', "not valid JSON"),
        ("target/summary.json", '{"parameters": 10}', "has no 'steps'"),
        ("alpha_tf/t0_small.json", '{"alpha": 0.5}', "has no 'tokens'"),
        ("alpha/t0_small/summary.json", "\udcff", "not UTF-8 text"),
    ],
)
def test_a_torn_or_foreign_result_file_is_one_line_naming_it(tmp_path, capsys, name, text, what):
    """The report reads every result file through the one boundary: exit 2, one line naming the
    file and what is wrong, nothing written."""
    _validation_and_test(tmp_path)
    alpha = {"alpha": 0.5, "tokens": 9, "examples": 2, "tau": 1.5, "gamma": 4}
    _result(tmp_path / "alpha/t0_small/summary.json", None)
    (tmp_path / "alpha/t0_small/summary.json").write_text(json.dumps(alpha))
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8", "surrogateescape"))  # "\udcff": the byte 0xff
    out = tmp_path / "out"
    line = _one_error_line(capsys, "--runs", str(tmp_path), "--out", str(out))
    assert line.startswith(f"error: {path}: ") and what in line
    assert not out.exists()


def test_a_torn_predictions_line_is_named_with_its_file_and_line(tmp_path, capsys):
    plain = tmp_path / "rows" / "t0_plain"
    plain.mkdir(parents=True)
    (plain / "summary.json").write_text(json.dumps({"this_run": {"tokens_per_s": 10.0}}))
    row = {"index": 0, "output": "a", "output_ids": [1], "length": 1, "targets": "a"}
    (plain / "predictions.jsonl").write_text(json.dumps(row) + '\n{"index": 1, "outp')
    line = _one_error_line(capsys, "--runs", str(tmp_path), "--out", str(tmp_path / "out"))
    assert line.startswith(f"error: {plain / 'predictions.jsonl'}: line 2 is not valid JSON")
    assert "cut short" in line


@pytest.mark.parametrize("complete", [False, None])
def test_a_report_of_an_incomplete_benchmark_is_refused_unless_allowed_and_then_labelled(
    tmp_path, capsys, complete
):
    """A benchmark.json marked "complete": false (a sweep running or killed), or not marked at all,
    is refused; with --allow_partial the report is built and says it is partial: printed, on
    stderr, in report.json and as report.md's first line."""
    _validation_and_test(tmp_path, test_complete=complete)
    test_file = tmp_path / "benchmark_test_t0" / "benchmark.json"
    out = tmp_path / "out"
    line = _one_error_line(capsys, "--runs", str(tmp_path), "--out", str(out))
    assert line.startswith(f"error: {test_file}: ") and '"complete"' in line
    assert "--allow_partial" in line and not out.exists()
    code = ende_report.main(["--runs", str(tmp_path), "--out", str(out), "--allow_partial"])
    printed = capsys.readouterr()
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert [r["draft"] for r in report["benchmark"]] == ["small"]
    (entry,) = report["partial"]
    assert entry.startswith("benchmark_test_t0/benchmark.json is ") and "complete" in entry
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("**PARTIAL REPORT (--allow_partial): built from benchmark_test_t0/")
    assert printed.out.startswith("**PARTIAL REPORT") and "PARTIAL REPORT" in printed.err


def test_a_report_of_complete_benchmarks_is_not_labelled(tmp_path, capsys):
    _validation_and_test(tmp_path)
    assert ende_report.main(["--runs", str(tmp_path), "--allow_partial"]) == 0
    out = tmp_path / "report"  # the default: beside the runs, not a committed folder
    assert json.loads((out / "report.json").read_text())["partial"] == []
    assert "PARTIAL" not in (out / "report.md").read_text() + capsys.readouterr().err


def test_the_gamma_of_an_incomplete_validation_sweep_is_refused_unless_allowed(tmp_path, capsys):
    points = [_point("small", 2, 1.1, 1.1), _point("small", 3, 1.0, 1.0)]
    _benchmark(tmp_path / "benchmark_validation_t0", 0.0, points, complete=False)
    argv = ["--runs", str(tmp_path), "--validation_gamma", "small", "0"]
    line = _one_error_line(capsys, *argv)
    assert str(tmp_path / "benchmark_validation_t0" / "benchmark.json") in line
    assert ende_report.main([*argv, "--allow_partial"]) == 0
    printed = capsys.readouterr()
    assert printed.out.strip() == "2" and "PARTIAL REPORT" in printed.err


def test_an_existing_report_is_refused_unless_overwrite(tmp_path, capsys):
    """No report replaces one already written (a committed one, say) unless asked to."""
    _validation_and_test(tmp_path)
    out = tmp_path / "committed"
    out.mkdir()
    (out / "report.md").write_text("the committed tables\n")
    line = _one_error_line(capsys, "--runs", str(tmp_path), "--out", str(out))
    assert line.startswith(f"error: {out / 'report.json'}: already exists") or line.startswith(
        f"error: {out / 'report.md'}: already exists"
    )
    assert "--overwrite" in line
    assert (out / "report.md").read_text() == "the committed tables\n"
    assert not (out / "report.json").exists()
    assert ende_report.main(["--runs", str(tmp_path), "--out", str(out), "--overwrite"]) == 0
    assert "| small | 0.0 | 2 |" in (out / "report.md").read_text()
    # and the default output, RUNS/report, is refused the second time alike
    assert ende_report.main(["--runs", str(tmp_path)]) == 0
    assert "already exists" in _one_error_line(capsys, "--runs", str(tmp_path))


def test_the_default_output_is_beside_the_runs_not_a_committed_folder():
    args = ende_report._parser().parse_args([])
    assert args.out is None and not args.overwrite and not args.allow_partial


def test_the_command_line_prints_one_line_and_exits_2_on_a_torn_benchmark(tmp_path):
    """As a user runs it (scripts/ende_report.py, the tables module beside it): no traceback."""
    import subprocess
    import sys

    (tmp_path / "benchmark_t0").mkdir()
    torn = tmp_path / "benchmark_t0" / "benchmark.json"
    torn.write_text('{"cells": [{"temperature": 0.0, "points": [{"gam')
    script = ROOT / "scripts" / "ende_report.py"
    argv = [sys.executable, str(script), "--runs", str(tmp_path), "--out", str(tmp_path / "o")]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: {torn}: is not valid JSON: ") and "(line 1, column" in line


def test_a_malformed_times_line_is_one_line_naming_the_file(tmp_path, capsys):
    _validation_and_test(tmp_path)
    (tmp_path / "times.tsv").write_text("train target\t60\n\nbenchmark\tslow\n")
    line = _one_error_line(capsys, "--runs", str(tmp_path), "--out", str(tmp_path / "out"))
    assert line == f"error: {tmp_path / 'times.tsv'}: line 3 is not '<step>\\t<seconds>'"
    (tmp_path / "times.tsv").write_text("train target\t60\n\ntrain target\t30\n")  # resumed
    assert ende_report.main(["--runs", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "report.json").read_text())["times_s"] == {
        "train target": 90
    }
