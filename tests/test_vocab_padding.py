"""Model tables padded past the vocabulary (`model_loading.fit_vocabulary`, `PaddingMasked`).

The padding ids are masked out of the draft's and the target's distributions alike, inside the
jitted loop; speculative decoding must stay exact over the ids that remain.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from speculative import decoding, vocab
from speculative.decoding.sampling import SamplingConfig
from speculative.errors import JobError
from speculative.loading import specs as ml
from tests import helpers

USED, EOS, SEQ_LEN, N = 6, 5, 3, 12_000
PROMPT = [1, 3, 2]


@pytest.fixture(scope="module")
def masked_pair():
    """A target padded to 8 ids and a draft padded to 10, both cut to 8 and masked from 6 on."""
    tgt, tgt_params = helpers.tiny_decoder(8, emb=16, layers=1, heads=2, kv_heads=1, seed=10)
    drf, drf_params = helpers.tiny_decoder(10, emb=16, layers=1, heads=2, kv_heads=2, seed=13)
    return (
        (ml.PaddingMasked(tgt, USED, 8), tgt_params),
        (ml.PaddingMasked(drf, USED, 8), drf_params),
    )


def _repeated_prompt(n):
    return helpers.repeated_prompt(n, PROMPT)


def test_masked_model_is_hashable_and_never_scores_padding(masked_pair):
    (tgt, params), _ = masked_pair
    assert tgt == ml.PaddingMasked(tgt.model, USED, 8) != ml.PaddingMasked(tgt.model, 5, 8)
    assert {tgt: 1}[ml.PaddingMasked(tgt.model, USED, 8)] == 1  # a usable static jit argument
    assert tgt.vocab_size == 8 and tgt.config is tgt.model.config
    # one compiled prefill with the masked model static (hashable), not eager op by op
    logits = helpers.prefill_logits(tgt, params, _repeated_prompt(2)["prompt"], 8)
    assert logits.shape[-1] == 8
    assert np.all(np.isneginf(np.asarray(logits[..., USED:])))
    assert np.all(np.isfinite(np.asarray(logits[..., :USED])))


def test_sampled_sequences_follow_the_masked_target_distribution(masked_pair):
    (tgt, tgt_params), (drf, drf_params) = masked_pair
    cfg = SamplingConfig(temperature=1.0)
    exact = helpers.exact_sequence_probs(tgt, tgt_params, PROMPT, SEQ_LEN, 8, EOS, cfg)
    assert abs(sum(exact.values()) - 1.0) < 1e-6
    assert all(max(seq) < USED for seq in exact)  # padding ids have probability 0
    samples, _ = helpers.speculative_samples(
        masked_pair, _repeated_prompt(N), gamma=2, max_decode_len=SEQ_LEN, eos_id=EOS, cfg=cfg
    )
    assert all(max(seq) < USED for seq in samples)
    assert helpers.chi_square_pvalue(samples, exact) > 1e-3
    # Unmasked, the random target puts real mass on the padding ids: the mask is what removes it.
    unmasked = helpers.exact_sequence_probs(tgt.model, tgt_params, PROMPT, 1, 8, EOS, cfg)
    assert sum(p for seq, p in unmasked.items() if seq[0] >= USED) > 0.05


def test_greedy_speculative_equals_plain_with_masking(masked_pair):
    (tgt, tgt_params), (drf, drf_params) = masked_pair
    batch = helpers.ragged_prompts(0, batch=5, width=6, vocab=USED)
    plain = decoding.autoregressive_decode(tgt, tgt_params, batch, max_decode_len=9, eos_id=EOS)
    for gamma in (1, 3):
        spec = decoding.speculative_decode(
            tgt, tgt_params, drf, drf_params, batch, gamma=gamma, max_decode_len=9, eos_id=EOS
        )
        np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(plain.tokens))
    assert int(np.max(np.asarray(plain.tokens))) < USED


def _loaded(size: int) -> ml.Loaded:
    model = helpers.tiny_decoder_model(size, emb=8, layers=1, heads=2, kv_heads=1)
    return ml.Loaded(model, None, "test")


def test_fit_vocabulary_refuses_small_models_and_masks_padded_ones(caplog):
    caplog.set_level(logging.INFO, logger="speculative")
    byte = vocab.ByteVocabulary(extra_ids=0)  # 259 ids
    with pytest.raises(JobError, match=r"^draft d\.gguf: the model has 128 output ids but the "):
        ml.fit_vocabulary(
            byte, "(byte)", {"target": (_loaded(259), "t"), "draft": (_loaded(128), "d.gguf")}
        )
    same, info = ml.fit_vocabulary(byte, "(byte)", {"target": (_loaded(259), "t")})
    assert info == {} and not isinstance(same["target"].model, ml.PaddingMasked)
    fitted, info = ml.fit_vocabulary(
        byte, "(byte)", {"target": (_loaded(320), "t"), "draft": (_loaded(264), "d")}
    )
    assert info == {
        "vocabulary_tokens": 259,
        "model_output_ids": {"target": 320, "draft": 264},
        "masked_ids": [259, 320],
    }
    assert {m.model.vocab_size for m in fitted.values()} == {264}
    assert "259...319 are padding, masked out" in caplog.text  # logged (INFO)
