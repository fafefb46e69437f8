"""The trainer behind `python -m speculative.train` (the command is speculative/train.py): a
gin-configured optax trainer for our T5 models (T5X style).

Teacher forcing with cross-entropy on the target tokens; inputs are TSV pairs (input<TAB>target)
with T5's task prefix and EOS appended, batched by length (examples of similar target length share
a batch, padded to a power of two so few shapes compile). Checkpoints are T5X checkpoints
(`checkpoints.t5x_write.save_t5x`, read back by `checkpoints.load_t5x`) carrying the optax state,
written every `checkpoint_every` steps and at the end; a killed run resumes from the latest one
and continues exactly as an uninterrupted run would (the batch order is a function of seed and
step, dropout's rng a function of seed and step). Writes OUTPUT_DIR/metrics.jsonl (loss,
validation loss), OUTPUT_DIR/best_checkpoint.json (the step and validation loss of the best
checkpoint, which is never pruned; `jobs.train.retention`), OUTPUT_DIR/loss.png,
OUTPUT_DIR/tensorboard/ (loss, validation loss, learning rate and seconds per step at every logged
step; `speculative.outputs.summaries`) and OUTPUT_DIR/summary.json (the final metrics and the run's
provenance: code commit, dirty tree, gin config).

    python -m speculative.train --gin_file=configs/train/ende_tiny.gin --gin.OUTPUT_DIR="'/tmp/t'"

Optimizer: Adafactor (T5X's default; optax.adafactor with its defaults) or AdamW, at a constant
learning rate after a linear warm-up or T5X's inverse square root (`jobs.train.objective`).
Regularisation, T5X's names: `t5.T5Config.dropout_rate`, `TrainConfig.label_smoothing` and
`TrainConfig.z_loss` (all 0 by default: configs/train/ende_target_regularised.gin binds them).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import json
import logging
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax

from speculative import vocab as vocab_lib
from speculative.checkpoints import t5x_write
from speculative.config import configurables  # noqa: F401  (gin names)
from speculative.data import inputs as inputs_lib
from speculative.errors import JobError, output_location
from speculative.jobs.train import guards, objective, resume, retention
from speculative.loading import specs as model_loading
from speculative.outputs import job_io, provenance, summaries

log = logging.getLogger(__name__)

PAD = 0


@gin.configurable(module="speculative")
@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What `speculative.train` does; see configs/train/*.gin.

    model: a T5 (e.g. @speculative.model_from_macro()); vocabulary: a speculative.VocabSpec.
    train_file / validation_file: TSV files of input<TAB>target pairs.
    prefix: prepended to every input (T5's task prefix).
    feature_lengths: {"inputs": max input tokens, "targets": max target tokens} (longer are cut).
    teacher / teacher_checkpoint: token-level distillation (DistillSpec-style) of a draft towards
      its target: a T5 and its T5X checkpoint. The loss becomes
      (1 - distill_weight) * cross-entropy(references) + distill_weight * KL(teacher || student)
      per target token, teacher-forced on the references. For sequence-level distillation,
      train on the teacher's own translations instead (decode the training inputs with
      `speculative.infer` and write them as a TSV).
    schedule: "constant" (linear warm-up to learning_rate, then constant) or "rsqrt" (T5X's
      "constant * rsqrt_decay": learning_rate / sqrt(max(step, warmup_steps))).
    label_smoothing, z_loss: T5X's loss terms (`jobs.train.objective`; T5X's z_loss default is
      1e-4, ours 0.0 so existing runs train as before). The validation loss is always the plain
      cross-entropy of the deterministic model, comparable across these settings.
    keep_checkpoints: keep only the newest K checkpoints plus the best by validation loss
      (None: keep every checkpoint).
    """

    model: Any = gin.REQUIRED
    vocabulary: Any = gin.REQUIRED
    train_file: str = gin.REQUIRED
    output_dir: str = gin.REQUIRED
    validation_file: str | None = None
    prefix: str = "translate English to German: "
    feature_lengths: dict = dataclasses.field(default_factory=lambda: {"inputs": 64, "targets": 64})
    batch_size: int = 32
    steps: int = 1000
    optimizer: str = "adafactor"
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    seed: int = 0
    checkpoint_every: int = 500
    eval_every: int = 100
    progress: bool = True
    teacher: Any = None
    teacher_checkpoint: str | None = None
    distill_weight: float = 1.0
    schedule: str = "constant"
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    keep_checkpoints: int | None = None


