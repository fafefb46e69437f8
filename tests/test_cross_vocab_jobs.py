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

    init = helpers.drafter_init  # the real prefill, compiled once per draft
    for model in (
        drafter.model,
        type(drafter.model)(dataclasses.replace(drafter.model.config, max_seq_len=40)),
    ):
        capped = dataclasses.replace(drafter, model=model)
        config = decoding.DecodeConfig(V_MAX_LEN, (0,), gamma=3)
        got = memory.cross_draft_bytes(capped, mesh, 2, 7, V_MAX_LEN, 3, jnp.float32)
        cache = init(capped, params, batch, config).cache
        k = capped.width
        need = k * 7 + k * (V_MAX_LEN + 3 + 2) + k + 3  # unfitted: K per prompt token
        assert cache.max_len == min(need, model.max_length)
        assert got == {
            "draft params": nbytes(params["model"]),
            "draft cache": nbytes(cache),
            "tables": nbytes(params["tables"]),
        }


def test_the_memory_arithmetic_is_one_for_every_cache_and_the_job_lines_count_the_draft(drafter):
    """`measure.memory.state_bytes(cache_length=L)` is the bytes of a decode state of L slots
    (the cross draft's cache is sized by it), and `job_report` adds the cross draft's parts
    (`jobs.common.cross_draft_parts`; None for any other draft)."""
    from speculative.jobs import common
    from speculative.loading import specs as ml
    from speculative.measure import memory as measure
    from speculative.parallel import partitioning

    drafter, params = drafter
    model, mesh = drafter.model, {"data": 1, "model": 1}
    batch = {"prompt": jnp.zeros((2, 7), jnp.int32)}
    for length in (40, 123):
        state = model.init_state(params["model"], batch, length)
        got = measure.state_bytes(
            model, partitioning.DRAFT_RULES, mesh, 2, 7, V_MAX_LEN, 3, cache_length=length
        )
        assert got == sum(leaf.nbytes for leaf in jax.tree.leaves(state))
    loaded = ml.Loaded(drafter, params, "cross")
    parts = common.cross_draft_parts(loaded, None, 2, 7, V_MAX_LEN, 3, jnp.float32)
    assert parts == common.cross_draft_bytes(drafter, mesh, 2, 7, V_MAX_LEN, 3, jnp.float32)
    assert common.cross_draft_parts(ml.Loaded(model, params["model"], "m"), *[None] * 6) is None
    line = measure.job_report(
        model, None, batch_size=2, input_len=7, max_decode_len=V_MAX_LEN, gamma=3,
        param_dtype=jnp.float32, draft_parts=parts,
    )  # fmt: skip
    gib = {k: f"{k} {v / measure.GIB:.3f}" for k, v in parts.items()}
    assert all(text in line for text in gib.values()) and "tables" in line


def test_the_benchmark_memory_check_and_lines_count_the_cross_draft(drafter, monkeypatch, caplog):
    """The benchmark's memory check counts a cross draft's cache and tables (before: nothing),
    and its memory lines its params, cache and tables."""
    from speculative import benchmark
    from speculative.jobs import common
    from speculative.jobs.benchmark import settings as bench_settings
    from speculative.jobs.benchmark import setup as bench_setup
    from speculative.loading import specs as ml
    from speculative.measure import memory as measure
    from speculative.parallel import partitioning

    drafter, params = drafter
    target = ml.Loaded(*helpers.tiny_decoder(drafter.target_vocab_size, 32, 1, 4, 2, 0), "t")
    setup = benchmark.Setup(target, ml.Loaded(drafter, params, "d"), (1,), 1, [[5] * 16], 16)
    cfg = benchmark.BenchmarkConfig(
        target=None, draft=None, vocabulary=None, output_dir="/unused", gammas=(2, 5),
        feature_lengths={"inputs": 16, "targets": 8},
    )  # fmt: skip
    s, mesh, args = bench_settings.resolve(cfg), {"data": 1, "model": 1}, (4, 16, 8, 5)
    cross = common.cross_draft_bytes(drafter, mesh, *args, jnp.float32)
    need = (
        measure.state_bytes(target.model, partitioning.TARGET_RULES, mesh, *args)
        + cross["draft cache"]
        + cross["tables"]
        + measure.workspace_bytes(target.model, mesh, 4, 16, 5)
    )
    monkeypatch.setattr(bench_setup, "available_bytes", lambda: int(need / 0.8) + 1)
    assert bench_setup.memory_shortfall(setup, s, 4) is None
    monkeypatch.setattr(bench_setup, "available_bytes", lambda: int(need / 0.8) - 1)
    assert bench_setup.memory_shortfall(setup, s, 4).startswith("estimated ")
    caplog.set_level("INFO")
    bench_setup.print_memory(setup, s)
    assert all(f"{part} " in caplog.text for part in ("draft params", "draft cache", "tables"))


