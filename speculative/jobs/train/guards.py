"""What keeps the T5 trainer (`speculative/train.py`) from running silently wrong.

- `validate`: settings that cannot work, refused before anything is read (a zero
  checkpoint_every, distillation settings without a teacher, ...).
- `fingerprint`: what the checkpoints in OUTPUT_DIR are a function of; a rerun with other
  settings, or another training file under the same name, is refused
  (`job_io.check_fingerprint`).
- `check_vocabulary`: a tokenizer whose ids the model (or the teacher) has no row for.
- `Health`: the first step whose loss or gradient norm was not finite, tracked on the device
  (no host sync per step) and checked before every log line and checkpoint, so a poisoned state
  is never written.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import jax.numpy as jnp

from speculative import vocab as vocab_lib
from speculative.errors import JobError, check_slot
from speculative.jobs.train import objective
from speculative.loading import specs as ml
from speculative.models import t5

FINGERPRINT = "train_job.json"
_COUNTS = ("batch_size", "steps", "checkpoint_every", "eval_every")
# Settings added after runs were fingerprinted without them: recorded only when they differ from
# these defaults, so an older run (trained with the defaults) still resumes.
_REGULARISATION = {"schedule": "constant", "label_smoothing": 0.0, "z_loss": 0.0}


def validate(cfg: Any) -> None:
    """One-line JobErrors for a TrainConfig that cannot run as asked."""
    for name in _COUNTS:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise JobError(f"TrainConfig.{name} must be an integer >= 1, got {value!r}")
    rate = cfg.learning_rate
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < math.inf:
        raise JobError(f"TrainConfig.learning_rate must be a finite number > 0, got {rate!r}")
    if not isinstance(cfg.warmup_steps, int) or cfg.warmup_steps < 0:
        raise JobError(
            f"TrainConfig.warmup_steps must be an integer >= 0, got {cfg.warmup_steps!r}"
        )
    lengths = cfg.feature_lengths
    if not all(isinstance(lengths.get(k), int) and lengths[k] >= 2 for k in ("inputs", "targets")):
        raise JobError(
            f"TrainConfig.feature_lengths needs 'inputs' and 'targets' >= 2, got {lengths}"
        )
    for name in ("model", "teacher"):  # a spec where an architecture belongs
        value = getattr(cfg, name)
        if isinstance(value, tuple(ml.SPEC_KINDS)):
            described = {**ml.SPEC_KINDS, t5.T5: "an architecture, e.g. %MODEL; no weights"}
            check_slot(value, f"speculative.TrainConfig.{name}", name, (t5.T5,), described)
    _validate_distillation(cfg)
    _validate_regularisation(cfg)


def _validate_regularisation(cfg: Any) -> None:
    if cfg.schedule not in objective.SCHEDULES:
        raise JobError(
            f"TrainConfig.schedule must be one of {objective.SCHEDULES}, got {cfg.schedule!r}"
        )
    if cfg.schedule == "rsqrt" and cfg.warmup_steps < 1:
        raise JobError("TrainConfig.schedule 'rsqrt' needs warmup_steps >= 1 (1/sqrt(step) at 0)")
    smoothing = cfg.label_smoothing
    if not isinstance(smoothing, int | float) or not 0.0 <= smoothing < 1.0:
        raise JobError(f"TrainConfig.label_smoothing must be in [0, 1), got {smoothing!r}")
    if not isinstance(cfg.z_loss, int | float) or not 0.0 <= cfg.z_loss < math.inf:
        raise JobError(f"TrainConfig.z_loss must be a finite number >= 0, got {cfg.z_loss!r}")
    keep = cfg.keep_checkpoints
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
        raise JobError(
            f"TrainConfig.keep_checkpoints must be None or an integer >= 1, got {keep!r}"
        )


def _validate_distillation(cfg: Any) -> None:
    if cfg.teacher is None:
        if cfg.teacher_checkpoint:
            raise JobError(
                "teacher_checkpoint is set but no teacher model is: bind TrainConfig.teacher (the "
                "checkpoint's T5), or unset teacher_checkpoint; it would be ignored"
            )
        if cfg.distill_weight != 1.0:
            raise JobError("distill_weight applies only with a teacher; it would be ignored")
        return
    if not cfg.teacher_checkpoint:
        raise JobError("a teacher needs teacher_checkpoint (a T5X checkpoint directory)")
    if not 0.0 <= cfg.distill_weight <= 1.0:
        raise JobError(f"distill_weight must be in [0, 1], got {cfg.distill_weight!r}")


def file_digest(path: str) -> str:
    """SHA-256 of a file (a training file replaced under the same name changes the job)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    except OSError as e:
        raise JobError(f"cannot read it: {e.strerror or e}", role="input", path=path) from None
    return digest.hexdigest()


def fingerprint(cfg: Any) -> dict[str, Any]:
    """The settings the checkpoints are a function of; not steps (a run may be extended or cut
    back), nor how often it logs, evaluates or checkpoints, nor how many it keeps, nor the
    validation file. The regularisation (schedule, label smoothing, z-loss, the model's dropout
    rate, which its repr leaves out) only when it is not the default."""
    keep = (
        "model", "vocabulary", "train_file", "prefix", "feature_lengths", "batch_size",
        "optimizer", "learning_rate", "warmup_steps", "seed", "teacher", "teacher_checkpoint",
        "distill_weight",
    )  # fmt: skip
    record = {name: repr(getattr(cfg, name)) for name in keep}
    for name, default in _REGULARISATION.items():
        if getattr(cfg, name) != default:
            record[name] = repr(getattr(cfg, name))
    dropout_rate = getattr(getattr(cfg.model, "config", None), "dropout_rate", 0.0)
    if dropout_rate:
        record["dropout_rate"] = repr(dropout_rate)
    record["train_file_sha256"] = file_digest(cfg.train_file)
    return record


def check_vocabulary(vocabulary: Any, path: str, model: Any, teacher: Any = None) -> None:
    """Refuses a tokenizer that can produce ids the model (or the teacher) has no output for:
    the loss would index past the table. Both tables may be wider (padding rows are unused)."""
    used = vocab_lib.used_size(vocabulary)
    for role, m in (("model", model), ("teacher", teacher)):
        if m is not None and m.config.vocab_size < used:
            raise JobError(
                f"the {role} has {m.config.vocab_size} output ids but the vocabulary {path} has "
                f"{used} tokens: the tokenizer can produce ids the {role} does not have",
                role=role,
            )


class Health:
    """The first step (1-based) whose loss or gradient norm was not finite, -1 while none was;
    an int32 device scalar carried through the jitted steps."""

    @staticmethod
    def initial() -> jnp.ndarray:
        return jnp.asarray(-1, jnp.int32)

    @staticmethod
    def update(
        first_bad: jnp.ndarray, step: jnp.ndarray, loss: jnp.ndarray, grad_norm: jnp.ndarray
    ):
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        return jnp.where((first_bad < 0) & ~finite, step, first_bad)

    @staticmethod
    def check(first_bad: jnp.ndarray, last_checkpoint: int) -> None:
        """Raises JobError when a step went non-finite (a host sync; call it before a log line
        or a checkpoint, never per step)."""
        step = int(first_bad)
        if step >= 0:
            raise JobError(
                f"the loss or gradient norm is not finite (NaN or inf) at step {step}; training "
                f"stopped, and nothing after step {last_checkpoint} was saved: lower the learning "
                "rate, check the data, or resume from that checkpoint"
            )
