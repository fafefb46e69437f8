"""T5 vocabularies (SentencePiece with sentinels, ByT5 bytes) and the draft/target compatibility check."""

from __future__ import annotations

import random

import pytest
import sentencepiece as spm

from speculative import vocab

WORDS = (
    "the quick brown fox jumps over lazy dog speculative decoding draft target model accepts "
    "rejects token tokens sample samples probability exact greedy cache encoder decoder "
    "attention relative position bucket layer norm"
).split()
SYLLABLES = "ka lo mi re su ta ne po vi zu gra ble tro sem pli dor wen fal qui xo".split()


def _train(tmp_path, name: str, vocab_size: int, seed: int, **special) -> str:
    rng = random.Random(seed)
    # Real words plus made-up ones, so that a 120-piece unigram model has enough to learn.
    made_up = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(300)]
    lines = [
        " ".join(rng.choice(WORDS + made_up) for _ in range(rng.randint(4, 12))) for _ in range(400)
    ]
    corpus = tmp_path / f"{name}.txt"
    corpus.write_text("\n".join(lines))
    ids = {"pad_id": 0, "eos_id": 1, "unk_id": 2, "bos_id": -1, **special}
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(tmp_path / name),
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
        **ids,
    )
    return str(tmp_path / f"{name}.model")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("spm")
    return {
        "a": _train(tmp, "a", 120, seed=0),
        "a_again": _train(tmp, "a_again", 120, seed=0),
        "b": _train(tmp, "b", 110, seed=1),
        "bad": _train(tmp, "bad", 120, seed=0, pad_id=3, unk_id=0),
    }


def test_sentencepiece_ids_sentinels_and_round_trip(models):
    v = vocab.SentencePieceVocabulary(models["a"], extra_ids=10)
    assert isinstance(v, vocab.Vocabulary)
    assert (v.pad_id, v.eos_id, v.unk_id) == (0, 1, 2)
    assert len(v.tokens) == 130 and v.tokens[0] == "<pad>" and v.tokens[1] == "</s>"
    # seqio order: <extra_id_0> is the last id, <extra_id_9> the first after the pieces.
    assert v.tokens[129] == "<extra_id_0>" and v.tokens[120] == "<extra_id_9>"
    text = "the lazy dog accepts draft tokens"
    ids = v.encode(text)
    assert ids and all(3 <= i < 120 for i in ids)
    assert v.decode(ids) == text
    with_sentinel = v.encode("the fox <extra_id_0> jumps <extra_id_3>")
    assert 129 in with_sentinel and 126 in with_sentinel
    assert v.decode(with_sentinel) == "the fox<extra_id_0> jumps<extra_id_3>"
    # Decoding stops at EOS, skips pad, maps ids beyond the pieces (model padding rows) to unk.
    assert v.decode(ids + [1] + ids) == text
    assert v.decode([0] + ids + [0, 0]) == text
    assert v.decode(ids + [150]) == v.decode(ids + [2])


def test_sentencepiece_rejects_non_t5_special_ids(models):
    with pytest.raises(ValueError, match="need pad id 0"):
        vocab.SentencePieceVocabulary(models["bad"])


def test_byte_vocabulary():
    v = vocab.ByteVocabulary(extra_ids=5)
    assert (
        len(v.tokens) == 3 + 256 + 5 and v.tokens[3] == "<0x00>" and v.tokens[-1] == "<extra_id_0>"
    )
    text = "Grüße, 世界!"
    ids = v.encode(text)
    assert ids[0] == ord("G") + 3 and len(ids) == len(text.encode("utf-8"))
    assert v.decode(ids + [1, 50]) == text
    assert v.encode("a<extra_id_0>") == [ord("a") + 3, 263]
    assert v.decode([ord("a") + 3, 263, 0]) == "a<extra_id_0>"


def test_compatible_pairs_pass(models):
    a = vocab.SentencePieceVocabulary(models["a"], extra_ids=10)
    same = vocab.SentencePieceVocabulary(models["a_again"], extra_ids=10)
    vocab.check_compatible(a, same)
    vocab.check_compatible(a, same, draft_model_vocab_size=256, target_model_vocab_size=256)
    vocab.check_compatible(vocab.ByteVocabulary(), vocab.ByteVocabulary())
    # Models padded past the vocabulary, by different amounts: compatible (padding is masked).
    vocab.check_compatible(a, same, draft_model_vocab_size=256, target_model_vocab_size=384)


def test_mismatched_pairs_are_refused(models):
    a = vocab.SentencePieceVocabulary(models["a"], extra_ids=10)
    b = vocab.SentencePieceVocabulary(models["b"], extra_ids=20)  # same total size, other pieces
    assert len(a.tokens) == len(b.tokens) == 130
    with pytest.raises(ValueError, match=r"differ at token id \d+: draft has"):
        vocab.check_compatible(a, b)
    with pytest.raises(ValueError, match="differ in size: draft has 130 tokens, target has 259"):
        vocab.check_compatible(a, vocab.ByteVocabulary())
    fewer = vocab.SentencePieceVocabulary(models["a"], extra_ids=5)
    with pytest.raises(ValueError, match="differ in size"):
        vocab.check_compatible(fewer, a)
    with pytest.raises(ValueError, match="draft model has 100 output ids, fewer than"):
        vocab.check_compatible(a, a, draft_model_vocab_size=100, target_model_vocab_size=100)
