"""Staged drafting (speculative/drafts/staged.py): prompt lookup proposes the draft model's tokens
and the draft model verifies them in one call. Its proposals must follow the draft model's own
autoregressive distribution (chi-square against exact probabilities, and a deliberately broken
inner rule that the same check rejects), and decoding with it must stay exact: greedy identity
with plain decoding (ragged batch, EOS inside blocks, gamma 1 and large) and the target's
sequence distribution when sampling."""

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decoding.config import DecodeConfig
from speculative.decoding.drafter import DraftContext, DraftRequest
from speculative.decoding.sampling import SamplingConfig
from speculative.drafts import staged
from speculative.errors import JobError
from speculative.measure import metrics
from tests import helpers

V, MAX_LEN = helpers.GREEDY_VOCAB, helpers.GREEDY_MAX_LEN  # target, draft, batch: conftest.py
SV, N = helpers.SV, helpers.N
REPEATING = [1, 3, 2, 1, 3]  # the lookup finds "1 3" and proposes what followed it


# gamma 1 and 9 (a lookahead that does not divide it) by default; gamma 4 is a slow-marked repeat
@pytest.mark.parametrize(
    "gamma, lookahead", [(1, 1), pytest.param(4, 3, marks=pytest.mark.slow), (9, 2)]
)
def test_greedy_identical_to_plain(target, draft, batch, greedy_reference, gamma, lookahead):
    eos_id, ref, _ = greedy_reference
    drafter = staged.StagedDrafter(draft[0], lookahead=lookahead)
    out = decoding.speculative_decode(
        *target, drafter, draft[1], batch, gamma=gamma, max_decode_len=MAX_LEN, eos_id=eos_id
    )
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)


def test_draft_calls_are_the_calls_made_and_the_lookup_is_counted(
    target, draft, batch, greedy_reference
):
    """A staged draft reports its model calls, not gamma a round: each call adds its kept lookup
    tokens and one drawn token, so per round calls + kept is gamma, or gamma + 1 when the last
    call's drawn token fell past gamma; every call scores `lookahead` lookup tokens. The greedy
    decode of the shared batch repeats itself enough that the lookup saves calls."""
    gamma, lookahead = 9, 2
    eos_id = greedy_reference[0]
    drafter = staged.StagedDrafter(draft[0], lookahead=lookahead)
    out = decoding.speculative_decode(
        *target, drafter, draft[1], batch, gamma=gamma, max_decode_len=MAX_LEN, eos_id=eos_id
    )
    st = out.stats
    rounds, calls = np.asarray(st.target_calls), np.asarray(st.draft_calls)
    kept, scored = np.asarray(st.lookup_accepted), np.asarray(st.lookup_proposed)
    extra = calls + kept - gamma * rounds  # rounds whose last drawn token was dropped
    assert np.all((0 <= extra) & (extra <= rounds)), (calls, kept, rounds)
    np.testing.assert_array_equal(scored, lookahead * calls)
    assert 0 < calls.sum() < gamma * rounds.sum() and kept.sum() > 0
    summary = metrics.summarize(st, out.lengths)
    assert summary["draft_calls"] == calls.sum()
    assert summary["lookup_acceptance"] == kept.sum() / scored.sum()
    # The draft model's own (unstaged) rounds: gamma calls a round, and no lookup counts.
    plain = decoding.speculative_decode(
        *target, *draft, batch, gamma=gamma, max_decode_len=MAX_LEN, eos_id=eos_id
    )
    np.testing.assert_array_equal(plain.stats.draft_calls, gamma * plain.stats.target_calls)
    assert plain.stats.lookup_proposed is None and "lookup_acceptance" not in metrics.summarize(
        plain.stats, plain.lengths
    )


