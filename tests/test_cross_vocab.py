"""A draft with another tokenizer (speculative/drafts/cross_vocab.py, vocab/cross_tables.py): the
byte-level tables (byte-level BPE, SentencePiece-style, byte and T5 SentencePiece vocabularies;
partial UTF-8; special tokens by role; a token the draft cannot spell refused), and decoding that
stays exact: greedy identity with plain decoding (ragged batch, EOS inside blocks, gamma 1 and
large), a draft that is the target in other ids accepted every time (the catch-up keeps the two
aligned), the target's exact 3-token sequence distribution when sampling (chi-square) and a
broken draw the same check rejects, and the infer job selecting it from DRAFT_VOCABULARY."""

import dataclasses
import io
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from speculative import decoding
from speculative.data import inputs
from speculative.decoding.sampling import SamplingConfig
from speculative.drafts import cross_vocab
from speculative.errors import JobError
from speculative.vocab import ByteVocabulary, SentencePieceVocabulary, cross_tables
from speculative.vocab.cross_tables import build_tables, choose_width, token_bytes
from speculative.vocab.hf_tokenizer import HFTokenizerVocabulary
from tests import helpers

TARGET_TEXT = ["def add(a, b):\n    return a + b\n", "for i in range(10): print(i) # café"]
DRAFT_TEXT = ["The cat sat on the mat, and the dog sat too.", "Résumé: naïve café, 日本"]


def _byte_level(vocab: dict[str, int], eos: str) -> HFTokenizerVocabulary:
    """A hand-written byte-level BPE vocabulary (GPT-2 alphabet pieces, no merges needed)."""
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(eos, special=True)])
    return HFTokenizerVocabulary(tokenizer, vocab[eos])


def _sentencepiece_style(vocab: dict[str, int], eos: str) -> HFTokenizerVocabulary:
    """A hand-written Llama-style vocabulary: '▁' for spaces, <0xNN> byte-fallback pieces."""
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tokenizer.add_special_tokens([AddedToken(eos, special=True)])
    return HFTokenizerVocabulary(tokenizer, vocab[eos])


