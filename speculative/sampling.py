"""Logit standardisation and the speculative acceptance rule (Leviathan et al. 2023, Algorithm 1).

Pure JAX, jittable, vectorised over any leading batch/position axes. Probabilities are float32
whatever the model dtype. No Python control flow depends on traced values; the only branches are on
the static `SamplingConfig`.

Exactness: the draft token x_i must have been drawn from exactly `process_logits(draft_logits_i)`
(the same temperature / top-k / top-p as the target). Then `verify` emits tokens distributed exactly as
sampling from `process_logits(target_logits)` one token at a time.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How logits become a distribution. Hashable, so it can be a static jit argument.

    temperature: 0 means greedy (one-hot argmax); otherwise logits are divided by it.
    top_k: keep the k highest logits (0 = off). Ties with the k-th logit are all kept.
    top_p: keep the smallest prefix of tokens (by descending probability) whose mass reaches top_p
      (1.0 = off).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0.0:  # also rejects NaN
            raise ValueError(f"SamplingConfig.temperature must be >= 0, got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"SamplingConfig.top_k must be an integer >= 0, got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def process_logits(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """Standardises logits into log-probabilities.

    Args:
      logits: [..., V] in any float dtype.
      cfg: the sampling configuration.
    Returns:
      [..., V] float32 log-probabilities; excluded tokens are -inf. With temperature 0 this is the
      one-hot argmax (0 at the argmax, -inf elsewhere; the first index wins ties, like jnp.argmax).
    """
    logits = logits.astype(jnp.float32)
    if cfg.greedy:
        best = jnp.argmax(logits, axis=-1)
        one_hot = jax.nn.one_hot(best, logits.shape[-1], dtype=jnp.bool_)
        return jnp.where(one_hot, 0.0, NEG_INF)
    logits = logits / cfg.temperature
    if cfg.top_k > 0 and cfg.top_k < logits.shape[-1]:
        kth_largest = jax.lax.top_k(logits, cfg.top_k)[0][..., -1:]
        logits = jnp.where(logits < kth_largest, NEG_INF, logits)
    if cfg.top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        sorted_probs = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
        # Keep a token while the mass strictly before it is below top_p; the first is always kept.
        kept = mass_before < cfg.top_p
        threshold = jnp.min(jnp.where(kept, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < threshold, NEG_INF, logits)
    return jax.nn.log_softmax(logits, axis=-1)


def sample(rng: jax.Array, logits: jax.Array, cfg: SamplingConfig) -> tuple[jax.Array, jax.Array]:
    """Draws one token per row from the standardised distribution.

    Args:
      rng: PRNG key.
      logits: [..., V] raw logits.
    Returns:
      (tokens [...] int32, log_probs [..., V] float32), the latter being exactly the distribution the
      token was drawn from.
    """
    log_probs = process_logits(logits, cfg)
    if cfg.greedy:
        tokens = jnp.argmax(log_probs, axis=-1)
    else:
        tokens = jax.random.categorical(rng, log_probs, axis=-1)
    return tokens.astype(jnp.int32), log_probs


def verify_detailed(
    rng: jax.Array,
    target_logits: jax.Array,
    draft_logits: jax.Array,
    draft_tokens: jax.Array,
    cfg: SamplingConfig,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`verify` plus the per-position overlap beta_i = sum_x min(p_i(x), q_i(x)).

    Args:
      rng: PRNG key.
      target_logits: [B, G+1, V] target logits at [t_last, x_1..x_G].
      draft_logits: [B, G, V] draft logits that x_1..x_G were sampled from.
      draft_tokens: [B, G] int32 x_1..x_G.
      cfg: sampling configuration shared by draft and target.
    Returns:
      num_accepted [B] int32 in 0..G, next_token [B] int32, beta [B, G] float32.
    """
    gamma = draft_tokens.shape[1]
    batch = draft_tokens.shape[0]
    p = jnp.exp(process_logits(target_logits, cfg))  # [B, G+1, V]
    q = jnp.exp(process_logits(draft_logits, cfg))  # [B, G, V]
    beta = jnp.sum(jnp.minimum(p[:, :gamma], q), axis=-1)

    accept_rng, resample_rng = jax.random.split(rng)
    tokens = draft_tokens[..., None]
    p_x = jnp.take_along_axis(p[:, :gamma], tokens, axis=-1)[..., 0]  # [B, G]
    q_x = jnp.take_along_axis(q, tokens, axis=-1)[..., 0]
    if cfg.greedy:
        accepted = p_x > 0.5  # p is one-hot: the draft token is the target's argmax
    else:
        r = jax.random.uniform(accept_rng, (batch, gamma), dtype=jnp.float32)
        accepted = r * q_x < p_x  # r < p/q without dividing by q
    num_accepted = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1)

    # Next token: from norm(max(0, p_{n+1} - q_{n+1})) at the first rejection, else from p_{G+1}.
    # Padding q with a zero row at position G+1 makes both cases one formula.
    rows = jnp.arange(batch)
    p_next = p[rows, num_accepted]  # [B, V]
    q_pad = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)
    residual = jnp.maximum(p_next - q_pad[rows, num_accepted], 0.0)
    mass = jnp.sum(residual, axis=-1, keepdims=True)
    # mass == 0 only when p == q at that position, where rejection had probability 0: fall back to p.
    next_dist = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_next)
    if cfg.greedy:
        next_token = jnp.argmax(p_next, axis=-1)
    else:
        next_token = jax.random.categorical(resample_rng, jnp.log(next_dist), axis=-1)
    return num_accepted.astype(jnp.int32), next_token.astype(jnp.int32), beta


def verify(
    rng: jax.Array,
    target_logits: jax.Array,
    draft_logits: jax.Array,
    draft_tokens: jax.Array,
    cfg: SamplingConfig,
) -> tuple[jax.Array, jax.Array]:
    """Speculative acceptance (Algorithm 1). Shapes as in `verify_detailed`.

    Returns:
      num_accepted [B] int32 (n: x_1..x_n are kept), next_token [B] int32 (emitted after them).
    """
    num_accepted, next_token, _ = verify_detailed(
        rng, target_logits, draft_logits, draft_tokens, cfg
    )
    return num_accepted, next_token
