"""Adaptive gamma (decoding.GammaPolicy): a confidence stop and a per-row schedule stay exact with
every draft kind, and really draft fewer tokens."""

import itertools

import jax
import numpy as np
import pytest

from speculative import decoding
from speculative.decoding import GammaPolicy
from speculative.decoding.sampling import SamplingConfig
from speculative.drafts import ngram, prompt_lookup
from tests import helpers

V, MAX_LEN = helpers.GREEDY_VOCAB, helpers.GREEDY_MAX_LEN  # target, draft, batch: conftest.py
POLICIES = {
    "confidence": GammaPolicy("confidence", threshold=0.3),
    "schedule": GammaPolicy("schedule", initial=2),
}


def _draft(kind, tables, draft):
    if kind == "model":
        return draft  # an unrelated smaller model
    if kind == "bigram":
        return ngram.NgramDrafter(V), tables
    return prompt_lookup.PromptLookupDrafter(V), ()


# Every draft kind at gamma 1 and 8, each kind with both policies and each policy at both gammas
# by default (a pairwise cover); the other six (kind, policy, gamma) cases are slow-marked repeats.
_DEFAULT = {
    ("model", "confidence", 1), ("model", "schedule", 8), ("bigram", "schedule", 1),
    ("bigram", "confidence", 8), ("prompt_lookup", "confidence", 1),
    ("prompt_lookup", "schedule", 8),
}  # fmt: skip
_GREEDY_CASES = [
    pytest.param(kind, policy, gamma, marks=() if case in _DEFAULT else pytest.mark.slow)
    for case in itertools.product(["model", "bigram", "prompt_lookup"], sorted(POLICIES), [1, 8])
    for kind, policy, gamma in [case]
]


@pytest.mark.parametrize("kind, policy, gamma", _GREEDY_CASES)
def test_greedy_identical_to_plain(target, draft, batch, greedy_reference, kind, policy, gamma):
    eos_id, ref, tables = greedy_reference
    out = decoding.speculative_decode(
        *target, *_draft(kind, tables, draft), batch, gamma=gamma, max_decode_len=MAX_LEN,
        eos_id=eos_id, gamma_policy=POLICIES[policy],
    )  # fmt: skip
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    s = out.stats
    np.testing.assert_array_equal(s.accepted, np.asarray(s.accepted_at).sum(1))
    assert np.all(np.asarray(s.drafted) <= gamma * np.asarray(s.target_calls))
    np.testing.assert_array_equal(s.draft_calls, s.drafted)


def test_policies_draft_fewer_tokens(target, draft, batch, greedy_reference):
    eos_id, _, tables = greedy_reference
    run = dict(gamma=8, max_decode_len=MAX_LEN, eos_id=eos_id)
    drafted = {}
    for name, policy in [("fixed", GammaPolicy())] + list(POLICIES.items()):
        out = decoding.speculative_decode(*target, *draft, batch, gamma_policy=policy, **run)
        drafted[name] = (
            np.asarray(out.stats.drafted).sum() / np.asarray(out.stats.target_calls).sum()
        )
    assert drafted["fixed"] == 8
    assert drafted["confidence"] < 8 and drafted["schedule"] < 8, drafted


SEQ_LEN, EOS, N = helpers.SEQ_LEN, helpers.EOS, helpers.N


@pytest.mark.parametrize(
    "cfg, policy",
    [
        pytest.param(  # the confidence policy at top-k below covers it
            SamplingConfig(temperature=1.0),
            GammaPolicy("confidence", threshold=0.5),
            marks=pytest.mark.slow,
        ),
        (SamplingConfig(temperature=0.8, top_k=3), GammaPolicy("confidence", threshold=0.6)),
        (SamplingConfig(temperature=1.0), GammaPolicy("schedule", initial=1)),
    ],
)
def test_sampled_sequences_follow_target_distribution(small_pair, small_target_probs, cfg, policy):
    (tgt, tgt_params), (drf, drf_params) = small_pair
    exact = small_target_probs(cfg)
    prompts = helpers.repeated_prompt(N)
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
