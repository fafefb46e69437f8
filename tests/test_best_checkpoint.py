"""A training run's directory as a decoding checkpoint: the jobs read the checkpoint that
best_checkpoint.json names (checkpoints.best), record that checkpoint in their outputs, and refuse
a broken record in one line before any weight is read."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from speculative.checkpoints import best, t5x_write
from speculative.errors import JobError
from speculative.jobs.train import retention
from speculative.loading import specs as ml
from speculative.models import t5
from tests import helpers


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run directory with checkpoints at steps 10, 20, 30 (different weights); the record names
    step 20, as the trainer's retention writes it."""
    root = tmp_path_factory.mktemp("run")
    model = t5.T5(helpers.tiny_t5_config(64, encoder_layers=1, decoder_layers=1))
    init = jax.jit(model.init_params)  # one program for the three seeds, not eager ops
    params = {s: init(jax.random.PRNGKey(s)) for s in (10, 20, 30)}
    for step, p in params.items():
        t5x_write.save_t5x(root, p, step)
    retention.write_best(root, {"step": 20, "validation_loss": 2.5})
    return root, model, params


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_a_run_directory_loads_its_best_checkpoint(run):
    root, model, params = run
    spec = ml.ModelSpec("t5x", str(root), model)
    loaded = ml.load_model(spec, "target")
    for got, want in zip(_leaves(loaded.params), _leaves(params[20]), strict=True):
        np.testing.assert_array_equal(got, want)
    # what outputs and fingerprints record is the checkpoint read, not the directory
    assert f"t5x:{root / 'checkpoint_20'} " in ml.describe(spec)
    assert loaded.description == ml.describe(spec)
    # a checkpoint named directly is read as it is
    direct = ml.ModelSpec("t5x", str(root / "checkpoint_30"), model)
    assert ml.resolved(direct) == direct
    got = ml.load_model(direct, "target").params
    np.testing.assert_array_equal(_leaves(got)[0], _leaves(params[30])[0])


@pytest.mark.parametrize(
    ("record", "says"),
    [
        ("{not json", "unreadable best-checkpoint record"),
        (json.dumps([20]), '"step" must be a non-negative integer'),
        (json.dumps({"step": -1, "validation_loss": 1.0}), '"step" must be'),
        (json.dumps({"step": True, "validation_loss": 1.0}), '"step" must be'),
        (json.dumps({"step": 20, "validation_loss": "low"}), '"validation_loss" must be'),
        (json.dumps({"step": 20, "validation_loss": float("nan")}), '"validation_loss" must be'),
        (json.dumps({"step": 40, "validation_loss": 1.0}), "names checkpoint_40, which is not"),
    ],
)
def test_a_broken_record_is_one_line_before_loading(run, tmp_path, record, says):
    root, model, _ = run
    copy = tmp_path / "run"
    t5x_write.save_t5x(copy, jax.tree.map(np.asarray, run[2][20]), 20)
    (copy / best.BEST).write_text(record)
    spec = ml.ModelSpec("t5x", str(copy), model)
    with pytest.raises(JobError) as e:
        ml.validate_model_spec(spec, "draft")
    message = str(e.value)
    assert message.startswith(f"draft {copy / best.BEST}: ") and says in message
    assert "\n" not in message


def test_an_incomplete_best_checkpoint_is_refused(run, tmp_path):
    """A record naming a checkpoint whose write did not finish (no `checkpoint` file)."""
    root, model, params = run
    copy = tmp_path / "run"
    t5x_write.save_t5x(copy, jax.tree.map(np.asarray, params[10]), 10)
    (copy / "checkpoint_10" / "checkpoint").unlink()
    retention.write_best(copy, {"step": 10, "validation_loss": 3.0})
    with pytest.raises(JobError, match="names checkpoint_10, which is not complete"):
        ml.load_model(ml.ModelSpec("t5x", str(copy), model), "target")
