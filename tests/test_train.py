"""speculative.train: a tiny T5 learns on the 40-pair EnDe sample, its T5X checkpoints read back
bit for bit, and a killed run resumes exactly."""

import json
import pathlib

import jax
import numpy as np
import pytest

from speculative import checkpoints, train
from speculative.checkpoints import t5x_write
from speculative.jobs.train import run as trainer
from speculative.models import t5
from speculative.outputs import summaries
from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[1]
GIN = str(ROOT / "configs/train/ende_tiny.gin")
DATA = str(ROOT / "tests/data/en_de_pairs.tsv")
# Rows of 62 to 83 input ids (the 29-byte prefix and EOS included) and 27 to 76 target ids, cut to
# at most 64 (EOS kept last): every batch trims to one shape, [B, 64] x [B, 64], so a run compiles
# its train step and its validation pass once each (uncut rows gave a compilation per shape).
LENGTHS = {"inputs": 64, "targets": 64}
TAGS = ("loss", "validation_loss", "learning_rate", "step_time_s")


def _run(out, steps, extra=()):
    argv = [
        f"--gin_file={GIN}",
        f"--gin.OUTPUT_DIR='{out}'",
        f"--gin.TRAIN_FILE='{DATA}'",
        f"--gin.VALIDATION_FILE='{DATA}'",
        f"--gin.STEPS={steps}",
        "--gin.BATCH_SIZE=8",
        # checkpointed and evaluated every 20 steps (the trainer compiles its validation pass anew
        # at each evaluation); losses are logged every 10
        "--gin.speculative.TrainConfig.checkpoint_every=20",
        "--gin.speculative.TrainConfig.eval_every=20",
        "--gin.speculative.TrainConfig.progress=False",
        f"--gin.speculative.TrainConfig.feature_lengths={LENGTHS}",
        *extra,
    ]
    return train.main(argv)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    summary = _run(out, 40)
    return out, summary


def test_loss_decreases_and_outputs_are_written(trained):
    out, summary = trained
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [h["loss"] for h in history if "loss" in h]
    valid = [h["validation_loss"] for h in history if "validation_loss" in h]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0], losses
    assert valid[-1] < valid[0]
    assert (out / "loss.png").stat().st_size > 0
    assert summary["parameters"] > 0 and summary["validation_loss"] == valid[-1]
    assert t5x_write.checkpoint_steps(out) == [20, 40]
    on_disk = json.loads((out / "summary.json").read_text())
    assert "\nSTEPS = 40\n" in on_disk["provenance"]["gin_config"]  # operative config
    assert {"git_commit", "git_dirty", "version"} <= set(on_disk["provenance"])
    # TensorBoard: every logged step of metrics.jsonl, as float32
    scalars = summaries.read_scalars(out / "tensorboard")
    assert set(scalars) == {f"train/{k}" for k in TAGS}
    assert scalars["train/loss"] == [(10 * (i + 1), pytest.approx(x)) for i, x in enumerate(losses)]
    assert [s for s, _ in scalars["train/validation_loss"]] == [20, 40]
    rates = [v for _, v in scalars["train/learning_rate"]]
    assert rates == pytest.approx([9e-3, 1e-2, 1e-2, 1e-2])  # ende_tiny.gin: 1e-2 after 10 steps
    assert all(v > 0 for _, v in scalars["train/step_time_s"])


def test_checkpoint_reads_back_bit_identical(tmp_path):
    model = t5.T5(helpers.tiny_t5_config(64))
    params = model.init_params(jax.random.PRNGKey(3))
    saved = t5x_write.save_t5x(tmp_path, params, step=7)
    loaded = checkpoints.load_t5x(str(saved), model.config)
    helpers.assert_same_tree(loaded, params)
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)
    assert t5x_write.checkpoint_steps(tmp_path) == [7]
    with pytest.raises(ValueError, match="without the trainer's state"):
        t5x_write.load_train_state(saved, {})


def test_resume_after_a_kill_matches_an_uninterrupted_run(trained, tmp_path):
    out, _ = trained
    _run(tmp_path, 20)  # "killed" after its step-20 checkpoint, having logged step 25...
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 25, "loss": 99.0}) + "\n")
    with summaries.Scalars(tmp_path) as killed:  # ... and step 30 to TensorBoard
        killed.write(30, {"train/loss": 99.0})
    _run(tmp_path, 40)  # ...and started again with the full schedule
    a = checkpoints.load_t5x(str(tmp_path / "checkpoint_40"), _config())
    b = checkpoints.load_t5x(str(out / "checkpoint_40"), _config())
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)

    # the steps after the checkpoint are logged once, as the uninterrupted run logged them
    def logged(run):
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert all(r["wall_s"] > 0 for r in rows)
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]

    assert logged(tmp_path) == logged(out)
    # the resumed writer purges the killed run's step 30: TensorBoard draws each step once
    resumed, whole = (summaries.read_scalars(d / "tensorboard") for d in (tmp_path, out))
    assert resumed["train/loss"] == whole["train/loss"]
    assert json.loads((tmp_path / "summary.json").read_text())["train_s"] > 0


