"""What the T5 trainer minimises and at what rate: T5X's cross-entropy with label smoothing and
z-loss, and the learning-rate schedules (`speculative/train.py`).

- `token_losses`: T5X's `cross_entropy_with_logits` on one-hot targets smoothed over the whole
  vocabulary (`label_smoothing`), minus T5X's normalizing constant (the entropy of the smoothed
  targets, so a perfect prediction scores 0 as without smoothing), plus `z_loss * log(Z)^2`.
  With both 0 it is plain cross-entropy, computed as before.
- `learning_rate_schedule`: "constant" (a linear warm-up from 0, then constant: the trainer's
  original schedule) or "rsqrt" (T5X's "constant * rsqrt_decay": learning_rate /
  sqrt(max(step, warmup_steps)), flat during the warm-up, then decaying).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("constant", "rsqrt")


def smoothing_constant(label_smoothing: float, vocab_size: int) -> float:
    """T5X's normalizing constant: the entropy of the smoothed one-hot target (0 unsmoothed)."""
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab_size - 1)
    return -(confidence * math.log(confidence) + (vocab_size - 1) * low * math.log(low + 1e-20))


def token_losses(
    logits: jnp.ndarray, targets: jnp.ndarray, label_smoothing: float = 0.0, z_loss: float = 0.0
) -> jnp.ndarray:
    """logits [B, T, V], integer targets [B, T] -> per-token loss [B, T] float32."""
    if label_smoothing == 0.0 and z_loss == 0.0:
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    logits = logits.astype(jnp.float32)
    vocab_size = logits.shape[-1]
    log_z = jax.nn.logsumexp(logits, axis=-1)  # [B, T]
    log_p = logits - log_z[..., None]
    target_log_p = jnp.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]
    # -sum(soft * log_p) with soft = low everywhere and confidence at the target, in one pass
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab_size - 1)
    loss = -(confidence - low) * target_log_p - low * jnp.sum(log_p, axis=-1)
    loss = loss - smoothing_constant(label_smoothing, vocab_size)
    return loss + z_loss * jnp.square(log_z)


def learning_rate_schedule(
    learning_rate: float, warmup_steps: int, schedule: str = "constant"
) -> optax.Schedule:
    """The learning rate at optimizer step `count` (0-based), by `schedule` (module docstring)."""
    if schedule == "rsqrt":
        floor = float(max(1, warmup_steps))

        def rsqrt(count):
            return learning_rate * jax.lax.rsqrt(jnp.maximum(jnp.float32(count), floor))

        return rsqrt
    if schedule == "constant":
        return optax.linear_schedule(0.0, learning_rate, max(1, warmup_steps))
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
