"""Logit standardisation and the speculative acceptance rule (Leviathan et al. 2023, Algorithm 1).

Pure JAX, jittable, vectorised over any leading batch/position axes. Probabilities are float32
whatever the model dtype. No Python control flow depends on traced values; the only branches are on
the static `SamplingConfig`.

Exactness: the draft token x_i must have been drawn from exactly `process_logits(draft_logits_i)`
(the same temperature / top-k / top-p as the target). Then `verify` emits tokens distributed exactly as
sampling from `process_logits(target_logits)` one token at a time.

No public function sorts the vocabulary (V = 151,936 for Qwen2.5, where a full sort costs ~36 ms per
row on CPU). Top-k reads `lax.top_k`; top-p reads the `NUCLEUS_CANDIDATES` largest logits and, for a
row whose nucleus is larger than that, bisects on the threshold (`_nucleus_threshold_by_bisection`).
The sort-based definition stays as `process_logits_by_sort`, the oracle of the tests.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf

# Logits `lax.top_k` gathers for the top-p cut. On CPU at V = 151,936: ~0.3 ms per row for 64..128
# candidates, ~0.4 ms for 256. The nucleus of most LLM steps ends inside 128; a row whose nucleus is
# larger is bisected instead (~0.7 ms more for that row).
NUCLEUS_CANDIDATES = 128
# Steps the bisection may split value ranges before it halves key ranges instead (<= 32 more).
_VALUE_STEPS = 24


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How logits become a distribution. Hashable, so it can be a static jit argument.

    temperature: 0 means greedy (one-hot argmax); otherwise logits are divided by it.
    top_k: keep the k highest logits (0 = off). Ties with the k-th logit are all kept.
    top_p: keep the smallest prefix of tokens (by descending probability) whose mass reaches top_p
      (1.0 = off). Ties with the smallest kept logit are all kept.
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


def greedy_tokens(logits: jax.Array) -> jax.Array:
    """[..., V] -> [...] int32 `jnp.argmax`: the first index wins ties, a NaN beats any number.

    A max pass and a first-hit pass: ~3x faster on XLA:CPU than argmax's index-carrying reduce.
    """
    logits = logits.astype(jnp.float32)
    best = jnp.max(logits, axis=-1, keepdims=True)
    hit = (logits == best) | jnp.isnan(logits)
    index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    return jnp.min(jnp.where(hit, index, logits.shape[-1]), axis=-1)


def categorical(rng: jax.Array, log_probs: jax.Array) -> jax.Array:
    """[..., V] -> [...] int32: `jax.random.categorical(rng, log_probs)`, the very same draw.

    The same Gumbel-max on the same noise, but ~3x faster on XLA:CPU, where the argmax that
    categorical applies to the noisy logits costs more than drawing the noise. The barrier keeps
    the noise from being recomputed in each of `greedy_tokens`' two passes.
    """
    noise = jax.random.gumbel(rng, log_probs.shape, log_probs.dtype)
    return greedy_tokens(jax.lax.optimization_barrier(noise + log_probs))


def _one_hot_log_probs(tokens: jax.Array, vocab: int) -> jax.Array:
    """[...] token ids -> [..., V] float32: 0 at the token, -inf elsewhere."""
    return jnp.where(jax.nn.one_hot(tokens, vocab, dtype=jnp.bool_), 0.0, NEG_INF)


def nucleus_threshold_by_sort(logits: jax.Array, top_p: float) -> jax.Array:
    """Reference top-p cut by a full sort: the definition, kept as the tests' oracle.

    Args:
      logits: [..., V] float32 after temperature and top-k (excluded tokens are -inf).
      top_p: in (0, 1).
    Returns:
      [..., 1] the smallest kept logit: tokens with logit >= it are kept.
    """
    sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
    sorted_probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    # Keep a token while the mass strictly before it is below top_p; the first is always kept.
    kept = mass_before < top_p
    return jnp.min(jnp.where(kept, sorted_logits, jnp.inf), axis=-1, keepdims=True)


def process_logits_by_sort(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """`process_logits` as it was before the sort-free cut: the oracle of tests and benchmarks."""
    logits = logits.astype(jnp.float32)
    if cfg.greedy:
        return _one_hot_log_probs(jnp.argmax(logits, axis=-1), logits.shape[-1])
    logits = logits / cfg.temperature
    if 0 < cfg.top_k < logits.shape[-1]:
        kth_largest = jax.lax.top_k(logits, cfg.top_k)[0][..., -1:]
        logits = jnp.where(logits < kth_largest, NEG_INF, logits)
    if cfg.top_p < 1.0:
        threshold = nucleus_threshold_by_sort(logits, cfg.top_p)
        logits = jnp.where(logits < threshold, NEG_INF, logits)
    return jax.nn.log_softmax(logits, axis=-1)


def _largest(x: jax.Array, k: int) -> jax.Array:
    """[..., V] -> [..., k] the k largest values, descending (`lax.top_k`).

    The barrier keeps XLA:CPU on its partial-sort TopK kernel (~0.3 ms per row at V = 151,936).
    Without it, reading single entries of the result (the k-th, say) lets XLA fold those slices
    into the sort that TopK is decomposed into, and the whole vocabulary is sorted (~35 ms per row).
    """
    return jax.lax.optimization_barrier(jax.lax.top_k(x, k)[0])


def _order_key(x: jax.Array) -> jax.Array:
    """float32 -> int32 in the same order (-0.0 and 0.0 share a key; -inf has the least)."""
    bits = jax.lax.bitcast_convert_type(jnp.where(x == 0.0, 0.0, x), jnp.int32)
    return jnp.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def _key_value(key: jax.Array) -> jax.Array:
    """Inverse of `_order_key`: the float32 with this key."""
    bits = jnp.where(key < 0, key ^ 0x7FFFFFFF, key)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _nucleus_threshold_by_bisection(
    row: jax.Array, max_logit: jax.Array, norm: jax.Array, top_p: float
) -> jax.Array:
    """Exact top-p cut of one row without sorting it.

    Token x is kept iff the mass of the tokens with a strictly larger logit is < top_p: the same
    set as the sorted-prefix rule, ties included. Narrows a bracket of logit order keys holding
    mass(key > lo) >= top_p > mass(key > hi), with lo + 1 and hi snapped onto token keys, until
    (lo, hi] holds a single key: hi's. Each step is one fused pass over the row; ~15 steps for
    LLM-like rows, never more than _VALUE_STEPS + 32.

    Args:
      row: [V] float32 logits after temperature and top-k.
      max_logit, norm: [1] the row's largest logit and sum(exp(row - max_logit)).
      top_p: in (0, 1).
    Returns:
      [1] the smallest kept logit.
    """
    probs = jnp.exp(row - max_logit) / norm  # as softmax computes them
    # Each probability as two int32 words, p = (high + low / 2**12) / 2**30 to within 2**-43, so
    # masses are exact sums in any order. (A float32 reduce inside the loop accumulates nearly
    # sequentially on XLA:CPU: 5e-5 off over 151,936 equal probabilities.)
    scaled = probs * 2.0**30
    high = jnp.floor(scaled)
    low = jnp.round((scaled - high) * 2.0**12)  # scaled - high is exact
    high, low = high.astype(jnp.int32), low.astype(jnp.int32)
    keys = _order_key(row)
    least, most = jnp.iinfo(jnp.int32).min, jnp.iinfo(jnp.int32).max

    def unresolved(state):
        lo, hi = state[:2]
        # hi - lo can exceed the int32 range: compare it as unsigned.
        return jax.lax.bitcast_convert_type(hi - lo, jnp.uint32) > 1

    def narrow(state):
        lo, hi, mass_lo, mass_hi, step = state
        # Split the value range where a straight line through the two masses meets top_p, kept
        # to its middle half: ~25% fewer steps than halving. (Splitting the key range instead
        # would spend steps on exponents no logit has.) Logits spread over many binades (0, -1e-3,
        # -1e-6, ...) can still take a step each that way, so after _VALUE_STEPS steps, or when
        # rounding leaves no room, halve the key range.
        fraction = jnp.clip((mass_lo - top_p) / (mass_lo - mass_hi), 0.25, 0.75)
        lo_value = _key_value(lo)
        mid = _order_key(lo_value + (_key_value(hi) - lo_value) * fraction)
        by_key = lo + jax.lax.shift_right_logical(hi - lo, 1)  # no int32 overflow
        mid = jnp.where((mid > lo) & (mid < hi) & (step < _VALUE_STEPS), mid, by_key)
        above = keys > mid
        # One variadic reduce (~3x faster on XLA:CPU than separate ones): the mass above mid and
        # the nearest token keys on both sides of it.
        high_sum, low_sum, key_below, key_above = jax.lax.reduce(
            (
                jnp.where(above, high, 0),
                jnp.where(above, low, 0),
                jnp.where(above, least, keys),
                jnp.where(above, keys, most),
            ),
            (jnp.int32(0), jnp.int32(0), jnp.int32(least), jnp.int32(most)),
            lambda x, y: (
                x[0] + y[0],
                x[1] + y[1],
                jnp.maximum(x[2], y[2]),
                jnp.minimum(x[3], y[3]),
            ),
            (0,),
        )
        mass = (high_sum.astype(jnp.float32) + low_sum.astype(jnp.float32) * 2.0**-12) * 2.0**-30
        cut_above_mid = mass >= top_p  # tokens at mid are not kept
        return (
            jnp.where(cut_above_mid, key_above - 1, lo),
            jnp.where(cut_above_mid, hi, key_below),
            jnp.where(cut_above_mid, mass, mass_lo),
            jnp.where(cut_above_mid, mass_hi, mass),
            step + 1,
        )

    # -inf tokens stay at or below lo: never inside the bracket.
    smallest = jnp.min(jnp.where(row > NEG_INF, row, jnp.inf))
    lo, hi = _order_key(smallest) - 1, _order_key(max_logit[0])
    state = (lo, hi, jnp.float32(1.0), jnp.float32(0.0), jnp.int32(0))
    hi = jax.lax.while_loop(unresolved, narrow, state)[1]
    return _key_value(hi)[None]


def nucleus_threshold(
    logits: jax.Array,
    top_p: float,
    candidates: jax.Array | None = None,
    num_candidates: int = NUCLEUS_CANDIDATES,
) -> jax.Array:
    """The top-p cut of `nucleus_threshold_by_sort`, without sorting the vocabulary.

    The K largest logits decide the cut whenever it falls inside them. A row whose K candidates are
    all kept is bisected; one row at a time under a per-row cond, so only such rows pay for it.
    The kept set is the reference's except where a token's mass-before lies within float32
    rounding of top_p (the reference's sorted cumsum is itself off by up to ~5e-7 at V = 151,936;
    no other summation order can reproduce its rounding).

    Args:
      logits: [..., V] float32 after temperature and top-k (excluded tokens are -inf).
      top_p: in (0, 1).
      candidates: [..., K] the K largest logits, descending, if already at hand (from top-k).
      num_candidates: K, when `candidates` is not given.
    Returns:
      [..., 1] the smallest kept logit: tokens with logit >= it are kept.
    """
    vocab = logits.shape[-1]
    if candidates is None:
        candidates = _largest(logits, min(num_candidates, vocab))
    max_logit = candidates[..., :1]  # == max(logits)
    norm = jnp.sum(jnp.exp(logits - max_logit), axis=-1, keepdims=True)
    # The sorted prefix of the reference, cut short at K.
    probs = jnp.exp(candidates - max_logit) / norm
    kept = jnp.cumsum(probs, axis=-1) - probs < top_p
    threshold = jnp.min(jnp.where(kept, candidates, jnp.inf), axis=-1, keepdims=True)
    if candidates.shape[-1] >= vocab:
        return threshold
    # The cut may lie beyond the candidates only if all are kept and the last one is finite (a -inf
    # one means every finite token is a candidate).
    beyond = kept[..., -1] & (candidates[..., -1] > NEG_INF)

    def bisect_rows(_):
        def one_row(args):
            row, row_max, row_norm, row_threshold, row_beyond = args
            return jax.lax.cond(
                row_beyond,
                lambda: _nucleus_threshold_by_bisection(row, row_max, row_norm, top_p),
                lambda: row_threshold,
            )

        rows = (
            logits.reshape(-1, vocab),
            max_logit.reshape(-1, 1),
            norm.reshape(-1, 1),
            threshold.reshape(-1, 1),
            beyond.reshape(-1),
        )
        return jax.lax.map(one_row, rows).reshape(threshold.shape)

    return jax.lax.cond(jnp.any(beyond), bisect_rows, lambda _: threshold, None)


def process_logits(logits: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """Standardises logits into log-probabilities.

    Args:
      logits: [..., V] in any float dtype.
      cfg: the sampling configuration.
    Returns:
      [..., V] float32 log-probabilities; excluded tokens are -inf. With temperature 0 this is the
      one-hot argmax (0 at the argmax, -inf elsewhere; the first index wins ties, like jnp.argmax).
    """
    vocab = logits.shape[-1]
    if cfg.greedy:
        return _one_hot_log_probs(greedy_tokens(logits), vocab)
    logits = logits.astype(jnp.float32) / cfg.temperature
    top_k = 0 < cfg.top_k < vocab
    top_p = cfg.top_p < 1.0
    candidates = None
    if top_k:
        # One top_k call serves both filters: its k-th value is the top-k threshold, and its values
        # (those below the threshold masked) are the top-p candidates.
        width = min(max(cfg.top_k, NUCLEUS_CANDIDATES), vocab) if top_p else cfg.top_k
        largest = _largest(logits, width)
        kth_largest = largest[..., cfg.top_k - 1 : cfg.top_k]
        logits = jnp.where(logits < kth_largest, NEG_INF, logits)
        candidates = jnp.where(largest < kth_largest, NEG_INF, largest)
    if top_p:
        threshold = nucleus_threshold(logits, cfg.top_p, candidates)
        logits = jnp.where(logits < threshold, NEG_INF, logits)
    return jax.nn.log_softmax(logits, axis=-1)


def sample(rng: jax.Array, logits: jax.Array, cfg: SamplingConfig) -> tuple[jax.Array, jax.Array]:
    """Draws one token per row from the standardised distribution.

    Args:
      rng: PRNG key.
      logits: [..., V] raw logits.
      cfg: the sampling configuration.
    Returns:
      (tokens [...] int32, log_probs [..., V] float32), the latter being exactly the distribution the
      token was drawn from.
    """
    if cfg.greedy:
        tokens = greedy_tokens(logits)  # the argmax of the one-hot, without reading it back
        return tokens, _one_hot_log_probs(tokens, logits.shape[-1])
    log_probs = process_logits(logits, cfg)
    return categorical(rng, log_probs), log_probs


def rejection_residual(p: jax.Array, q: jax.Array) -> tuple[jax.Array, jax.Array]:
    """What a rejected draw from q leaves of p, both [..., V]: (max(0, p - q) [..., V], its mass
    [..., 1]). Every acceptance rule's next token after a rejection comes from it (`renormalised`)."""
    residual = jnp.maximum(p - q, 0.0)
    return residual, jnp.sum(residual, axis=-1, keepdims=True)


