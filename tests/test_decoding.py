"""Speculative decoding is exact: greedy token identity, sampled distribution identity, stats."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.sampling import SamplingConfig
from tests import helpers

V = 64
MAX_LEN = 19  # not a multiple of gamma + 1: the length limit falls inside a block


@pytest.fixture(scope="module")
def target():
    return helpers.tiny_decoder(V, emb=64, layers=2, heads=4, kv_heads=2, seed=0)


@pytest.fixture(scope="module")
def draft():
    return helpers.tiny_decoder(V, emb=32, layers=1, heads=2, kv_heads=1, seed=1)


@pytest.fixture(scope="module")
def batch():
    return helpers.ragged_prompts(0, batch=9, width=7, vocab=V)


@pytest.fixture(scope="module")
def eos_and_reference(target, batch):
    """An EOS id that some rows emit mid-sequence, and the plain greedy decode with it."""
    model, params = target
    free = decoding.autoregressive_decode(model, params, batch, max_decode_len=MAX_LEN, eos_id=V)
    eos_id = int(free.tokens[0, 6])
    ref = decoding.autoregressive_decode(
        model, params, batch, max_decode_len=MAX_LEN, eos_id=eos_id
    )
    lengths = np.asarray(ref.lengths)
    assert lengths.min() < MAX_LEN and lengths.max() == MAX_LEN, "want rows ending both ways"
    return eos_id, ref


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
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

SV, SEQ_LEN, EOS, N = 6, 3, 5, 24_000
PROMPT = [1, 3, 2]


@pytest.fixture(scope="module")
def small_pair():
    tgt = helpers.tiny_decoder(SV, emb=16, layers=1, heads=2, kv_heads=1, seed=10)
    drf = helpers.tiny_decoder(SV, emb=16, layers=1, heads=2, kv_heads=2, seed=11)
    return tgt, drf


def _repeated_prompt(n):
    return {
        "prompt": jnp.tile(jnp.asarray([PROMPT], jnp.int32), (n, 1)),
        "prompt_lengths": jnp.full((n,), len(PROMPT), jnp.int32),
    }


@pytest.mark.parametrize(
    "cfg, gamma",
    [
        (SamplingConfig(temperature=1.0), 2),
        (SamplingConfig(temperature=1.0), 1),
        (SamplingConfig(temperature=0.8, top_k=3), 3),
        (SamplingConfig(temperature=1.2, top_p=0.7), 2),
    ],
)
def test_sampled_sequences_follow_target_distribution(small_pair, cfg, gamma):
    (tgt, tgt_params), (drf, drf_params) = small_pair
    exact = helpers.exact_sequence_probs(tgt, tgt_params, PROMPT, SEQ_LEN, SV, EOS, cfg)
    assert abs(sum(exact.values()) - 1.0) < 1e-6
    out = decoding.speculative_decode(
        tgt,
        tgt_params,
        drf,
        drf_params,
        _repeated_prompt(N),
        gamma=gamma,
        max_decode_len=SEQ_LEN,
        sampling=cfg,
        eos_id=EOS,
        rng=jax.random.PRNGKey(42),
    )
    samples = helpers.rows_as_sequences(out.tokens, out.lengths)
    assert helpers.chi_square_pvalue(samples, exact) > 1e-3
    alpha = float(np.mean(out.stats["alpha"]))
    assert 0.2 < alpha < 0.99, f"want a draft that is sometimes rejected, alpha={alpha}"

    # Rows are independent draws: adjacent rows collide at the rate sum_s p(s)^2.
    collide = np.mean([a == b for a, b in zip(samples[0::2], samples[1::2])])
    expected = sum(p * p for p in exact.values())
    assert abs(collide - expected) < 5 * np.sqrt(expected * (1 - expected) / (N // 2))

    # Power: the same test rejects the draft's own sequence distribution.
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


def test_plain_sampling_follows_exact_probabilities(small_pair):
    """The harness itself: plain decoding of the target passes the same test."""
    (tgt, tgt_params), _ = small_pair
    cfg = SamplingConfig(temperature=1.0)
    exact = helpers.exact_sequence_probs(tgt, tgt_params, PROMPT, SEQ_LEN, SV, EOS, cfg)
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
    kwargs = dict(gamma=3, max_decode_len=12, sampling=cfg, eos_id=V)
    first = decoding.speculative_decode(*target, *draft, batch, rng=jax.random.PRNGKey(5), **kwargs)
    compiled = decoding._speculative_jit._cache_size()
    again = decoding.speculative_decode(*target, *draft, batch, rng=jax.random.PRNGKey(5), **kwargs)
    assert decoding._speculative_jit._cache_size() == compiled
    np.testing.assert_array_equal(first.tokens, again.tokens)
    other = decoding.speculative_decode(*target, *draft, batch, rng=jax.random.PRNGKey(6), **kwargs)
    assert not np.array_equal(first.tokens, other.tokens)
    plain = decoding.autoregressive_decode(
        *target,
        batch,
        rng=jax.random.PRNGKey(5),
        **{k: v for k, v in kwargs.items() if k != "gamma"},
    )
    plain_compiled = decoding._autoregressive_jit._cache_size()
    plain_again = decoding.autoregressive_decode(
        *target,
        batch,
        rng=jax.random.PRNGKey(5),
        **{k: v for k, v in kwargs.items() if k != "gamma"},
    )
    assert decoding._autoregressive_jit._cache_size() == plain_compiled
    np.testing.assert_array_equal(plain.tokens, plain_again.tokens)


# --- bad input --------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors(target, draft, batch):
    with pytest.raises(ValueError, match="gamma"):
        decoding.speculative_decode(*target, *draft, batch, gamma=0, max_decode_len=4, eos_id=1)
    other_vocab = helpers.tiny_decoder(V + 1, emb=32, layers=1, heads=2, kv_heads=1, seed=2)
    with pytest.raises(ValueError, match="vocabularies differ in size"):
        decoding.speculative_decode(
            *target, *other_vocab, batch, gamma=2, max_decode_len=4, eos_id=1
        )
    with pytest.raises(ValueError, match="max_seq_len"):
        decoding.speculative_decode(*target, *draft, batch, gamma=2, max_decode_len=250, eos_id=1)
    long_prompt = helpers.ragged_prompts(1, batch=2, width=300, vocab=V)
    with pytest.raises(ValueError, match="longer than the model context"):
        decoding.autoregressive_decode(*target, long_prompt, max_decode_len=4, eos_id=1)
    with pytest.raises(ValueError, match="prompt_lengths"):
        bad = dict(batch, prompt_lengths=jnp.zeros_like(batch["prompt_lengths"]))
        decoding.autoregressive_decode(*target, bad, max_decode_len=4, eos_id=1)
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(temperature=1.0, top_p=0.0)


def test_nan_logits_are_reported(target, draft, batch):
    model, params = target
    broken = jax.tree_util.tree_map(lambda x: x, params)
    broken["decoder_norm"]["scale"] = jnp.full_like(params["decoder_norm"]["scale"], jnp.nan)
    with pytest.raises(FloatingPointError, match="NaN logits"):
        decoding.speculative_decode(
            model, broken, *draft, batch, gamma=2, max_decode_len=4, eos_id=1
        )


def test_compiled_entry_points_match_the_plain_calls(target, draft, batch):
    kwargs = dict(max_decode_len=9, sampling=SamplingConfig(temperature=1.0), eos_id=V)
    rng = jax.random.PRNGKey(3)
    run, seconds = decoding.compile_speculative(*target, *draft, batch, gamma=2, rng=rng, **kwargs)
    assert seconds > 0
    direct = decoding.speculative_decode(*target, *draft, batch, gamma=2, rng=rng, **kwargs)
    np.testing.assert_array_equal(run().tokens, direct.tokens)
    run, _ = decoding.compile_autoregressive(*target, batch, rng=rng, **kwargs)
    direct = decoding.autoregressive_decode(*target, batch, rng=rng, **kwargs)
    np.testing.assert_array_equal(run().tokens, direct.tokens)


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
