"""Speculative decoding is exact: greedy token identity, sampled distribution identity, stats."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decoding.sampling import SamplingConfig
from speculative.measure import timing
from tests import helpers

V, MAX_LEN = helpers.GREEDY_VOCAB, helpers.GREEDY_MAX_LEN  # target, draft, batch: conftest.py


@pytest.fixture(scope="module")
def eos_and_reference(greedy_reference):
    """An EOS id that some rows emit mid-sequence, and the plain greedy decode with it."""
    eos_id, ref, _ = greedy_reference
    lengths = np.asarray(ref.lengths)
    assert lengths.min() < MAX_LEN and lengths.max() == MAX_LEN, "want rows ending both ways"
    return eos_id, ref


# gamma 1 and large for both drafts by default; 2 and 4, between them, are slow-marked repeats
_MIDDLE = pytest.mark.slow


@pytest.mark.parametrize(
    "gamma", [1, pytest.param(2, marks=_MIDDLE), pytest.param(4, marks=_MIDDLE), 8]
)
@pytest.mark.parametrize("which_draft", ["unrelated", "self"])
def test_greedy_identical_to_plain(target, draft, batch, eos_and_reference, gamma, which_draft):
    eos_id, ref = eos_and_reference
    draft_model, draft_params = target if which_draft == "self" else draft
    out = decoding.speculative_decode(
        *target,
        draft_model,
        draft_params,
        batch,
        gamma=gamma,
        max_decode_len=MAX_LEN,
        eos_id=eos_id,
    )
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    s = {k: np.asarray(v) for k, v in out.stats.items()}
    # Bookkeeping: every round drafts gamma tokens; greedy beta is 1 exactly when accepted.
    np.testing.assert_array_equal(s["drafted"], gamma * s["target_calls"])
    np.testing.assert_array_equal(s["draft_calls"], gamma * s["target_calls"])
    np.testing.assert_array_equal(s["accepted"], s["accepted_at"].sum(1))
    np.testing.assert_allclose(s["alpha"] * s["verified_at"].sum(1), s["accepted"], atol=1e-4)
    assert np.all(s["target_calls"] >= np.ceil(s["accepted"] / gamma))
    if which_draft == "self":
        np.testing.assert_allclose(s["alpha"], 1.0)
        np.testing.assert_array_equal(s["accepted"], s["drafted"])
        expected_calls = np.ceil(np.asarray(ref.lengths) / (gamma + 1))
        np.testing.assert_array_equal(s["target_calls"], expected_calls)
    else:
        assert s["alpha"].mean() < 0.5


def test_greedy_batch_of_one_and_large_gamma(target, draft):
    batch = helpers.ragged_prompts(3, batch=1, width=5, vocab=V)
    ref = decoding.autoregressive_decode(*target, batch, max_decode_len=23, eos_id=V)
    for gamma in (3, 12):
        out = decoding.speculative_decode(
            *target, *draft, batch, gamma=gamma, max_decode_len=23, eos_id=V
        )
        np.testing.assert_array_equal(out.tokens, ref.tokens)
        assert int(out.lengths[0]) == 23


def test_rows_are_independent_of_batch_composition(target, draft, batch, eos_and_reference):
    """A row's greedy output does not depend on its neighbours' acceptance lengths."""
    eos_id, ref = eos_and_reference
    single = {k: v[3:4] for k, v in batch.items()}
    out = decoding.speculative_decode(
        *target, *draft, single, gamma=4, max_decode_len=MAX_LEN, eos_id=eos_id
    )
    np.testing.assert_array_equal(out.tokens[0], ref.tokens[3])


# --- sampling: the sequence distribution equals the target's ----------------------------------

SV, SEQ_LEN, EOS, N, PROMPT = helpers.SV, helpers.SEQ_LEN, helpers.EOS, helpers.N, helpers.PROMPT
_repeated_prompt = helpers.repeated_prompt
SAMPLED_CASES = [
    pytest.param(SamplingConfig(temperature=1.0), 2, marks=pytest.mark.slow),  # gamma 1 and top-p's
    (SamplingConfig(temperature=1.0), 1),
    (SamplingConfig(temperature=0.8, top_k=3), 3),
    (SamplingConfig(temperature=1.2, top_p=0.7), 2),
]


def check_sampled_sequences_follow_target(
    small_pair, exact, cfg, gamma, draft_power=True, acceptance="token", tree=None
):
    """Speculative decoding of N rows samples sequences from the target's exact distribution `exact`
    (chi-square), rows are independent, and (draft_power) the same test rejects the draft's own.
    Also run on mutants of the acceptance rule (tests/test_mutations.py), with block
    verification (tests/test_block_verification.py) and with token trees (test_token_trees.py)."""
    assert abs(sum(exact.values()) - 1.0) < 1e-6
    samples, out = helpers.speculative_samples(
        small_pair, _repeated_prompt(N), gamma=gamma, max_decode_len=SEQ_LEN, eos_id=EOS, cfg=cfg,
        acceptance=acceptance, tree=tree,
    )  # fmt: skip
    assert helpers.chi_square_pvalue(samples, exact) > 1e-3
    alpha = float(np.mean(out.stats["alpha"]))
    assert 0.2 < alpha < 0.99, f"want a draft that is sometimes rejected, alpha={alpha}"

    # Rows are independent draws: adjacent rows collide at the rate sum_s p(s)^2.
    collide = np.mean([a == b for a, b in zip(samples[0::2], samples[1::2])])
    expected = sum(p * p for p in exact.values())
    assert abs(collide - expected) < 5 * np.sqrt(expected * (1 - expected) / (N // 2))
    if not draft_power:
        return

    # Power: the same test rejects the draft's own sequence distribution.
    _, (drf, drf_params) = small_pair
    draft_out = decoding.autoregressive_decode(
        drf,
        drf_params,
        _repeated_prompt(N),
        max_decode_len=SEQ_LEN,
        sampling=cfg,
        eos_id=EOS,
        rng=jax.random.PRNGKey(43),
    )
    draft_samples = helpers.rows_as_sequences(draft_out.tokens, draft_out.lengths)
    assert helpers.chi_square_pvalue(draft_samples, exact) < 1e-6


@pytest.mark.parametrize("cfg, gamma", SAMPLED_CASES)
def test_sampled_sequences_follow_target_distribution(small_pair, small_target_probs, cfg, gamma):
    check_sampled_sequences_follow_target(small_pair, small_target_probs(cfg), cfg, gamma)


def test_plain_sampling_follows_exact_probabilities(small_pair, small_target_probs):
    """The harness itself: plain decoding of the target passes the same test."""
    (tgt, tgt_params), _ = small_pair
    cfg = SamplingConfig(temperature=1.0)
    exact = small_target_probs(cfg)
    out = decoding.autoregressive_decode(
        tgt,
        tgt_params,
        _repeated_prompt(N),
        max_decode_len=SEQ_LEN,
        sampling=cfg,
        eos_id=EOS,
        rng=jax.random.PRNGKey(7),
    )
    assert (
        helpers.chi_square_pvalue(helpers.rows_as_sequences(out.tokens, out.lengths), exact) > 1e-3
    )


# --- determinism, compilation -----------------------------------------------------------------


def test_deterministic_and_compiled_once(target, draft, batch):
    cfg = SamplingConfig(temperature=1.0, top_k=20)
    kwargs = dict(max_decode_len=12, sampling=cfg, eos_id=V)
    results = {}

    def spec(seed):
        results[seed] = decoding.speculative_decode(
            *target, *draft, batch, gamma=3, rng=jax.random.PRNGKey(seed), **kwargs
        )

    assert helpers.compile_count(lambda: spec(5)) >= 1
    first = results[5]
    assert helpers.compile_count(lambda: spec(5)) == 0  # same shapes and config: no recompile
    np.testing.assert_array_equal(first.tokens, results[5].tokens)
    np.testing.assert_array_equal(first.stats.accepted, results[5].stats.accepted)
    assert helpers.compile_count(lambda: spec(6)) == 0  # a new rng is an argument, not a constant
    assert not np.array_equal(first.tokens, results[6].tokens)

    def plain():
        results["plain"] = decoding.autoregressive_decode(
            *target, batch, rng=jax.random.PRNGKey(5), **kwargs
        )

    assert helpers.compile_count(plain) >= 1
    first_plain = results["plain"]
    assert helpers.compile_count(plain) == 0
    np.testing.assert_array_equal(first_plain.tokens, results["plain"].tokens)


def test_ahead_of_time_compiled_loops_match_the_plain_calls(target, draft, batch):
    """JAX's own lower().compile() on the jitted loops reruns the same program on new inputs."""
    sampling = SamplingConfig(temperature=1.0)
    rng, other_rng = jax.random.PRNGKey(3), jax.random.PRNGKey(4)
    config = decoding.DecodeConfig(max_decode_len=9, stop_ids=V, sampling=sampling, gamma=2)
    (tm, tp), (dm, dp) = target, draft
    compiled, seconds = timing.compile_ahead(
        decoding.speculative_loop, tm, tp, dm, dp, batch, rng, config=config
    )
    assert seconds > 0.01  # an XLA compile, not a cache hit
    for key in (rng, other_rng):
        direct = decoding.speculative_decode(
            *target, *draft, batch, gamma=2, max_decode_len=9, sampling=sampling, eos_id=V, rng=key
        )
        out = compiled(tp, dp, batch, key)
        np.testing.assert_array_equal(out.tokens, direct.tokens)
        np.testing.assert_array_equal(out.stats.accepted, direct.stats.accepted)
    plain_config = decoding.DecodeConfig(max_decode_len=9, stop_ids=V, sampling=sampling)
    compiled, _ = timing.compile_ahead(
        decoding.autoregressive_loop, tm, tp, batch, rng, plain_config
    )
    direct = decoding.autoregressive_decode(
        *target, batch, max_decode_len=9, sampling=sampling, eos_id=V, rng=rng
    )
    np.testing.assert_array_equal(compiled(tp, batch, rng).tokens, direct.tokens)


