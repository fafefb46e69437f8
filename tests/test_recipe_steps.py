"""scripts/steps.sh, the resumable steps of scripts/reproduce_ende.sh: a step counts as done only
after its command exited 0, so a step killed at any point, outputs half written, runs again."""

from __future__ import annotations

import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _steps(runs: pathlib.Path, body: str) -> subprocess.CompletedProcess:
    script = f'set -euo pipefail\nruns="{runs}"\nsource scripts/steps.sh\n{body}\n'
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True)


def test_a_killed_step_runs_again_and_a_finished_one_is_skipped(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out.txt"
    runs.mkdir()
    # The step writes its output, then is killed before it can finish (SIGKILL, as the OOM killer).
    killed = _steps(runs, f"step 'infer rows/t0_small' sh -c 'echo partial > {out}; kill -9 $$'")
    assert killed.returncode != 0 and out.read_text() == "partial\n"
    assert not (runs / ".done").exists() or not list((runs / ".done").iterdir())
    rerun = _steps(runs, f"step 'infer rows/t0_small' sh -c 'echo whole > {out}'")
    assert rerun.returncode == 0 and out.read_text() == "whole\n"  # it ran again
    assert "== infer rows/t0_small\n" in rerun.stdout
    again = _steps(runs, f"step 'infer rows/t0_small' sh -c 'echo third > {out}'")
    assert "== infer rows/t0_small: done" in again.stdout and out.read_text() == "whole\n"
    assert [p.name for p in (runs / ".done").iterdir()] == ["infer_rows_t0_small"]
    names = [line.split("\t")[0] for line in (runs / "times.tsv").read_text().splitlines()]
    assert names == ["infer rows/t0_small"]  # timed once, when it finished


def test_a_failing_step_stops_the_recipe(tmp_path):
    done = _steps(tmp_path, "step a false\nstep b true")
    assert done.returncode != 0 and "== b" not in done.stdout