@dataclasses.dataclass(frozen=True)
class Examples:
    """Tokenised pairs, padded: inputs [N, S], targets [N, T] (EOS included, 0 = pad)."""

    inputs: np.ndarray
    targets: np.ndarray

    @property
    def target_lengths(self) -> np.ndarray:
        return np.sum(self.targets != PAD, axis=1)


def read_pairs(path: str) -> list[tuple[str, str]]:
    """(input, target) rows of a TSV file; a malformed row is a JobError naming file and line."""
    pairs = []
    try:
        with open(path, encoding="utf-8", newline="") as f:
            for line_no, row in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), 1):
                if len(row) < 2:
                    raise JobError("want input<TAB>target", role="input", path=f"{path}:{line_no}")
                pairs.append((row[0], row[1]))
    except (OSError, UnicodeDecodeError) as e:
        raise JobError(str(e), role="input", path=path) from e
    if not pairs:
        raise JobError("no pairs", role="input", path=path)
    return pairs


def encode(
    pairs: Sequence[tuple[str, str]], vocabulary: Any, prefix: str, lengths: dict
) -> Examples:
    """Tokenises with the prefix and EOS appended (cut to the feature lengths, EOS kept last)."""
    eos = vocab_lib.stop_ids(vocabulary)[0]

    def ids(text: str, limit: int) -> list[int]:
        return vocabulary.encode(text)[: limit - 1] + [eos]

    inputs = [ids(prefix + src, lengths["inputs"]) for src, _ in pairs]
    targets = [ids(tgt, lengths["targets"]) for _, tgt in pairs]
    return Examples(
        inputs_lib.pad_rows(inputs, pad_id=PAD), inputs_lib.pad_rows(targets, pad_id=PAD)
    )