def test_decode_config_is_validated_and_hashable():
    config = decoding.DecodeConfig(max_decode_len=np.int64(4), stop_ids=[2, 3], gamma=np.int32(2))
    assert config == decoding.DecodeConfig(4, (2, 3), SamplingConfig(), 2)
    assert hash(config) == hash(decoding.DecodeConfig(4, (2, 3), SamplingConfig(), 2))
    assert (config.stop_ids, config.block) == ((2, 3), 3)
    assert decoding.DecodeConfig(4, 1).block == 1 and decoding.DecodeConfig(4, 1).stop_ids == (1,)
    for bad, match in [
        (dict(max_decode_len=0, stop_ids=1), "max_decode_len"),
        (dict(max_decode_len=4, stop_ids=()), "eos_id"),
        (dict(max_decode_len=4, stop_ids=1, gamma=0), "gamma"),
        (dict(max_decode_len=4, stop_ids=1, gamma=True), "gamma"),
        (dict(max_decode_len=4, stop_ids=1, sampling={"temperature": 1.0}), "SamplingConfig"),
    ]:
        with pytest.raises(ValueError, match=match):
            decoding.DecodeConfig(**bad)


def test_several_stop_ids(target, draft, batch):
    """eos_id may be a sequence (Qwen completion ends with <|endoftext|>, chat with <|im_end|>)."""
    free = decoding.autoregressive_decode(*target, batch, max_decode_len=MAX_LEN, eos_id=V)
    stops = (int(free.tokens[0, 5]), int(free.tokens[2, 3]))
    plain = decoding.autoregressive_decode(*target, batch, max_decode_len=MAX_LEN, eos_id=stops)
    spec = decoding.speculative_decode(
        *target, *draft, batch, gamma=3, max_decode_len=MAX_LEN, eos_id=stops
    )
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    for unstopped, length in zip(np.asarray(free.tokens), np.asarray(plain.lengths), strict=True):
        hits = np.flatnonzero(np.isin(unstopped, stops))
        assert length == (hits[0] + 1 if hits.size else MAX_LEN)
    with pytest.raises(ValueError, match="eos_id"):
        decoding.autoregressive_decode(*target, batch, max_decode_len=4, eos_id=())


