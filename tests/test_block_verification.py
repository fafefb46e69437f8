"""Block verification (speculative/decoding/acceptance/block.py) is exact and never accepts less.

- An exact reference of the rule, in numpy, enumerates every draft block and every stopping point on
  small vocabularies with context-dependent p and q (q with zero mass where p has mass): completed
  by the target, its output is distributed exactly as the target (to 1e-12), and its expected
  accepted length is at least token verification's, computed the same way (never sampled).
- The JAX rule matches the reference: one verify call on many rows, chi-square against the exact
  outcome probabilities (at temperature 1, with top-k, with top-p, and with adaptive lengths).
- Decoding with acceptance='block' samples whole sequences from the target's exact distribution
  (the chi-square of tests/test_decoding.py), and greedy output equals plain decoding on ragged
  batches with EOS inside a block, at gamma 1 and large.
- A broken stopping rule (h_i = w_i, the residual mass ignored) fails the JAX-vs-exact check.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decoding import acceptance, sampling
from speculative.decoding.acceptance import ChainRound
from speculative.decoding.acceptance import block as block_rule
from speculative.decoding.sampling import SamplingConfig
from speculative.errors import JobError
from tests import helpers
from tests.test_decoding import check_sampled_sequences_follow_target

# ------------------------------------------------------------------------------------------------
# The exact reference: one block, p and q given for every prefix (tables keyed by the prefix).


def block_outcomes(p, q, x, gamma):
    """{emitted tokens: probability} of block verification on draft block x (all gamma tokens)."""
    w = [1.0]
    for i in range(gamma):
        w.append(min(w[-1] * p[x[:i]][x[i]] / q[x[:i]][x[i]], 1.0))
    residual, h = {}, {gamma: w[gamma]}
    for i in range(gamma):
        r = np.maximum(w[i] * p[x[:i]] - q[x[:i]], 0.0)
        residual[i] = r / r.sum() if r.sum() > 0 else p[x[:i]]
        if i:
            h[i] = r.sum() / (r.sum() + 1 - w[i]) if r.sum() + 1 - w[i] > 0 else 1.0
    out = {}
    for tau in range(gamma, -1, -1):
        stop = (h[tau] if tau else 1.0) * np.prod([1 - h[j] for j in range(tau + 1, gamma + 1)])
        following = p[x] if tau == gamma else residual[tau]
        for y, py in enumerate(following):
            if stop * py > 0:
                out[x[:tau] + (y,)] = out.get(x[:tau] + (y,), 0.0) + stop * py
    return out


def token_outcomes(p, q, x, gamma):
    """{emitted tokens: probability} of token-by-token verification (Algorithm 1) on block x."""
    out, kept = {}, 1.0
    for i in range(gamma):
        prefix, accept = x[:i], min(1.0, p[x[:i]][x[i]] / q[x[:i]][x[i]])
        r = np.maximum(p[prefix] - q[prefix], 0.0)
        r = r / r.sum() if r.sum() > 0 else p[prefix]
        for y, py in enumerate(r):
            out[prefix + (y,)] = out.get(prefix + (y,), 0.0) + kept * (1 - accept) * py
        kept *= accept
    for y, py in enumerate(p[x]):
        out[x + (y,)] = out.get(x + (y,), 0.0) + kept * py
    return out


def random_tables(rng, vocab, gamma, zero_fraction=0.3):
    def dist(zero=0.0):
        d = rng.gamma(0.5, size=vocab) * (rng.random(vocab) >= zero)
        d[rng.integers(vocab)] += 1e-3  # never all zero
        return d / d.sum()

    prefixes = [t for n in range(gamma + 1) for t in itertools.product(range(vocab), repeat=n)]
    p = {t: dist() for t in prefixes}
    q = {t: dist(zero_fraction) for t in prefixes if len(t) < gamma}
    return p, q


def completed(rule, p, q, vocab, gamma):
    """(distribution of gamma + 1 tokens: the rule's output completed by sampling the target,
    expected accepted draft tokens)."""
    dist, accepted = {}, 0.0
    for x in itertools.product(range(vocab), repeat=gamma):
        qx = np.prod([q[x[:i]][x[i]] for i in range(gamma)])
        if qx == 0:
            continue
        for emitted, prob in rule(p, q, x, gamma).items():
            accepted += qx * prob * (len(emitted) - 1)
            stack = [(emitted, qx * prob)]
            while stack:
                seq, mass = stack.pop()
                if len(seq) == gamma + 1:
                    dist[seq] = dist.get(seq, 0.0) + mass
                    continue
                stack.extend((seq + (y,), mass * py) for y, py in enumerate(p[seq]))
    return dist, accepted


@pytest.mark.parametrize(
    "seed, vocab, gamma", [(0, 3, 1), (1, 3, 2), (2, 3, 3), (3, 2, 4), (4, 4, 2)]
)
def test_reference_is_exact_and_never_accepts_less_than_token_verification(seed, vocab, gamma):
    p, q = random_tables(np.random.default_rng(seed), vocab, gamma)
    target = {
        s: np.prod([p[s[:i]][s[i]] for i in range(gamma + 1)])
        for s in itertools.product(range(vocab), repeat=gamma + 1)
    }
    block, block_accepted = completed(block_outcomes, p, q, vocab, gamma)
    token, token_accepted = completed(token_outcomes, p, q, vocab, gamma)
    for dist in (block, token):
        assert max(abs(dist.get(s, 0.0) - target[s]) for s in target) < 1e-12
    assert block_accepted >= token_accepted - 1e-12
    if gamma == 1:  # one token: the two rules are the same rule
        assert block_accepted == pytest.approx(token_accepted, abs=1e-12)


def test_block_verification_accepts_more_on_the_papers_example():
    """Sun et al.'s motivating example: i.i.d. tokens, target (1/3, 2/3), draft (2/3, 1/3),
    gamma 2: token verification accepts 10/9 draft tokens per round, block verification 11/9."""
    target, draft = np.array([1 / 3, 2 / 3]), np.array([2 / 3, 1 / 3])
    prefixes = [t for n in range(3) for t in itertools.product(range(2), repeat=n)]
    p = {t: target for t in prefixes}
    q = {t: draft for t in prefixes if len(t) < 2}
    _, token = completed(token_outcomes, p, q, 2, 2)
    _, block = completed(block_outcomes, p, q, 2, 2)
    assert token == pytest.approx(10 / 9) and block == pytest.approx(11 / 9)


# ------------------------------------------------------------------------------------------------
# The JAX rule against the reference: one verify call, context-independent p and q per position.

ROWS = 40_000
GAMMA, VOCAB = 3, 4


def one_call_outcomes(rule, cfg, seed, lengths=None):
    """Samples of `rule` on ROWS rows sharing per-position logits (draft tokens drawn from q),
    and the exact outcome probabilities of block verification for the same p and q."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    target_logits = jax.random.normal(keys[0], (1, GAMMA + 1, VOCAB)) * 1.5
    draft_logits = jax.random.normal(keys[1], (1, GAMMA, VOCAB)) * 1.5
    p = np.exp(np.asarray(sampling.process_logits(target_logits[0], cfg), np.float64))
    q = np.exp(np.asarray(sampling.process_logits(draft_logits[0], cfg), np.float64))
    p, q = p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)  # float32 sums to 1 +- 1e-7
    draft_tokens = jax.random.categorical(
        keys[2], jnp.log(jnp.asarray(q, jnp.float32)), shape=(ROWS, GAMMA)
    ).astype(jnp.int32)
    tile = lambda x: jnp.broadcast_to(x, (ROWS, *x.shape[1:]))  # noqa: E731
    draft_lengths = None if lengths is None else jnp.full((ROWS,), lengths, jnp.int32)
    round_ = ChainRound(tile(target_logits), tile(draft_logits), draft_tokens, draft_lengths)
    # One compiled call, as the decode loop runs the rule (eagerly every op compiled on its own);
    # traced here, so a rule patched by a test is the one compiled.
    n, nxt, _ = jax.jit(lambda key, r: rule(key, r, cfg, 1.0))(jax.random.PRNGKey(seed + 1), round_)
    n, nxt, drafts = np.asarray(n), np.asarray(nxt), np.asarray(draft_tokens)
    samples = [tuple(int(t) for t in drafts[r, : n[r]]) + (int(nxt[r]),) for r in range(ROWS)]
    length = GAMMA if lengths is None else lengths
    prefixes = [t for k in range(length + 1) for t in itertools.product(range(VOCAB), repeat=k)]
    p_table = {t: p[len(t)] for t in prefixes}
    q_table = {t: q[len(t)] for t in prefixes if len(t) < length}
    exact = {}
    for x in itertools.product(range(VOCAB), repeat=length):
        qx = np.prod([q[i][x[i]] for i in range(length)])
        if qx == 0:  # a block the draft never proposes (top-k / top-p cut a token out of q)
            continue
        for emitted, prob in block_outcomes(p_table, q_table, x, length).items():
            exact[emitted] = exact.get(emitted, 0.0) + qx * prob
    return samples, exact


