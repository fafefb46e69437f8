"""Issue 28: T5 training that generalises. Dropout only in training passes (decoding unchanged),
T5X's label smoothing and z-loss, T5X's rsqrt schedule, the best checkpoint by validation loss
kept through pruning and restarts, and the fingerprint refusing a changed regularisation."""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from speculative import checkpoints, train
from speculative.checkpoints import t5x_write
from speculative.errors import JobError
from speculative.jobs.train import guards, objective, retention
from speculative.jobs.train import run as trainer
from speculative.models import t5
from speculative.outputs import job_io
from tests import helpers
from tests.test_train import DATA, GIN

ENC = jnp.array([[5, 6, 7, 1, 0], [9, 3, 1, 0, 0]])
DEC = jnp.array([[0, 5, 6, 9], [0, 4, 1, 0]])


def _pair(rate: float):
    cfg = helpers.tiny_t5_config(64, encoder_layers=1, decoder_layers=1)
    plain, dropped = t5.T5(cfg), t5.T5(dataclasses.replace(cfg, dropout_rate=rate))
    return plain, dropped, helpers.init_params(plain, 0)  # one jitted init, not eager


def test_dropout_changes_training_passes_only():
    plain, dropped, params = _pair(0.1)
    # Jitted (the models are static, hashable by config): one program per model and rng-or-not
    # instead of an eager op-by-op pass; every comparison below is between jitted passes.
    forward = jax.jit(lambda m, p, e, d, r: m.forward(p, e, d, r), static_argnums=0)
    reference = np.asarray(forward(plain, params, ENC, DEC, None))
    # deterministic apply, and a zero rate even with an rng: bit-identical to the plain network
    np.testing.assert_array_equal(forward(dropped, params, ENC, DEC, None), reference)
    np.testing.assert_array_equal(
        forward(plain, params, ENC, DEC, jax.random.PRNGKey(1)), reference
    )
    a, b, a2 = (forward(dropped, params, ENC, DEC, jax.random.PRNGKey(k)) for k in (1, 2, 1))
    assert np.abs(np.asarray(a) - reference).max() > 0.1
    assert np.abs(np.asarray(a) - np.asarray(b)).max() > 0.1
    np.testing.assert_array_equal(a, a2)  # a function of the rng alone
    # the trainer's step: dropout changes its loss, with masks that are a function of the step
    batch = {"inputs": ENC, "decoder_inputs": DEC, "targets": jnp.roll(DEC, -1, axis=1)}
    cfg = trainer.TrainConfig(model=None, vocabulary=None, train_file="", output_dir="", seed=5)
    optimizer = optax.sgd(0.0)

    steps = {m: trainer.make_train_step(m, optimizer, cfg=cfg) for m in (plain, dropped)}

    def loss(model, step):
        health = jnp.asarray(-1, jnp.int32)
        return float(steps[model](params, optimizer.init(params), batch, None, health, step)[2])

    loss_fn = jax.jit(trainer.loss_fn, static_argnums=1)
    assert loss_fn(params, dropped, batch) == loss(plain, 1) == loss(plain, 2)
    assert loss(dropped, 1) != loss(plain, 1)
    assert loss(dropped, 1) == loss(dropped, 1) != loss(dropped, 2)


def test_decoding_never_pays_for_dropout():
    """The decoding programs of a model with dropout are the plain model's, op for op."""
    plain, dropped, params = _pair(0.5)

    def programs(model):
        state = model.init_state(params, {"encoder_input_tokens": ENC}, 8)
        extend = jax.make_jaxpr(lambda s, t: model.extend(params, s, t))(state, DEC[:, :2])
        init = jax.make_jaxpr(lambda e: model.init_state(params, {"encoder_input_tokens": e}, 8))
        return str(init(ENC)), str(extend)

    assert programs(dropped) == programs(plain)


