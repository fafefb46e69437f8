"""A draft whose output head scores a shortlist of the vocabulary (models.decoder.restrict_head,
drafts/shortlist.py): the head's logits, the frequency ranking, and exactness of a shortlist draft
(greedy identity with plain decoding, ragged rows, EOS mid-block, gamma 1 and 8; chi-square at
T = 1, top-k and top-p)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding, vocab
from speculative.decoding.sampling import SamplingConfig
from speculative.drafts import shortlist
from speculative.models import decoder
from tests import helpers

V, MAX_LEN = helpers.GREEDY_VOCAB, helpers.GREEDY_MAX_LEN  # target, batch: conftest.py


def _logits(model, params, tokens):
    return np.asarray(helpers.prefill_logits(model, params, tokens))


@pytest.mark.parametrize("tied", [False, True])
def test_shortlist_head_keeps_the_listed_logits_and_rules_out_the_rest(tied):
    config = decoder.DecoderConfig(
        vocab_size=V, emb_dim=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
        mlp_dim=64, tie_word_embeddings=tied,
    )  # fmt: skip
    model = decoder.DecoderLM(config)
    params = helpers.init_params(model, 0)
    short_config, short_params = decoder.restrict_head(config, params, [40, 3, 7, 3, 63, 0])
    assert short_config.head_tokens == 5 and not short_config.tie_word_embeddings
    ids = [0, 3, 7, 40, 63]
    np.testing.assert_array_equal(short_params["logits_dense"]["token_ids"], ids)
    assert short_params["layers_0"] is params["layers_0"], "the body is shared, not copied"
    tokens = jnp.asarray([[5, 9, 2, 11], [1, 1, 60, 3]], jnp.int32)
    full = _logits(model, params, tokens)
    short = _logits(decoder.DecoderLM(short_config), short_params, tokens)
    assert short.shape == full.shape == (2, 4, V)
    np.testing.assert_allclose(short[..., ids], full[..., ids], rtol=1e-5, atol=1e-5)
    rest = np.setdiff1d(np.arange(V), ids)
    assert np.all(np.isneginf(short[..., rest]))


def test_restrict_head_refuses_bad_ids():
    model, params = helpers.tiny_decoder(V, emb=16, layers=1, heads=2, kv_heads=1, seed=0)
    for bad in ([], [-1, 2], [V]):
        with pytest.raises(ValueError, match="shortlist ids"):
            decoder.restrict_head(model.config, params, bad)
    config, short = decoder.restrict_head(model.config, params, [1, 2])
    with pytest.raises(ValueError, match="already a shortlist"):
        decoder.restrict_head(config, short, [1])
    with pytest.raises(ValueError, match="head_tokens"):
        decoder.DecoderConfig(
            vocab_size=8, emb_dim=8, num_layers=1, num_heads=1, num_kv_heads=1, head_dim=8,
            mlp_dim=8, head_tokens=9,
        )  # fmt: skip


def test_most_frequent_ranks_by_count_then_id_and_keeps_forced_ids():
    sequences = [[5, 5, 5, 2, 2, 7], [2, 9, 9, 9, 9]]
    # counts: 9 -> 4, then 2 and 5 -> 3 (a tie goes to the lower id), 7 -> 1, unseen ids last
    np.testing.assert_array_equal(shortlist.most_frequent(sequences, 2, 10), [2, 9])
    np.testing.assert_array_equal(shortlist.most_frequent(sequences, 3, 10), [2, 5, 9])
    np.testing.assert_array_equal(shortlist.most_frequent(sequences, 5, 10), [0, 2, 5, 7, 9])
    np.testing.assert_array_equal(
        shortlist.most_frequent(sequences, 3, 10, always=[8, 8]), [2, 8, 9]
    )
    with pytest.raises(ValueError, match="shortlist size"):
        shortlist.most_frequent(sequences, 11, 10)
    with pytest.raises(ValueError, match="outside"):
        shortlist.most_frequent([[10]], 2, 10)
    with pytest.raises(ValueError, match="forced ids"):
        shortlist.most_frequent(sequences, 1, 10, always=[1, 2])


def test_python_sources_fit_a_shortlist_on_the_standard_library():
    texts = shortlist.python_sources(max_bytes=200_000)
    assert texts and sum(map(len, texts)) >= 200_000
    assert texts == shortlist.python_sources(max_bytes=200_000), "deterministic"
    byte_vocab = vocab.ByteVocabulary()
    ids = shortlist.fit_python_sources(byte_vocab, 64, always=[byte_vocab.eos_id], max_bytes=50_000)
    assert ids.shape == (64,) and byte_vocab.eos_id in ids
    for char in " e(:\n":  # the bytes of Python source a byte vocabulary must keep
        assert byte_vocab.encode(char)[0] in ids


@pytest.fixture(scope="module")
def shortlist_draft():
    return helpers.tiny_decoder(V, emb=32, layers=1, heads=2, kv_heads=1, seed=3)


@pytest.mark.parametrize("gamma", [1, 8])
def test_greedy_shortlist_draft_is_identical_to_plain(
    target, shortlist_draft, batch, greedy_free, greedy_reference, gamma
):
    (target, target_params), (draft, draft_params) = target, shortlist_draft
    eos_id, ref, _ = greedy_reference
    # The target's own head, cut to the ids its free-running outputs use but the EOS: the draft
    # then agrees often, yet can never propose the EOS some rows stop at.
    used = np.unique(np.asarray(greedy_free.tokens))
    ids = [int(t) for t in used if t != eos_id]
    config, params = decoder.restrict_head(target.config, target_params, ids)
    out = decoding.speculative_decode(
        target, target_params, decoder.DecoderLM(config), params, batch, gamma=gamma,
        max_decode_len=MAX_LEN, eos_id=eos_id,
    )  # fmt: skip
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    assert 0 < float(np.mean(out.stats.alpha)) < 1
    # the unrelated draft, cut to half the vocabulary, is exact too
    config, params = decoder.restrict_head(draft.config, draft_params, range(0, V, 2))
    out = decoding.speculative_decode(
        target, target_params, decoder.DecoderLM(config), params, batch, gamma=gamma,
        max_decode_len=MAX_LEN, eos_id=eos_id,
    )  # fmt: skip
    np.testing.assert_array_equal(out.tokens, ref.tokens)


SV, SEQ_LEN, EOS, N = helpers.SV, helpers.SEQ_LEN, helpers.EOS, helpers.N


@pytest.mark.parametrize(
    "cfg, gamma",
    [
        pytest.param(SamplingConfig(temperature=1.0), 2, marks=pytest.mark.slow),  # top-k's path
        (SamplingConfig(temperature=0.8, top_k=3), 3),
        pytest.param(SamplingConfig(temperature=1.2, top_p=0.7), 2, marks=pytest.mark.slow),
    ],
)
def test_sampled_shortlist_draft_follows_target_distribution(
    small_pair, small_target_probs, cfg, gamma
):
    (tgt, tgt_params), _ = small_pair
    draft, draft_params = helpers.tiny_decoder(SV, emb=16, layers=1, heads=2, kv_heads=1, seed=2)
    # ids 1 and EOS are off the shortlist: only the residual can emit them
    config, params = decoder.restrict_head(draft.config, draft_params, [0, 2, 3, 4])
    exact = small_target_probs(cfg)
    prompts = helpers.repeated_prompt(N)
    out = decoding.speculative_decode(
        tgt, tgt_params, decoder.DecoderLM(config), params, prompts, gamma=gamma,
        max_decode_len=SEQ_LEN, sampling=cfg, eos_id=EOS, rng=jax.random.PRNGKey(7),
    )  # fmt: skip
    samples = helpers.rows_as_sequences(out.tokens, out.lengths)
    assert helpers.chi_square_pvalue(samples, exact) > 1e-3
    assert 0.1 < float(np.mean(out.stats.alpha)) < 0.99
    assert any(EOS in s or 1 in s for s in samples), "off-list ids still come out"
