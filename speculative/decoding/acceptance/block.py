"""Block verification (Sun, Mendlovic, Leviathan et al., "Block Verification Accelerates Speculative
Decoding", ICLR 2025): the gamma draft tokens are accepted jointly rather than one by one.

The 'block' rule, for chains. Same inputs and outputs as the token rule (`token.verify_chain`)
and the same guarantee: the emitted tokens follow the target's distribution exactly, for any draft. It never accepts fewer tokens in
expectation than token-by-token verification, and more whenever a later draft token is likelier
under the target than under the draft (docs/design.md §1, "Block verification").

The rule, per row, with p_i / q_i the target / draft distributions at block position i (after
x_1..x_{i-1}) and w_0 = 1:

    w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))                       i = 1..G
    r_i = max(0, w_i p_{i+1} - q_{i+1}),  R_i = sum_x r_i(x)        i = 0..G-1
    h_i = R_i / (R_i + 1 - w_i) for i < G,  h_G = w_G
    tau = the largest i in 1..G with u_i < h_i (u_i ~ U(0, 1)), else 0
    emit x_1..x_tau, then y ~ p_{G+1} if tau = G, else y ~ r_tau / R_tau.

w_i is how much of the target's mass on x_1..x_i is still unclaimed; h_i is the chance of stopping
at i given that no longer prefix was kept. With G = 1 it is token verification. At temperature 0
both rules keep the longest prefix agreeing with the target's argmax (`sampling.verify_greedy`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from speculative.decoding.acceptance.base import ChainRound, Rule, Support
from speculative.decoding.acceptance.residual import rejection_residual, renormalised
from speculative.decoding.sampling import SamplingConfig, categorical, process_logits, verify_greedy


def prefix_weights(p_x: jax.Array, q_x: jax.Array) -> jax.Array:
    """[B, G] p_i(x_i), q_i(x_i) -> [B, G+1] w_0..w_G (w_0 = 1), the unclaimed target mass."""
    ratio = p_x / jnp.where(q_x > 0, q_x, 1.0)  # a proposed token has q > 0
    weights = [jnp.ones_like(p_x[:, 0])]
    for i in range(p_x.shape[1]):  # gamma is static and small
        weights.append(jnp.minimum(weights[-1] * ratio[:, i], 1.0))
    return jnp.stack(weights, axis=1)


def stop_probabilities(weights: jax.Array, mass: jax.Array, lengths: jax.Array) -> jax.Array:
    """h_1..h_G [B, G] from w [B, G+1] and the residual masses R_0..R_{G-1} [B, G]; a row that
    proposed only lengths[b] tokens stops at its last proposal with h = w there and never later."""
    gamma = mass.shape[1]
    w = weights[:, 1:]  # w_1..w_G
    r = jnp.concatenate([mass[:, 1:], jnp.zeros_like(mass[:, :1])], axis=1)  # R_1..R_G (R_G unused)
    denominator = r + 1.0 - w
    # denominator 0 means w_i = 1 and R_i = 0 (p = q next): nothing is left to decide, keep going.
    h = renormalised(r, denominator, 1.0)  # 1 where nothing is left to reject
    position = jnp.arange(1, gamma + 1)[None, :]
    h = jnp.where(position == lengths[:, None], w, h)
    return jnp.where(position > lengths[:, None], 0.0, h)


def verify_block(
    rng: jax.Array, round: ChainRound, cfg: SamplingConfig, lenience: float = 1.0
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Block verification; arguments and returns as `token.verify_chain`.

    Args:
      round: target_logits [B, G+1, V], draft_logits [B, G, V], draft_tokens [B, G] int32 and
        draft_lengths, optional [B] in 1..G (an adaptive gamma): a row is verified as a block of
        its own length.
      lenience: must be 1 (the lenient rule is defined for token verification only).
    Returns:
      num_accepted [B] int32 in 0..G, next_token [B] int32, beta [B, G] float32 (sum_x min(p, q)
      per position, as token verification reports it, so alpha stays comparable).
    """
    if lenience != 1.0:
        raise ValueError("block verification is exact only; lenience must be 1")
    draft_tokens, draft_lengths = round.draft_tokens, round.draft_lengths
    if cfg.greedy:
        return verify_greedy(round.target_logits, round.draft_logits, draft_tokens, draft_lengths)
    batch, gamma = draft_tokens.shape
    p = jnp.exp(process_logits(round.target_logits, cfg))  # [B, G+1, V]
    q = jnp.exp(process_logits(round.draft_logits, cfg))  # [B, G, V]
    beta = jnp.sum(jnp.minimum(p[:, :gamma], q), axis=-1)
    lengths = jnp.full((batch,), gamma) if draft_lengths is None else draft_lengths
    tokens = draft_tokens[..., None]
    p_x = jnp.take_along_axis(p[:, :gamma], tokens, axis=-1)[..., 0]
    q_x = jnp.take_along_axis(q, tokens, axis=-1)[..., 0]
    weights = prefix_weights(p_x, q_x)  # [B, G+1]
    # r_0..r_{G-1} [B, G, V] and R_0..R_{G-1} [B, G, 1]
    residual, mass = rejection_residual(weights[:, :gamma, None] * p[:, :gamma], q)
    h = stop_probabilities(weights, mass[..., 0], lengths)

    stop_rng, next_rng = jax.random.split(rng)
    kept = jax.random.uniform(stop_rng, (batch, gamma), dtype=jnp.float32) < h
    num_accepted = jnp.max(jnp.where(kept, jnp.arange(1, gamma + 1)[None, :], 0), axis=1)

    rows = jnp.arange(batch)
    at = jnp.minimum(num_accepted, gamma - 1)
    p_next = p[rows, num_accepted]
    from_residual = renormalised(residual[rows, at], mass[rows, at], p_next)
    # A row that kept all its proposals draws from p at the next position, not from a residual.
    next_dist = jnp.where((num_accepted < lengths)[:, None], from_residual, p_next)
    next_token = categorical(next_rng, jnp.log(next_dist))
    return num_accepted.astype(jnp.int32), next_token, beta


RULE = Rule(
    "block",
    "block verification (Sun et al. 2025): exact, never fewer tokens accepted than 'token'",
    chains=Support(adaptive=True),
    chain=lambda: verify_block,  # read when traced: a patched verify_block is the one run
)