def test_label_smoothing_and_z_loss_against_hand_computed_values():
    # jitted (the two settings static, as in the train step): one program per shape and setting
    # instead of every op compiled on its own
    token_losses = jax.jit(objective.token_losses, static_argnums=(2, 3))
    # Uniform logits over 4 ids: cross-entropy log 4 whatever the target distribution; T5X's
    # constant is the smoothed target's entropy, -(0.9 log 0.9 + 3 (0.1/3) log(0.1/3)).
    logits, targets = jnp.zeros((1, 1, 4)), jnp.array([[2]])
    constant = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1 / 3))
    assert objective.smoothing_constant(0.1, 4) == pytest.approx(constant)
    assert constant == pytest.approx(0.434944, abs=1e-6)
    got = token_losses(logits, targets, 0.1)
    np.testing.assert_allclose(got, [[math.log(4) - 0.434944]], atol=1e-6)  # 0.951350
    got = token_losses(logits, targets, 0.1, 1e-4)
    np.testing.assert_allclose(got, [[math.log(4) - 0.434944 + 1e-4 * math.log(4) ** 2]], atol=1e-6)
    # Arbitrary logits: -sum(soft * log_softmax) - constant + z * logZ^2, written out in numpy
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
    targets = rng.integers(0, 5, size=(2, 3))
    soft = np.where(np.eye(5)[targets] > 0, 0.8, 0.2 / 4)
    log_z = np.log(np.exp(logits).sum(-1))
    want = -(soft * (logits - log_z[..., None])).sum(-1) - objective.smoothing_constant(0.2, 5)
    got = token_losses(jnp.asarray(logits), jnp.asarray(targets), 0.2, 1e-3)
    np.testing.assert_allclose(got, want + 1e-3 * log_z**2, rtol=1e-5)
    # predicting the smoothed targets exactly scores 0, as a perfect unsmoothed prediction does
    np.testing.assert_allclose(token_losses(jnp.log(soft), targets, 0.2), 0, atol=1e-5)
    # both off: optax's cross-entropy, bit for bit (existing runs train as before); jitted both,
    # as the train step runs them
    plain = jax.jit(optax.softmax_cross_entropy_with_integer_labels)(logits, targets)
    np.testing.assert_array_equal(token_losses(logits, targets), plain)


def test_rsqrt_schedule_is_t5x_constant_times_rsqrt_decay():
    rsqrt = trainer.learning_rate_schedule(1.0, 100, "rsqrt")
    rates = [float(rsqrt(s)) for s in (0, 50, 100, 400, 10_000)]
    assert rates == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.01])  # 1/sqrt(max(step, 100))
    constant = trainer.learning_rate_schedule(1e-2, 10)  # the default, as before
    assert [float(constant(s)) for s in (0, 5, 10, 500)] == pytest.approx([0, 5e-3, 1e-2, 1e-2])
    with pytest.raises(ValueError, match="schedule must be one of"):
        trainer.learning_rate_schedule(1.0, 10, "cosine")


def _save(out, step):
    t5x_write.save_t5x(out, {"w": np.full((2,), step, np.float32)}, step, {"n": np.int32(step)})


def test_the_best_checkpoint_survives_pruning_and_a_stop_before_it_was_recorded(tmp_path):
    best = None
    for step, loss in [(10, 3.0), (20, 2.0), (30, 2.5), (40, 2.6), (50, 2.7)]:
        _save(tmp_path, step)
        best = retention.after_save(tmp_path, {"step": step, "validation_loss": loss}, best, 2)
    assert t5x_write.checkpoint_steps(tmp_path) == [20, 40, 50]  # the best + the newest 2
    assert retention.read_best(tmp_path) == {"step": 20, "validation_loss": 2.0}
    assert not list(tmp_path.glob(".removing_*"))
    # Stopped after writing checkpoint 60 (better) but before best_checkpoint.json was updated:
    # the resumed run rebuilds the best from the logged records and the checkpoints on disk.
    _save(tmp_path, 60)
    records = [{"step": s, "validation_loss": v} for s, v in [(10, 3.0), (20, 2.0), (60, 1.5)]]
    records += [{"step": 40, "validation_loss": 2.6}, {"step": 50, "validation_loss": 2.7}]
    assert retention.read_best(tmp_path)["step"] == 20
    assert retention.reconcile(tmp_path, records) == {"step": 60, "validation_loss": 1.5}
    assert retention.read_best(tmp_path) == {"step": 60, "validation_loss": 1.5}
    # a record whose checkpoint is gone (pruned) is never named the best
    assert retention.best_of([{"step": 10, "validation_loss": 0.1}], [20, 60]) is None
    # keep None (the default): nothing is pruned
    retention.prune(tmp_path, 60, 60, None)
    assert t5x_write.checkpoint_steps(tmp_path) == [20, 40, 50, 60]


QUICK = [
    f"--gin_file={GIN}",
    f"--gin.TRAIN_FILE='{DATA}'",
    f"--gin.VALIDATION_FILE='{DATA}'",
    "--gin.BATCH_SIZE=4",
    "--gin.t5.T5Config.emb_dim=32",
    "--gin.t5.T5Config.num_encoder_layers=1",
    "--gin.t5.T5Config.num_decoder_layers=1",
    "--gin.t5.T5Config.mlp_dim=64",
    "--gin.t5.T5Config.dropout_rate=0.1",
    "--gin.speculative.TrainConfig.label_smoothing=0.1",
    "--gin.speculative.TrainConfig.z_loss=1e-4",
    "--gin.speculative.TrainConfig.schedule='rsqrt'",
    "--gin.speculative.TrainConfig.checkpoint_every=4",
    "--gin.speculative.TrainConfig.eval_every=1000",  # evaluated at the checkpoints only
    "--gin.speculative.TrainConfig.keep_checkpoints=1",
    "--gin.speculative.TrainConfig.progress=False",
    # every row cut to 32 bytes: one batch shape, one compilation per run
    "--gin.speculative.TrainConfig.feature_lengths={'inputs': 32, 'targets': 32}",
]