def _trained(texts: list[str], size: int, eos: str) -> HFTokenizerVocabulary:
    """Byte-level BPE trained in-process on `texts` (all 256 bytes, then merges up to `size`)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=size,
        special_tokens=[eos],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts * 5, trainer)
    return HFTokenizerVocabulary(tokenizer, tokenizer.token_to_id(eos))


# The small pair of the sampled checks. Target: byte-level BPE; "ab" and "é" (Ã©) have no draft
# token (two-token spellings), "Ã" is byte 0xC3 alone (partial UTF-8).
SMALL_TARGET = {"<eos>": 0, "a": 1, "b": 2, "c": 3, "Ġ": 4, "ab": 5, "Ġa": 6, "Ã": 7, "Ã©": 8}
# Draft: SentencePiece style; "bc" and the lone byte 0xA9 are draft-only, "<0x20>" duplicates "▁".
SMALL_DRAFT = {
    "</s>": 0, "<0xC3>": 1, "<0xA9>": 2, "a": 3, "b": 4, "c": 5, "\u2581": 6, "\u2581a": 7,
    "bc": 8, "<0x20>": 9,
}  # fmt: skip


@pytest.fixture(scope="module")
def small_vocabs():
    return _byte_level(SMALL_TARGET, "<eos>"), _sentencepiece_style(SMALL_DRAFT, "</s>")


def test_tables_of_the_small_pair(small_vocabs):
    target, draft = small_vocabs
    assert token_bytes(target).bytes[7:9] == (b"\xc3", b"\xc3\xa9")  # partial UTF-8, whole é
    assert token_bytes(draft).bytes[6] == token_bytes(draft).bytes[9] == b" "
    tables = build_tables(draft, target)
    # draft id -> target id: "▁" stands for both spaces (not the fallback <0x20>); EOS by role
    np.testing.assert_array_equal(tables.to_target, [0, 7, -1, 1, 2, 3, 4, 6, -1, -1])
    np.testing.assert_array_equal(tables.to_draft, [0, 3, 4, 5, 6, -1, 7, 1, -1])
    np.testing.assert_array_equal(tables.spelling_lengths, [1, 1, 1, 1, 1, 2, 1, 1, 2])
    np.testing.assert_array_equal(tables.spelling[5], [3, 4])  # "ab" -> a, b
    np.testing.assert_array_equal(tables.spelling[8], [1, 2])  # é -> <0xC3>, <0xA9>
    assert tables.spelling[0, 0] == 0 and tables.unspelled == ()  # EOS -> the draft's EOS
    assert tables.coverage(9) == pytest.approx(7 / 9)


def test_special_tokens_are_matched_by_role_never_by_string():
    target = _byte_level({"<|end|>": 0, "<s>": 1, "<|im_start|>": 2, "a": 3, "<x>": 4}, "<|end|>")
    draft = _byte_level({"a": 0, "<|im_start|>": 1, "</s>": 2, "<s>": 3, "<x>": 4}, "</s>")
    for vocabulary, special in (
        (target, ("<s>", "<|im_start|>")),
        (draft, ("<s>", "<|im_start|>")),
    ):
        vocabulary.tokenizer.add_special_tokens([AddedToken(t, special=True) for t in special])
    target.bos_id, draft.bos_id = 1, 3
    tables = build_tables(draft, target)
    np.testing.assert_array_equal(tables.spelling[:3, 0], [2, 3, 2])  # EOS, BOS by role
    assert tables.unspelled == (2,)  # <|im_start|>: a special with no role, not matched by name
    np.testing.assert_array_equal(tables.to_draft, [2, -1, -1, 0, 4])  # "<x>" is plain text
    np.testing.assert_array_equal(tables.spelling_lengths, [1, 1, 0, 1, 1])


def test_byte_and_bpe_vocabularies_and_a_token_the_draft_cannot_spell():
    bpe = _trained(TARGET_TEXT, 300, "<|endoftext|>")
    byte = ByteVocabulary(extra_ids=2)
    size = len(bpe.tokens)  # BPE tokens spelled byte by byte, at the worst-case width
    tables = build_tables(byte, bpe, coverage=1.0, max_width=None)
    lengths = [len(b) if b else 1 for b in token_bytes(bpe).bytes]  # its EOS: the byte EOS
    np.testing.assert_array_equal(tables.spelling_lengths, lengths)
    assert tables.width == tables.longest == max(lengths) > 1 and tables.too_long == ()
    assert tables.coverage(size) == pytest.approx(257 / size)
    back = build_tables(bpe, byte)  # bytes as the BPE's single-byte tokens; pad, unk by role
    assert back.coverage(len(byte.tokens)) == pytest.approx(257 / 261)  # bytes and EOS
    assert back.unspelled == (0, 2, 259, 260)  # pad, unk, sentinels: no role in a BPE vocabulary
    small_target = _byte_level(SMALL_TARGET, "<eos>")
    with pytest.raises(ValueError, match=r"target token 3 \(bytes b'\\x00'\) has no spelling"):
        build_tables(small_target, byte)  # the small vocabulary has no byte 0


def test_the_catch_up_width_covers_99_percent_capped_at_8():
    """K (`choose_width`): the smallest width spelling 99% of the spelled target tokens (unspelled
    ones, length 0, not counted), at most 8; 1.0 and no cap: the longest spelling."""
    assert cross_tables.WIDTH_COVERAGE == 0.99 and cross_tables.MAX_WIDTH == 8
    assert choose_width([0] * 50 + [1] * 98 + [2, 9]) == 2  # 99 of 100 spelled in <= 2
    assert choose_width([1] * 99 + [9]) == 1
    assert choose_width([1] * 98 + [3, 9]) == 3  # 98% in 1: short of 99%
    assert choose_width([1] * 50 + [12] * 50) == 8  # capped
    assert choose_width([1] * 50 + [12] * 50, max_width=None) == 12
    assert choose_width([1, 2, 27], coverage=1.0, max_width=None) == 27
    assert choose_width([0, 0]) == 1
    with pytest.raises(ValueError, match="coverage must be in"):
        choose_width([1], coverage=0.0)


def test_tokens_spelled_in_more_than_k_draft_tokens_are_spelled_as_nothing():
    """A byte draft facing a BPE target: K is chosen from the spelling lengths (here capped at 3),
    and every target token longer than K bytes is spelled as nothing and listed, the rest in
    full; the log line says so."""
    bpe = _trained(TARGET_TEXT, 300, "<|endoftext|>")
    full = build_tables(ByteVocabulary(extra_ids=2), bpe, coverage=1.0, max_width=None)
    lengths = full.spelling_lengths
    tables = build_tables(ByteVocabulary(extra_ids=2), bpe)
    assert tables.width == choose_width(lengths) and tables.longest == full.width > tables.width
    tables = build_tables(ByteVocabulary(extra_ids=2), bpe, max_width=3)
    long = np.flatnonzero(lengths > 3)
    assert tables.width == 3 and tables.too_long == tuple(long.tolist()) and len(long) > 0
    np.testing.assert_array_equal(tables.spelling_lengths, np.where(lengths > 3, 0, lengths))
    short = lengths <= 3
    np.testing.assert_array_equal(tables.spelling[short], full.spelling[short, :3])
    assert np.all(tables.spelling[long] == tables.draft_eos)  # padding only
    assert tables.width_coverage == pytest.approx(np.mean(lengths[lengths > 0] <= 3))
    assert tables.unspelled == full.unspelled  # the specials; too long ones listed apart
    line = cross_tables.describe(tables, len(bpe.tokens))
    assert f"up to K = 3 draft tokens, {tables.slots_per_token:.2f} on average (K covers " in line
    assert f"{100 * tables.width_coverage:.2f}%" in line
    assert f"{len(long)} spelled in more, up to {full.width}, are spelled as nothing" in line


def test_sentencepiece_model_tables(tmp_path):
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TARGET_TEXT * 3 + DRAFT_TEXT * 3), model_writer=model,
        vocab_size=60, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False,
        character_coverage=1.0,
    )  # fmt: skip
    (tmp_path / "sp.model").write_bytes(model.getvalue())
    sp = SentencePieceVocabulary(str(tmp_path / "sp.model"), extra_ids=3)
    byte = ByteVocabulary()
    tables = build_tables(byte, sp)
    pieces = list(sp.tokens)
    for i in range(3, len(pieces) - 3):
        spelled = tables.spelling[i, : tables.spelling_lengths[i]] - ByteVocabulary.OFFSET
        assert bytes(spelled.tolist()) == pieces[i].replace("\u2581", " ").encode()
    assert tables.spelling[1, 0] == byte.eos_id
    assert set(tables.unspelled) == {2, len(pieces) - 3, len(pieces) - 2, len(pieces) - 1}
    assert tables.spelling[0, 0] == byte.pad_id  # pad by role: both vocabularies name one
    with pytest.raises(ValueError, match="has no spelling in the draft's vocabulary"):
        build_tables(sp, byte)  # the SentencePiece model has no piece for most bytes


def test_outside_mass_and_restriction():
    logits = jnp.log(jnp.asarray([[0.5, 0.2, 0.3]]))
    to_draft = jnp.asarray([2, -1, 0, -1])  # target ids 0 and 2 are draft ids 2 and 0
    q = cross_vocab.restrict(logits, to_draft)
    np.testing.assert_allclose(jax.nn.softmax(q), [[0.3 / 0.8, 0, 0.5 / 0.8, 0]], rtol=1e-6)
    np.testing.assert_allclose(cross_vocab.outside_mass(logits, to_draft), [0.2], rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# Decoding.

V_MAX_LEN = helpers.GREEDY_MAX_LEN


def _tiny(vocab: int, emb: int, layers: int, heads: int, kv_heads: int, seed: int):
    """`helpers.tiny_decoder` with room for a draft cache of K slots per target token."""
    model = helpers.tiny_decoder_model(vocab, emb, layers, heads, kv_heads)
    model = type(model)(dataclasses.replace(model.config, max_seq_len=2048))
    return model, helpers.init_params(model, seed)


@pytest.fixture(scope="module")
def trained_pair():
    """Two trained byte-level BPE vocabularies with different merges, random tiny models over
    them: (target vocabulary, (model, params), (drafter, params), tables)."""
    target_vocab = _trained(TARGET_TEXT, 300, "<|endoftext|>")
    draft_vocab = _trained(DRAFT_TEXT, 280, "</s>")
    tables = build_tables(draft_vocab, target_vocab)
    target = _tiny(len(target_vocab.tokens), 32, layers=2, heads=4, kv_heads=2, seed=0)
    draft = _tiny(len(draft_vocab.tokens), 16, layers=1, heads=2, kv_heads=1, seed=1)
    return target_vocab, target, cross_vocab.make_drafter(*draft, tables), tables


@pytest.fixture(scope="module")
def greedy_case(trained_pair):
    """(batch, eos, plain greedy output): 9 ragged prompts and, as EOS, a token row 0 emits
    mid-sequence, so that rows stop inside blocks."""
    target_vocab, target, _, _ = trained_pair
    batch = helpers.ragged_prompts(0, batch=9, width=7, vocab=len(target_vocab.tokens))
    free = decoding.autoregressive_decode(*target, batch, max_decode_len=V_MAX_LEN, eos_id=0)
    eos = int(free.tokens[0, 6])
    ref = decoding.autoregressive_decode(*target, batch, max_decode_len=V_MAX_LEN, eos_id=eos)
    assert np.asarray(ref.lengths).min() < V_MAX_LEN
    return batch, eos, ref


@pytest.mark.parametrize(
    "gamma, acceptance, tree",
    [
        (1, "token", None),
        (7, "token", None),
        (None, "token", (3, 2, 2, 1)),
        # the block rule takes any q; its sampled case below is slow too
        pytest.param(5, "block", None, marks=pytest.mark.slow),
    ],
)
def test_greedy_identical_to_plain(trained_pair, greedy_case, gamma, acceptance, tree):
    target_vocab, target, (drafter, params), tables = trained_pair
    batch, eos, ref = greedy_case
    assert tables.width >= 2 and 0 < tables.coverage(len(target_vocab.tokens)) < 1
    out = decoding.speculative_decode(
        *target, drafter, params, batch, gamma=gamma, max_decode_len=V_MAX_LEN, eos_id=eos,
        acceptance=acceptance, tree=tree,
    )  # fmt: skip
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    share = np.asarray(out.stats.outside_mass) / np.maximum(np.asarray(out.stats.drafted), 1)
    assert np.all((share > 0) & (share < 1))  # its own tokens outside the intersection
    np.testing.assert_array_equal(out.stats.draft_stalls, 0)  # a cache no row outgrows


def test_tokens_longer_than_k_spelled_as_nothing_stay_exact(trained_pair, greedy_case):
    """K capped at 1: every target token the draft spells in 2 or more tokens is spelled as
    nothing (the draft does not see it, in the prompt or the output), and greedy output still
    equals plain decoding."""
    target_vocab, target, (drafter, _), _ = trained_pair
    batch, eos, ref = greedy_case
    draft_vocab = _trained(DRAFT_TEXT, 280, "</s>")
    tables = build_tables(draft_vocab, target_vocab, max_width=1)
    assert tables.width == 1 and tables.too_long
    emitted = set(np.asarray(ref.tokens).ravel().tolist()) | set(
        np.asarray(batch["prompt"]).ravel().tolist()
    )
    assert emitted & set(tables.too_long)  # the text holds tokens the draft does not see
    narrow, params = cross_vocab.make_drafter(drafter.model, drafter_params(trained_pair), tables)
    assert narrow.width == 1
    for gamma in (1, 4):
        out = decoding.speculative_decode(
            *target, narrow, params, batch, gamma=gamma, max_decode_len=V_MAX_LEN, eos_id=eos
        )
        np.testing.assert_array_equal(out.tokens, ref.tokens)
        np.testing.assert_array_equal(out.lengths, ref.lengths)


def drafter_params(trained_pair):
    """The draft model's weights of the trained pair (without its tables)."""
    return trained_pair[2][1]["model"]


