"""Gemma 2 and Gemma 3 (text) from Hugging Face directories (format 'hf', models.gemma).

Tiny random models built and saved by `transformers` itself, with a sliding window of 4 positions so
that every prompt here is longer than it; their norm weights are randomised (transformers starts
them at 0, which would hide the (1 + w) convention). transformers' forward pass and greedy
`generate` are the oracles; torch and transformers are test oracles only.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding, infer
from speculative.checkpoints import hf_model, load_hf_decoder
from speculative.errors import JobError
from speculative.loading import specs as ml
from speculative.measure import memory
from speculative.models.gemma import GemmaConfig, GemmaLM
from speculative.parallel import partitioning
from tests import helpers
from tests.test_hf_decoder import TEXTS, _tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[1]
V, WINDOW = 320, 4
SMALL = dict(
    vocab_size=V, hidden_size=32, intermediate_size=48, num_attention_heads=4, head_dim=16,
    max_position_embeddings=256, initializer_range=0.3, sliding_window=WINDOW,
)  # fmt: skip
GEMMA3_ROPE = {
    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
}
# name -> (transformers class prefix, config overrides)
VARIANTS = {
    "gemma2": ("Gemma2", dict(num_hidden_layers=3, num_key_value_heads=2, query_pre_attn_scalar=24,
                              attn_logit_softcapping=2.0, final_logit_softcapping=10.0)),
    "gemma2_draft": ("Gemma2", dict(num_hidden_layers=1, num_key_value_heads=1)),
    "gemma3": ("Gemma3Text", dict(num_hidden_layers=3, num_key_value_heads=2, query_pre_attn_scalar=8,
                                  rope_parameters=GEMMA3_ROPE, sliding_window_pattern=3,
                                  final_logit_softcapping=20.0)),
    "gemma3_draft": ("Gemma3Text", dict(num_hidden_layers=2, num_key_value_heads=1,
                                        tie_word_embeddings=False)),
}  # fmt: skip


def _save(directory: pathlib.Path, name: str, seed: int) -> pathlib.Path:
    arch, overrides = VARIANTS[name]
    config = getattr(transformers, f"{arch}Config")(**copy.deepcopy({**SMALL, **overrides}))
    torch.manual_seed(seed)
    causal = "Gemma3" if arch == "Gemma3Text" else arch
    model = getattr(transformers, f"{causal}ForCausalLM")(config).eval()
    with torch.no_grad():
        for key, weight in model.named_parameters():
            if key.endswith("norm.weight"):
                weight.normal_(0.0, 0.5)
    out = directory / name
    model.save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("gemma")
    return {name: _save(root, name, seed=i) for i, name in enumerate(VARIANTS)}


def _reference(directory: pathlib.Path, ids: np.ndarray) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        return model(torch.as_tensor(ids)).logits.numpy()


def _logits(config: GemmaConfig, params, ids: np.ndarray) -> np.ndarray:
    return np.asarray(helpers.prefill_logits(GemmaLM(config), params, ids))


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_logits_equal_transformers(saved, name):
    """A 24-token prompt through a window of 4: local layers see 4 keys, global ones all."""
    config, params = load_hf_decoder(saved[name])
    assert isinstance(config, GemmaConfig) and config.sliding_window == WINDOW
    assert config.local_layers == ((True, False, True) if name == "gemma2" else (True, True, False))
    ids = np.random.default_rng(0).integers(0, V, size=(2, 24))
    expected = _reference(saved[name], ids)
    ours = _logits(config, params, ids)
    scale = np.abs(expected).max()
    assert scale > 1.0
    np.testing.assert_allclose(ours, expected, atol=2e-5 * scale, rtol=0)
    # The test can fail: without the window, the soft-caps or the (1 + w) norms, logits differ.
    changed = [dataclasses.replace(config, local_layers=())]
    changed.append(dataclasses.replace(config, final_softcap=0.0, attn_softcap=0.0))
    changed.append(dataclasses.replace(config, rope_scaling=()))
    for other in changed[:2] if name == "gemma2" else changed[::2]:
        assert np.abs(_logits(other, params, ids) - expected).max() > 100 * 2e-5 * scale
    assert config.qk_norm == (name == "gemma3")


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_plain_steps_verify_blocks_and_trees_respect_the_window(saved, name):
    """Prefill 10 tokens, one plain step, a verify block of 4, then a tree whose path 0 -> 2 -> 3
    is the real continuation (the others are decoys): every real token's logits equal the full
    forward pass's at its position. Tree token 3 sits at slot index + 3 but position index + 2,
    so a window counted in slots would see one key too few."""
    config, params = load_hf_decoder(saved[name])
    model = GemmaLM(config)
    ids = np.random.default_rng(1).integers(2, V, size=(2, 18))
    expected = _reference(saved[name], ids)
    tokens = jnp.asarray(ids, jnp.int32)
    state = model.init_state(params, {"prompt": tokens}, 24)
    extend = jax.jit(model.extend)  # one program per block length
    got = []
    for start, stop in ((0, 10), (10, 11), (11, 15)):
        logits, state = extend(params, state, tokens[:, start:stop])
        got.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(got, 1), expected[:, :15], atol=1e-4, rtol=0)
    # Tree: 0 root (token 15), 1 decoy child of 0, 2 = token 16 child of 0, 3 = token 17 child of
    # 2, 4 decoy child of 1.
    parents = [-1, 0, 0, 2, 1]
    ancestors = np.eye(5, dtype=bool)
    for i, parent in enumerate(parents):
        while parent >= 0:
            ancestors[i, parent], parent = True, parents[parent]
    tree = jnp.stack([tokens[:, 15], tokens[:, 3], tokens[:, 16], tokens[:, 17], tokens[:, 5]], 1)
    logits, _ = jax.jit(lambda p, s, t: model.extend(p, s, t, ancestors))(params, state, tree)
    real = np.asarray(logits)[:, [0, 2, 3]]
    np.testing.assert_allclose(real, expected[:, 15:18], atol=1e-4, rtol=0)


def _pair(saved, target: str, draft: str):
    (tc, tp), (dc, dp) = load_hf_decoder(saved[target]), load_hf_decoder(saved[draft])
    return (hf_model(tc), tp), (hf_model(dc), dp)


@pytest.mark.parametrize(
    "names",
    [("gemma2", "gemma2_draft"), pytest.param(("gemma3", "gemma3_draft"), marks=pytest.mark.slow)],
)
def test_greedy_speculative_equals_plain(saved, names):
    """Chains, the block rule and a tree, batch 2 with ragged prompts longer than the window."""
    (target, tp), (draft, dp) = _pair(saved, *names)
    prompt = np.random.default_rng(2).integers(3, V, size=(2, 9))
    prompt[1, 6:] = 0  # right-padded: row 1 has 6 tokens
    batch = {"prompt": jnp.asarray(prompt, jnp.int32), "prompt_lengths": jnp.asarray([9, 6])}
    plain = decoding.autoregressive_decode(target, tp, batch, max_decode_len=12, eos_id=0)
    runs = {
        "chain": dict(gamma=3),
        "block": dict(gamma=3, acceptance="block"),
        "tree": dict(tree=(2, 2, 1)),
    }
    for kind, options in runs.items():
        spec = decoding.speculative_decode(
            target, tp, draft, dp, batch, max_decode_len=12, eos_id=0, **options
        )
        np.testing.assert_array_equal(spec.tokens, plain.tokens, err_msg=kind)
        np.testing.assert_array_equal(spec.lengths, plain.lengths, err_msg=kind)


PROMPTS = ["def add(a, b):", "Hello, world! Hello"]


def _generate(directory: pathlib.Path, vocabulary, max_new: int) -> list[list[int]]:
    """transformers' greedy generate, one prompt at a time, with our job's stop ids and the
    padding ids past the tokenizer suppressed (the job masks them)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    used = len(vocabulary.tokens)
    outs = []
    for text in PROMPTS:
        ids = torch.as_tensor([vocabulary.encode(text)])
        with torch.no_grad():
            out = model.generate(
                ids, max_new_tokens=max_new, do_sample=False, eos_token_id=[0, 1],
                pad_token_id=0, suppress_tokens=list(range(used, V)),
            )  # fmt: skip
        outs.append(out[0, ids.shape[1] :].tolist())
    return outs


