"""A draft with another tokenizer beside the jobs (tests/test_cross_vocab.py has the tables and
decoding): a few target bytes the draft cannot spell tolerated (SmolLM2 facing Qwen2.5), the
memory report of the draft (weights, K slots per target token of cache, tables), drafts of two
tokenizers selected per draft in one job, and, under --slow, greedy identity under the
partitioner (tests/test_cross_vocab_sharded.py in a 4-device interpreter)."""

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.drafts import cross_vocab
from speculative.vocab import ByteVocabulary, cross_tables
from tests import gguf_testutil as gt
from tests import helpers
from tests.test_cross_vocab import DRAFT_TEXT, TARGET_TEXT, V_MAX_LEN, _byte_level, _tiny, _trained
from tests.test_gguf_loader import random_hf_state


@pytest.fixture(scope="module")
def drafter():
    """(CrossVocabDrafter, its params): the tiny draft of test_cross_vocab.py's trained pair."""
    target_vocab = _trained(TARGET_TEXT, 300, "<|endoftext|>")
    draft_vocab = _trained(DRAFT_TEXT, 280, "</s>")
    tables = cross_tables.build_tables(draft_vocab, target_vocab)
    return cross_vocab.make_drafter(*_tiny(len(draft_vocab.tokens), 16, 1, 2, 1, 1), tables)


@pytest.mark.parametrize("missing", [(0xC0,), (0xC0, 0xC1, 0xFF)])
def test_a_few_bytes_the_draft_cannot_spell_are_spelled_as_nothing(missing):
    """A byte-level draft without some single bytes (SmolLM2 has no 0xC0) facing a byte target:
    up to 1% of the target's ids are spelled as nothing and listed; more is refused."""
    alphabet = {b: c for c, b in cross_tables.gpt2_byte_alphabet().items()}
    pieces = ["</s>"] + [alphabet[b] for b in range(256) if b not in missing]
    draft = _byte_level({p: i for i, p in enumerate(pieces)}, "</s>")
    target = ByteVocabulary(extra_ids=0)  # 259 ids: 1% is 2.59
    ids = [b + ByteVocabulary.OFFSET for b in missing]
    if len(missing) > 2:
        with pytest.raises(ValueError, match=r"target token 195 .* \(3 such target tokens"):
            cross_tables.build_tables(draft, target)
        return
    tables = cross_tables.build_tables(draft, target)
    assert set(ids) <= set(tables.unspelled) and np.all(tables.spelling_lengths[ids] == 0)
    assert np.all(tables.to_draft[ids] == -1) and tables.spelling_lengths[ids[0] + 1] == 1


def test_the_memory_report_counts_weights_cache_and_tables(drafter):
    """`memory.cross_draft_bytes` equals the bytes of the draft's real params, tables and prefilled
    cache (K slots per target token; capped at a short draft context)."""
    from speculative import memory

    drafter, params = drafter
    batch = helpers.ragged_prompts(0, batch=2, width=7, vocab=drafter.target_vocab_size)
    mesh = {"data": 1, "model": 1}

    def nbytes(tree) -> int:
        return sum(leaf.nbytes for leaf in jax.tree.leaves(tree))

    for model in (
        drafter.model,
        type(drafter.model)(dataclasses.replace(drafter.model.config, max_seq_len=40)),
    ):
        capped = dataclasses.replace(drafter, model=model)
        config = decoding.DecodeConfig(V_MAX_LEN, (0,), gamma=3)
        got = memory.cross_draft_bytes(capped, mesh, 2, 7, V_MAX_LEN, 3, jnp.float32)
        cache = capped.init(params, batch, config).cache
        worst = capped.width * (7 + V_MAX_LEN + 3 + 2) + 3
        assert cache.max_len == min(worst, model.max_length)
        assert got == {
            "draft params": nbytes(params["model"]),
            "draft cache": nbytes(cache),
            "tables": nbytes(params["tables"]),
        }


