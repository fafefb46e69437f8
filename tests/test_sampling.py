"""process_logits and the acceptance rule: exact output distributions."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from speculative.decoding import sampling
from speculative.decoding.sampling import SamplingConfig

V = 10
TARGET = jnp.asarray(
    [
        [1.0, 0.5, 0.2, -0.3, 2.0, 0.0, -1.0, 0.7, 1.5, -2.0],
        [0.0, 1.2, -0.5, 0.8, 0.1, 2.2, -0.4, 0.3, 0.0, 1.0],
    ]
)
DRAFT = jnp.asarray(
    [
        [0.2, 1.5, 0.9, -0.1, 1.0, 0.3, 0.5, -0.7, 0.1, 0.0],
        [1.0, 0.0, 0.4, 0.2, -0.6, 1.9, 0.8, 0.0, -1.0, 0.5],
    ]
)
CONFIGS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_k=4),
    SamplingConfig(temperature=1.3, top_p=0.8),
    SamplingConfig(temperature=1.0, top_k=6, top_p=0.9),
]


def test_greedy_is_one_hot_argmax():
    logp = sampling.process_logits(TARGET.astype(jnp.bfloat16), SamplingConfig())
    assert logp.dtype == jnp.float32
    np.testing.assert_array_equal(np.argmax(logp, -1), np.argmax(TARGET, -1))
    np.testing.assert_array_equal(np.exp(logp).sum(-1), 1.0)
    assert np.sum(np.isfinite(logp)) == 2


def test_temperature_top_k_top_p_match_definitions():
    logits = TARGET[0]
    np.testing.assert_allclose(
        sampling.process_logits(logits, SamplingConfig(temperature=2.0)),
        jax.nn.log_softmax(logits / 2.0),
        rtol=1e-6,
    )
    kept = np.isfinite(sampling.process_logits(logits, SamplingConfig(temperature=1.0, top_k=3)))
    np.testing.assert_array_equal(np.flatnonzero(kept), np.sort(np.argsort(-logits)[:3]))
    probs = np.asarray(jax.nn.softmax(logits))
    order = np.argsort(-probs)
    for top_p in (0.05, 0.3, 0.6, 0.95, 1.0):
        cfg = SamplingConfig(temperature=1.0, top_p=top_p)
        kept = np.isfinite(sampling.process_logits(logits, cfg))
        # Smallest prefix (by probability) whose mass reaches top_p.
        needed = int(np.searchsorted(np.cumsum(probs[order]), top_p - 1e-7) + 1)
        np.testing.assert_array_equal(np.flatnonzero(kept), np.sort(order[:needed]))
        renorm = np.where(kept, probs, 0) / probs[kept].sum()
        np.testing.assert_allclose(np.exp(sampling.process_logits(logits, cfg)), renorm, atol=1e-6)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_acceptance_rule_preserves_target_analytically(cfg):
    """sum over draft tokens of q(x) min(1, p/q) delta_x + P(reject) * residual == p, exactly."""
    p = np.exp(np.asarray(sampling.process_logits(TARGET[0], cfg), np.float64))
    q = np.exp(np.asarray(sampling.process_logits(DRAFT[0], cfg), np.float64))
    accept = np.where(q > 0, np.minimum(1.0, p / np.where(q > 0, q, 1.0)), 0.0)
    residual = np.maximum(p - q, 0.0)
    reject_mass = 1.0 - np.sum(q * accept)
    output = q * accept + reject_mass * residual / residual.sum()
    np.testing.assert_allclose(output, p, atol=1e-6)
    beta = np.minimum(p, q).sum()
    np.testing.assert_allclose(reject_mass, 1 - beta, atol=1e-6)


def _draw(cfg, n, seed):
    """n independent verify() calls on the same (p, q), gamma = 1 draft position + bonus position."""
    key_draft, key_verify = jax.random.split(jax.random.PRNGKey(seed))
    target_logits = jnp.broadcast_to(TARGET, (n, 2, V))
    draft_logits = jnp.broadcast_to(DRAFT[:1], (n, 1, V))
    draft_tokens, _ = sampling.sample(key_draft, draft_logits, cfg)
    n_acc, next_token = jax.jit(sampling.verify, static_argnums=4)(
        key_verify, target_logits, draft_logits, draft_tokens, cfg
    )
    first = np.where(n_acc == 1, draft_tokens[:, 0], next_token)
    return np.asarray(n_acc), np.asarray(first), np.asarray(next_token)


def _pvalue(samples, probs):
    """Chi-square p-value of token samples against probs; 0 if a zero-probability token appears."""
    counts = np.bincount(samples, minlength=V)
    support = probs > 0
    if counts[~support].sum():
        return 0.0
    expected = probs[support] / probs[support].sum() * len(samples)
    return stats.chisquare(counts[support], expected).pvalue


def check_verify_output_matches_target(cfg, n=200_000, seed=0):
    """One draft position + bonus: the first token follows p_1, the bonus after an accepted draft
    follows p_2, the acceptance rate is beta (chi-square and a 4-sigma band). Also run on mutants of
    the acceptance rule (tests/test_mutations.py)."""
    n_acc, first, next_token = _draw(cfg, n, seed=seed)
    p1 = np.exp(np.asarray(sampling.process_logits(TARGET[0], cfg), np.float64))
    p2 = np.exp(np.asarray(sampling.process_logits(TARGET[1], cfg), np.float64))
    q1 = np.exp(np.asarray(sampling.process_logits(DRAFT[0], cfg), np.float64))
    assert _pvalue(first, p1) > 1e-3
    # After an accepted draft the bonus token comes from p_2.
    assert _pvalue(next_token[n_acc == 1], p2) > 1e-3
    # The acceptance rate is beta = sum min(p, q).
    beta = np.minimum(p1, q1).sum()
    assert abs(n_acc.mean() - beta) < 4 * np.sqrt(beta * (1 - beta) / n)
    # Power: the same test rejects the draft's distribution (what a wrong rule would emit).
    assert _pvalue(first, q1) < 1e-6


@pytest.mark.parametrize("cfg", CONFIGS)
def test_verify_output_matches_target_by_chi_square(cfg):
    check_verify_output_matches_target(cfg)


def test_verify_greedy_accepts_exact_prefix():
    target_logits = jax.nn.one_hot(jnp.array([[3, 5, 7, 1]]), V) * 5.0  # argmax 3, 5, 7, 1
    draft_tokens = jnp.array([[3, 5, 2]])
    n, nxt = sampling.verify(
        jax.random.PRNGKey(0), target_logits, jnp.zeros((1, 3, V)), draft_tokens, SamplingConfig()
    )
    assert int(n[0]) == 2 and int(nxt[0]) == 7
    n, nxt = sampling.verify(
        jax.random.PRNGKey(0),
        target_logits,
        jnp.zeros((1, 3, V)),
        jnp.array([[3, 5, 7]]),
        SamplingConfig(),
    )
    assert int(n[0]) == 3 and int(nxt[0]) == 1


def test_verify_identical_distributions_always_accept():
    """p == q: the residual is zero; every draft must be accepted and nothing divides by zero."""
    cfg = SamplingConfig(temperature=1.0)
    logits = jnp.broadcast_to(TARGET[0], (5000, 4, V))

    # draw and verify jitted together (cfg static, as in the decode loop): one program, not op by op
    @functools.partial(jax.jit, static_argnums=1)
    def draw_and_verify(logits, cfg):
        tokens, _ = sampling.sample(jax.random.PRNGKey(1), logits[:, :3], cfg)
        return sampling.verify(jax.random.PRNGKey(2), logits, logits[:, :3], tokens, cfg)

    n, nxt = draw_and_verify(logits, cfg)
    assert np.all(np.asarray(n) == 3)
    assert np.all((np.asarray(nxt) >= 0) & (np.asarray(nxt) < V))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
    ],
)
def test_bad_sampling_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)


# --- The sort-free top-p / top-k cut against the full-sort reference, at the Qwen2.5 vocabulary. ---

QWEN_VOCAB = 151_936
# Within this distance of top_p in exact arithmetic, the float32 mass of the reference (a cumsum in
# sorted order) and of the sort-free cut (sums in vocabulary order) may round to opposite sides: such
# tokens are on the boundary to float32 precision. Both sums err by < 5e-7 at V = 151,936.
ROUNDING_BAND = 2e-6

_process = jax.jit(sampling.process_logits, static_argnums=1)
_process_by_sort = jax.jit(sampling.process_logits_by_sort, static_argnums=1)


def _zipf_rows(rows, vocab, seed, exponent=2.0):
    """[rows, V] logits ~ -exponent * log(rank), shuffled: a few tokens carry most of the mass."""
    rng = np.random.default_rng(seed)
    zipf = -exponent * np.log(np.arange(1, vocab + 1))
    rows = [rng.permutation(zipf) + 0.05 * rng.standard_normal(vocab) for _ in range(rows)]
    return np.stack(rows).astype(np.float32)


def _normal_rows(rows, vocab, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal((rows, vocab)) * scale).astype(np.float32)


def _filtered(logits, cfg):
    """The float32 logits the top-p cut sees: temperature, then top-k (kept ties), as the reference."""
    x = np.asarray(jnp.asarray(logits).astype(jnp.float32) / cfg.temperature)
    if 0 < cfg.top_k < x.shape[-1]:
        kth = np.sort(x, axis=-1)[..., -cfg.top_k, None]
        x = np.where(x < kth, -np.inf, x)
    return x


def _exact_mass_above(row):
    """[V] float32 logits -> [V] float64 probability of the tokens with a strictly larger logit."""
    row = row.astype(np.float64)
    probs = np.exp(row - row.max())
    probs /= probs.sum()
    order = np.argsort(-row, kind="stable")
    before = np.cumsum(probs[order]) - probs[order]
    first_of_value = np.searchsorted(-row[order], -row[order], side="left")
    above = np.empty_like(row)
    above[order] = before[first_of_value]
    return above


def _assert_same_cut(logits, cfg, band=ROUNDING_BAND):
    """process_logits == the sort reference, bit for bit, unless the boundary is a rounding tie.

    Where the kept sets differ, every differing token must lie within `band` of top_p in exact
    arithmetic; away from the band both must also agree with the float64 definition.
    Returns the indices of the rows (flattened) where the sets differed.
    """
    new = np.asarray(_process(logits, cfg))
    ref = np.asarray(_process_by_sort(logits, cfg))
    assert new.dtype == np.float32 and new.shape == ref.shape
    kept_new, kept_ref = np.isfinite(new), np.isfinite(ref)
    if np.array_equal(kept_new, kept_ref):
        np.testing.assert_array_equal(new, ref)
        return []
    filtered = _filtered(logits, cfg).reshape(-1, new.shape[-1])
    kept_new, kept_ref = kept_new.reshape(filtered.shape), kept_ref.reshape(filtered.shape)
    rows_differing = []
    for index, (row, k_new, k_ref) in enumerate(zip(filtered, kept_new, kept_ref, strict=True)):
        if np.array_equal(k_new, k_ref):
            continue
        rows_differing.append(index)
        above = _exact_mass_above(row)
        on_edge = np.abs(above - cfg.top_p) < band
        assert np.all(on_edge[k_new != k_ref]), "kept sets differ away from the rounding band"
        exact = np.isfinite(row) & (above < cfg.top_p)
        np.testing.assert_array_equal(k_new[~on_edge], exact[~on_edge])
    return rows_differing


@pytest.mark.parametrize(
    "top_p", [1e-4, 0.3, 0.9, *(pytest.param(p, marks=pytest.mark.slow) for p in (0.95, 0.999))]
)
def test_top_p_matches_sort_on_random_vocab_rows(top_p):
    """Peaked rows end the nucleus among the top_k candidates; normal rows need the bisection."""
    logits = np.concatenate(
        [
            _zipf_rows(2, QWEN_VOCAB, seed=1),
            _zipf_rows(1, QWEN_VOCAB, seed=2, exponent=1.1),
            _normal_rows(2, QWEN_VOCAB, seed=3),
            _normal_rows(1, QWEN_VOCAB, seed=4, scale=3.0),
        ]
    )
    for temperature in (1.0, 0.6):
        cfg = SamplingConfig(temperature=temperature, top_p=top_p)
        _assert_same_cut(logits, cfg)
    if top_p == 1e-4:  # only the argmax survives
        kept = np.isfinite(np.asarray(_process(logits, SamplingConfig(1.0, top_p=top_p))))
        np.testing.assert_array_equal(np.flatnonzero(kept) % QWEN_VOCAB, np.argmax(logits, -1))


def test_top_p_one_is_no_filter():
    logits = _normal_rows(2, QWEN_VOCAB, seed=5, scale=2.0)
    cfg = SamplingConfig(temperature=0.8, top_p=1.0)
    out = np.asarray(_process(logits, cfg))
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out, np.asarray(_process_by_sort(logits, cfg)))
    np.testing.assert_array_equal(out, np.asarray(jax.nn.log_softmax(jnp.asarray(logits) / 0.8)))


def test_top_p_ties_straddling_the_boundary_are_all_kept():
    # 10 tokens at 10.0 hold ~23% of the mass, 5000 tied at 5.0 hold ~77%: a cut at 0.5 falls
    # ~1800 tokens into the tie, past the top_k candidates, and must keep all 5000.
    rng = np.random.default_rng(6)
    row = rng.standard_normal(QWEN_VOCAB).astype(np.float32) - 5.0
    perm = rng.permutation(QWEN_VOCAB)
    head, tie = perm[:10], perm[10:5010]
    row[head], row[tie] = 10.0, 5.0
    for top_p in (0.1, 0.5, 0.99):
        cfg = SamplingConfig(temperature=1.0, top_p=top_p)
        assert _assert_same_cut(row[None], cfg) == []
        kept = np.isfinite(np.asarray(_process(row[None], cfg)))[0]
        expected = {0.1: head, 0.5: perm[:5010], 0.99: perm[:5010]}[top_p]
        np.testing.assert_array_equal(np.flatnonzero(kept), np.sort(expected))
    # Many ties everywhere: logits on a 1/4 grid (~60 distinct values over the vocabulary).
    grid = np.round(_normal_rows(3, QWEN_VOCAB, seed=7, scale=2.0) * 4) / 4
    for top_p in (0.2, 0.7, 0.95, 0.999):
        assert _assert_same_cut(grid, SamplingConfig(temperature=1.0, top_p=top_p)) == []


def test_top_k_keeps_ties_at_the_kth_value():
    logits = _normal_rows(2, QWEN_VOCAB, seed=8)
    kth = np.sort(logits, axis=-1)[:, -50]
    for r in range(2):  # 9 more tokens tied with the 50th largest
        below = np.flatnonzero(logits[r] < kth[r])[:9]
        logits[r, below] = kth[r]
    for k in (1, 50, 1000):
        cfg = SamplingConfig(temperature=1.0, top_k=k)
        out = np.asarray(_process(logits, cfg))
        np.testing.assert_array_equal(out, np.asarray(_process_by_sort(logits, cfg)))
        if k == 50:
            np.testing.assert_array_equal(np.isfinite(out).sum(-1), [59, 59])


@pytest.mark.parametrize("top_k, top_p", [(50, 0.9), (50, 0.999), (1000, 0.99), (3, 0.2)])
def test_top_k_with_top_p_matches_sort(top_k, top_p):
    logits = np.concatenate(
        [_zipf_rows(1, QWEN_VOCAB, seed=9), _normal_rows(2, QWEN_VOCAB, seed=10)]
    )
    logits[1, :400] = logits[1].max()  # 400 tokens tied at the top: more than the candidates
    assert _assert_same_cut(logits, SamplingConfig(temperature=1.0, top_k=top_k, top_p=top_p)) == []


def test_batched_rows_are_cut_independently():
    """[B, L, V] with peaked and flat rows mixed: only some rows take the bisection."""
    rows = np.concatenate(
        [_zipf_rows(3, QWEN_VOCAB, seed=11), _normal_rows(3, QWEN_VOCAB, seed=12)]
    )
    # On a 1/8 grid: the ties make every boundary step far larger than float32 rounding.
    rows = np.round(rows * 8) / 8
    logits = rows[np.random.default_rng(13).permutation(6)].reshape(2, 3, QWEN_VOCAB)
    cfg = SamplingConfig(temperature=0.9, top_p=0.9)
    assert _assert_same_cut(logits, cfg) == []
    batched = np.asarray(_process(logits, cfg))
    for b in range(2):
        for position in range(3):
            np.testing.assert_array_equal(
                batched[b, position], np.asarray(_process(logits[b, position], cfg))
            )


def test_bfloat16_logits_match_sort():
    # bfloat16 has 8 significant bits: its values tie in large groups.
    logits = jnp.asarray(
        np.concatenate([_zipf_rows(1, QWEN_VOCAB, seed=14), _normal_rows(2, QWEN_VOCAB, seed=15)]),
        jnp.bfloat16,
    )
    for cfg in (
        SamplingConfig(temperature=1.0, top_p=0.95),
        SamplingConfig(temperature=0.7, top_k=50, top_p=0.8),
        SamplingConfig(temperature=1.0, top_k=20),
    ):
        assert _assert_same_cut(logits, cfg) == []


def test_flat_rows_beyond_the_candidates_take_the_exact_fallback():
    """All-equal and near-uniform rows: the K candidates never reach top_p."""
    equal = np.zeros((2, QWEN_VOCAB), np.float32)
    for top_p in (1e-4, 0.5, 0.999):
        out = np.asarray(_process(equal, SamplingConfig(temperature=1.0, top_p=top_p)))
        np.testing.assert_array_equal(out, np.full_like(out, -np.log(np.float32(QWEN_VOCAB))))
    hot = _normal_rows(3, QWEN_VOCAB, seed=16, scale=3.0)
    for top_p in (0.05, 0.5, 0.95):
        cfg = SamplingConfig(temperature=200.0, top_p=top_p)
        kept = np.isfinite(np.asarray(_process_by_sort(hot, cfg))).sum(-1)
        assert np.all(kept > sampling.NUCLEUS_CANDIDATES)
        _assert_same_cut(hot, cfg)
    # 151,776 equal probabilities and 160 tokens a little below them, at -2**-k: the masses near
    # 1 - 1e-6 must be summed exactly, not in float32 (which drifts by 5e-5 here).
    near_equal = np.zeros((1, QWEN_VOCAB), np.float32)
    near_equal[0, -160:] = -(2.0 ** -np.arange(160.0))
    for top_p in (0.5, 0.999995, 0.999999):
        assert _assert_same_cut(near_equal, SamplingConfig(temperature=1.0, top_p=top_p)) == []


def test_bisection_matches_sort_on_small_rows():
    """Few candidates on a small vocabulary forces the bisection on most rows, cheaply."""
    rng = np.random.default_rng(17)
    rows = np.round(rng.standard_normal((400, 40)) * rng.choice([1, 2, 4, 8], (400, 1))) / 2
    rows[rng.random(rows.shape) < 0.2] = -np.inf  # top-k leftovers
    rows[:20] = -0.0  # signed zeros tie
    rows[:10, ::2] = 0.0
    rows[20:40, 0] = 1e30  # all the mass in one token
    rows[40:60] = -(2.0 ** -rng.permutation(np.arange(40.0)))  # one binade per token
    rows[60:80] = 2.0 ** rng.permutation(np.arange(-60.0, 60.0, 3.0))
    rows = jnp.asarray(rows, jnp.float32)
    cut = jax.jit(sampling.nucleus_threshold, static_argnums=(1, 3))
    for top_p in (0.01, 0.37, 0.83, 0.999):
        kept = np.asarray(rows >= cut(rows, top_p, None, 3))
        kept_ref = np.asarray(rows >= sampling.nucleus_threshold_by_sort(rows, top_p))
        np.testing.assert_array_equal(kept, kept_ref)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU lowering")
def test_no_full_vocabulary_sort_is_compiled():
    """On XLA:CPU a top_k whose entries are read one by one silently becomes a full sort."""
    x = jax.ShapeDtypeStruct((3, QWEN_VOCAB), jnp.float32)
    for cfg in (
        SamplingConfig(temperature=1.0, top_k=50),
        SamplingConfig(temperature=1.0, top_p=0.95),
        SamplingConfig(temperature=1.0, top_k=50, top_p=0.95),
    ):
        hlo = jax.jit(sampling.process_logits, static_argnums=1).lower(x, cfg).compile().as_text()
        assert not [line for line in hlo.splitlines() if " sort(" in line], cfg
    hlo = jax.jit(sampling.process_logits_by_sort, static_argnums=1).lower(x, cfg).compile()
    assert " sort(" in hlo.as_text()  # the check can see a sort


def test_greedy_tokens_match_argmax():
    rng = np.random.default_rng(18)
    cases = [
        np.round(rng.standard_normal((3, 4, 50))),
        np.full((2, 7), -np.inf),
        np.array([[1.0, np.nan, 3.0, np.nan], [np.inf, 1, np.inf, 0], [-0.0, 0.0, -1, -2]]),
    ]

    # The three calls jitted together: one program per case and dtype, not op by op eagerly.
    @jax.jit
    def greedy(x):
        tokens, log_probs = sampling.sample(jax.random.PRNGKey(0), x, SamplingConfig())
        return (
            tokens,
            log_probs,
            jnp.argmax(x, axis=-1),
            sampling.process_logits(x, SamplingConfig()),
        )

    for logits in cases:
        for dtype in (jnp.float32, jnp.bfloat16):
            x = jnp.asarray(logits, dtype)
            tokens, log_probs, argmax, processed = greedy(x)
            np.testing.assert_array_equal(tokens, argmax)
            assert tokens.dtype == jnp.int32
            np.testing.assert_array_equal(
                log_probs,
                np.where(np.arange(x.shape[-1]) == np.asarray(tokens)[..., None], 0, -np.inf),
            )
            np.testing.assert_array_equal(log_probs, processed)


def test_verify_greedy_matches_one_hot_definition():
    """beta, n and the next token from one-hot p and q, computed the long way."""
    rng = np.random.default_rng(19)
    batch, gamma, vocab = 64, 4, 6
    target = np.round(rng.standard_normal((batch, gamma + 1, vocab)))  # ties: the first index wins
    draft = np.round(rng.standard_normal((batch, gamma, vocab)))
    p = np.eye(vocab)[np.argmax(target, -1)]
    q = np.eye(vocab)[np.argmax(draft, -1)]
    tokens = np.where(rng.random((batch, gamma)) < 0.7, np.argmax(target[:, :gamma], -1), 0)
    n, nxt, beta = sampling.verify_detailed(
        jax.random.PRNGKey(0), target, draft, jnp.asarray(tokens, jnp.int32), SamplingConfig()
    )
    accepted = np.take_along_axis(p[:, :gamma], tokens[..., None], -1)[..., 0] > 0.5
    n_ref = np.cumprod(accepted, axis=1).sum(1)
    np.testing.assert_array_equal(n, n_ref)
    np.testing.assert_array_equal(nxt, np.argmax(p[np.arange(batch), n_ref], -1))
    np.testing.assert_array_equal(beta, np.minimum(p[:, :gamma], q).sum(-1))
    assert n.dtype == nxt.dtype == jnp.int32 and beta.dtype == jnp.float32


def test_categorical_is_jax_random_categorical():
    """`sample` and `verify` draw the same tokens as jax.random.categorical with the same key."""
    rng = np.random.default_rng(20)
    logits = rng.standard_normal((2, 3, 1000)).astype(np.float32) * 3
    logits[0, 0, rng.random(1000) < 0.5] = -np.inf
    log_probs = jax.nn.log_softmax(jnp.asarray(logits))
    for seed in range(4):
        key = jax.random.PRNGKey(seed)
        np.testing.assert_array_equal(
            sampling.categorical(key, log_probs), jax.random.categorical(key, log_probs, axis=-1)
        )
        tokens, _ = sampling.sample(key, logits, SamplingConfig(temperature=1.0))
        np.testing.assert_array_equal(tokens, jax.random.categorical(key, log_probs, axis=-1))


# --- lenient acceptance (the paper's factor l; lossy) -------------------------------------------


def _draw_lenient(cfg, n, seed, lenience):
    key_draft, key_verify = jax.random.split(jax.random.PRNGKey(seed))
    target_logits = jnp.broadcast_to(TARGET, (n, 2, V))
    draft_logits = jnp.broadcast_to(DRAFT[:1], (n, 1, V))
    draft_tokens, _ = sampling.sample(key_draft, draft_logits, cfg)
    n_acc, next_token, beta = jax.jit(sampling.verify_detailed, static_argnums=(4, 5))(
        key_verify, target_logits, draft_logits, draft_tokens, cfg, lenience
    )
    first = np.where(n_acc == 1, draft_tokens[:, 0], next_token)
    return np.asarray(n_acc), np.asarray(first), np.asarray(beta)


def test_lenience_one_is_the_exact_rule_bit_for_bit():
    cfg = SamplingConfig(temperature=1.0, top_k=6)
    key = jax.random.PRNGKey(3)
    target_logits = jnp.broadcast_to(TARGET, (64, 2, V))
    draft_logits = jnp.broadcast_to(DRAFT[:1], (64, 1, V))
    # jitted with cfg and lenience static, as the decode loop runs them (one program per call
    # form, not op by op eagerly): the default lenience against an explicit 1.0
    tokens, _ = jax.jit(sampling.sample, static_argnums=2)(key, draft_logits, cfg)
    verify = jax.jit(sampling.verify_detailed, static_argnums=(4, 5))
    exact = verify(key, target_logits, draft_logits, tokens, cfg)
    lenient = verify(key, target_logits, draft_logits, tokens, cfg, 1.0)
    for a, b in zip(exact, lenient, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("lenience", [0.5, 0.3, 0.1])
def test_lenient_rule_follows_its_analytic_distribution(lenience):
    """First emitted token: P(x) = min(q(x), p(x)/l) + (1 - beta_l) norm(max(0, p - l q))(x), with
    the acceptance rate beta_l = sum min(q, p/l) rising as l falls."""
    cfg = SamplingConfig(temperature=1.0)
    n = 200_000
    n_acc, first, beta = _draw_lenient(cfg, n, seed=1, lenience=lenience)
    p = np.exp(np.asarray(sampling.process_logits(TARGET[0], cfg), np.float64))
    q = np.exp(np.asarray(sampling.process_logits(DRAFT[0], cfg), np.float64))
    accept = np.minimum(q, p / lenience)
    beta_l = min(accept.sum(), 1.0)  # at l = 0.1 every draft token is accepted
    residual = np.maximum(p - lenience * q, 0.0)
    analytic = accept + (1 - beta_l) * residual / residual.sum()
    assert abs(analytic.sum() - 1) < 1e-6
    assert _pvalue(first, analytic) > 1e-3
    assert abs(n_acc.mean() - beta_l) <= 4 * np.sqrt(beta_l * (1 - beta_l) / n)
    np.testing.assert_allclose(beta[:, 0], beta_l, rtol=1e-5)
    assert beta_l > np.minimum(p, q).sum()  # more acceptance than the exact rule...
    assert _pvalue(first, p) < 1e-6  # ...and no longer the target's distribution
