"""The T5 trainer's guarantees (issue 27): settings refused before anything is read, a job
fingerprint and a lock on OUTPUT_DIR, a non-finite loss stopping the run before it is saved, and
a damaged newest checkpoint skipped for the previous complete one."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
import threading

import pytest

from speculative import train
from speculative.checkpoints import t5x_write
from speculative.errors import JobError
from speculative.jobs.train import guards
from speculative.jobs.train import run as trainer
from speculative.outputs import job_io
from tests.test_train import DATA, GIN, LENGTHS

QUICK = [
    "--gin.BATCH_SIZE=4",
    # one layer each side: the guards do not depend on the depth, and the train step compiles in
    # about half the time of ende_tiny.gin's two
    "--gin.t5.T5Config.num_encoder_layers=1",
    "--gin.t5.T5Config.num_decoder_layers=1",
    "--gin.speculative.TrainConfig.checkpoint_every=5",
    "--gin.speculative.TrainConfig.eval_every=1000",
    "--gin.speculative.TrainConfig.progress=False",
    f"--gin.speculative.TrainConfig.feature_lengths={LENGTHS}",
]


def _run(out, steps, *extra):
    argv = [f"--gin_file={GIN}", f"--gin.OUTPUT_DIR='{out}'", f"--gin.TRAIN_FILE='{DATA}'"]
    return train.main([*argv, "--gin.VALIDATION_FILE=None", f"--gin.STEPS={steps}", *QUICK, *extra])


def _cfg(**overrides) -> trainer.TrainConfig:
    base = trainer.TrainConfig(model=None, vocabulary=None, train_file=DATA, output_dir="/unused")
    return dataclasses.replace(base, **overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"checkpoint_every": 0}, r"checkpoint_every must be an integer >= 1, got 0"),
        ({"steps": 2.5}, "steps must be an integer"),
        ({"learning_rate": float("nan")}, "learning_rate must be a finite number > 0"),
        ({"warmup_steps": -1}, "warmup_steps must be an integer >= 0"),
        ({"feature_lengths": {"inputs": 8}}, "feature_lengths needs 'inputs' and 'targets'"),
        ({"teacher_checkpoint": "/ckpt"}, "teacher_checkpoint is set but no teacher model is"),
        ({"distill_weight": 0.5}, "distill_weight applies only with a teacher"),
        ({"teacher": object()}, "a teacher needs teacher_checkpoint"),
        ({"teacher": object(), "teacher_checkpoint": "/c", "distill_weight": 2.0}, r"in \[0, 1\]"),
    ],
)
def test_settings_that_cannot_work_are_refused_before_anything_is_read(overrides, message):
    with pytest.raises(JobError, match=message) as e:
        guards.validate(_cfg(**overrides))
    assert "\n" not in str(e.value)


def test_fingerprint_lock_and_a_damaged_newest_checkpoint(tmp_path, caplog):
    out, every2 = tmp_path / "run", "--gin.speculative.TrainConfig.checkpoint_every=2"
    _run(out, 4, every2)
    assert t5x_write.checkpoint_steps(out) == [2, 4]
    # Another seed, or another file under the same name, in the same OUTPUT_DIR: refused, named.
    with pytest.raises(JobError, match=r"holds a model trained with other settings \(seed\)"):
        _run(out, 4, every2, "--gin.SEED=1")
    other = tmp_path / "pairs.tsv"
    other.write_text(open(DATA).read().replace("Berlin", "Hamburg"))
    with pytest.raises(JobError, match=r"other settings \(train_file, train_file_sha256\)"):
        _run(out, 4, every2, f"--gin.TRAIN_FILE='{other}'")
    with job_io.lock_output_dir(out):  # a second trainer on the directory
        with pytest.raises(JobError, match="is in use by another job"):
            _run(out, 4, every2)
    # Killed while writing checkpoint 6 (a partial temporary directory), and checkpoint 4
    # damaged since: the run resumes from checkpoint 2, says so, and writes 4 and 6 anew.
    shutil.rmtree(next((out / "checkpoint_4").glob("target.encoder*")))
    partial = out / ".tmp_checkpoint_6"
    partial.mkdir()
    (partial / "target.x").write_text("half")
    with caplog.at_level(logging.INFO, logger="speculative"):
        _run(out, 6, every2)
    assert "checkpoint_4 cannot be read" in caplog.text and "(step 2)" in caplog.text
    assert t5x_write.checkpoint_steps(out) == [2, 4, 6]
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [6]  # the damaged run's step 4 was past checkpoint 2: dropped, redone


def test_a_non_finite_loss_stops_training_before_it_is_saved(tmp_path):
    out = tmp_path / "nan"
    with pytest.raises(
        JobError, match=r"not finite \(NaN or inf\) at step (\d+); .*after step 0"
    ) as e:
        _run(out, 20, "--gin.speculative.TrainConfig.learning_rate=1e30",
             "--gin.speculative.TrainConfig.optimizer='adamw'")  # fmt: skip
    step = int(re.search(r"at step (\d+);", str(e.value)).group(1))
    assert 1 <= step <= 5  # found at the first check, step 5 at the latest
    assert t5x_write.checkpoint_steps(out) == []  # the poisoned state was never saved
    assert not (out / "metrics.jsonl").read_text()  # nor logged
    # the stopped run closed its TensorBoard writer: no event-logger thread of it lives on
    assert not [t for t in threading.enumerate() if type(t).__name__ == "_EventLoggerThread"]


def test_a_tokenizer_wider_than_the_model_is_refused(tmp_path):
    with pytest.raises(JobError, match="model has 64 output ids but the vocabulary"):
        _run(tmp_path / "v", 5, "--gin.t5.T5Config.vocab_size=64")


def test_a_tilde_in_output_dir_is_expanded(tmp_path, monkeypatch):
    from speculative.outputs.storage import OutputDir

    monkeypatch.setenv("HOME", str(tmp_path))
    assert job_io.prepare_output_dir("~/runs/a") == tmp_path / "runs/a"
    with job_io.lock_output_dir("~/runs/b") as out:
        assert out == tmp_path / "runs/b"
    assert OutputDir("~/runs/c").url == str(tmp_path / "runs/c")
    assert not (tmp_path / "~").exists()
