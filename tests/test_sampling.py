"""process_logits and the acceptance rule: exact output distributions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from speculative import sampling
from speculative.sampling import SamplingConfig

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


@pytest.mark.parametrize("cfg", CONFIGS)
def test_verify_output_matches_target_by_chi_square(cfg):
    n = 200_000
    n_acc, first, next_token = _draw(cfg, n, seed=0)
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
    tokens, _ = sampling.sample(jax.random.PRNGKey(1), logits[:, :3], cfg)
    n, nxt = sampling.verify(jax.random.PRNGKey(2), logits, logits[:, :3], tokens, cfg)
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
