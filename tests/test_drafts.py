"""Drafts other than a model (speculative/drafts/): exact under the rejection rule, like the model
draft. Greedy token identity with plain decoding and the sequence chi-square test at T = 1 / top-k."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decoding.drafter import DraftRequest
from speculative.decoding.sampling import SamplingConfig
from speculative.drafts import base, layer_skip, ngram, prompt_lookup
from tests import helpers

V, MAX_LEN = helpers.GREEDY_VOCAB, helpers.GREEDY_MAX_LEN  # target, batch: conftest.py


def _drafts(tables):
    return {
        "unigram": (ngram.NgramDrafter(V, order=1), tables),
        "bigram": (ngram.NgramDrafter(V), tables),
        "prompt_lookup": (prompt_lookup.PromptLookupDrafter(V), ()),
    }


@pytest.mark.parametrize("gamma", [1, 8])
@pytest.mark.parametrize("kind", ["unigram", "bigram", "prompt_lookup"])
def test_greedy_identical_to_plain(target, batch, greedy_reference, kind, gamma):
    eos_id, ref, tables = greedy_reference
    drafter, params = _drafts(tables)[kind]
    out = decoding.speculative_decode(
        *target, drafter, params, batch, gamma=gamma, max_decode_len=MAX_LEN, eos_id=eos_id
    )
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    accepted = np.asarray(out.stats.accepted)
    if kind == "bigram":
        assert accepted.sum() > 0, (
            "a bigram fitted on the target's outputs should be right sometimes"
        )


SV, SEQ_LEN, EOS, N, PROMPT = helpers.SV, helpers.SEQ_LEN, helpers.EOS, helpers.N, helpers.PROMPT


@pytest.mark.parametrize(
    "cfg, gamma, kind",
    [
        # ~16 s; the bigram tables sampled again below at top-k
        pytest.param(SamplingConfig(temperature=1.0), 2, "bigram", marks=pytest.mark.slow),
        (SamplingConfig(temperature=0.8, top_k=3), 3, "bigram"),
        # unigram tables are the bigram path with one context: the bigram case covers it
        pytest.param(SamplingConfig(temperature=1.0), 1, "unigram", marks=pytest.mark.slow),
        (SamplingConfig(temperature=1.0), 2, "prompt_lookup"),
        (SamplingConfig(temperature=1.2, top_p=0.7), 3, "prompt_lookup"),
    ],
)
def test_sampled_sequences_follow_target_distribution(
    small_pair, small_target_probs, cfg, gamma, kind
):
    (tgt, tgt_params), _ = small_pair
    exact = small_target_probs(cfg)
    tables = ngram.fit([[1, 3, 2, 4, 4, 0, 2, 3, 1, 1, 4, 2]], SV, top_k=2, add_k=0.5)
    prompts = helpers.repeated_prompt(N)
    drafter, params = {
        "unigram": (ngram.NgramDrafter(SV, 1), tables),
        "bigram": (ngram.NgramDrafter(SV), tables),
        "prompt_lookup": (prompt_lookup.PromptLookupDrafter(SV, max_ngram=2), ()),
    }[kind]
    out = decoding.speculative_decode(
        tgt, tgt_params, drafter, params, prompts, gamma=gamma,
        max_decode_len=SEQ_LEN, sampling=cfg, eos_id=EOS, rng=jax.random.PRNGKey(7),
    )  # fmt: skip
    samples = helpers.rows_as_sequences(out.tokens, out.lengths)
    assert helpers.chi_square_pvalue(samples, exact) > 1e-3
    alpha = float(np.mean(out.stats.alpha))
    assert 0.1 < alpha < 0.99, f"want a draft that is sometimes rejected, alpha={alpha}"


def test_bigram_probabilities_follow_the_counts():
    tables = ngram.fit([[1, 2, 1, 2, 1, 3]], 5, top_k=1, add_k=1.0, backoff=2.0)
    uni = (np.array([0, 3, 2, 1, 0]) + 1.0) / (6 + 5)
    np.testing.assert_allclose(tables.unigram, uni, rtol=1e-6)
    q = np.asarray(ngram.bigram_probs(tables, jnp.array([1, 4])))
    # After 1: successors 2 (twice) and 3 (once); top_k=1 keeps 2 with count 2.
    expected_1 = 2.0 * uni
    expected_1[2] += 2
    np.testing.assert_allclose(q[0], expected_1 / (2 + 2.0), rtol=1e-6)
    np.testing.assert_allclose(q[1], uni, rtol=1e-6)  # never seen first: the unigram
    np.testing.assert_allclose(q.sum(1), 1.0, rtol=1e-6)


def test_tables_round_trip_and_bad_files_are_refused(tmp_path):
    tables = ngram.fit([[0, 1, 2, 1, 0]], 4, top_k=2)
    ngram.save(tables, tmp_path / "t.npz")
    again = ngram.load(tmp_path / "t.npz")
    helpers.assert_same_tree(again, tables)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(tables)):
        np.testing.assert_array_equal(a, b)
    np.savez(tmp_path / "bad.npz", unigram=np.ones(3))
    with pytest.raises(ValueError, match="bad.npz"):
        ngram.load(tmp_path / "bad.npz")
    with pytest.raises(ValueError, match="token ids"):
        ngram.fit([[0, 9]], 4)


def test_vocabulary_mismatch_is_refused(target, batch):
    tables = ngram.fit([[0, 1]], V + 1)
    with pytest.raises(ValueError, match="vocabularies differ"):
        decoding.speculative_decode(
            *target, ngram.NgramDrafter(V + 1), tables, batch, gamma=2, max_decode_len=4, eos_id=0
        )


def test_history_joins_prompt_and_generated_tokens():
    ctx = base.DraftContext(
        pos=jnp.array([3, 1]),
        last=jnp.array([7, 4]),
        prev=jnp.array([6, 3]),
        tokens=jnp.array([[6, 7, 9], [4, 9, 9]]),
        lengths=jnp.array([2, 1]),
        prompt=jnp.array([[1, 2, 0], [3, 5, 8]]),
        prompt_lengths=jnp.array([2, 3]),
        done=jnp.array([False, False]),
        budget=jnp.array([4, 4]),
    )
    ids, length = ctx.history()
    np.testing.assert_array_equal(length, [4, 4])
    np.testing.assert_array_equal(ids, [[1, 2, 6, 7, 0, 0], [3, 5, 8, 4, 0, 0]])


def test_latest_match_finds_the_latest_earlier_occurrence():
    ids = jnp.array([[5, 1, 2, 7, 1, 2, 9, 1, 2, 0], [3, 3, 3, 3, 0, 0, 0, 0, 0, 0]])
    length = jnp.array([9, 4])
    # Row 0 ends "1 2": earlier at 4 and 1 (4 wins); row 1 ends "3 3": at 1 (2 would end at len).
    np.testing.assert_array_equal(prompt_lookup.latest_match(ids, length, 2), [4, 1])
    np.testing.assert_array_equal(prompt_lookup.latest_match(ids, length, 3), [-1, 0])
    np.testing.assert_array_equal(prompt_lookup.latest_match(ids, jnp.array([1, 2]), 2), [-1, -1])


@functools.partial(jax.jit, static_argnums=(0, 2))
def _propose(drafter, ctx, gamma):
    """One round's proposals, jitted as the decode loop runs them (not op by op eagerly)."""
    request = DraftRequest(ctx, jax.random.PRNGKey(0), SamplingConfig(), gamma)
    tokens, logits, _ = drafter.propose((), (), request)
    return tokens, logits