def renormalised(residual: jax.Array, mass: jax.Array, fallback: jax.Array) -> jax.Array:
    """residual [..., V] / mass [..., 1]; `fallback` [..., V] where the mass is 0 (never rejected)."""
    return jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), fallback)


def verify_greedy(
    target_logits: jax.Array,
    draft_logits: jax.Array,
    draft_tokens: jax.Array,
    draft_lengths: jax.Array | None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`verify_detailed` at temperature 0, from argmaxes alone (p and q are one-hot).

    Shapes as in `verify_detailed`.
    """
    gamma = draft_tokens.shape[1]
    target_best = greedy_tokens(target_logits)  # [B, G+1]
    # sum_x min(p, q) of two one-hots: 1 where they coincide, else 0.
    beta = (greedy_tokens(draft_logits) == target_best[:, :gamma]).astype(jnp.float32)
    accepted = draft_tokens == target_best[:, :gamma]
    if draft_lengths is not None:
        accepted &= jnp.arange(gamma)[None, :] < draft_lengths[:, None]
    num_accepted = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1)
    next_token = jnp.take_along_axis(target_best, num_accepted[:, None], axis=1)[:, 0]
    return num_accepted.astype(jnp.int32), next_token, beta


def verify_detailed(
    rng: jax.Array,
    target_logits: jax.Array,
    draft_logits: jax.Array,
    draft_tokens: jax.Array,
    cfg: SamplingConfig,
    lenience: float = 1.0,
    draft_lengths: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`verify` plus the per-position acceptance probability beta_i = sum_x min(p_i(x), q_i(x)).

    Args:
      rng: PRNG key.
      target_logits: [B, G+1, V] target logits at [t_last, x_1..x_G].
      draft_logits: [B, G, V] draft logits that x_1..x_G were sampled from.
      draft_tokens: [B, G] int32 x_1..x_G.
      cfg: sampling configuration shared by draft and target.
      lenience: l in (0, 1]. 1 is the exact rule. l < 1 is the paper's lenient acceptance
        (Leviathan et al. 2023, appendix "Lenience"): q is multiplied by l before it is compared
        with p, so x is accepted with probability min(1, p(x) / (l q(x))) and a rejection resamples
        from norm(max(0, p - l q)). It is lossy: no token is emitted with probability above
        p(x) / l, but the output no longer follows p. beta is then sum_x min(q(x), p(x) / l), the
        acceptance probability. Temperature 0 ignores it (argmax agreement has no slack).
      draft_lengths: optional [B] int32 in 1..G: row b proposed only its first draft_lengths[b]
        tokens (an adaptive gamma); later positions are never accepted, and when all proposed
        tokens are accepted the next token comes from p at the next position, as for a full block.
        Exact as long as the length depends on the draft alone (or on earlier rounds).
    Returns:
      num_accepted [B] int32 in 0..G, next_token [B] int32, beta [B, G] float32.
    """
    if cfg.greedy:
        return verify_greedy(target_logits, draft_logits, draft_tokens, draft_lengths)
    batch, gamma = draft_tokens.shape
    p = jnp.exp(process_logits(target_logits, cfg))  # [B, G+1, V]
    q = jnp.exp(process_logits(draft_logits, cfg))  # [B, G, V]
    if lenience != 1.0:  # a static branch: the exact rule's arithmetic stays bit for bit
        beta = jnp.sum(jnp.minimum(p[:, :gamma] / lenience, q), axis=-1)
        q = lenience * q
    else:
        beta = jnp.sum(jnp.minimum(p[:, :gamma], q), axis=-1)

    accept_rng, resample_rng = jax.random.split(rng)
    tokens = draft_tokens[..., None]
    p_x = jnp.take_along_axis(p[:, :gamma], tokens, axis=-1)[..., 0]  # [B, G]
    q_x = jnp.take_along_axis(q, tokens, axis=-1)[..., 0]
    r = jax.random.uniform(accept_rng, (batch, gamma), dtype=jnp.float32)
    accepted = r * q_x < p_x  # r < p/q without dividing by q
    if draft_lengths is not None:
        accepted &= jnp.arange(gamma)[None, :] < draft_lengths[:, None]
    num_accepted = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1)

    # Next token: from norm(max(0, p_{n+1} - q_{n+1})) at the first rejection, else from p_{G+1}
    # (q_{G+1} = 0 makes both one formula; gathered, not padded, so q is not copied).
    rows = jnp.arange(batch)
    p_next = p[rows, num_accepted]  # [B, V]
    if gamma:
        q_next = q[rows, jnp.minimum(num_accepted, gamma - 1)]
        proposed = gamma if draft_lengths is None else draft_lengths
        # Past the row's last proposal there is no q: the next token is drawn from p itself.
        q_next = jnp.where((num_accepted < proposed)[:, None], q_next, 0.0)
    else:
        q_next = jnp.zeros_like(p_next)
    next_dist = renormalised(*rejection_residual(p_next, q_next), p_next)
    next_token = categorical(resample_rng, jnp.log(next_dist))
    return num_accepted.astype(jnp.int32), next_token, beta


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