CASES = [
    (SamplingConfig(temperature=1.0), None),
    (SamplingConfig(temperature=0.9, top_k=3), None),
    (SamplingConfig(temperature=1.1, top_p=0.8), None),
    (SamplingConfig(temperature=1.0), 2),  # an adaptive gamma: a row proposed 2 of its 3 slots
]


@pytest.mark.parametrize("cfg, lengths", CASES)
def test_jax_rule_matches_the_exact_outcome_distribution(cfg, lengths):
    samples, exact = one_call_outcomes(block_rule.verify_block, cfg, 7, lengths)
    assert abs(sum(exact.values()) - 1.0) < 1e-9
    assert helpers.chi_square_pvalue(samples, exact) > 1e-3


def broken_stop_rule(weights, mass, lengths):
    """h_i = w_i: the residual mass left out of the stopping probability."""
    del mass
    h = weights[:, 1:]
    position = jnp.arange(1, h.shape[1] + 1)[None, :]
    return jnp.where(position > lengths[:, None], 0.0, h)


def test_a_broken_stopping_rule_is_caught(monkeypatch):
    # Patched where the rule lives (decoding/acceptance/block.py).
    monkeypatch.setattr(acceptance.block, "stop_probabilities", broken_stop_rule)
    samples, exact = one_call_outcomes(block_rule.verify_block, SamplingConfig(temperature=1.0), 7)
    assert helpers.chi_square_pvalue(samples, exact) < 1e-6