def _output(outside, drafted, with_mass=True):
    """A DecodeOutput of len(drafted) rows of 4 tokens whose stats carry `outside_mass`."""
    rows = len(drafted)
    stats = decoding.DecodeStats.zeros(rows, 2).replace(
        target_calls=jnp.full((rows,), 2, jnp.int32),
        drafted=jnp.asarray(drafted, jnp.int32),
        accepted=jnp.ones((rows,), jnp.int32),
        beta_sum=jnp.ones((rows,), jnp.float32),
        accepted_at=jnp.ones((rows, 2), jnp.int32),
        verified_at=jnp.ones((rows, 2), jnp.int32),
        outside_mass=jnp.asarray(outside, jnp.float32) if with_mass else None,
    )
    tokens, lengths = jnp.ones((rows, 4), jnp.int32), jnp.full((rows,), 4, jnp.int32)
    return decoding.DecodeOutput(tokens, lengths, stats)


@pytest.mark.parametrize("with_mass", [True, False])
def test_the_mass_outside_reaches_the_benchmark_points(with_mass):
    """A cross-vocabulary variant's point in benchmark.json carries draft_mass_outside (pooled
    over drafted tokens, as `metrics.summarize`) and draft_mass_outside_rows (per example, in
    batch order); a draft of the target's tokenizer, None for both."""
    from speculative.jobs.benchmark import harness, points

    plain, spec = harness.Timed(), harness.Timed()
    for outside, drafted in (([1.0, 0.5], [4, 5]), ([3.0], [10])):
        plain.add(_output(outside, drafted, with_mass=False), 2.0, 0.0)
        spec.add(_output(outside, drafted, with_mass), 1.0, 0.0)
    costs = {"target_extend_s": {3: 0.1}, "c": 0.5, "target_step_s": 0.1, "draft_step_s": 0.05}
    point = points.make_point(2, plain, spec, (0.0, 0.0), costs, greedy=True)
    row = json.loads(json.dumps(dataclasses.asdict(point)))  # as benchmark.json's points hold it
    if not with_mass:
        assert row["draft_mass_outside"] is None and row["draft_mass_outside_rows"] is None
        return
    assert row["draft_mass_outside"] == pytest.approx(4.5 / 19)
    assert row["draft_mass_outside_rows"] == pytest.approx([1.0 / 4, 0.5 / 5, 3.0 / 10])