def test_a_draft_with_a_short_context_stays_exact(trained_pair, greedy_case, caplog):
    """A draft model whose context is far below the worst case (K slots per target token): its
    cache is capped, it is fed the end of the prompt and rows that outgrow it stop feeding it;
    the output is still the target's."""
    _, target, (drafter, params), _ = trained_pair
    batch, eos, ref = greedy_case
    model = drafter.model
    short = type(model)(dataclasses.replace(model.config, max_seq_len=40))
    capped = dataclasses.replace(drafter, model=short)
    cross_vocab._warn_short.cache_clear()  # once per (size, need) and process
    out = decoding.speculative_decode(
        *target, capped, params, batch, gamma=3, max_decode_len=V_MAX_LEN, eos_id=eos
    )
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    need = drafter.cache_length(batch, decoding.DecodeConfig(V_MAX_LEN, eos, gamma=3))
    assert need > 40
    assert (
        f"cross-vocabulary draft cache capped at 40 slots by the draft's context (needs {need}): "
        "rows may stop feeding the draft; output stays exact"
    ) in caplog.text
    np.testing.assert_array_equal(out.stats.draft_stalls, 0)  # its rows end before they outgrow it
    # Rows that run to max_decode_len outgrow it: each row's stalled rounds are counted.
    free = decoding.autoregressive_decode(*target, batch, max_decode_len=V_MAX_LEN, eos_id=0)
    out = decoding.speculative_decode(
        *target, capped, params, batch, gamma=3, max_decode_len=V_MAX_LEN, eos_id=0
    )
    np.testing.assert_array_equal(out.tokens, free.tokens)
    stalls = np.asarray(out.stats.draft_stalls)
    assert (
        stalls.shape == (batch["prompt"].shape[0],) and np.any(stalls > 0) and np.any(stalls == 0)
    )
    assert np.all(stalls <= np.asarray(out.stats.target_calls))