def batch_indices(examples: Examples, batch_size: int, seed: int, step: int) -> np.ndarray:
    """The example indices of the batch at `step`: each epoch shuffles, groups by target length
    (sorted within windows of 16 batches), and shuffles the batches. A pure function of
    (seed, step), so a resumed run sees the same batches as an uninterrupted one."""
    n = len(examples.inputs)
    per_epoch = max(1, n // batch_size)
    epoch, k = divmod(step, per_epoch)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(n)
    window = 16 * batch_size
    lengths = examples.target_lengths
    for start in range(0, n, window):
        chunk = order[start : start + window]
        order[start : start + window] = chunk[np.argsort(lengths[chunk], kind="stable")]
    if n < batch_size:  # a dataset smaller than a batch: cycle it to fill the batch
        return np.resize(order, batch_size)
    batches = order[: per_epoch * batch_size].reshape(per_epoch, batch_size)
    return batches[rng.permutation(per_epoch)[k]]


def make_batch(examples: Examples, indices: np.ndarray) -> dict[str, jnp.ndarray]:
    """Inputs, decoder inputs (targets shifted right after the start token 0) and targets, each
    trimmed to the batch's longest row rounded up to a power of two (few shapes to compile)."""

    def trim(a: np.ndarray) -> np.ndarray:
        used = int(np.max(np.sum(a != PAD, axis=1)))
        return a[:, : min(a.shape[1], max(8, 1 << (used - 1).bit_length()))]

    inputs, targets = trim(examples.inputs[indices]), trim(examples.targets[indices])
    decoder_inputs = np.pad(targets[:, :-1], ((0, 0), (1, 0)))
    return {
        "inputs": jnp.asarray(inputs),
        "decoder_inputs": jnp.asarray(decoder_inputs),
        "targets": jnp.asarray(targets),
    }


def loss_fn(
    params: Any,
    model: Any,
    batch: dict[str, jnp.ndarray],
    teacher_logits: jnp.ndarray | None = None,
    distill_weight: float = 0.0,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    dropout_rng: jax.Array | None = None,
) -> jnp.ndarray:
    """Mean per-token loss over non-pad target tokens (float32): cross-entropy on the references
    (label-smoothed, plus z-loss: `objective.token_losses`), mixed with KL(teacher || student)
    when teacher_logits [B, T, V] are given. dropout_rng: a training pass with dropout."""
    args = (params, batch["inputs"], batch["decoder_inputs"])
    logits = model.forward(*args) if dropout_rng is None else model.forward(*args, dropout_rng)
    mask = (batch["targets"] != PAD).astype(jnp.float32)
    losses = objective.token_losses(logits, batch["targets"], label_smoothing, z_loss)
    if teacher_logits is not None:
        kl = token_kl(teacher_logits, logits)
        losses = (1.0 - distill_weight) * losses + distill_weight * kl
    return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def token_kl(teacher_logits: jnp.ndarray, student_logits: jnp.ndarray) -> jnp.ndarray:
    """[B, T, V] x2 -> [B, T] KL(p_teacher || q_student) in nats (vocabulary widths may differ
    only by padding: the common prefix is used)."""
    width = min(teacher_logits.shape[-1], student_logits.shape[-1])
    log_p = jax.nn.log_softmax(teacher_logits[..., :width].astype(jnp.float32))
    log_q = jax.nn.log_softmax(student_logits[..., :width].astype(jnp.float32))
    return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


def learning_rate_schedule(
    learning_rate: float, warmup_steps: int, schedule: str = "constant"
) -> optax.Schedule:
    """`objective.learning_rate_schedule`: "constant" (a linear warm-up from 0 to
    `learning_rate`, then constant) or "rsqrt" (T5X's inverse square root)."""
    return objective.learning_rate_schedule(learning_rate, warmup_steps, schedule)


def make_optimizer(
    name: str, learning_rate: float, warmup_steps: int, schedule_name: str = "constant"
) -> optax.GradientTransformation:
    schedule = learning_rate_schedule(learning_rate, warmup_steps, schedule_name)
    if name == "adafactor":
        return optax.adafactor(learning_rate=schedule)
    if name == "adamw":
        return optax.adamw(learning_rate=schedule, weight_decay=1e-4)
    raise JobError(f"optimizer must be 'adafactor' or 'adamw', got {name!r}")


def make_train_step(
    model: Any,
    optimizer: optax.GradientTransformation,
    teacher: Any = None,
    distill_weight: float = 0.0,
    cfg: TrainConfig | None = None,
):
    """A jitted (params, opt_state, batch, teacher_params, health, step) -> (params, opt_state,
    loss, gradient norm, health): health is `guards.Health`'s first non-finite step, updated on
    the device (no host sync per step). cfg: label smoothing, z-loss and the seed of dropout's
    rng, fold_in(PRNGKey(seed), step) (a resumed run drops what an uninterrupted one did)."""
    smoothing, z_loss = (0.0, 0.0) if cfg is None else (cfg.label_smoothing, cfg.z_loss)
    dropout = cfg is not None and getattr(model.config, "dropout_rate", 0.0) > 0.0
    seed = 0 if cfg is None else cfg.seed

    @jax.jit
    def step(params, opt_state, batch, teacher_params, health, number):
        rng = jax.random.fold_in(jax.random.PRNGKey(seed), number) if dropout else None
        teacher_logits = None
        if teacher is not None:
            teacher_logits = jax.lax.stop_gradient(
                teacher.forward(teacher_params, batch["inputs"], batch["decoder_inputs"])
            )
        loss, grads = jax.value_and_grad(loss_fn)(
            params, model, batch, teacher_logits, distill_weight, smoothing, z_loss, rng
        )
        grad_norm = optax.tree.norm(grads)
        health = guards.Health.update(health, number, loss, grad_norm)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grad_norm, health

    return step


@functools.partial(jax.jit, static_argnames="model")
def _evaluate(params: Any, batch: dict[str, jax.Array], model: Any) -> tuple[jax.Array, jax.Array]:
    """(mean loss, target tokens) of one batch; module-level so every evaluation of a run, and
    every run of the same model, reuses one compiled program."""
    return loss_fn(params, model, batch), jnp.sum(batch["targets"] != PAD)


def validation_loss(params: Any, model: Any, examples: Examples, batch_size: int) -> float:
    """Token-weighted mean cross-entropy over every validation example."""
    total, tokens = 0.0, 0
    for start in range(0, len(examples.inputs), batch_size):
        indices = np.arange(start, min(start + batch_size, len(examples.inputs)))
        loss, count = _evaluate(params, make_batch(examples, indices), model)
        total += float(loss) * int(count)
        tokens += int(count)
    return total / max(tokens, 1)


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Runs (or resumes) training under OUTPUT_DIR's lock; returns the final metrics. Settings
    that cannot work are refused before anything is read, a rerun with other settings is refused
    (`jobs.train.guards`), and a non-finite loss or gradient norm stops the run before it is
    logged or saved."""
    output_dir = output_location(cfg.output_dir)  # file://DIR is DIR
    job_io.require_local(output_dir, "the T5 trainer")  # not a local 'gs:' folder
    guards.validate(cfg)
    with job_io.lock_output_dir(output_dir) as out:
        job_io.check_fingerprint(
            out, guards.fingerprint(cfg), name=guards.FINGERPRINT, what="a model"
        )
        return _train_locked(cfg, out)


def _datasets(cfg: TrainConfig) -> tuple[Examples, Examples | None]:
    """The encoded training and validation (None without a validation file) examples."""
    vocabulary = model_loading.load_vocabulary(
        cfg.vocabulary, slot="speculative.TrainConfig.vocabulary"
    )
    where = model_loading.where(cfg.vocabulary)
    guards.check_vocabulary(vocabulary, where, cfg.model, cfg.teacher)
    train_set = encode(read_pairs(cfg.train_file), vocabulary, cfg.prefix, cfg.feature_lengths)
    valid_set = None
    if cfg.validation_file:
        pairs = read_pairs(cfg.validation_file)
        valid_set = encode(pairs, vocabulary, cfg.prefix, cfg.feature_lengths)
    return train_set, valid_set


def _train_locked(cfg: TrainConfig, out: pathlib.Path) -> dict[str, Any]:
    model = cfg.model
    train_set, valid_set = _datasets(cfg)
    optimizer = make_optimizer(cfg.optimizer, cfg.learning_rate, cfg.warmup_steps, cfg.schedule)
    params = model.init_params(jax.random.PRNGKey(cfg.seed))
    start, params, opt_state = resume.restore(
        out, cfg.steps, model.config, params, optimizer.init(params)
    )
    teacher_params = None
    if cfg.teacher is not None:
        teacher_params = model_loading.load_model(
            model_loading.ModelSpec("t5x", cfg.teacher_checkpoint, cfg.teacher), "teacher"
        ).params
    train_step = make_train_step(model, optimizer, cfg.teacher, cfg.distill_weight, cfg)
    earlier = job_io.keep_records_up_to(out / "metrics.jsonl", start)
    best = retention.reconcile(out, earlier)  # a run stopped before recording its best
    wall_before = earlier[-1].get("wall_s", 0.0) if earlier else 0.0  # of the killed run(s)
    started = time.perf_counter()
    timer, bar = summaries.StepTimer(start), _progress(cfg, start)
    loss, health, saved = float("nan"), guards.Health.initial(), start
    # purge_step hides a killed run's later steps; `with` closes the writers on a raised JobError
    with (
        open(out / "metrics.jsonl", "a", encoding="utf-8") as log_file,
        summaries.Scalars(out, purge_step=start + 1) as tensorboard,
        bar if bar is not None else contextlib.nullcontext(),
    ):
        for step in range(start, cfg.steps):
            batch = make_batch(train_set, batch_indices(train_set, cfg.batch_size, cfg.seed, step))
            params, opt_state, loss_value, grad_norm, health = train_step(
                params, opt_state, batch, teacher_params, health, jnp.int32(step + 1)
            )
            done = step + 1
            record = {"step": done}
            if done % 10 == 0 or done == cfg.steps:
                guards.Health.check(health, saved)  # the only host sync: every 10 steps
                loss = float(loss_value)
                record.update(loss=loss, grad_norm=float(grad_norm))
            checkpoint = done % cfg.checkpoint_every == 0 or done == cfg.steps
            # every checkpoint is evaluated (logged before it is saved), so the best can be kept
            if valid_set is not None and (checkpoint or done % cfg.eval_every == 0):
                record["validation_loss"] = validation_loss(
                    params, model, valid_set, cfg.batch_size
                )
            if len(record) > 1:
                record["wall_s"] = round(wall_before + time.perf_counter() - started, 2)
                log_file.write(json.dumps(record) + "\n")
                log_file.flush()
                tensorboard.write(done, _scalars(cfg, record, timer.per_step(done)))
            if checkpoint:
                guards.Health.check(health, saved)  # never save a state past a non-finite step
                t5x_write.save_t5x(out, params, done, opt_state)
                saved = done
                best = retention.after_save(out, record, best, cfg.keep_checkpoints)
                tensorboard.flush()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}")
    return _finish(cfg, out, params, loss)


def _scalars(cfg: TrainConfig, record: dict[str, Any], step_s: float) -> dict[str, Any]:
    """TensorBoard's train/ scalars of a metrics.jsonl record (loss and validation loss when it
    has them), the learning rate of its last step and the seconds per step since the last record."""
    schedule = learning_rate_schedule(cfg.learning_rate, cfg.warmup_steps, cfg.schedule)
    return {
        "train/loss": record.get("loss"),
        "train/validation_loss": record.get("validation_loss"),
        "train/learning_rate": float(schedule(record["step"] - 1)),
        "train/step_time_s": step_s,
    }


def _finish(cfg: TrainConfig, out: pathlib.Path, params: Any, loss: float) -> dict[str, Any]:
    """The final metrics from metrics.jsonl (every run of this directory), loss.png and
    summary.json."""
    history = [json.loads(line) for line in open(out / "metrics.jsonl", encoding="utf-8")]
    plot_losses(history, out / "loss.png")
    logged = [h["loss"] for h in history if "loss" in h]
    final = {"steps": cfg.steps, "loss": logged[-1] if logged else loss}  # a finished run rerun
    if history and "wall_s" in history[-1]:
        final["train_s"] = history[-1]["wall_s"]  # summed over resumed runs, compilation included
    valid = [h["validation_loss"] for h in history if "validation_loss" in h]
    if valid:
        final["validation_loss"] = valid[-1]
    best = retention.read_best(out)
    if best is not None:
        final["best_step"], final["best_validation_loss"] = best["step"], best["validation_loss"]
    final["parameters"] = int(sum(x.size for x in jax.tree.leaves(params)))
    final["provenance"] = provenance.record(gin.operative_config_str())
    job_io.write_text_atomic(out / "summary.json", json.dumps(final, indent=1))
    return final


def _progress(cfg: TrainConfig, start: int):
    if not cfg.progress:
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=start, desc="train", file=sys.stderr)


def plot_losses(history: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key in ("loss", "validation_loss"):
        points = [(h["step"], h[key]) for h in history if key in h]
        if points:
            ax.plot(*zip(*points), label=key.replace("_", " "))
    ax.set(xlabel="step", ylabel="cross-entropy per target token", yscale="log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