@pytest.mark.parametrize(
    "mode",
    [
        "plain",
        "chain",
        pytest.param("block", marks=pytest.mark.slow),
        pytest.param("tree", marks=pytest.mark.slow),
    ],
)
def test_infer_cli_equals_transformers_generate(saved, tmp_path, monkeypatch, mode):
    monkeypatch.chdir(ROOT)
    target, draft = saved["gemma3"], saved["gemma3_draft"]
    for directory in (target, draft):
        _tokenizer(directory, TEXTS * 20)
    gin_file = tmp_path / "gemma.gin"
    gin_file.write_text(
        f"TARGET_FORMAT = 'hf'\nTARGET_CHECKPOINT = '{target}'\n"
        f"DRAFT_FORMAT = 'hf'\nDRAFT_CHECKPOINT = '{draft}'\n"
        "VOCABULARY = @target/speculative.VocabSpec()\ntarget/speculative.VocabSpec.kind = 'hf'\n"
        "target/speculative.VocabSpec.path = %TARGET_CHECKPOINT\n"
        "TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 10}\n"
    )
    flags = {
        "plain": ["--gin.SPECULATIVE=False"],
        "chain": ["--gin.GAMMA=3"],
        "block": ["--gin.GAMMA=3", "--gin.ACCEPTANCE='block'"],
        "tree": ["--gin.TREE=(2, 2, 1)"],
    }[mode]
    inputs = helpers.write_jsonl(tmp_path / "in.jsonl", PROMPTS)
    out = tmp_path / "out"
    infer.main(
        ["--gin_file=configs/runs/infer.gin", f"--gin_file={gin_file}", *helpers.QUIET_INFER,
         f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_DIR='{out}'", "--gin.BATCH_SIZE=2", *flags]
    )  # fmt: skip
    rows, summary = helpers.read_outputs(out)
    assert summary["examples"] == 2
    vocabulary = ml.load_vocabulary(ml.VocabSpec(kind="hf", path=str(target)))
    assert [r["output_ids"] for r in rows] == _generate(target, vocabulary, 10)


# ------------------------------------------------------------------------------------------------
# Unsupported fields: one-line errors naming the field and the file.


@pytest.mark.parametrize(
    "name, edit, expected",
    [
        ("gemma2", {"hidden_activation": "gelu"}, "hidden_activation 'gelu' is not supported"),
        ("gemma2", {"attention_bias": True}, "attention_bias is true"),
        ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention is true"),
        ("gemma3", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping is set"),
        ("gemma2", {"layer_types": ["chunked_attention"] * 3}, "layer kind 'chunked_attention'"),
        ("gemma3", {"model_type": "gemma3"}, "model_type 'gemma3' is not a supported"),
    ],
)
def test_unsupported_gemma_fields_are_refused(saved, tmp_path, name, edit, expected):
    directory = tmp_path / name
    directory.mkdir()
    for file in saved[name].iterdir():
        (directory / file.name).symlink_to(file)
    config = json.loads((saved[name] / "config.json").read_text())
    (directory / "config.json").unlink()
    (directory / "config.json").write_text(json.dumps({**config, **edit}))
    with pytest.raises(JobError) as info:
        ml.load_model(ml.ModelSpec(format="hf", path=str(directory)), "target")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"target {directory}: ")
    assert f"config.json: config {expected}" in message or f"config.json: {expected}" in message


def test_v4_gemma3_config_layout(saved, tmp_path):
    """transformers 4's Gemma 3 fields: rope_theta (global) + rope_scaling (global only) +
    rope_local_base_freq (local) + sliding_window_pattern, read as the version 5 layout."""
    new, _ = load_hf_decoder(saved["gemma3"])
    directory = tmp_path / "v4"
    directory.mkdir()
    for file in saved["gemma3"].iterdir():
        if file.name != "config.json":
            (directory / file.name).symlink_to(file)
    config = json.loads((saved["gemma3"] / "config.json").read_text())
    config.pop("rope_parameters"), config.pop("layer_types")
    config.update(rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=3)
    config.update(rope_scaling={"rope_type": "linear", "factor": 2.0})
    (directory / "config.json").write_text(json.dumps(config))
    old, _ = load_hf_decoder(directory)
    assert old == new


def test_partitioning_and_memory_read_the_gemma_tree():
    """Every Gemma parameter carries logical axes the rules know: on a 1 x 2 mesh the heads, MLP
    and vocabulary split, the (1 + w) norm scales (embed, kv) are replicated."""
    config = GemmaConfig(64, 16, 2, 4, 2, 8, 32, sliding_window=WINDOW, qk_norm=True,
                         local_layers=(True, False))  # fmt: skip
    model = GemmaLM(config)
    total = sum(x.size for x in jax.tree.leaves(partitioning.param_shapes(model)))
    whole = memory.param_bytes(model, partitioning.TARGET_RULES, {"data": 1, "model": 1}, "float32")
    half = memory.param_bytes(model, partitioning.TARGET_RULES, {"data": 1, "model": 2}, "float32")
    assert whole == 4 * total
    norms = 2 * 4 * 16 + 2 * 2 * 8 + 16  # four per layer, q/k norms, the final norm
    assert half == 4 * (norms + (total - norms) // 2)
    axes = partitioning.param_axes(model)
    assert axes["layers_0"]["self_attention"]["query_norm"]["scale"] == jax.sharding.PartitionSpec(
        "kv"
    )