def _long_prompts(tables, rows: int, width: int, length: int):
    """Right-padded prompts [rows, width] of `length` target tokens each, all spelled in K draft
    tokens (the longest spellings), so each row's prompt spells to K * length draft tokens."""
    longest = np.flatnonzero(tables.spelling_lengths == tables.width)
    ids = np.random.default_rng(5).choice(longest, size=(rows, length))
    prompt = np.zeros((rows, width), np.int32)
    prompt[:, :length] = ids
    return {
        "prompt": jnp.asarray(prompt),
        "prompt_lengths": jnp.full((rows,), length, jnp.int32),
    }


def test_a_prompt_of_long_spellings_gets_a_cache_it_does_not_outgrow(trained_pair, greedy_case):
    """A prompt whose spelling is far longer than the mean spelling length estimated (the
    earlier sizing): the drafter fitted to it (`fit_prompts`) sizes its cache from the actual
    spelling, below the worst case (K per prompt slot) yet enough: no row stalls, and sampled,
    every row's tokens and acceptance equal the unfitted worst-case drafter's (the same q
    throughout; the mean-based sizing, which fed the draft the prompt's last ceil(mean * 12) draft
    tokens, accepted a different number here). Greedy, these random models never agree, so it is
    the sampled run that compares acceptance (greedy identity with a fitted cache: the tests
    above)."""
    target_vocab, target, (drafter, params), tables = trained_pair
    _, eos, _ = greedy_case
    batch = _long_prompts(tables, rows=4, width=12, length=8)
    spelled = tables.width * 8
    assert spelled > math.ceil(tables.slots_per_token * 12)  # the mean-based estimate's room
    fitted = drafter.fit_prompts(np.asarray(batch["prompt"])[:, :8].tolist())
    config = decoding.DecodeConfig(V_MAX_LEN, eos, gamma=3)
    assert fitted.prompt_slots == spelled
    assert fitted.need(batch, config) == fitted.cache_length(batch, config)
    assert fitted.cache_length(batch, config) < drafter.cache_length(batch, config)
    assert fitted.prompt_window(batch, config) == spelled  # the whole prompt is fed
    sampled = [
        decoding.speculative_decode(
            *target,
            d,
            params,
            batch,
            gamma=3,
            max_decode_len=V_MAX_LEN,
            eos_id=eos,
            sampling=SamplingConfig(temperature=1.0),
            rng=jax.random.PRNGKey(7),
        )  # fmt: skip
        for d in (fitted, drafter)
    ]
    fit, worst = (out.stats for out in sampled)
    np.testing.assert_array_equal(sampled[0].tokens, sampled[1].tokens)
    np.testing.assert_array_equal(fit.accepted, worst.accepted)
    np.testing.assert_array_equal(fit.drafted, worst.drafted)
    np.testing.assert_allclose(fit.beta_sum, worst.beta_sum, rtol=1e-5)
    assert np.sum(fit.accepted) > 0
    np.testing.assert_array_equal(fit.draft_stalls, 0)