def _run(out, steps):
    return train.main([*QUICK, f"--gin.OUTPUT_DIR='{out}'", f"--gin.STEPS={steps}"])


@pytest.mark.slow  # ~20 s; resume equality itself: tests/test_train.py's kill-and-resume test
def test_a_stopped_regularised_run_matches_an_uninterrupted_one(tmp_path):
    whole = _run(tmp_path / "whole", 12)
    _run(tmp_path / "parts", 4)
    # stopped after checkpoint 8 was written but before it was recorded as the best (if it was)
    _run(tmp_path / "parts", 8)
    (tmp_path / "parts" / retention.BEST).unlink()
    parts = _run(tmp_path / "parts", 12)
    a, b = tmp_path / "whole", tmp_path / "parts"
    config = t5.T5Config(384, 32, 4, 1, 1, 16, 64, ("gelu", "linear"))  # ende_tiny, QUICK's sizes
    x, y = (checkpoints.load_t5x(str(d / "checkpoint_12"), config) for d in (a, b))
    for u, v in zip(jax.tree.leaves(x), jax.tree.leaves(y)):
        np.testing.assert_array_equal(u, v)  # dropout's masks are functions of (seed, step)
    history = [json.loads(line) for line in (a / "metrics.jsonl").read_text().splitlines()]
    valid = {h["step"]: h["validation_loss"] for h in history if "validation_loss" in h}
    assert sorted(valid) == [4, 8, 12]  # every checkpoint evaluated
    best = min(valid, key=valid.get)
    for run, summary in ((a, whole), (b, parts)):
        assert retention.read_best(run) == {"step": best, "validation_loss": valid[best]}
        assert t5x_write.checkpoint_steps(run) == sorted({best, 12})  # the best + the newest
        assert (summary["best_step"], summary["best_validation_loss"]) == (best, valid[best])


def test_the_fingerprint_refuses_a_changed_regularisation_but_not_more_steps(tmp_path):
    model = t5.T5(helpers.tiny_t5_config(384))
    base = trainer.TrainConfig(model=model, vocabulary=None, train_file=DATA, output_dir="/unused")
    recorded = guards.fingerprint(base)
    # the defaults add nothing: a run fingerprinted before these settings existed still resumes
    assert not {"schedule", "label_smoothing", "z_loss", "dropout_rate"} & set(recorded)
    job_io.check_fingerprint(tmp_path, recorded, name=guards.FINGERPRINT, what="a model")
    longer = dataclasses.replace(base, steps=5000, keep_checkpoints=3)
    job_io.check_fingerprint(
        tmp_path, guards.fingerprint(longer), name=guards.FINGERPRINT, what="a model"
    )
    dropped = t5.T5(dataclasses.replace(model.config, dropout_rate=0.1))
    for change, name in [
        ({"label_smoothing": 0.1}, "label_smoothing"),
        ({"z_loss": 1e-4}, "z_loss"),
        ({"schedule": "rsqrt"}, "schedule"),
        ({"model": dropped}, "dropout_rate"),
    ]:
        changed = guards.fingerprint(dataclasses.replace(base, **change))
        with pytest.raises(JobError, match=rf"other settings \({name}\)"):
            job_io.check_fingerprint(tmp_path, changed, name=guards.FINGERPRINT, what="a model")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"schedule": "cosine"}, "schedule must be one of"),
        ({"schedule": "rsqrt", "warmup_steps": 0}, "needs warmup_steps >= 1"),
        ({"label_smoothing": 1.0}, r"label_smoothing must be in \[0, 1\)"),
        ({"z_loss": -1.0}, "z_loss must be a finite number >= 0"),
        ({"keep_checkpoints": 0}, "keep_checkpoints must be None or an integer >= 1"),
    ],
)
def test_regularisation_settings_that_cannot_work_are_refused(overrides, message):
    base = trainer.TrainConfig(model=None, vocabulary=None, train_file=DATA, output_dir="/unused")
    with pytest.raises(JobError, match=message):
        guards.validate(dataclasses.replace(base, **overrides))
    with pytest.raises(ValueError, match="dropout_rate must be in"):
        t5.T5Config(vocab_size=64, dropout_rate=1.0)