def test_the_cache_is_sized_by_the_prompts_spelling_and_k_per_generated_token(drafter):
    """The draft's cache: the prompt's draft tokens (K per prompt token unfitted; the fitted
    prompts' longest spelling, `fit_prompts`; the draft prompts' width) + K per generated token
    (max_decode_len + gamma + 2) + K + gamma; `need` is a batch's own, from the tables."""
    drafter, params = drafter
    tables = cross_tables.build_tables(
        _trained(DRAFT_TEXT, 280, "</s>"), _trained(TARGET_TEXT, 300, "<|endoftext|>")
    )
    lengths, k = tables.spelling_lengths, drafter.width
    np.testing.assert_array_equal(drafter.spelling_lengths, lengths)
    batch = {"prompt": jnp.zeros((2, 20), jnp.int32), "prompt_lengths": jnp.full((2,), 20)}
    config = decoding.DecodeConfig(100, (0,), gamma=4)
    reserve = k * 106 + k + 4
    assert drafter.cache_length(batch, config) == k * 20 + reserve  # unfitted: the worst case
    short = [[1, 2, 3], [4, 5]]
    fitted = drafter.fit_prompts(short)
    spelled = max(int(np.sum(lengths[p])) for p in short)
    assert fitted.prompt_slots == spelled < k * 20
    assert fitted.cache_length(batch, config) == spelled + reserve
    assert fitted.prompt_window(batch, config) == spelled
    assert fitted != drafter  # a jit key of its own
    rows = jnp.asarray([[1, 2, 3, 0], [4, 5, 0, 0]], jnp.int32)
    mine = {"prompt": rows, "prompt_lengths": jnp.asarray([3, 2], jnp.int32)}
    assert fitted.need(mine, config) == spelled + reserve
    own = {**batch, cross_vocab.DRAFT_PROMPT: jnp.zeros((2, 9), jnp.int32)}
    assert drafter.cache_length(own, config) == 9 + reserve


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
    from speculative.loading import specs as ml
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


def test_the_notebook_gives_a_draft_with_its_own_tokenizer_the_text(tmp_path):
    """`load_pair` with a draft GGUF of another tokenizer: `generate` and `chat` hand the draft
    each prompt's text in its own tokens (issue 54), not the target's ids spelled through the
    tables; the output stays the target's own (greedy identity with plain decoding)."""
    import speculative

    target = write_bpe_model(_trained(TARGET_TEXT, 300, "<|endoftext|>"), tmp_path / "t.gguf", 0)
    draft = write_bpe_model(_trained(DRAFT_TEXT, 280, "</s>"), tmp_path / "d.gguf", 1)
    pair = speculative.load_pair(str(target), str(draft), dtype="float32")
    assert isinstance(pair.draft.model, cross_vocab.CrossVocabDrafter)
    texts = [TARGET_TEXT[0], DRAFT_TEXT[0]]
    ids = [pair.vocabulary.encode(t) for t in texts]
    batch = pair.batch(ids, texts)
    own = [pair.draft_vocabulary.encode(t) for t in texts]
    lengths = np.asarray(batch[cross_vocab.DRAFT_LENGTHS]).tolist()
    assert lengths == [len(x) for x in own]
    rows = np.asarray(batch[cross_vocab.DRAFT_PROMPT])
    assert [rows[i, : lengths[i]].tolist() for i in range(2)] == own
    assert cross_vocab.DRAFT_PROMPT not in pair.batch(ids)  # no texts: spelled by the tables
    spec = pair.generate(texts, max_new_tokens=10, gamma=2)
    assert spec.tokens == pair.generate(texts, max_new_tokens=10, speculative=False).tokens
    assert spec.stats["drafted"] > 0


def test_the_notebook_refuses_a_draft_vocabulary_it_would_ignore(tmp_path):
    """`load_pair(..., draft_vocabulary=...)` with a GGUF draft: the draft is read with its file's
    own tokenizer whatever is passed (as the jobs read it), so passing another is refused, naming
    both, before anything loads (issue 57; was: silently ignored)."""
    import speculative
    from speculative.errors import JobError
    from speculative.loading import specs as ml

    target = write_bpe_model(_trained(TARGET_TEXT, 300, "<|endoftext|>"), tmp_path / "t.gguf", 0)
    draft = write_bpe_model(_trained(DRAFT_TEXT, 280, "</s>"), tmp_path / "d.gguf", 1)
    byte = ml.VocabSpec("byte", extra_ids=0)
    with pytest.raises(
        JobError,
        match=r"draft_vocabulary=.*byte.* would be ignored: a gguf draft "
        r"is read with the tokenizer its file carries \(.*d\.gguf\)",
    ):
        speculative.load_pair(str(target), str(draft), dtype="float32", draft_vocabulary=byte)