def _proposals(drafter, params, cfg: SamplingConfig, gamma: int, seed: int = 3):
    """gamma proposals for each of N copies of REPEATING, from one `propose` call: [N, gamma]."""
    batch = helpers.repeated_prompt(N, REPEATING)
    config = DecodeConfig(8, (SV,), cfg, gamma)
    last = batch["prompt"][:, -1]
    context = DraftContext(
        pos=batch["prompt_lengths"] - 1,
        last=last,
        prev=batch["prompt"][:, -2],
        tokens=jnp.zeros((N, 8 + gamma + 1), jnp.int32),
        lengths=jnp.zeros(N, jnp.int32),
        prompt=batch["prompt"],
        prompt_lengths=batch["prompt_lengths"],
        done=jnp.zeros(N, bool),
        budget=jnp.full(N, gamma, jnp.int32),
    )

    @jax.jit
    def run(params, rng):
        state = drafter.init(params, batch, config)
        tokens, _, _ = drafter.propose(params, state, DraftRequest(context, rng, cfg, gamma))
        return tokens

    return np.asarray(run(params, jax.random.PRNGKey(seed)))


@pytest.mark.parametrize(
    "cfg, lookahead",
    [
        # ~24 s; the top-p case below checks the same proposals, and catches the broken rule
        pytest.param(SamplingConfig(temperature=1.0), 2, marks=pytest.mark.slow),
        (SamplingConfig(temperature=0.9, top_p=0.8), 1),
    ],
)
def test_proposals_follow_the_draft_models_own_distribution(small_pair, cfg, lookahead):
    _, (drf, drf_params) = small_pair
    tokens = _proposals(staged.StagedDrafter(drf, lookahead=lookahead), drf_params, cfg, gamma=3)
    exact = helpers.exact_sequence_probs(drf, drf_params, REPEATING, 3, SV, eos_id=SV, cfg=cfg)
    samples = [tuple(int(t) for t in row) for row in tokens]
    assert helpers.chi_square_pvalue(samples, exact) > 1e-3


def test_a_broken_inner_rule_is_caught(small_pair, monkeypatch):
    """Accepting every lookup guess (no rejection) makes the proposals follow the lookup, not the
    draft model: the check above must fail on it."""
    _, (drf, drf_params) = small_pair
    cfg = SamplingConfig(temperature=1.0)

    def accept_all(rng, target_logits, draft_logits, draft_tokens, sampling):
        _, extra = decoding_verify(rng, target_logits, draft_logits, draft_tokens, sampling)
        return jnp.full(extra.shape, draft_tokens.shape[1], jnp.int32), extra

    decoding_verify = staged.verify
    monkeypatch.setattr(staged, "verify", accept_all)
    tokens = _proposals(staged.StagedDrafter(drf, lookahead=2), drf_params, cfg, gamma=3)
    exact = helpers.exact_sequence_probs(drf, drf_params, REPEATING, 3, SV, eos_id=SV, cfg=cfg)
    samples = [tuple(int(t) for t in row) for row in tokens]
    assert helpers.chi_square_pvalue(samples, exact) < 1e-6


@pytest.mark.parametrize(
    "cfg, gamma",
    [
        pytest.param(SamplingConfig(temperature=1.0), 2, marks=pytest.mark.slow),  # top-p covers it
        (SamplingConfig(1.2, top_p=0.7), 4),
    ],
)
def test_sampled_sequences_follow_target_distribution(small_pair, small_target_probs, cfg, gamma):
    (tgt, tgt_params), (drf, drf_params) = small_pair
    drafter = staged.StagedDrafter(drf, lookahead=2, max_ngram=2)
    samples, out = helpers.speculative_samples(
        ((tgt, tgt_params), (drafter, drf_params)), helpers.repeated_prompt(N),
        gamma=gamma, max_decode_len=helpers.SEQ_LEN, eos_id=helpers.EOS, cfg=cfg, seed=11,
    )  # fmt: skip
    assert helpers.chi_square_pvalue(samples, small_target_probs(cfg)) > 1e-3
    alpha = float(np.mean(out.stats.alpha))
    assert 0.1 < alpha < 0.99, f"want a draft that is sometimes rejected, alpha={alpha}"