def _config():
    import gin

    from speculative.config import configurables

    gin.clear_config()
    return configurables.build_model([GIN], [f"OUTPUT_DIR='{ROOT}'"]).config


STUDENT = [
    "--gin.t5.T5Config.emb_dim=32",
    "--gin.t5.T5Config.num_encoder_layers=1",
    "--gin.t5.T5Config.num_decoder_layers=1",
    "--gin.t5.T5Config.mlp_dim=64",
]
TEACHER = [
    "--gin.speculative.TrainConfig.teacher=@teacher/t5.T5()",
    "--gin.teacher/t5.T5.config=@teacher/t5.T5Config()",
    "--gin.teacher/t5.T5Config.emb_dim=64",
    "--gin.teacher/t5.T5Config.num_encoder_layers=2",
    "--gin.teacher/t5.T5Config.num_decoder_layers=2",
    "--gin.teacher/t5.T5Config.mlp_dim=128",
    "--gin.speculative.TrainConfig.distill_weight=1.0",
]


def _student_teacher_kl(student_dir, teacher_dir):
    import dataclasses

    from speculative.loading import specs as model_loading

    teacher_cfg = _config()
    student_cfg = dataclasses.replace(
        teacher_cfg, emb_dim=32, num_encoder_layers=1, num_decoder_layers=1, mlp_dim=64
    )
    teacher, student = t5.T5(teacher_cfg), t5.T5(student_cfg)
    tp = checkpoints.load_t5x(str(teacher_dir / "checkpoint_40"), teacher_cfg)
    sp = checkpoints.load_t5x(str(student_dir / "checkpoint_30"), student_cfg)
    vocabulary = model_loading.load_vocabulary(model_loading.VocabSpec(kind="byte"))
    examples = trainer.encode(
        trainer.read_pairs(DATA),
        vocabulary,
        "translate English to German: ",
        LENGTHS,
    )
    batch = trainer.make_batch(examples, np.arange(len(examples.inputs)))
    kl = trainer.token_kl(
        teacher.forward(tp, batch["inputs"], batch["decoder_inputs"]),
        student.forward(sp, batch["inputs"], batch["decoder_inputs"]),
    )
    mask = np.asarray(batch["targets"]) != 0
    return float(np.sum(np.asarray(kl) * mask) / mask.sum())


@pytest.mark.slow  # two 30-step trainings (~35 s); run with scripts/test.sh --slow
def test_token_level_distillation_moves_the_student_towards_its_teacher(trained, tmp_path):
    teacher_dir, _ = trained
    # One checkpoint and no validation passes: only the final students are compared.
    once = [
        "--gin.speculative.TrainConfig.checkpoint_every=30",
        "--gin.speculative.TrainConfig.eval_every=1000",
    ]
    _run(tmp_path / "references", 30, STUDENT + once)
    extra = [f"--gin.speculative.TrainConfig.teacher_checkpoint='{teacher_dir / 'checkpoint_40'}'"]
    _run(tmp_path / "distilled", 30, STUDENT + TEACHER + extra + once)
    on_references = _student_teacher_kl(tmp_path / "references", teacher_dir)
    distilled = _student_teacher_kl(tmp_path / "distilled", teacher_dir)
    assert distilled < 0.9 * on_references, (distilled, on_references)  # measured 0.66 vs 0.76


def test_batches_cover_an_epoch_and_a_tiny_dataset_is_cycled():
    examples = trainer.Examples(np.ones((10, 8), np.int32), np.ones((10, 8), np.int32))
    epoch = np.concatenate([trainer.batch_indices(examples, 4, 0, step) for step in (0, 1)])
    assert len(set(epoch.tolist())) == 8  # two batches of 4 distinct examples per epoch
    small = trainer.batch_indices(examples, 16, 0, 3)
    assert small.shape == (16,) and set(small.tolist()) == set(range(10))


def test_distillation_loss_is_the_teacher_student_kl():
    """The default suite's check of the distillation loss (the training run is in the slow suite):
    KL(p || q) per token, 0 for the teacher itself, mixed into the loss by distill_weight."""
    rng = np.random.default_rng(0)
    teacher = rng.normal(size=(2, 3, 8)).astype(np.float32)
    student = rng.normal(size=(2, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(trainer.token_kl(teacher, teacher), 0.0, atol=1e-6)
    p = np.exp(teacher) / np.exp(teacher).sum(-1, keepdims=True)
    q = np.exp(student) / np.exp(student).sum(-1, keepdims=True)
    np.testing.assert_allclose(
        trainer.token_kl(teacher, student), (p * np.log(p / q)).sum(-1), rtol=1e-5
    )
    padded = np.concatenate([student, np.full((2, 3, 4), -1e9, np.float32)], -1)
    np.testing.assert_allclose(
        trainer.token_kl(teacher, padded), trainer.token_kl(teacher, student)
    )