def _lookup(prompt, gamma, **kw):
    ctx = base.DraftContext(
        pos=jnp.array([len(prompt) - 1]),
        last=jnp.array([prompt[-1]]),
        prev=jnp.array([prompt[-2]]),
        tokens=jnp.zeros((1, 4), jnp.int32),
        lengths=jnp.array([0]),
        prompt=jnp.array([prompt]),
        prompt_lengths=jnp.array([len(prompt)]),
        done=jnp.array([False]),
        budget=jnp.array([gamma]),
    )
    tokens, logits = _propose(prompt_lookup.PromptLookupDrafter(16, **kw), ctx, gamma)
    np.testing.assert_array_equal(np.argmax(np.asarray(logits), -1), tokens)
    assert np.all(np.isneginf(np.asarray(logits)).sum(-1) == 15)  # one-hot q
    return np.asarray(tokens[0]).tolist()


def test_prompt_lookup_reads_on_repeats_periodically_and_falls_back():
    # "4 5 6" appeared before, followed by 8 9: read on; past the present, repeat with period 5.
    assert _lookup([4, 5, 6, 8, 9, 4, 5, 6], 7) == [8, 9, 4, 5, 6, 8, 9]
    # The longest n wins: "2 3" at 0 (then 7) beats the later lone "3" at 4 (then 1).
    assert _lookup([2, 3, 7, 9, 3, 1, 2, 3], 2) == [7, 9]
    assert _lookup([2, 3, 7, 9, 3, 1, 2, 3], 2, max_ngram=1) == [1, 2]
    # Nothing matches: the last token repeated.
    assert _lookup([1, 2, 3, 4], 3) == [4, 4, 4]