def test_a_batch_longer_than_the_fitted_prompts_warns(trained_pair, greedy_case, caplog):
    """A batch whose prompts spell to more than `fit_prompts` saw: the draft is fed the end of
    its prompt, with a warning naming the need (still exact)."""
    _, target, (drafter, params), tables = trained_pair
    batch, eos, ref = greedy_case
    fitted = drafter.fit_prompts([[1]])
    cross_vocab._warn_short.cache_clear()
    config = decoding.DecodeConfig(V_MAX_LEN, eos, gamma=3)
    need = fitted.need(batch, config)
    assert need > fitted.cache_length(batch, config)
    out = decoding.speculative_decode(
        *target, fitted, params, batch, gamma=3, max_decode_len=V_MAX_LEN, eos_id=eos
    )
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    assert f"fitted to (`fit_prompts`); this batch needs {need}" in caplog.text


def _mirror(target, target_vocab: HFTokenizerVocabulary, extra: int = 2):
    """The target model as a draft over a permuted copy of its vocabulary with `extra`
    draft-only tokens: (draft vocabulary, draft model, its params)."""
    (model, params), size = target, len(target_vocab.tokens)
    order = np.random.default_rng(3).permutation(size)  # draft id d is target id order[d]
    pieces = [target_vocab.tokens[i] for i in order] + [f"zq{k}" for k in range(extra)]
    eos = int(np.flatnonzero(order == target_vocab.eos_id)[0])
    vocabulary = _byte_level({p: d for d, p in enumerate(pieces)}, pieces[eos])

    def rows(table):  # [V, E] -> [V + extra, E]: the target's rows in draft order, zeros after
        return jnp.concatenate([table[order], jnp.zeros((extra, table.shape[1]), table.dtype)])

    draft_params = {name: dict(part) for name, part in params.items()}
    draft_params["token_embedder"]["embedding"] = rows(params["token_embedder"]["embedding"])
    draft_params["logits_dense"]["kernel"] = rows(params["logits_dense"]["kernel"])
    config = dataclasses.replace(model.config, vocab_size=size + extra)
    return vocabulary, type(model)(config), draft_params


