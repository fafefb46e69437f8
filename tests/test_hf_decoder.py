"""Hugging Face Llama / Qwen2 / Mistral checkpoints (format 'hf') and tokenizer.json (kind 'hf').

The fixtures are tiny random models built and saved by `transformers` itself (safetensors, one with
a sharded index), and a tiny BPE tokenizer built with `tokenizers`; transformers' own forward pass
is the oracle for our logits. torch and transformers are test oracles only.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from speculative import decoding, infer, vocab
from speculative.checkpoints import load_hf_decoder
from speculative.errors import JobError
from speculative.loading import specs as ml
from speculative.models.decoder import DecoderLM
from tests import helpers

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[1]
V = 320  # model rows; the tokenizer below has fewer (the rest is padding the jobs mask)
SMALL = dict(
    vocab_size=V, hidden_size=32, intermediate_size=48, num_attention_heads=4,
    max_position_embeddings=256, initializer_range=0.3,
)  # fmt: skip

# name -> (model class, config class, config overrides, save_pretrained max_shard_size)
VARIANTS = {
    "llama_tied": ("Llama", dict(num_hidden_layers=2, num_key_value_heads=4, tie_word_embeddings=True), None),
    "llama_sharded_llama3": ("Llama", dict(
        num_hidden_layers=2, num_key_value_heads=2, rope_theta=500.0, rope_scaling=dict(
            rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=16)), "30KB"),
    "llama_linear": ("Llama", dict(num_hidden_layers=1, num_key_value_heads=2,
                                   rope_scaling=dict(rope_type="linear", factor=4.0)), None),
    "llama_yarn": ("Llama", dict(num_hidden_layers=1, num_key_value_heads=2, max_position_embeddings=64,
                                 rope_scaling=dict(rope_type="yarn", factor=4.0,
                                                   original_max_position_embeddings=16)), None),
    "qwen2_gqa_bias": ("Qwen2", dict(num_hidden_layers=2, num_key_value_heads=1, rms_norm_eps=1e-5,
                                     tie_word_embeddings=False), None),
    "qwen2_draft": ("Qwen2", dict(num_hidden_layers=1, num_key_value_heads=1, rms_norm_eps=1e-5,
                                  tie_word_embeddings=True), None),
    "mistral_head_dim": ("Mistral", dict(num_hidden_layers=1, num_key_value_heads=2, head_dim=16,
                                         sliding_window=48), None),
}  # fmt: skip


def _save(directory: pathlib.Path, name: str, seed: int = 0) -> pathlib.Path:
    arch, overrides, shard = VARIANTS[name]
    config = getattr(transformers, f"{arch}Config")(**{**SMALL, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, f"{arch}ForCausalLM")(config).eval()
    out = directory / name
    model.save_pretrained(out, safe_serialization=True, max_shard_size=shard or "5GB")
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("hf")
    return {name: _save(root, name, seed=i) for i, name in enumerate(VARIANTS)}


def _logits(config, params, ids: np.ndarray) -> np.ndarray:
    return np.asarray(_apply_decoder(DecoderLM(config), params, jnp.asarray(ids, jnp.int32)))


@functools.partial(jax.jit, static_argnums=0)
def _apply_decoder(model, params, ids):
    """One decoder pass, jitted (the model static, hashable by config): one program, not op by op."""
    state = model.init_state(params, {"prompt": ids}, ids.shape[1])
    positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
    return model.apply_decoder(params, state, ids, positions)[0]


@pytest.mark.parametrize("name", [n for n in VARIANTS if n != "qwen2_draft"])
def test_logits_equal_transformers(saved, name):
    directory = saved[name]
    config, params = load_hf_decoder(directory)
    ids = np.random.default_rng(0).integers(0, V, size=(2, 40))
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        expected = reference(torch.as_tensor(ids)).logits.numpy()
    ours = _logits(config, params, ids)
    scale = np.abs(expected).max()
    assert scale > 1.0  # large enough weights that a wrong RoPE or layout shows
    np.testing.assert_allclose(ours, expected, atol=2e-5 * scale, rtol=0)
    if config.rope_scaling:  # the test can fail: plain RoPE gives other logits
        plain = _logits(dataclasses.replace(config, rope_scaling=()), params, ids)
        assert np.abs(plain - expected).max() > 100 * 2e-5 * scale
    layers = {"sharded": "model.safetensors.index.json", "tied": "model.safetensors"}
    for key, file in layers.items():
        if key in name:
            assert (directory / file).exists()
    assert config.tie_word_embeddings == ("tied" in name)
    assert ("logits_dense" in params) != config.tie_word_embeddings


def test_config_fields(saved):
    qwen, _ = load_hf_decoder(saved["qwen2_gqa_bias"])
    assert (qwen.num_heads, qwen.num_kv_heads, qwen.qkv_bias, qwen.norm_eps) == (4, 1, True, 1e-5)
    mistral, _ = load_hf_decoder(saved["mistral_head_dim"])
    assert mistral.head_dim == 16 and mistral.max_seq_len == 48  # capped at the window
    half, _ = load_hf_decoder(saved["qwen2_draft"], dtype=jnp.bfloat16)
    assert half.dtype == "bfloat16"


@pytest.mark.parametrize("stored", [ml_dtypes.bfloat16, np.float16])
def test_half_precision_files_read_as_the_requested_dtype(saved, tmp_path, stored):
    directory = _copy(saved, "qwen2_draft", tmp_path)
    _rewrite(directory, lambda t: t.update({k: v.astype(stored) for k, v in t.items()}))
    _, params = load_hf_decoder(directory, dtype=jnp.float32)
    _, full = load_hf_decoder(saved["qwen2_draft"], dtype=jnp.float32)
    for ours, reference in zip(jax.tree.leaves(params), jax.tree.leaves(full)):
        assert ours.dtype == jnp.float32
        expected = np.asarray(reference).astype(stored).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(ours), expected)


def test_greedy_speculative_equals_plain(saved):
    target = load_hf_decoder(saved["qwen2_gqa_bias"])
    draft = load_hf_decoder(saved["qwen2_draft"])
    (tc, tp), (dc, dp) = target, draft
    batch = helpers.ragged_prompts(0, batch=2, width=6, vocab=V, low=3)
    plain = decoding.autoregressive_decode(DecoderLM(tc), tp, batch, max_decode_len=10, eos_id=0)
    spec = decoding.speculative_decode(
        DecoderLM(tc), tp, DecoderLM(dc), dp, batch, gamma=3, max_decode_len=10, eos_id=0
    )
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    np.testing.assert_array_equal(spec.lengths, plain.lengths)


# ------------------------------------------------------------------------------------------------
# One-line errors naming the tensor (or field) and the file.


def _copy(saved, name: str, tmp_path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(shutil.copytree(saved[name], tmp_path / name))


def _load_error(directory: pathlib.Path) -> str:
    with pytest.raises(JobError) as info:
        ml.load_model(ml.ModelSpec(format="hf", path=str(directory)), "target")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"target {directory}: ")
    return message


def _rewrite(directory: pathlib.Path, edit) -> None:
    file = directory / "model.safetensors"
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def test_missing_wrong_shape_and_wrong_dtype_tensors(saved, tmp_path):
    name = "model.layers.1.mlp.up_proj.weight"
    missing = _copy(saved, "qwen2_gqa_bias", tmp_path / "missing")
    _rewrite(missing, lambda t: t.pop(name))
    assert f"tensor '{name}' is missing" in _load_error(missing)

    shape = _copy(saved, "qwen2_gqa_bias", tmp_path / "shape")
    _rewrite(
        shape, lambda t: t.update({"model.layers.0.self_attn.k_proj.bias": np.zeros(16, "f4")})
    )
    message = _load_error(shape)
    assert (
        "model.safetensors: tensor 'model.layers.0.self_attn.k_proj.bias' has shape (16,)"
        in message
    )
    assert "implies (8,)" in message

    extra = _copy(saved, "qwen2_gqa_bias", tmp_path / "extra")
    _rewrite(extra, lambda t: t.update({"model.layers.2.mlp.up_proj.weight": t[name]}))
    assert "unexpected tensor 'model.layers.2.mlp.up_proj.weight'" in _load_error(extra)

    ints = _copy(saved, "qwen2_gqa_bias", tmp_path / "ints")
    _rewrite(ints, lambda t: t.update({name: t[name].astype(np.int32)}))
    assert f"tensor '{name}' has dtype I32" in _load_error(ints)


def test_tied_head_and_stored_rope_buffers_are_checked(saved, tmp_path):
    """A tied config's lm_head.weight must equal the embedding (transformers would drop it); old
    Llama files' rotary_emb.inv_freq buffers must equal the config's frequencies."""
    untied = _copy(saved, "qwen2_gqa_bias", tmp_path / "untied")
    config = json.loads((untied / "config.json").read_text())
    (untied / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    assert "'lm_head.weight' differs from 'model.embed_tokens.weight'" in _load_error(untied)

    buffers = _copy(saved, "qwen2_draft", tmp_path / "buffers")
    name = "model.layers.0.self_attn.rotary_emb.inv_freq"
    inv = 10000.0 ** (-np.arange(0, 8, 2) / 8)
    _rewrite(buffers, lambda t: t.update({name: inv.astype(np.float32)}))
    load_hf_decoder(buffers)
    _rewrite(buffers, lambda t: t.update({name: (inv / 2).astype(np.float32)}))
    assert f"tensor '{name}' differs from the RoPE frequencies" in _load_error(buffers)


def test_pickle_only_directory_is_refused(saved, tmp_path):
    directory = tmp_path / "bin"
    directory.mkdir()
    shutil.copy(saved["qwen2_draft"] / "config.json", directory)
    (directory / "pytorch_model.bin").write_bytes(b"not opened")
    message = _load_error(directory)
    assert "only pickled weights (pytorch_model.bin)" in message and "safetensors" in message


@pytest.mark.parametrize(
    "edit, expected",
    [
        ({"rope_type": "longrope"}, "RoPE scaling type 'longrope' is not supported"),
        ({"rope_type": "linear"}, "RoPE scaling 'linear' needs 'factor'"),
        ({"partial_rotary_factor": 0.5}, "partial rotary embeddings"),
    ],
)
def test_unsupported_rope_is_refused(saved, tmp_path, edit, expected):
    directory = _copy(saved, "qwen2_draft", tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config["rope_parameters"] = {**config["rope_parameters"], **edit}
    (directory / "config.json").write_text(json.dumps(config))
    message = _load_error(directory)
    assert f"config.json: {expected}" in message


def test_dynamic_rope_and_v4_config_layout(saved, tmp_path):
    """transformers 4's rope_theta + rope_scaling ('type'); 'dynamic' is plain RoPE up to
    max_position_embeddings, so the context is capped there."""
    directory = _copy(saved, "qwen2_draft", tmp_path)
    config = json.loads((directory / "config.json").read_text())
    theta = config.pop("rope_parameters")["rope_theta"]
    config.update(rope_theta=theta, rope_scaling={"type": "dynamic", "factor": 2.0})
    config.update(max_position_embeddings=100, use_sliding_window=True, sliding_window=60)
    config.update(max_window_layers=1)  # the one layer is full attention: no window
    config.pop("layer_types")
    (directory / "config.json").write_text(json.dumps(config))
    loaded, _ = load_hf_decoder(directory)
    assert loaded.rope_scaling == () and loaded.rope_theta == theta and loaded.max_seq_len == 100


# ------------------------------------------------------------------------------------------------
# tokenizer.json (VocabSpec kind 'hf') and the inference job.


def _tokenizer(directory: pathlib.Path, texts: list[str], eos: str = "<|endoftext|>") -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos}))


TEXTS = ["def add(a, b):\n    return a + b\n", "Hello, world! Hello again.", "x = 1; y = 2"]


def test_tokenizer_json_round_trip_and_compatibility(tmp_path):
    _tokenizer(tmp_path / "a", TEXTS * 20)
    vocabulary = ml.load_vocabulary(ml.VocabSpec(kind="hf", path=str(tmp_path / "a")))
    assert isinstance(vocabulary, vocab.Vocabulary)
    text = "def mul(x, y):\n\treturn x * y  # ünïcode"
    ids = vocabulary.encode(text)
    assert vocabulary.decode(ids) == text
    reference = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tmp_path / "a/tokenizer.json")
    )
    assert ids == reference(text)["input_ids"]
    assert vocabulary.tokens[vocabulary.eos_id] == "<|endoftext|>"
    assert set(vocabulary.stop_ids) == {0, 1}  # EOS and <|im_end|>
    same = ml.load_vocabulary(ml.VocabSpec(kind="hf", path=str(tmp_path / "a/tokenizer.json")))
    vocab.check_compatible(same, vocabulary)

    _tokenizer(tmp_path / "b", TEXTS[:1] * 20)  # other merges, other pieces
    with pytest.raises(JobError, match="draft vocabulary .*: draft and target vocabularies differ"):
        ml.check_draft_vocabulary(ml.VocabSpec(kind="hf", path=str(tmp_path / "b")), vocabulary)
    (tmp_path / "a/tokenizer_config.json").write_text(json.dumps({"eos_token": "<nope>"}))
    with pytest.raises(JobError, match="eos_token '<nope>' is not a token"):
        ml.load_vocabulary(ml.VocabSpec(kind="hf", path=str(tmp_path / "a")))


def test_infer_job_with_hf_target_and_draft(saved, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    for name in ("qwen2_gqa_bias", "qwen2_draft"):
        _tokenizer(saved[name], TEXTS * 20)
    gin_file = tmp_path / "hf.gin"
    gin_file.write_text(
        f"TARGET_FORMAT = 'hf'\nTARGET_CHECKPOINT = '{saved['qwen2_gqa_bias']}'\n"
        f"DRAFT_FORMAT = 'hf'\nDRAFT_CHECKPOINT = '{saved['qwen2_draft']}'\n"
        "VOCABULARY = @target/speculative.VocabSpec()\ntarget/speculative.VocabSpec.kind = 'hf'\n"
        "target/speculative.VocabSpec.path = %TARGET_CHECKPOINT\n"
        "DRAFT_VOCABULARY = @draft/speculative.VocabSpec()\ndraft/speculative.VocabSpec.kind = 'hf'\n"
        "draft/speculative.VocabSpec.path = %DRAFT_CHECKPOINT\n"
        "TASK_FEATURE_LENGTHS = {'inputs': 16, 'targets': 10}\n"
    )
    inputs = helpers.write_jsonl(tmp_path / "in.jsonl", ["def add(a, b):", "Hello"])
    rows = {}
    for speculative in (True, False):
        out = tmp_path / f"out_{speculative}"
        infer.main(
            ["--gin_file=configs/runs/infer.gin", f"--gin_file={gin_file}", *helpers.QUIET_INFER,
             f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_DIR='{out}'", "--gin.BATCH_SIZE=2",
             "--gin.GAMMA=3", f"--gin.SPECULATIVE={speculative}"]
        )  # fmt: skip
        rows[speculative], summary = helpers.read_outputs(out)
        assert summary["examples"] == 2
    assert [r["output_ids"] for r in rows[True]] == [r["output_ids"] for r in rows[False]]
    assert all(max(r["output_ids"]) < 300 for r in rows[True])  # padding ids 300.. are masked
    assert os.path.basename(str(saved["qwen2_gqa_bias"])) in json.dumps(summary)


def test_notebook_api_loads_hf_directories_by_path(saved):
    """`speculative.load_pair` on two Hugging Face directories: the format ('hf') and the
    vocabulary (their tokenizer.json, checked against each other) come from the paths alone."""
    import speculative

    for name in ("qwen2_gqa_bias", "qwen2_draft"):
        _tokenizer(saved[name], TEXTS * 20)
    pair = speculative.load_pair(str(saved["qwen2_gqa_bias"]), draft=str(saved["qwen2_draft"]))
    spec = pair.generate(["def add(a, b):", "Hello"], max_new_tokens=10, gamma=3)
    plain = pair.generate(["def add(a, b):", "Hello"], max_new_tokens=10, speculative=False)
    assert spec.tokens == plain.tokens and spec.texts == plain.texts
    assert all(max(t) < 300 for t in spec.tokens) and "alpha" in spec.stats
