"""Nothing silent in the jobs (issue 16): what each bad input makes the user see.

Every error a user can fix is one line, `error: <role> <path>: <what is wrong>`, with exit status
2 (--debug shows the traceback); inputs are never changed without a word; one job per output
directory. Tiny random-weight models, as in tests/test_infer_job.py.
"""

from __future__ import annotations

import gzip
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import pytest

from speculative import benchmark, infer
from speculative.config import gin_flags
from speculative.errors import JobError
from speculative.loading import specs as ml
from speculative.outputs import job_io
from tests import gguf_testutil as gt
from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = helpers.TINY_INFER
FAST = helpers.QUIET_INFER


@pytest.fixture(autouse=True)
def _cwd_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


_jsonl = helpers.write_jsonl


def _flags(inputs: pathlib.Path, out: pathlib.Path, *extra: str) -> list[str]:
    return TINY + FAST + [f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_DIR='{out}'", *extra]


def _rows(out: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def _one_line_error(capsys, flags, prefix: str) -> str:
    """Runs the job as its __main__ does; asserts exit 2 and one stderr line starting prefix."""
    capsys.readouterr()
    assert gin_flags.run_job(infer.main, flags) == 2
    err = helpers.without_log_lines(capsys.readouterr().err)  # the log lines before it go
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {prefix}"), err
    return err


# ------------------------------------------------------------------------------------------------
# 1. Vocabulary size against the models.


def test_vocabulary_larger_than_the_model_is_refused_naming_both_sizes(tmp_path, capsys):
    inputs = _jsonl(tmp_path / "in.jsonl", ["café"])  # é's bytes are ids >= 128
    flags = _flags(
        inputs,
        tmp_path / "o",
        "--gin.target/decoder.DecoderConfig.vocab_size=128",
        "--gin.draft/decoder.DecoderConfig.vocab_size=128",
    )
    err = _one_line_error(capsys, flags, "target (random weights): the model has 128 output ids")
    assert "(byte vocabulary) has 259 tokens" in err
    assert not (tmp_path / "o" / "predictions.jsonl").exists()


def test_padding_ids_are_masked_out_and_reported(tmp_path):
    """Model tables padded past the 259-id byte vocabulary, by different amounts: the padding ids
    (most of these random models' outputs, unmasked) are never produced, and greedy speculative
    decoding still equals plain decoding."""
    inputs = _jsonl(tmp_path / "in.jsonl", ["Hi", "x = 1", "def f():"])
    sizes = [
        "--gin.target/decoder.DecoderConfig.vocab_size=768",
        "--gin.draft/decoder.DecoderConfig.vocab_size=640",
    ]
    spec = infer.main(_flags(inputs, tmp_path / "spec", "--gin.GAMMA=3", *sizes))
    plain = infer.main(_flags(inputs, tmp_path / "plain", "--gin.SPECULATIVE=False", *sizes))
    assert spec["vocab_padding"] == {
        "vocabulary_tokens": 259,
        "model_output_ids": {"target": 768, "draft": 640},
        "masked_ids": [259, 768],
    }
    assert plain["vocab_padding"]["model_output_ids"] == {"target": 768}
    spec_rows, plain_rows = _rows(tmp_path / "spec"), _rows(tmp_path / "plain")
    for s, p in zip(spec_rows, plain_rows, strict=True):
        assert s["output_ids"] == p["output_ids"]
        assert max(s["output_ids"]) < 259
    on_disk = json.loads((tmp_path / "spec" / "summary.json").read_text())
    assert on_disk["vocab_padding"]["masked_ids"] == [259, 768]


# ------------------------------------------------------------------------------------------------
# 2. Truncation.


def test_truncated_inputs_are_reported_per_row_and_in_the_summary(tmp_path):
    long_text = "".join(chr(ord("a") + i % 26) for i in range(100))
    inputs = _jsonl(tmp_path / "in.jsonl", ["short", long_text])
    lengths = "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 4}"
    summary = infer.main(_flags(inputs, tmp_path / "o", lengths, "--gin.SPECULATIVE=False"))
    short, cut = _rows(tmp_path / "o")
    assert "truncated_from" not in short and "inputs_used" not in short
    assert cut["truncated_from"] == 100 and cut["inputs_used"] == long_text[-16:]
    assert cut["inputs"] == long_text
    assert summary["truncated_inputs"] == 1


def test_strict_inputs_refuses_a_long_input_naming_file_and_line(tmp_path, capsys):
    inputs = _jsonl(tmp_path / "in.jsonl", ["short", "x" * 40])
    flags = _flags(
        inputs,
        tmp_path / "o",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 4}",
        "--gin.STRICT_INPUTS=True",
    )
    err = _one_line_error(capsys, flags, f"input {inputs}:2: input 1 has 40 tokens")
    assert "more than the inputs feature length 16" in err
    assert not (tmp_path / "o").exists()  # refused before anything is written


# ------------------------------------------------------------------------------------------------
# 3. NUM_EXAMPLES.


@pytest.mark.parametrize("value", ["-1", "0", "True", "2.5"])
def test_num_examples_must_be_none_or_positive(tmp_path, value):
    inputs = _jsonl(tmp_path / "in.jsonl", ["a", "b", "c"])
    with pytest.raises(JobError, match="NUM_EXAMPLES must be None .* or an integer >= 1"):
        infer.main(_flags(inputs, tmp_path / "o", f"--gin.NUM_EXAMPLES={value}"))
    bench = [
        "--gin_file=configs/runs/benchmark.gin",
        "--gin_file=configs/demo/tiny_random_models.gin",
        f"--gin.INPUT_FILE='{inputs}'",
        f"--gin.OUTPUT_DIR='{tmp_path / 'b'}'",
        f"--gin.NUM_EXAMPLES={value}",
    ]
    with pytest.raises(JobError, match="NUM_EXAMPLES must be None"):
        benchmark.main(bench)
    assert not (tmp_path / "o").exists() and not (tmp_path / "b").exists()


# ------------------------------------------------------------------------------------------------
# 4. One job per output directory.

_HOLD_LOCK = """
import sys, time
from speculative.outputs import job_io
with job_io.lock_output_dir(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(120)
"""


def test_second_job_is_refused_naming_the_holder_and_a_killed_holder_does_not_block(tmp_path):
    out = tmp_path / "o"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(out)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        inputs = _jsonl(tmp_path / "in.jsonl", ["a"])
        with pytest.raises(JobError, match=rf"in use by another job \(host .*, pid {holder.pid},"):
            infer.main(_flags(inputs, out))
        assert not (out / "predictions.jsonl").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert _lock_pid(out) == holder.pid  # left behind: its holder died
    with job_io.lock_output_dir(out):  # taken over once its heartbeat is a few seconds old
        assert _lock_pid(out) == os.getpid()
    with job_io.lock_output_dir(out):  # released on exit
        pass


def _lock_pid(out: pathlib.Path) -> int:
    return json.loads((out / job_io.LOCK).read_text())["pid"]


def test_one_directory_as_a_path_and_a_file_url_is_one_lock_across_a_kill(tmp_path):
    """Issue 40: a job on DIR and one on file://DIR share DIR/.lock and DIR/predictions.jsonl;
    after the first is killed the rerun on file://DIR resumes with every row once."""
    inputs = _jsonl(tmp_path / "in.jsonl", ["Hi", "Ein", "x = 1", "abc", "Hey"])
    out = tmp_path / "o"
    flags = _flags(inputs, out, "--gin.BATCH_SIZE=2")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = tmp_path / "first.log"
    with open(log, "w") as log_file:
        first = subprocess.Popen(
            [sys.executable, "-m", "speculative.infer", *flags],
            cwd=ROOT, env=env, stdout=log_file, stderr=log_file,
        )  # fmt: skip
    predictions = out / "predictions.jsonl"
    try:
        deadline = time.time() + 300
        while time.time() < deadline and first.poll() is None:
            if predictions.exists() and predictions.stat().st_size > 0:
                break
            time.sleep(0.01)
        first.send_signal(signal.SIGSTOP)  # alive, at a point with rows written: it cannot end
        assert first.poll() is None, log.read_text()[-3000:]
        written = predictions.read_bytes()
        lock = re.escape(os.path.join(os.path.realpath(out), job_io.LOCK))
        url = f"file://{out}"
        # file://DIR is DIR (one storage layout, one lock): the message names the directory
        refused = rf"'{re.escape(str(out))}' is in use .*pid {first.pid},.*file {lock}"
        with pytest.raises(JobError, match=refused):
            infer.main(_flags(inputs, url, "--gin.BATCH_SIZE=2"))
        assert predictions.read_bytes() == written and not (out / "predictions").exists()
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert _lock_pid(out) == first.pid
    done = written.count(b"\n")
    assert 1 <= done < 5
    # the rerun under the other spelling waits out the dead job's last heartbeat, then resumes
    # the same predictions.jsonl (no chunk files)
    rerun = infer.main(_flags(inputs, url, "--gin.BATCH_SIZE=2"))
    assert rerun["this_run"]["decoded_examples"] == 5 - done
    assert not (out / "predictions").exists()
    assert sorted(r["index"] for r in _rows(out)) == [0, 1, 2, 3, 4]  # each row once
    assert not (out / job_io.LOCK).exists()


# ------------------------------------------------------------------------------------------------
# 5. One-line errors naming role and file.


def test_corrupt_and_unsupported_gguf_models_are_one_line_errors(tmp_path, capsys):
    inputs = _jsonl(tmp_path / "in.jsonl", ["a"])
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    gguf = ["--gin.TARGET_FORMAT='gguf'", "--gin.TARGET_MODEL=None"]
    flags = _flags(inputs, tmp_path / "o", *gguf, f"--gin.TARGET_CHECKPOINT='{corrupt}'")
    err = _one_line_error(capsys, flags, f"target {corrupt}: ")
    assert f"{corrupt}: {corrupt}" not in err  # the path is named once
    # --debug: the traceback instead of the line
    assert gin_flags.run_job(infer.main, [*flags, "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err

    hparams = dict(layers=1, context=64, emb=8, mlp=16, heads=2, kv_heads=1)
    mystery = gt.write_model(
        tmp_path / "mystery.gguf", "mystery", {**hparams, "rope_theta": 1e4, "eps": 1e-6}, {}
    )
    # The same output directory: the failed job wrote no rows, so it is not "a different job".
    flags = _flags(inputs, tmp_path / "o", *gguf, f"--gin.TARGET_CHECKPOINT='{mystery}'")
    _one_line_error(capsys, flags, f"target {mystery}: ")


def test_gguf_vocabulary_without_a_tokenizer_is_a_one_line_error(tmp_path, capsys):
    inputs = _jsonl(tmp_path / "in.jsonl", ["a"])
    hparams = dict(layers=1, context=64, emb=8, mlp=16, heads=2, kv_heads=1, rope_theta=1e4)
    bare = gt.write_model(tmp_path / "bare.gguf", "llama", {**hparams, "eps": 1e-6}, {})
    flags = _flags(
        inputs,
        tmp_path / "o",
        "--gin.VOCABULARY=@speculative.VocabSpec()",
        "--gin.speculative.VocabSpec.kind='gguf'",
        f"--gin.speculative.VocabSpec.path='{bare}'",
    )
    _one_line_error(capsys, flags, f"vocabulary {bare}: ")


@pytest.mark.parametrize("config", ["{not json", "{}", "[1, 2]", '{"d_model": "512"}'])
def test_bad_hf_config_json_is_a_one_line_error(tmp_path, capsys, config):
    inputs = _jsonl(tmp_path / "in.jsonl", ["a"])
    model_dir = tmp_path / "t5"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(config)
    flags = _flags(
        inputs,
        tmp_path / "o",
        "--gin.TARGET_FORMAT='hf_t5'",
        "--gin.TARGET_MODEL=None",
        f"--gin.TARGET_CHECKPOINT='{model_dir}'",
    )
    _one_line_error(capsys, flags, f"target {model_dir}: ")


def test_bad_input_files_are_one_line_errors_naming_file_and_line(tmp_path, capsys):
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"inputs": "ok"}\n{"inputs": "caf\xe9"}\n')
    _one_line_error(capsys, _flags(latin1, tmp_path / "o"), f"input {latin1}:2: not UTF-8 text")
    surrogate = tmp_path / "surrogate.jsonl"
    surrogate.write_text('{"inputs": "a"}\n{"inputs": "b"}\n{"inputs": "x\\ud800y"}\n')
    err = _one_line_error(capsys, _flags(surrogate, tmp_path / "o"), f"input {surrogate}:3: ")
    assert "lone surrogate" in err
    rows = "".join(json.dumps({"inputs": f"row {i}"}) + "\n" for i in range(500))
    whole = gzip.compress(rows.encode())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    err = _one_line_error(capsys, _flags(cut, tmp_path / "o"), f"input {cut}: ")
    assert "truncated or corrupt gzip data after line" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("poisoned", ["target", "draft"])
def test_nan_logits_name_the_model_and_the_inputs(tmp_path, capsys, monkeypatch, poisoned):
    load = ml.load_model

    def with_nan_weights(spec, role="model"):
        loaded = load(spec, role)
        if role != poisoned:
            return loaded
        params = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), loaded.params)
        return ml.Loaded(loaded.model, params, loaded.description)

    monkeypatch.setattr(ml, "load_model", with_nan_weights)
    inputs = _jsonl(tmp_path / "in.jsonl", ["a", "b"])
    err = _one_line_error(capsys, _flags(inputs, tmp_path / "o"), f"{poisoned} (random weights): ")
    assert "NaN logits while decoding input(s) 0" in err