def write_bpe_model(vocabulary, path: pathlib.Path, seed: int) -> pathlib.Path:
    """A tiny llama GGUF file with random weights and `vocabulary`'s BPE tokenizer."""
    model = json.loads(vocabulary.tokenizer.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types_ = [3 if i == vocabulary.eos_id else 1 for i in range(len(tokens))]
    meta = dict(
        tokens=tokens, merges=merges, token_types=types_, pre="gpt2", eos_id=vocabulary.eos_id
    )
    hp = dict(emb=32, layers=1, heads=2, kv_heads=1, mlp=64, context=512, rope_theta=1e4, eps=1e-5)
    state = random_hf_state(np.random.default_rng(seed), hp, vocab=len(tokens))
    tensors = gt.hf_to_gguf_tensors(state, "llama", hp["heads"], hp["kv_heads"], hp["layers"])
    return gt.write_model(path, "llama", hp, tensors, tokenizer=meta)


def test_the_memory_command_reads_a_gguf_pair(tmp_path, capsys):
    """`python -m speculative.memory --cross_draft` on two tiny GGUF files (metadata and
    tokenizers only): one row with K and every part."""
    from speculative import memory

    target = write_bpe_model(_trained(TARGET_TEXT, 300, "<|endoftext|>"), tmp_path / "t.gguf", 0)
    draft = write_bpe_model(_trained(DRAFT_TEXT, 280, "</s>"), tmp_path / "d.gguf", 1)
    memory.main(["--target", str(target), "--cross_draft", str(draft), "--input_len", "8"])
    table = capsys.readouterr().out.splitlines()
    assert (
        "| target params | target cache | draft params | draft cache | tables | total |" in table[1]
    )
    assert table[3].startswith(f"| {target} | {draft} (K = ")


def test_drafts_of_two_tokenizers_in_one_job(tmp_path):
    """With DRAFT_VOCABULARY set, a draft model whose GGUF file carries another tokenizer proposes
    through the tables while a draft with DRAFT_VOCABULARY's (the target's) is fitted as usual:
    both as variants of one job."""
    from speculative.jobs import common
    from speculative.models import decoder

    alphabet = {b: c for c, b in cross_tables.gpt2_byte_alphabet().items()}
    tokens = [alphabet[b] for b in range(256)] + ["<eos>", "ĠĠ"]
    merges, types = ["Ġ Ġ"], [1] * 256 + [3, 1]
    meta = dict(tokens=tokens, merges=merges, token_types=types, pre="gpt2", eos_id=256)
    hp = dict(emb=32, layers=1, heads=2, kv_heads=1, mlp=64, context=512, rope_theta=1e4, eps=1e-5)
    state = random_hf_state(np.random.default_rng(0), hp, vocab=258)
    tensors = gt.hf_to_gguf_tensors(state, "llama", hp["heads"], hp["kv_heads"], hp["layers"])
    path = gt.write_model(tmp_path / "own.gguf", "llama", hp, tensors, tokenizer=meta)
    config = decoder.DecoderConfig(
        vocab_size=264, emb_dim=32, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8,
        mlp_dim=64, max_seq_len=256,
    )  # fmt: skip
    random = ml.ModelSpec("random", model=decoder.DecoderLM(config), dtype="float32")
    byte = ml.VocabSpec("byte", extra_ids=0)
    drafts = [("own", ml.ModelSpec("gguf", str(path), dtype="float32")), ("same", random)]
    loaded = common.load_models(random, drafts, ml.load_vocabulary(byte), byte, byte)
    own, same = loaded.drafts
    assert isinstance(own.model, cross_vocab.CrossVocabDrafter) and own.model.width == 1
    tables = own.params["tables"]
    np.testing.assert_array_equal(tables["to_target"][255:], [258, 1, -1])  # EOS by role
    assert same.is_model and same.model.vocab_size == 264  # fitted to the target's vocabulary


@pytest.mark.slow  # 45 s: an interpreter of its own, two meshes compiled
def test_partitioned_on_4_host_devices(tmp_path):
    """tests/test_cross_vocab_sharded.py (2x2 and 4x1 meshes) in a 4-device interpreter."""
    helpers.run_pytest_on_host_devices(
        ["tests/test_cross_vocab_sharded.py"], tmp_path / "cross.xml", min_tests=2, devices=4
    )
    from speculative.loading import specs as ml
