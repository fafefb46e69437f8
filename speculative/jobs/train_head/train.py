"""Training a feature-level draft head on the target's hidden states (`python -m
speculative.train_head`; models/feature_head.py, drafts/feature_head.py).

Objective (EAGLE's): entry j = (f_j + noise, e(t_{j+1})) predicts f_{j+1}; the loss is the
smooth-L1 distance to the real f_{j+1} plus `classification_weight` times the cross-entropy of
the head's output distribution against the target's (both over the head's output ids). Noise on
the input features (`feature_noise` times each window's feature RMS, Gaussian) stands in for the
head's own errors, which it reads back when it drafts several tokens.

Held-out evaluation drafts as decoding does: the head reads the real hidden states up to a start
position, then steps on its own predictions (fed the text's tokens) for `eval_depth` positions;
at each depth it reports alpha = E[sum_x min(p, q)] (T = 1) and greedy agreement (argmax q =
argmax p, what T = 0 accepts), p being the target's distribution there.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from speculative.drafts.feature_head import FeatureHeadDrafter, HeadDraftState
from speculative.models import base
from speculative.models.feature_head import FeatureHead


def learning_rate_schedule(learning_rate: float, warmup: int, steps: int) -> optax.Schedule:
    """A linear warm-up from 0, then a cosine decay to 5% of `learning_rate` at `steps`."""
    return optax.warmup_cosine_decay_schedule(
        0.0, learning_rate, max(1, warmup), max(steps, warmup + 1), learning_rate * 0.05
    )


def make_optimizer(learning_rate: float, warmup: int, steps: int) -> optax.GradientTransformation:
    """AdamW with `learning_rate_schedule`, gradients clipped at norm 1."""
    schedule = learning_rate_schedule(learning_rate, warmup, steps)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))


def batch_windows(count: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """The window indices of the batch at `step`: a new permutation per epoch, a pure function of
    (seed, step), so a resumed run sees the batches an uninterrupted one would."""
    per_epoch = max(1, count // batch_size)
    epoch, k = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(count)
    if count < batch_size:
        return np.resize(order, batch_size)
    return order[k * batch_size : (k + 1) * batch_size]


def head_loss(
    params: Any,
    head: FeatureHead,
    features: jax.Array,
    tokens: jax.Array,
    embedding: jax.Array,
    scorer: jax.Array,
    rng: jax.Array,
    noise: float,
    classification_weight: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """features [B, L, E] float32, tokens [B, L] -> (loss, {"regression", "classification"}).

    scorer: [S, E] the output-head rows of the ids the head scores."""
    inputs, targets = features[:, :-1], features[:, 1:]
    if noise > 0:
        rms = jnp.sqrt(jnp.mean(jnp.square(inputs), axis=(1, 2), keepdims=True))
        inputs = inputs + noise * rms * jax.random.normal(rng, inputs.shape)
    predicted = head.forward(params, inputs, embedding[tokens[:, 1:]])
    regression = jnp.mean(optax.huber_loss(predicted, targets, delta=1.0))
    target_log_p = jax.nn.log_softmax(base.dense(targets, scorer))
    log_q = jax.nn.log_softmax(base.dense(predicted, scorer))
    classification = -jnp.mean(jnp.sum(jnp.exp(target_log_p) * log_q, axis=-1))
    loss = regression + classification_weight * classification
    return loss, {"regression": regression, "classification": classification}


def make_train_step(head: FeatureHead, optimizer: optax.GradientTransformation, cfg: Any):
    """A jitted (params, opt_state, features, tokens, embedding, scorer, rng) ->
    (params, opt_state, loss, parts)."""

    @jax.jit
    def step(params, opt_state, features, tokens, embedding, scorer, rng):
        (loss, parts), grads = jax.value_and_grad(head_loss, has_aux=True)(
            params, head, features, tokens, embedding, scorer, rng, cfg.feature_noise,
            cfg.classification_weight,
        )  # fmt: skip
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, parts

    return step


def make_evaluate(drafter: FeatureHeadDrafter, depth: int, used: int):
    """A jitted (draft params, full output head [V, E], features [L, E], tokens [L], starts [R])
    -> (alpha [depth], greedy agreement [depth], held-out loss terms) summed over the R starts."""

    @jax.jit
    def evaluate(params, table, features, tokens, starts):
        rows, length = starts.shape[0], features.shape[0]
        tiled = jnp.broadcast_to(features[None], (rows, length, features.shape[1]))
        after = jnp.broadcast_to(jnp.concatenate([tokens[1:], tokens[:1]])[None], (rows, length))
        state = HeadDraftState(
            drafter.head.init_cache(rows, length), jnp.zeros((rows, features.shape[1]))
        )
        state = drafter.observe_target(params, state, tiled, after, jnp.zeros_like(starts), starts)
        carry = (state.cache, state.feature)
        alpha, greedy = [], []
        for i in range(1, depth + 1):
            q = jax.nn.softmax(drafter.draft_logits(params, carry[1]))
            p_logits = base.dense(features[starts + i - 1], table)[:, :used]
            p = jax.nn.softmax(p_logits)
            alpha.append(jnp.sum(jnp.minimum(p, q[:, :used]), axis=-1).sum())
            greedy.append(jnp.sum(jnp.argmax(q, -1) == jnp.argmax(p, -1)))
            _, carry = drafter.draft_step(params, carry, tokens[starts + i])
        return jnp.stack(alpha), jnp.stack(greedy)

    return evaluate


def evaluate_heldout(
    evaluate: Any,
    params: Any,
    table: jax.Array,
    tokens: np.ndarray,
    features: np.ndarray,
    starts_per_window: int,
    depth: int,
) -> dict[str, list[float]]:
    """alpha and greedy agreement per draft position, averaged over every held-out window and
    `starts_per_window` start positions spread over its second half to its end."""
    length = tokens.shape[1]
    starts = np.linspace(length // 2, length - depth - 1, starts_per_window).astype(np.int32)
    alpha = np.zeros(depth)
    greedy = np.zeros(depth)
    for w in range(len(tokens)):
        window_features = jnp.asarray(features[w], jnp.float32)
        a, g = evaluate(params, table, window_features, jnp.asarray(tokens[w]), starts)
        alpha += np.asarray(a)
        greedy += np.asarray(g)
    total = len(tokens) * len(starts)
    return {
        "alpha": [round(float(x) / total, 4) for x in alpha],
        "greedy_agreement": [round(float(x) / total, 4) for x in greedy],
    }
