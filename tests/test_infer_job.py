"""The gin-configured inference job (speculative.infer) end to end on tiny random-weight models.

Models, vocabulary and every setting come from gin files (configs/runs/infer.gin +
configs/demo/tiny_random_models.gin) and --gin.NAME=value flags, as a user would launch it.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest

import speculative
from speculative import infer
from speculative.config import gin_flags
from speculative.errors import JobError
from speculative.outputs import job_io
from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = helpers.TINY_INFER
FAST = helpers.QUIET_INFER
# Three prompts pad to width 8, three to width 16: a new width compiles, which keeps the resume
# test's subprocess busy (for seconds) after its first rows are written, so it is killed mid-run.
PROMPTS = ["Hi", "Ein", "x = 1", "def add(a, b):", "Hello, world!", "import numpy"]


def _write_jsonl(path: pathlib.Path, texts) -> pathlib.Path:
    path.write_text(
        "".join(json.dumps({"inputs": t, "id": f"ex{i}"}) + "\n" for i, t in enumerate(texts))
    )
    return path


def _flags(inputs: pathlib.Path, out: pathlib.Path, *extra: str) -> list[str]:
    return TINY + FAST + [f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_DIR='{out}'", *extra]


def _rows(out: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


@pytest.fixture(autouse=True)
def _cwd_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # gin paths in the flags are relative to the repository, as in the docs


# ------------------------------------------------------------------------------------------------
# End to end.


def test_greedy_speculative_equals_plain_and_outputs_are_complete(tmp_path, capsys):
    inputs = _write_jsonl(tmp_path / "in.jsonl", PROMPTS[:5])
    spec = infer.main(_flags(inputs, tmp_path / "spec", "--gin.BATCH_SIZE=2", "--gin.GAMMA=3"))
    _check_logs_and_provenance(capsys.readouterr(), tmp_path / "spec")
    plain = infer.main(
        _flags(inputs, tmp_path / "plain", "--gin.BATCH_SIZE=2", "--gin.SPECULATIVE=False")
    )
    spec_rows, plain_rows = _rows(tmp_path / "spec"), _rows(tmp_path / "plain")
    assert [r["index"] for r in spec_rows] == [0, 1, 2, 3, 4]
    assert [r["id"] for r in spec_rows] == [f"ex{i}" for i in range(5)]
    for s, p in zip(spec_rows, plain_rows):
        assert s["output_ids"] == p["output_ids"] and s["output"] == p["output"]
        assert s["inputs"] == p["inputs"]
        assert 1 <= s["length"] == len(s["output_ids"]) <= 16  # TASK_FEATURE_LENGTHS targets = 16
        assert 0.0 <= s["alpha"] <= 1.0 and len(s["accepted_at"]) == 3
        assert s["accepted"] == sum(s["accepted_at"]) and s["drafted"] == 3 * s["target_calls"]
        assert "alpha" not in p and p["target_calls"] == p["length"]
    assert spec["tokens"] == plain["tokens"] == sum(r["length"] for r in spec_rows)
    assert spec["examples"] == 5 and spec["speculative"] and not plain["speculative"]
    assert spec["tau"] == pytest.approx(spec["tokens"] / spec["target_calls"])
    on_disk = json.loads((tmp_path / "spec" / "summary.json").read_text())
    assert on_disk["alpha"] == pytest.approx(spec["alpha"])
    assert "InferConfig.gamma = " in (tmp_path / "spec" / "config.gin").read_text()
    # A second run over a finished directory decodes nothing and reports the same totals.
    again = infer.main(_flags(inputs, tmp_path / "spec", "--gin.BATCH_SIZE=2", "--gin.GAMMA=3"))
    assert again["this_run"]["decoded_examples"] == 0 and again["tokens"] == spec["tokens"]
    assert len(_rows(tmp_path / "spec")) == 5


def test_resume_after_sigkill_has_every_row_once_and_same_results(tmp_path):
    inputs = _write_jsonl(tmp_path / "in.jsonl", PROMPTS)
    sampled = [
        "--gin.TEMPERATURE=1.0",
        "--gin.SEED=7",
    ]  # sampling: rng per batch must be reproducible
    reference = tmp_path / "reference"
    infer.main(_flags(inputs, reference, *sampled))

    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "speculative.infer", *_flags(inputs, out, *sampled)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = tmp_path / "first_run.log"
    with open(log, "w") as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log_file, stderr=log_file)
        predictions = out / "predictions.jsonl"
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if predictions.exists() and predictions.stat().st_size > 0:
                break
            time.sleep(0.02)
        time.sleep(random.uniform(0.0, 0.5))  # a random point after the first rows appeared
        proc.send_signal(signal.SIGKILL)
        code = proc.wait()
    assert code == -signal.SIGKILL, f"the job ended before the kill:\n{log.read_text()[-3000:]}"
    assert predictions.exists(), f"no rows within 300 s:\n{log.read_text()[-3000:]}"
    partial = predictions.read_text().count("\n")
    assert 1 <= partial < len(PROMPTS)
    lock = json.loads((out / job_io.LOCK).read_text())
    assert lock["pid"] == proc.pid  # left behind: taken over once its heartbeat is stale

    restart = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert restart.returncode == 0, restart.stderr[-2000:]
    rows, expected = _rows(out), _rows(reference)
    assert sorted(r["index"] for r in rows) == list(range(len(PROMPTS)))  # each exactly once
    assert sorted(rows, key=lambda r: r["index"]) == expected


# ------------------------------------------------------------------------------------------------
# Bad input: each a clear JobError, nothing written or lost.


def test_unknown_gin_binding(tmp_path, capsys):
    inputs = _write_jsonl(tmp_path / "in.jsonl", PROMPTS[:1])
    flags = _flags(inputs, tmp_path / "o", "--gin.speculative.InferConfig.gamma_typo=3")
    with pytest.raises(JobError, match="gamma_typo"):
        infer.main(flags)
    assert gin_flags.run_job(infer.main, flags) == 2  # one line on stderr, no traceback
    err = capsys.readouterr().err
    assert err.startswith("error: gin config") and "Traceback" not in err
    with pytest.raises(JobError, match="No configurable matching 'nonexistent'"):
        infer.main(_flags(inputs, tmp_path / "o", "--gin.nonexistent.x=1"))
    assert not (tmp_path / "o").exists()


def test_missing_required_macro(tmp_path):
    flags = TINY + FAST + ["--gin.INPUT_FILE='x.jsonl'"]  # OUTPUT_DIR left at %gin.REQUIRED
    with pytest.raises(JobError, match=r"required gin macro\(s\) not set: OUTPUT_DIR"):
        infer.main(flags)
    with pytest.raises(JobError, match="TARGET_CHECKPOINT, TARGET_FORMAT"):
        infer.main(["--gin_file=configs/runs/infer.gin", "--gin.DRAFT_FORMAT='random'"])


def test_missing_checkpoint_path(tmp_path):
    inputs = _write_jsonl(tmp_path / "in.jsonl", PROMPTS[:1])
    missing = tmp_path / "no_such_model.gguf"
    flags = _flags(
        inputs,
        tmp_path / "o",
        "--gin.TARGET_FORMAT='gguf'",
        f"--gin.TARGET_CHECKPOINT='{missing}'",
        "--gin.TARGET_MODEL=None",
    )
    with pytest.raises(JobError, match=f"^target {missing}: path does not exist$"):
        infer.main(flags)
    assert not (tmp_path / "o").exists()  # checked before anything is created


def test_empty_input_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(JobError, match="has no examples"):
        infer.main(_flags(empty, tmp_path / "o"))
    assert not (tmp_path / "o").exists()


def test_malformed_jsonl_line_is_reported_with_its_line_number(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"inputs": "fine"}\n\n{"inputs": "broken\n{"inputs": "also fine"}\n')
    with pytest.raises(JobError, match=r"bad\.jsonl:3: malformed JSONL line"):
        infer.main(_flags(bad, tmp_path / "o"))
    missing_field = tmp_path / "field.jsonl"
    missing_field.write_text('{"inputs": "a"}\n{"prompt": "b"}\n')
    with pytest.raises(JobError, match=r"field\.jsonl:2: no string field 'inputs'"):
        infer.main(_flags(missing_field, tmp_path / "o"))
    assert not (tmp_path / "o").exists()  # policy: the job stops before decoding or writing


def test_output_directory_not_writable(tmp_path):
    inputs = _write_jsonl(tmp_path / "in.jsonl", PROMPTS[:1])
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(JobError, match="is not writable"):
        infer.main(_flags(inputs, blocker / "out"))
    assert blocker.read_text() == "not a directory"
    if os.geteuid() != 0:  # root ignores permission bits
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(JobError, match="is not writable"):
            infer.main(_flags(inputs, locked))


def test_different_job_in_same_output_dir_is_refused_and_rows_kept(tmp_path):
    inputs = _write_jsonl(tmp_path / "in.jsonl", PROMPTS[:2])
    out = tmp_path / "o"
    same = ["--gin.BATCH_SIZE=2", "--gin.GAMMA=3"]  # compiled already by the first test
    infer.main(_flags(inputs, out, *same))
    before = (out / "predictions.jsonl").read_bytes()
    with pytest.raises(JobError, match="different job.*gamma"):
        infer.main(_flags(inputs, out, "--gin.BATCH_SIZE=2", "--gin.GAMMA=5"))
    assert (out / "predictions.jsonl").read_bytes() == before


def _check_logs_and_provenance(captured, out: pathlib.Path) -> None:
    """Status lines are log records on stderr (timestamp, level, logger), the summary is on
    stdout, and summary.json names the code and the config that produced it."""
    logged = [line for line in captured.err.splitlines() if helpers.LOG_LINE.match(line)]
    assert any(" INFO speculative.loading.specs: target: " in line for line in logged), logged
    assert any(" INFO speculative.jobs.infer.run: 5 examples, 0 already in " in x for x in logged)
    assert "target:" not in captured.out and "wrote " in captured.out  # results stay on stdout
    made = json.loads((out / "summary.json").read_text())["provenance"]
    where = json.loads((out / "summary.json").read_text())["environment"]  # issue 57
    assert where["jax"] and where["time_utc"] and where["cores"] >= 1
    assert (
        made["gin_config"] == (out / "config.gin").read_text()
        and "InferConfig" in made["gin_config"]
    )
    assert made["version"] == speculative.__version__
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    if head.returncode == 0:  # tests run from a checkout; from an sdist the commit is null
        assert made["git_commit"] == head.stdout.strip() and isinstance(made["git_dirty"], bool)


# ------------------------------------------------------------------------------------------------
# Pieces: the resumable store and the flag parsing.


def test_result_store_truncates_torn_line_and_rejects_corruption(tmp_path):
    store = job_io.ResultStore(str(tmp_path), {"job": 1})
    store.append([{"index": 0, "x": "a"}, {"index": 1, "x": "b"}])
    with open(store.path, "ab") as f:
        f.write(b'{"index": 2, "x": "tor')  # a kill in the middle of a write
    resumed = job_io.ResultStore(str(tmp_path), {"job": 1})
    assert sorted(resumed.done) == [0, 1]
    resumed.append([{"index": 1, "x": "b"}, {"index": 2, "x": "c"}])  # 1 is not duplicated
    assert [json.loads(line)["index"] for line in store.path.read_text().splitlines()] == [0, 1, 2]
    store.path.write_text('{"index": 0}\nnot json\n{"index": 2}\n')
    with pytest.raises(JobError, match=r"predictions\.jsonl:2: corrupt row"):
        job_io.ResultStore(str(tmp_path), {"job": 1})


def _spec_row(index, alpha, accepted_at, verified_at, length):
    return {
        "index": index,
        "length": length,
        "target_calls": sum(verified_at) // 2 + 1,
        "alpha": alpha,
        "accepted": sum(accepted_at),
        "drafted": 2 * (sum(verified_at) // 2 + 1),
        "draft_calls": 2 * (sum(verified_at) // 2 + 1),
        "verified": sum(verified_at),
        "accepted_at": accepted_at,
        "verified_at": verified_at,
    }


def test_summary_pools_alpha_over_verified_positions_and_running_pool_agrees():
    rows = [
        _spec_row(0, 1.0, [3, 2], [3, 3], 9),
        _spec_row(1, 0.25, [1, 0], [4, 1], 4),
        _spec_row(2, 0.5, [0, 0], [2, 0], 3),
    ]
    s = infer.summarize_rows(rows)
    assert s["examples"] == 3 and s["tokens"] == 16
    assert s["alpha"] == pytest.approx((1.0 * 6 + 0.25 * 5 + 0.5 * 2) / 13)
    assert s["acceptance_by_position"] == pytest.approx([4 / 9, 2 / 4])
    assert (s["accepted"], s["tau"]) == (6, 16 / s["target_calls"])
    # The progress bar's running pool, one batch at a time, equals pooling every row at once.
    running = infer.pool_rows(rows[:1])
    running = infer.pool_rows([running] + rows[1:2])
    running = infer.pool_rows([running] + rows[2:])
    assert running["alpha"] == pytest.approx(s["alpha"])
    assert running["length"] == s["tokens"] and running["accepted"] == s["accepted"]
    plain = [
        {"index": 0, "length": 5, "target_calls": 5},
        {"index": 1, "length": 2, "target_calls": 2},
    ]
    assert infer.summarize_rows(plain) == {
        "examples": 2,
        "tokens": 7,
        "target_calls": 7,
        "tau": 1.0,
    }


def test_gin_flag_rewriting_repeatable_files_and_search_paths(tmp_path):
    assert gin_flags.rewrite_gin_args(["--gin.GAMMA=5", "--gin_file=a.gin", "--gin.X='a=b'"]) == [
        "--gin_bindings=GAMMA = 5",
        "--gin_file=a.gin",
        "--gin_bindings=X = 'a=b'",
    ]
    with pytest.raises(JobError, match="--gin.NAME=VALUE"):
        gin_flags.rewrite_gin_args(["--gin.GAMMA"])
    (tmp_path / "more.gin").write_text("GAMMA = 6\nBATCH_SIZE = 3\n")
    args = gin_flags.parse_args(
        TINY
        + [
            "--gin_file=more.gin",  # found through --gin_search_paths
            f"--gin_search_paths=/nonexistent,{tmp_path}",
            "--gin_bindings=BATCH_SIZE = 2",
            "--gin.OUTPUT_DIR='/tmp/x'",
            "--gin.INPUT_FILE='x.jsonl'",
        ],
        "test",
    )
    gin_flags.parse_gin(args.gin_file, args.gin_bindings, args.gin_search_paths)
    cfg = infer.InferConfig()
    assert (cfg.gamma, cfg.batch_size, cfg.output_dir) == (6, 2, "/tmp/x")  # later wins
    assert cfg.target.model.config.num_layers == 2 and cfg.draft.model.config.num_layers == 1


def test_draft_vocabulary_larger_than_the_draft_model_is_refused(tmp_path):
    """A DRAFT_VOCABULARY other than VOCABULARY selects the cross-vocabulary draft
    (tests/test_cross_vocab.py), fitted to its own vocabulary: one the draft model cannot
    produce every id of is refused as a VOCABULARY would be."""
    inputs = _write_jsonl(tmp_path / "in.jsonl", PROMPTS[:2])
    flags = _flags(
        inputs,
        tmp_path / "out",
        "--gin.DRAFT_VOCABULARY=@draft/speculative.VocabSpec()",
        "--gin.draft/speculative.VocabSpec.kind='byte'",
        "--gin.draft/speculative.VocabSpec.extra_ids=10",
    )
    with pytest.raises(JobError, match="the model has 264 output ids but the vocabulary"):
        infer.main(flags)