def test_the_target_in_other_ids_is_accepted_every_time(trained_pair, greedy_case):
    """A draft computing the target's own logits in permuted ids: greedy, every proposal is the
    target's argmax, so every one is accepted (a catch-up that fed the draft anything else, or at
    another slot, would be rejected), EOS included, inside blocks."""
    target_vocab, (model, params), _, _ = trained_pair
    batch, eos, ref = greedy_case
    vocabulary, draft, draft_params = _mirror((model, params), target_vocab)
    tables = build_tables(vocabulary, target_vocab)
    drafter, dparams = cross_vocab.make_drafter(draft, draft_params, tables)
    out = decoding.speculative_decode(
        model, params, drafter, dparams, batch, gamma=4, max_decode_len=V_MAX_LEN, eos_id=eos
    )
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.stats.accepted, out.stats.drafted)
    share = np.asarray(out.stats.outside_mass) / np.asarray(out.stats.drafted)
    assert np.all((share > 0) & (share < 0.1))  # the two zero-logit draft-only tokens


TEXTS = [
    "def add(a, b):\n    return",
    "The cat sat on the mat,",
    "for i in range(10): café",
    "日本",
]


def test_the_draft_reads_the_prompt_text_in_its_own_tokens(trained_pair):
    """With the texts (`with_draft_prompts`) the draft is prefilled with its tokenizer's encoding
    of each prompt, not the target ids spelled one by one (which differ here), and greedy output
    is still the target's."""
    target_vocab, target, (drafter, params), tables = trained_pair
    draft_vocab = _trained(DRAFT_TEXT, 280, "</s>")  # the fixture's, rebuilt (deterministic)
    ids = [target_vocab.encode(t) for t in TEXTS]
    batch = cross_vocab.with_draft_prompts(inputs.decoder_batch(ids), draft_vocab, TEXTS, 32)
    own = [draft_vocab.encode(t) for t in TEXTS]
    np.testing.assert_array_equal(batch["draft_prompt_lengths"], [len(o) for o in own])
    for row, o in enumerate(own):
        np.testing.assert_array_equal(batch["draft_prompt"][row, : len(o)], o)
    spelled = [
        sum((tables.spelling[i, : tables.spelling_lengths[i]].tolist() for i in r), []) for r in ids
    ]
    assert any(s != o for s, o in zip(spelled, own))  # the old path would feed other tokens
    config = decoding.DecodeConfig(V_MAX_LEN, (target_vocab.eos_id,), SamplingConfig(), 3)
    state = helpers.drafter_init(drafter, params, batch, config)
    np.testing.assert_array_equal(state.base, [len(o) for o in own])  # x_1 after the prompt
    np.testing.assert_array_equal(state.tail, [o[-1] for o in own])
    kwargs = dict(max_decode_len=V_MAX_LEN, eos_id=target_vocab.eos_id)
    ref = decoding.autoregressive_decode(*target, batch, **kwargs)
    out = decoding.speculative_decode(*target, drafter, params, batch, gamma=3, **kwargs)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)