def test_lookahead_and_ngrams_are_checked(draft):
    with pytest.raises(ValueError, match="lookahead >= 1"):
        staged.StagedDrafter(draft[0], lookahead=0)
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        staged.StagedDrafter(draft[0], max_ngram=1, min_ngram=2)


def test_infer_job_with_a_staged_draft_writes_the_same_greedy_outputs(tmp_path):
    """ModelSpec.staged_lookahead through gin: the job stages its draft and, greedy, writes the
    same outputs as with the draft unstaged (both equal plain greedy decoding)."""
    flag = "--gin.draft/speculative.ModelSpec.staged_lookahead=2"
    summary = helpers.infer_matches_plain_draft(tmp_path, "staged", flag)
    assert "staged by prompt lookup (2 a call)" in json.dumps(summary)
    # The lookup is counted (rows, pooled into the summary) and its calls are the calls made.
    rows = [json.loads(line) for line in (tmp_path / "staged" / "predictions.jsonl").open()]
    assert all(r["lookup_proposed"] == 2 * r["draft_calls"] for r in rows)
    found = json.dumps(summary)
    assert '"lookup_acceptance"' in found and '"lookup_accepted"' in found


def test_a_bad_lookahead_is_one_line(tmp_path):
    with pytest.raises(JobError, match="staged_lookahead must be an int >= 0"):
        helpers.tiny_infer(tmp_path, "bad", "--gin.draft/speculative.ModelSpec.staged_lookahead=-1")


def test_the_benchmark_times_a_staged_drafters_model_prefill_apart(draft):
    """Decode-only speedups leave out the draft model's prefill: a staged drafter's is its model's
    (before, it had none timed, so its prefill counted as decoding)."""
    from speculative.drafts import prompt_lookup
    from speculative.jobs.benchmark import harness
    from speculative.loading import specs as ml

    model, params = draft
    wrapped = ml.Loaded(staged.StagedDrafter(model, 2), params, "staged")
    assert harness.prefilled_model(wrapped) == (model, params)
    assert harness.prefilled_model(ml.Loaded(model, params, "model")) == (model, params)
    lookup = ml.Loaded(prompt_lookup.PromptLookupDrafter(model.vocab_size), {}, "lookup")
    assert harness.prefilled_model(lookup) is None


@pytest.mark.parametrize(
    "role, field, value, message",
    [
        ("draft", "staged_lookahead", -1, "draft: staged_lookahead must be an int >= 0, got -1"),
        ("draft", "staged_lookahead", 1.5, "draft: staged_lookahead must be an int >= 0, got 1.5"),
        ("draft", "shortlist", True, "draft: shortlist must be an int >= 0, got True"),
        ("target", "staged_lookahead", 3, "target: staged_lookahead is a draft's option"),
        ("target", "shortlist", 64, "target: shortlist is a draft's option"),
    ],
)
def test_draft_forms_are_checked_before_any_weight_loads(role, field, value, message):
    """A staged lookahead or shortlist that is no int >= 0, or either on a target (where it was
    silently ignored), is refused by `load_pair` before anything is read (issue 57)."""
    import speculative
    from speculative.loading import specs as ml
    from speculative.models import decoder

    config = decoder.DecoderConfig(
        vocab_size=264, emb_dim=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
        mlp_dim=64, max_seq_len=256,
    )  # fmt: skip
    good = ml.ModelSpec("random", model=decoder.DecoderLM(config))
    bad = dataclasses.replace(good, **{field: value})
    target, draft = (bad, good) if role == "target" else (good, bad)
    loads = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ml, "load_model", lambda *a, **k: loads.append(a))
        with pytest.raises(JobError, match=re.escape(message)):
            speculative.load_pair(target, draft, vocabulary=speculative.VocabSpec("byte"))
    assert loads == []