@pytest.mark.parametrize("gamma", [1, 6])
def test_layer_skip_self_draft_is_exact_in_greedy_decoding(batch, gamma):
    model, params = helpers.tiny_decoder(V, emb=32, layers=3, heads=4, kv_heads=2, seed=4)
    free = decoding.autoregressive_decode(model, params, batch, max_decode_len=MAX_LEN, eos_id=V)
    eos_id = int(free.tokens[1, 5])
    ref = decoding.autoregressive_decode(
        model, params, batch, max_decode_len=MAX_LEN, eos_id=eos_id
    )
    drafter = layer_skip.LayerSkipDrafter(target=model, num_layers=2)
    out = decoding.speculative_decode(
        model, params, drafter, params, batch, gamma=gamma, max_decode_len=MAX_LEN, eos_id=eos_id
    )
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    assert 0 < float(np.mean(out.stats.alpha)) < 1


def test_layer_skip_self_draft_follows_target_distribution():
    cfg = SamplingConfig(temperature=1.0)
    tgt, tgt_params = helpers.tiny_decoder(SV, emb=16, layers=2, heads=2, kv_heads=1, seed=11)
    exact = helpers.exact_sequence_probs(tgt, tgt_params, PROMPT, SEQ_LEN, SV, EOS, cfg)
    prompts = helpers.repeated_prompt(N)
    drafter = layer_skip.LayerSkipDrafter(target=tgt, num_layers=1)
    out = decoding.speculative_decode(
        tgt, tgt_params, drafter, tgt_params, prompts, gamma=2, max_decode_len=SEQ_LEN,
        sampling=cfg, eos_id=EOS, rng=jax.random.PRNGKey(9),
    )  # fmt: skip
    samples = helpers.rows_as_sequences(out.tokens, out.lengths)
    assert helpers.chi_square_pvalue(samples, exact) > 1e-3
    assert 0.2 < float(np.mean(out.stats.alpha)) < 0.99


def test_layer_skip_validates_its_depth_and_target(target):
    model, _ = target
    with pytest.raises(ValueError, match="num_layers must be in 1..1"):
        layer_skip.LayerSkipDrafter(target=model, num_layers=2)
    drafter = layer_skip.LayerSkipDrafter(target=model, num_layers=1)
    assert drafter.model.config.num_layers == 1 and hash(drafter) == hash(
        layer_skip.LayerSkipDrafter(target=model, num_layers=1)
    )
    other, _ = helpers.tiny_decoder(V, emb=32, layers=2, heads=4, kv_heads=2, seed=1)
    with pytest.raises(ValueError, match="target it was built from"):
        drafter.check_target(other)
