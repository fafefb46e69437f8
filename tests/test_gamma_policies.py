"""Adaptive gamma (decoding.GammaPolicy): a confidence stop and a per-row schedule stay exact with
every draft kind, and really draft fewer tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decoding import GammaPolicy
from speculative.drafts import ngram, prompt_lookup
from speculative.sampling import SamplingConfig
from tests import helpers

V, MAX_LEN = 64, 19
POLICIES = {
    "confidence": GammaPolicy("confidence", threshold=0.3),
    "schedule": GammaPolicy("schedule", initial=2),
}


@pytest.fixture(scope="module")
def target():
    return helpers.tiny_decoder(V, emb=64, layers=2, heads=4, kv_heads=2, seed=0)


@pytest.fixture(scope="module")
def batch():
    return helpers.ragged_prompts(0, batch=9, width=7, vocab=V)


@pytest.fixture(scope="module")
def reference(target, batch):
    eos_id, ref, free = helpers.greedy_reference_with_mid_eos(*target, batch, MAX_LEN, V)
    tables = ngram.fit(helpers.rows_as_sequences(free.tokens, free.lengths), V, top_k=4)
    return eos_id, ref, tables


def _draft(kind, tables):
    if kind == "model":
        # A sharpened copy of the target's own weights as the draft: confident and often right.
        return helpers.tiny_decoder(V, emb=32, layers=1, heads=2, kv_heads=1, seed=1)
    if kind == "bigram":
        return ngram.NgramDrafter(V), tables
    return prompt_lookup.PromptLookupDrafter(V), ()


@pytest.mark.parametrize("gamma", [1, 8])
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("kind", ["model", "bigram", "prompt_lookup"])
def test_greedy_identical_to_plain(target, batch, reference, kind, policy, gamma):
    eos_id, ref, tables = reference
    out = decoding.speculative_decode(
        *target, *_draft(kind, tables), batch, gamma=gamma, max_decode_len=MAX_LEN,
        eos_id=eos_id, gamma_policy=POLICIES[policy],
    )  # fmt: skip
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    s = out.stats
    np.testing.assert_array_equal(s.accepted, np.asarray(s.accepted_at).sum(1))
    assert np.all(np.asarray(s.drafted) <= gamma * np.asarray(s.target_calls))
    np.testing.assert_array_equal(s.draft_calls, s.drafted)


def test_policies_draft_fewer_tokens(target, batch, reference):
    eos_id, _, tables = reference
    run = dict(gamma=8, max_decode_len=MAX_LEN, eos_id=eos_id)
    drafted = {}
    for name, policy in [("fixed", GammaPolicy())] + list(POLICIES.items()):
        out = decoding.speculative_decode(
            *target, *_draft("model", tables), batch, gamma_policy=policy, **run
        )
        drafted[name] = (
            np.asarray(out.stats.drafted).sum() / np.asarray(out.stats.target_calls).sum()
        )
    assert drafted["fixed"] == 8
    assert drafted["confidence"] < 8 and drafted["schedule"] < 8, drafted


SV, SEQ_LEN, EOS, N = 6, 3, 5, 24_000
PROMPT = [1, 3, 2]


@pytest.mark.parametrize(
    "cfg, policy",
    [
        (SamplingConfig(temperature=1.0), GammaPolicy("confidence", threshold=0.5)),
        (SamplingConfig(temperature=0.8, top_k=3), GammaPolicy("confidence", threshold=0.6)),
        (SamplingConfig(temperature=1.0), GammaPolicy("schedule", initial=1)),
    ],
)
def test_sampled_sequences_follow_target_distribution(cfg, policy):
    tgt, tgt_params = helpers.tiny_decoder(SV, emb=16, layers=1, heads=2, kv_heads=1, seed=10)
    drf, drf_params = helpers.tiny_decoder(SV, emb=16, layers=1, heads=2, kv_heads=2, seed=13)
    exact = helpers.exact_sequence_probs(tgt, tgt_params, PROMPT, SEQ_LEN, SV, EOS, cfg)
    prompts = {
        "prompt": jnp.tile(jnp.asarray([PROMPT], jnp.int32), (N, 1)),
        "prompt_lengths": jnp.full((N,), len(PROMPT), jnp.int32),
    }
    out = decoding.speculative_decode(
        tgt, tgt_params, drf, drf_params, prompts, gamma=3, max_decode_len=SEQ_LEN, sampling=cfg,
        eos_id=EOS, rng=jax.random.PRNGKey(3), gamma_policy=policy,
    )  # fmt: skip
    samples = helpers.rows_as_sequences(out.tokens, out.lengths)
    assert helpers.chi_square_pvalue(samples, exact) > 1e-3
    drafted = np.asarray(out.stats.drafted).sum() / np.asarray(out.stats.target_calls).sum()
    assert drafted < 3, "the policy should shorten some blocks"


def test_bad_policies_are_refused():
    with pytest.raises(ValueError, match="gamma policy"):
        GammaPolicy("sometimes")
    with pytest.raises(ValueError, match="threshold"):
        GammaPolicy("confidence", threshold=1.5)
    with pytest.raises(ValueError, match="initial"):
        GammaPolicy("schedule", initial=0)