# The sampled checks: SMALL_TARGET ids, 3 tokens after PROMPT, target EOS 0.
PROMPT, SEQ_LEN, N = [1, 3, 2], 3, helpers.N


@pytest.fixture(scope="module")
def small_models(small_vocabs):
    target_vocab, draft_vocab = small_vocabs
    target = helpers.tiny_decoder(9, emb=16, layers=1, heads=2, kv_heads=1, seed=10)
    draft = helpers.tiny_decoder(10, emb=16, layers=1, heads=2, kv_heads=2, seed=13)
    return target, cross_vocab.make_drafter(*draft, build_tables(draft_vocab, target_vocab))


_EXACT: dict = {}  # SamplingConfig -> the small target's exact sequence probabilities


def _exact(target, cfg: SamplingConfig) -> dict:
    if cfg not in _EXACT:
        _EXACT[cfg] = helpers.exact_sequence_probs(*target, PROMPT, SEQ_LEN, 9, 0, cfg)
    return _EXACT[cfg]


def _samples(small_models, cfg: SamplingConfig, gamma, acceptance: str = "token", tree=None):
    target, drafter = small_models
    samples, out = helpers.speculative_samples(
        (target, drafter), helpers.repeated_prompt(N, PROMPT), gamma=gamma,
        max_decode_len=SEQ_LEN, eos_id=0, cfg=cfg, seed=11, acceptance=acceptance, tree=tree,
    )  # fmt: skip
    return helpers.chi_square_pvalue(samples, _exact(target, cfg)), out


@pytest.mark.parametrize(
    "cfg, gamma, acceptance, tree",
    [
        (SamplingConfig(temperature=1.0), 2, "token", None),
        # trees: the greedy tree case above runs by default (this one: 7 s cold)
        pytest.param(
            SamplingConfig(temperature=1.0), None, "token", (3, 2), marks=pytest.mark.slow
        ),
        # the block rule with top-k: its path is the greedy block case's too (slow: 8 s)
        pytest.param(SamplingConfig(1.2, top_k=5), 3, "block", None, marks=pytest.mark.slow),
    ],
)
def test_sampled_sequences_follow_the_target(small_models, cfg, gamma, acceptance, tree):
    pvalue, out = _samples(small_models, cfg, gamma, acceptance, tree)
    assert pvalue > 1e-3
    alpha = float(np.mean(out.stats.alpha))
    assert 0.1 < alpha < 0.99, f"want a draft that is sometimes rejected, alpha={alpha}"


def test_a_draw_outside_the_intersection_is_caught(small_models, monkeypatch):
    """Drawing from the draft's q without the restriction (target ids outside the intersection
    drawn with logit 0) while the rule is told the restricted q: the check above must fail.
    (gamma 4: a program of its own, not the one the jit cache holds for the test above.)"""
    draw = cross_vocab.sample

    def unrestricted(rng, q, cfg):
        return draw(rng, jnp.where(jnp.isinf(q), 0.0, q), cfg)

    monkeypatch.setattr(cross_vocab, "sample", unrestricted)
    pvalue, _ = _samples(small_models, SamplingConfig(temperature=1.0), 4)
    assert pvalue < 1e-6