def test_lenient_acceptance_is_labelled_lossy_and_accepts_more(small_pair):
    (tgt, tgt_params), (drf, drf_params) = small_pair
    run = dict(
        gamma=3, max_decode_len=SEQ_LEN, sampling=SamplingConfig(temperature=1.0), eos_id=EOS,
        rng=jax.random.PRNGKey(5),
    )  # fmt: skip
    prompts = _repeated_prompt(2000)
    exact = decoding.speculative_decode(tgt, tgt_params, drf, drf_params, prompts, **run)
    same = decoding.speculative_decode(
        tgt, tgt_params, drf, drf_params, prompts, lenience=1.0, **run
    )
    lenient = decoding.speculative_decode(
        tgt, tgt_params, drf, drf_params, prompts, lenience=0.3, **run
    )
    assert exact.exact and same.exact and not lenient.exact and lenient.lenience == 0.3
    np.testing.assert_array_equal(same.tokens, exact.tokens)

    def accepted(out):
        return np.asarray(out.stats.accepted).sum() / np.asarray(out.stats.verified).sum()

    assert accepted(lenient) > accepted(exact) + 0.05
    plain = decoding.autoregressive_decode(
        tgt, tgt_params, prompts, max_decode_len=SEQ_LEN, eos_id=EOS
    )
    assert plain.exact
    with pytest.raises(ValueError, match="lenience"):
        decoding.DecodeConfig(4, 0, gamma=2, lenience=0.0)


def test_nan_draft_logits_are_reported_not_decoded(target, draft, batch):
    """A draft with a NaN weight would make q NaN and every round's output garbage: refused."""
    draft_model, draft_params = draft
    poisoned = jax.tree.map(lambda x: x, draft_params)
    poisoned["decoder_norm"]["scale"] = poisoned["decoder_norm"]["scale"].at[0].set(jnp.nan)
    with pytest.raises(decoding.NaNLogitsError, match="the draft produced NaN logits") as e:
        decoding.speculative_decode(
            *target, draft_model, poisoned, batch, gamma=2, max_decode_len=4, eos_id=V
        )
    assert e.value.role == "draft" and e.value.rows == list(range(9))
    assert isinstance(e.value, FloatingPointError)