# ------------------------------------------------------------------------------------------------
# Decoding with acceptance='block'.


@pytest.mark.parametrize(
    "cfg, gamma",
    [
        # T = 1: the rule's exact outcome distribution at T = 1 is checked above (one call)
        pytest.param(SamplingConfig(temperature=1.0), 3, marks=pytest.mark.slow),
        (SamplingConfig(temperature=0.8, top_k=3), 2),
    ],
)
def test_block_decoding_samples_the_target_distribution(small_pair, small_target_probs, cfg, gamma):
    check_sampled_sequences_follow_target(
        small_pair, small_target_probs(cfg), cfg, gamma, draft_power=False, acceptance="block"
    )


# gamma 1 and 12 by default; 4, between them, is a slow-marked repeat (test_decoding.py's _MIDDLE)
@pytest.mark.parametrize("gamma", [1, pytest.param(4, marks=pytest.mark.slow), 12])
def test_block_greedy_is_plain_greedy_with_eos_inside_blocks(
    target, draft, batch, greedy_reference, gamma
):
    eos_id, ref, _ = greedy_reference
    out = decoding.speculative_decode(
        *target, *draft, batch, gamma=gamma, max_decode_len=helpers.GREEDY_MAX_LEN,
        eos_id=eos_id, acceptance="block",
    )  # fmt: skip
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)


def test_lenient_block_verification_is_refused():
    with pytest.raises(ValueError, match="acceptance 'block' is exact"):
        decoding.DecodeConfig(8, (1,), gamma=2, lenience=0.5, acceptance="block")


# ------------------------------------------------------------------------------------------------
# The infer job with ACCEPTANCE = 'block'.


def test_infer_job_with_block_acceptance(tmp_path, monkeypatch):
    monkeypatch.chdir(helpers.ROOT)
    _infer = helpers.tiny_infer
    plain, _ = _infer(tmp_path, "plain", "--gin.SPECULATIVE=False")
    rows, summary = _infer(tmp_path, "block", "--gin.ACCEPTANCE='block'")
    assert [r["output_ids"] for r in rows] == [r["output_ids"] for r in plain]
    assert summary["acceptance"] == "block" and summary["exact"] is True
    _, token_summary = _infer(tmp_path, "token", "--gin.TEMPERATURE=1.0")
    assert "acceptance" not in token_summary  # the paper's rule: summaries as before
    with pytest.raises(JobError, match="ACCEPTANCE 'block' is exact only") as e:
        _infer(tmp_path, "lossy", "--gin.ACCEPTANCE='block'", "--gin.LENIENCE=0.5")
    assert "\n" not in str(e.value)
    with pytest.raises(JobError, match="ACCEPTANCE must be one of"):
        _infer(tmp_path, "unknown", "--gin.ACCEPTANCE='blocks'")


# The benchmark sweep of block against token verification is shared with the tree variant:
# tests/test_token_trees.py::test_benchmark_sweeps_block_and_a_tree_against_the_chain.