def test_a_tree_it_cannot_grow_is_refused(small_models):
    target, (drafter, params) = small_models
    batch = helpers.repeated_prompt(2, PROMPT)
    tree = decoding.TreeShape(parents=(0, 0, 2))  # a second child with a child
    with pytest.raises(ValueError, match="cannot propose a tree"):
        decoding.speculative_decode(
            *target, drafter, params, batch, tree=tree, max_decode_len=4, eos_id=0
        )


# ------------------------------------------------------------------------------------------------
# The infer job: a DRAFT_VOCABULARY other than VOCABULARY selects the cross-vocabulary draft.

OTHER_VOCABULARY = [
    "--gin.DRAFT_VOCABULARY=@draft/speculative.VocabSpec()",
    "--gin.draft/speculative.VocabSpec.kind='byte'",
    "--gin.draft/speculative.VocabSpec.extra_ids=5",  # 264 ids: the draft's 5 sentinels
]


def test_infer_job_with_a_draft_vocabulary_of_its_own(tmp_path, caplog):
    caplog.set_level("INFO")
    rows, summary = helpers.tiny_infer(tmp_path, "cross", *OTHER_VOCABULARY)
    # its memory line counts the draft: weights, its cache and the tables (`cross_draft_parts`)
    line = next(r.message for r in caplog.records if r.message.startswith("memory per device"))
    assert all(f"{part} " in line for part in ("draft params", "draft cache", "tables"))
    plain, _ = helpers.tiny_infer(tmp_path, "plain", "--gin.SPECULATIVE=False")
    assert [r["output_ids"] for r in rows] == [r["output_ids"] for r in plain]
    assert all(0 < r["draft_mass_outside"] < 1 for r in rows)
    assert 0 < summary["draft_mass_outside"] < 1 and summary["accepted"] > 0


def test_a_draft_that_is_not_a_model_cannot_have_its_own_vocabulary(tmp_path):
    with pytest.raises(JobError, match="only a draft model may have its own vocabulary"):
        helpers.tiny_infer(
            tmp_path, "lookup", *OTHER_VOCABULARY, "--gin_file=configs/drafts/prompt_lookup.gin"
        )


def test_load_pair_takes_a_draft_with_its_own_vocabulary():
    import speculative
    from speculative.models import decoder

    def tiny(layers: int):
        config = decoder.DecoderConfig(
            vocab_size=264, emb_dim=32, num_layers=layers, num_heads=4, num_kv_heads=2,
            head_dim=8, mlp_dim=64, max_seq_len=256,
        )  # fmt: skip
        return speculative.ModelSpec("random", model=decoder.DecoderLM(config), dtype="float32")

    byte, own = (
        speculative.VocabSpec("byte", extra_ids=0),
        speculative.VocabSpec("byte", extra_ids=5),
    )
    pair = speculative.load_pair(tiny(2), tiny(1), vocabulary=byte, draft_vocabulary=own)
    # decoding with it is the infer job's test above (the same loading, jobs.common)
    assert isinstance(pair.draft.model, cross_vocab.CrossVocabDrafter)
    assert pair.draft.params["tables"]["to_draft"].shape == (264,)
    with pytest.raises(JobError, match="load_pair draft_vocabulary: got a ModelSpec"):
        speculative.load_pair(tiny(2), tiny(1), vocabulary=byte, draft_vocabulary=tiny(1))


def test_the_mass_outside_pools_over_drafted_tokens():
    from speculative import infer

    def row(outside: float, drafted: int) -> dict:
        return {
            "index": 0, "length": 4, "target_calls": 2, "alpha": 0.5, "accepted": 1,
            "drafted": drafted, "draft_calls": drafted, "accepted_at": [1, 0],
            "verified_at": [2, 1], "outside_mass": outside,
        }  # fmt: skip

    rows = [row(1.0, 4), row(0.5, 6), row(3.0, 10)]
    assert infer.summarize_rows(rows)["draft_mass_outside"] == pytest.approx(4.5 / 20)
    running = infer.pool_rows(rows[:1])
    running = infer.pool_rows([running, *rows[1:]])
    assert running["outside_mass"] == pytest.approx(4.5) and running["drafted"] == 20
