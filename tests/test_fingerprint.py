"""The one fingerprint check (`job_io.check_fingerprint`) of every job: the infer and benchmark
jobs' job.json and the trainers' train_job.json / head_job.json, one format written
({"fingerprint": {...}}), and the trainers' older bare {...} file still read, so an OUTPUT_DIR
written before resumes (same settings) or is refused (other settings) as it was.

The trainers run for real up to the point past the check (their next step is stubbed out), so
nothing is trained or loaded here.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from speculative.errors import JobError
from speculative.jobs.train import guards
from speculative.jobs.train import run as trainer
from speculative.jobs.train_head import run as head_run
from speculative.outputs import job_io
from tests.test_train import DATA


class PastTheCheck(Exception):
    """Raised by the stubbed step after the fingerprint check: the run would have resumed."""


def _stop(*args, **kwargs):
    raise PastTheCheck


def _train_cfg(out, **overrides) -> trainer.TrainConfig:
    base = trainer.TrainConfig(model=None, vocabulary=None, train_file=DATA, output_dir=str(out))
    return dataclasses.replace(base, **overrides)


def _head_cfg(out, **overrides) -> head_run.HeadTrainConfig:
    return head_run.HeadTrainConfig(target="t", vocabulary="v", output_dir=str(out), **overrides)


def test_a_trainer_directory_written_before_resumes_or_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer, "_train_locked", _stop)
    out = tmp_path / "run"
    out.mkdir()
    old = out / guards.FINGERPRINT  # the bare object the trainer wrote before
    old.write_text(json.dumps(guards.fingerprint(_train_cfg(out)), indent=1))
    before = old.read_bytes()
    with pytest.raises(PastTheCheck):
        trainer.train(_train_cfg(out))
    assert old.read_bytes() == before  # resumed: the old file is kept as it is
    with pytest.raises(JobError, match=r"holds a model trained with other settings \(seed\)") as e:
        trainer.train(_train_cfg(out, seed=1))
    assert "\n" not in str(e.value)

    # The head trainer: its old head_job.json as well.
    monkeypatch.setattr(head_run.ml, "load_vocabulary", _stop)
    head = tmp_path / "head"
    head.mkdir()
    (head / head_run.FINGERPRINT).write_text(json.dumps(_head_cfg(head).fingerprint(), indent=1))
    with pytest.raises(PastTheCheck):
        head_run.run(_head_cfg(head))
    with pytest.raises(JobError, match=r"holds a head trained with other settings \(seed\)"):
        head_run.run(_head_cfg(head, seed=3))


def test_one_format_is_written_and_read_by_every_job(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer, "_train_locked", _stop)
    out = tmp_path / "run"
    with pytest.raises(PastTheCheck):
        trainer.train(_train_cfg(out))
    record = json.loads((out / guards.FINGERPRINT).read_text())
    assert record == {"fingerprint": guards.fingerprint(_train_cfg(out))}
    with pytest.raises(PastTheCheck):
        trainer.train(_train_cfg(out))  # a resume reads what it wrote
    with pytest.raises(JobError, match=r"other settings \(learning_rate\)"):
        trainer.train(_train_cfg(out, learning_rate=0.5))
    # The infer job's store writes the same form to job.json, tuples normalised to lists.
    store = job_io.ResultStore(str(tmp_path / "infer"), {"gamma": 3, "tree": (2, 1)})
    assert json.loads((store.dir / job_io.JOB).read_text()) == {
        "fingerprint": {"gamma": 3, "tree": [2, 1]}
    }


def test_a_damaged_fingerprint_is_named_or_taken_over_when_nothing_is_held(tmp_path):
    out = tmp_path / "infer"
    store = job_io.ResultStore(str(out), {"gamma": 3})
    store.append([{"index": 0, "output": "x"}])
    for damage in ("{not json", "[1, 2]"):
        (out / job_io.JOB).write_text(damage)
        with pytest.raises(JobError, match=r"^fingerprint .*job\.json: (unreadable|not a job)"):
            job_io.ResultStore(str(out), {"gamma": 3})  # rows are held: not overwritten
        assert (out / job_io.JOB).read_text() == damage
    (out / job_io.PREDICTIONS).unlink()  # no rows: the new job takes the directory over
    assert job_io.ResultStore(str(out), {"gamma": 4}).done == {}
    assert json.loads((out / job_io.JOB).read_text()) == {"fingerprint": {"gamma": 4}}
