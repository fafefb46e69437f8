"""checkpoints.load_gguf on small GGUF files written here with gguf.GGUFWriter.

Covers: every type gguf-py can quantise (exact placement against gguf's own dequantisation of the
same bytes, and closeness to the source within quantisation error), K-quants from raw blocks,
GGUF's dimension order and llama.cpp's Q/K row permutation (by comparing full forward passes with
transformers' PyTorch Llama / Qwen2 on the same weights), config from metadata, and clear errors
for truncated / corrupt files, unsupported architectures, and missing or mis-shaped tensors.
"""

from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative.checkpoints import load_gguf
from speculative.models.decoder import DecoderLM
from tests import gguf_testutil as gt
from tests import helpers

Q = gguf.GGMLQuantizationType
# E is a multiple of 256 so that K-quant blocks fit a row.
HP = dict(
    emb=256, layers=2, heads=4, kv_heads=2, mlp=256, context=512, rope_theta=10000.0, eps=1e-5
)
VOCAB = 64


def random_hf_state(rng, hp=HP, vocab=VOCAB, bias=False, tied=False):
    """HF-layout (PyTorch [out, in]) random weights of a llama/qwen2 model, float32."""
    e, h, k, m = hp["emb"], hp["heads"], hp["kv_heads"], hp["mlp"]
    d = e // h

    def normal(*shape, std=0.2):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    state = {
        "model.embed_tokens.weight": normal(vocab, e, std=1.0),
        "model.norm.weight": 1.0 + normal(e, std=0.1),
    }
    if not tied:
        state["lm_head.weight"] = normal(vocab, e, std=0.1)
    for i in range(hp["layers"]):
        p = f"model.layers.{i}."
        state.update(
            {
                p + "input_layernorm.weight": 1.0 + normal(e, std=0.1),
                p + "post_attention_layernorm.weight": 1.0 + normal(e, std=0.1),
                p + "self_attn.q_proj.weight": normal(h * d, e, std=e**-0.5),
                p + "self_attn.k_proj.weight": normal(k * d, e, std=e**-0.5),
                p + "self_attn.v_proj.weight": normal(k * d, e, std=e**-0.5),
                p + "self_attn.o_proj.weight": normal(e, h * d, std=e**-0.5),
                p + "mlp.gate_proj.weight": normal(m, e, std=e**-0.5),
                p + "mlp.up_proj.weight": normal(m, e, std=e**-0.5),
                p + "mlp.down_proj.weight": normal(e, m, std=m**-0.5),
            }
        )
        if bias:
            state[p + "self_attn.q_proj.bias"] = normal(h * d, std=0.5)
            state[p + "self_attn.k_proj.bias"] = normal(k * d, std=0.5)
            state[p + "self_attn.v_proj.bias"] = normal(k * d, std=0.5)
    return state


def expected_params(state, hp=HP):
    """The DecoderLM tree (decoder.py docstring) of an HF-layout state, flat {path: array}."""
    e, h, k = hp["emb"], hp["heads"], hp["kv_heads"]
    d = e // h
    out = {
        "token_embedder/embedding": state["model.embed_tokens.weight"],
        "decoder_norm/scale": state["model.norm.weight"],
    }
    if "lm_head.weight" in state:
        out["logits_dense/kernel"] = state["lm_head.weight"]
    for i in range(hp["layers"]):
        p, lay = f"model.layers.{i}.", f"layers_{i}/"
        a = lay + "self_attention/"
        out[lay + "pre_self_attention_layer_norm/scale"] = state[p + "input_layernorm.weight"]
        out[lay + "pre_mlp_layer_norm/scale"] = state[p + "post_attention_layernorm.weight"]
        out[a + "query/kernel"] = state[p + "self_attn.q_proj.weight"].reshape(h, d, e)
        out[a + "key/kernel"] = state[p + "self_attn.k_proj.weight"].reshape(k, d, e)
        out[a + "value/kernel"] = state[p + "self_attn.v_proj.weight"].reshape(k, d, e)
        out[a + "out/kernel"] = state[p + "self_attn.o_proj.weight"].reshape(e, h, d)
        out[lay + "mlp/wi_0/kernel"] = state[p + "mlp.gate_proj.weight"]
        out[lay + "mlp/wi_1/kernel"] = state[p + "mlp.up_proj.weight"]
        out[lay + "mlp/wo/kernel"] = state[p + "mlp.down_proj.weight"]
        for name in ("q", "k", "v"):
            key = f"{p}self_attn.{name}_proj.bias"
            if key in state:
                heads = h if name == "q" else k
                part = {"q": "query", "k": "key", "v": "value"}[name]
                out[f"{a}{part}/bias"] = state[key].reshape(heads, d)
    return out


def flat(params):
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return {"/".join(p.key for p in path): np.asarray(v) for path, v in leaves}


def write(tmp_path, state, arch="llama", qtype=Q.F32, name="m.gguf", hp=HP, **kw):
    tensors = gt.hf_to_gguf_tensors(state, arch, hp["heads"], hp["kv_heads"], hp["layers"])
    return gt.write_model(tmp_path / name, arch, hp, tensors, qtype, **kw)


def roundtrip(w, qtype):
    """What gguf itself dequantises the stored bytes of w to."""
    return gguf.quants.dequantize(gt.quantize(w, qtype), qtype).reshape(w.shape).astype(np.float32)


# Max |error| / max |x| per type: half a quantisation step, a whole one for Q4_0 / Q5_0, whose
# symmetric scale clips the extreme of the opposite sign (ggml block formats).
TOLERANCE = {
    Q.F32: 0.0,
    Q.F16: 1e-3,
    Q.BF16: 8e-3,
    Q.Q8_0: 5e-3,
    Q.Q5_0: 0.065,
    Q.Q5_1: 0.035,
    Q.Q4_0: 0.13,
    Q.Q4_1: 0.07,
}


@pytest.mark.parametrize("qtype", list(TOLERANCE), ids=lambda q: q.name)
def test_quant_types_reproduce_source(tmp_path, qtype):
    state = random_hf_state(np.random.default_rng(0), tied=False)
    path = write(tmp_path, state, "llama", qtype)
    config, params = load_gguf(path)
    got = flat(params)
    # 2-D weights are stored as qtype, 1-D ones as F32 (as llama.cpp does).
    stored = {k: (roundtrip(v, qtype) if v.ndim == 2 else v) for k, v in state.items()}
    exact, source = expected_params(stored), expected_params(state)
    assert set(got) == set(source)
    for key, want in source.items():
        assert got[key].dtype == np.float32
        # Exactly where gguf's dequantisation of the same bytes puts each value ...
        np.testing.assert_array_equal(got[key], exact[key], err_msg=key)
        # ... and within quantisation error of the source.
        err = np.abs(got[key] - want).max() / np.abs(want).max()
        assert err <= TOLERANCE[qtype], (key, err)


def random_kquant_bytes(rng, rows, cols, qtype):
    """Valid K-quant blocks: random quants and sub-scales, small finite f16 super-scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scale = (rng.uniform(0.5, 1.5, (rows, cols // block, 1)) * 1e-2).astype(np.float16)
    scale = scale.view(np.uint8)
    if qtype == Q.Q4_K:  # d, dmin, scales[12], qs[128]
        raw[..., 0:2], raw[..., 2:4] = scale, scale
    elif qtype == Q.Q6_K:  # ql[128], qh[64], scales[16], d
        raw[..., 208:210] = scale
    return raw.reshape(rows, -1)


def inverse_permute_rows(w, heads):
    order = gt.permute_rows(np.arange(w.shape[0])[:, None], heads)[:, 0]
    return w[np.argsort(order)]


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_k_quants_from_raw_blocks(tmp_path, qtype):
    rng = np.random.default_rng(1)
    state = random_hf_state(rng)
    e, h, k, m = HP["emb"], HP["heads"], HP["kv_heads"], HP["mlp"]
    d = e // h
    # Layer 0's Q (permuted rows), K and down projection as K-quants; the rest F32.
    shapes = {"attn_q": (h * d, e), "attn_k": (k * d, e), "ffn_down": (e, m)}
    raw = {
        f"blk.0.{n}.weight": (random_kquant_bytes(rng, *s, qtype), qtype) for n, s in shapes.items()
    }
    deq = {n: gguf.quants.dequantize(b, t) for n, (b, t) in raw.items()}
    state["model.layers.0.self_attn.q_proj.weight"] = inverse_permute_rows(
        deq["blk.0.attn_q.weight"], h
    )
    state["model.layers.0.self_attn.k_proj.weight"] = inverse_permute_rows(
        deq["blk.0.attn_k.weight"], k
    )
    state["model.layers.0.mlp.down_proj.weight"] = deq["blk.0.ffn_down.weight"]
    tensors = gt.hf_to_gguf_tensors(state, "llama", h, k, HP["layers"])
    for name in raw:
        del tensors[name]
    path = gt.write_model(tmp_path / "k.gguf", "llama", HP, tensors, raw=raw)
    _, params = load_gguf(path)
    got, want = flat(params), expected_params(state)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    assert np.abs(want["layers_0/mlp/wo/kernel"]).max() > 0


def test_unpermute_inverts_llama_cpp_permutation():
    from speculative.checkpoints.gguf import _unpermute_rows

    w = np.arange(4 * 8 * 3).reshape(4 * 8, 3)
    permuted = gt.permute_rows(w, 4)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(_unpermute_rows(permuted, 4), w)
    b = np.arange(2 * 6)
    np.testing.assert_array_equal(_unpermute_rows(gt.permute_rows(b, 2), 2), b)


FORWARD_HP = dict(
    emb=64, layers=2, heads=4, kv_heads=2, mlp=128, context=128, rope_theta=500.0, eps=1e-5
)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_forward_matches_transformers(tmp_path, arch):
    """Dimension order, Q/K permutation (llama), biases (qwen2), RoPE and tying, end to end."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hp = FORWARD_HP
    common = dict(
        vocab_size=VOCAB,
        hidden_size=hp["emb"],
        intermediate_size=hp["mlp"],
        num_hidden_layers=hp["layers"],
        num_attention_heads=hp["heads"],
        num_key_value_heads=hp["kv_heads"],
        max_position_embeddings=hp["context"],
        rms_norm_eps=hp["eps"],
        rope_theta=hp["rope_theta"],
    )
    if arch == "llama":  # tied embeddings, no biases
        cfg = transformers.LlamaConfig(tie_word_embeddings=True, **common)
        model_cls = transformers.LlamaForCausalLM
    else:  # untied, QKV biases
        cfg = transformers.Qwen2Config(tie_word_embeddings=False, **common)
        model_cls = transformers.Qwen2ForCausalLM
    torch.manual_seed(0)
    model = model_cls._from_config(cfg, attn_implementation="eager").eval()
    state = random_hf_state(
        np.random.default_rng(2), hp, bias=arch == "qwen2", tied=arch == "llama"
    )
    missing, unexpected = model.load_state_dict(
        {k: torch.from_numpy(v) for k, v in state.items()}, strict=False
    )
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    tokens = np.random.default_rng(3).integers(0, VOCAB, (2, 12))
    with torch.no_grad():
        ref = model(torch.from_numpy(tokens)).logits.numpy()

    config, params = load_gguf(write(tmp_path, state, arch, hp=hp))
    assert config.tie_word_embeddings == (arch == "llama")
    assert config.qkv_bias == (arch == "qwen2")
    lm = DecoderLM(config)
    logits = helpers.prefill_logits(lm, params, tokens, 16)
    np.testing.assert_allclose(np.asarray(logits), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_config_from_metadata(tmp_path):
    hp = dict(HP, context=333, rope_theta=12345.0, eps=3e-6)
    state = random_hf_state(np.random.default_rng(4), bias=True, tied=True)
    config, params = load_gguf(write(tmp_path, state, "qwen2", hp=hp), dtype=jnp.bfloat16)
    assert (config.vocab_size, config.emb_dim, config.num_layers) == (VOCAB, 256, 2)
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.mlp_dim) == (
        4,
        2,
        64,
        256,
    )
    assert config.max_seq_len == 333
    assert config.rope_theta == pytest.approx(12345.0)
    assert config.norm_eps == pytest.approx(3e-6)
    assert config.qkv_bias and config.tie_word_embeddings
    assert config.dtype == "bfloat16"
    assert {x.dtype for x in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    assert "logits_dense" not in params


def test_explicit_head_dim(tmp_path):
    """attention.key_length overrides emb / heads (head_dim 32 with 4 heads and emb 256)."""
    hp = dict(HP, head_dim=32)
    rng = np.random.default_rng(5)
    e, h, k, d = hp["emb"], hp["heads"], hp["kv_heads"], 32
    state = random_hf_state(rng, tied=True)
    for i in range(hp["layers"]):
        p = f"model.layers.{i}.self_attn."
        state[p + "q_proj.weight"] = rng.standard_normal((h * d, e)).astype(np.float32)
        state[p + "k_proj.weight"] = rng.standard_normal((k * d, e)).astype(np.float32)
        state[p + "v_proj.weight"] = rng.standard_normal((k * d, e)).astype(np.float32)
        state[p + "o_proj.weight"] = rng.standard_normal((e, h * d)).astype(np.float32)
    config, params = load_gguf(write(tmp_path, state, hp=hp))
    assert config.head_dim == 32
    got = flat(params)
    want = state["model.layers.1.self_attn.o_proj.weight"].reshape(e, h, d)
    np.testing.assert_array_equal(got["layers_1/self_attention/out/kernel"], want)


# ---- errors -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_file(tmp_path_factory):
    state = random_hf_state(np.random.default_rng(6), tied=True)
    return write(tmp_path_factory.mktemp("good"), state)


def test_truncated_file(tmp_path, good_file):
    data = good_file.read_bytes()
    for cut, what in ((len(data) - 1000, "truncated"), (200, "truncated or corrupt")):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=what):
            load_gguf(bad)


def test_corrupt_magic_and_missing_file(tmp_path, good_file):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + good_file.read_bytes()[4:])
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        load_gguf(bad)
    with pytest.raises(ValueError, match="not found"):
        load_gguf(tmp_path / "absent.gguf")


def test_unsupported_architecture(tmp_path):
    state = random_hf_state(np.random.default_rng(7), tied=True)
    tensors = gt.hf_to_gguf_tensors(state, "qwen2", HP["heads"], HP["kv_heads"], HP["layers"])
    path = gt.write_model(tmp_path / "f.gguf", "falcon", HP, tensors)
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'falcon'"):
        load_gguf(path)


def test_missing_and_unexpected_tensors(tmp_path):
    state = random_hf_state(np.random.default_rng(8), tied=True)
    tensors = gt.hf_to_gguf_tensors(state, "llama", HP["heads"], HP["kv_heads"], HP["layers"])
    missing = dict(tensors)
    del missing["blk.1.ffn_up.weight"]
    with pytest.raises(ValueError, match="GGUF tensor 'blk.1.ffn_up.weight' is missing"):
        load_gguf(gt.write_model(tmp_path / "a.gguf", "llama", HP, missing))
    extra = dict(tensors, **{"blk.0.attn_k_norm.weight": np.ones(64, np.float32)})
    with pytest.raises(ValueError, match="unexpected GGUF tensor 'blk.0.attn_k_norm.weight'"):
        load_gguf(gt.write_model(tmp_path / "b.gguf", "llama", HP, extra))


def test_wrong_shape_and_missing_metadata(tmp_path):
    state = random_hf_state(np.random.default_rng(9), tied=True)
    tensors = gt.hf_to_gguf_tensors(state, "llama", HP["heads"], HP["kv_heads"], HP["layers"])
    # metadata says 128-wide MLP, the tensors are 256 wide
    with pytest.raises(ValueError, match=r"layers_0/mlp/wi_0/kernel.*ffn_gate.*\(256, 256\)"):
        load_gguf(gt.write_model(tmp_path / "a.gguf", "llama", dict(HP, mlp=128), tensors))
    # metadata says 1 KV head, the K/V projections have 2
    with pytest.raises(ValueError, match=r"'blk.0.attn_k.weight' of shape \(128, 256\) does not"):
        load_gguf(gt.write_model(tmp_path / "c.gguf", "llama", dict(HP, kv_heads=1), tensors))
    w = gguf.GGUFWriter(str(tmp_path / "b.gguf"), "llama")
    w.add_block_count(2)
    w.add_tensor("token_embd.weight", np.zeros((VOCAB, 256), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"metadata key 'llama\.embedding_length' is missing"):
        load_gguf(tmp_path / "b.gguf")


def test_non_finite_values(tmp_path):
    state = random_hf_state(np.random.default_rng(10), tied=True)
    state["model.layers.1.mlp.up_proj.weight"][3, 5] = np.nan
    with pytest.raises(ValueError, match="layers_1/mlp/wi_1/kernel.*NaN"):
        load_gguf(write(tmp_path, state))


# ---- every error names the file ------------------------------------------------------------------


def test_errors_name_the_file(tmp_path):
    state = random_hf_state(np.random.default_rng(11), tied=True)
    tensors = gt.hf_to_gguf_tensors(state, "qwen2", HP["heads"], HP["kv_heads"], HP["layers"])
    falcon = gt.write_model(tmp_path / "f.gguf", "falcon", HP, tensors)
    with pytest.raises(ValueError, match=f"^{falcon}: unsupported GGUF architecture 'falcon'"):
        load_gguf(falcon)
    no_eps = dict(HP)
    path = gt.write_model(tmp_path / "e.gguf", "llama", dict(no_eps, eps=-1.0), tensors)
    with pytest.raises(ValueError, match=f"^{path}: .*layer_norm_rms_epsilon' is -1.0, not a pos"):
        load_gguf(path)


def test_missing_tokenizer_names_the_file(good_file):
    from speculative.vocab.gguf_vocab import from_gguf

    with pytest.raises(
        ValueError, match=f"^{good_file}: GGUF metadata key 'tokenizer.ggml.model' is missing"
    ):
        from_gguf(good_file)


def test_block_count_beyond_the_tensors_is_refused_up_front(tmp_path):
    """A corrupt layer count is refused before the model's shapes are built."""
    state = random_hf_state(np.random.default_rng(12), tied=True)
    path = write(tmp_path, state, hp=dict(HP, layers=2))
    data = bytearray(path.read_bytes())
    key = b"llama.block_count"
    at = data.index(key) + len(key) + 4  # then the uint32 value type, then the value
    data[at : at + 4] = (10**9).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"^{path}: llama.block_count is 1000000000, but the file"):
        load_gguf(path)


def test_tensor_type_that_disagrees_with_the_layout(tmp_path):
    """A tensor whose type says F16 where F32 bytes were written would read half its data wrongly."""
    state = random_hf_state(np.random.default_rng(13), tied=True)
    path = write(tmp_path, state)
    data = bytearray(path.read_bytes())
    name = b"output_norm.weight"
    # tensor info: name, n_dims (u32), dims (u64 each), type (u32), offset (u64)
    at = data.index(name) + len(name) + 4 + 8
    assert int.from_bytes(data[at : at + 4], "little") == int(Q.F32)
    data[at : at + 4] = int(Q.F16).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"^{path} is corrupt: 512 unused bytes before tensor "):
        load_gguf(path)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # gguf-py's uint64 sum
def test_tensor_offset_off_the_alignment(tmp_path):
    """Found by the fuzzer: an offset of 2**64 - 1 wrapped round to one byte before the data
    section, and the tensor loaded shifted by a byte."""
    state = random_hf_state(np.random.default_rng(14), tied=True)
    path = write(tmp_path, state)
    data = bytearray(path.read_bytes())
    name = b"token_embd.weight"
    # tensor info: name, n_dims (u32), 2 dims (u64 each), type (u32), offset (u64)
    at = data.index(name) + len(name) + 4 + 16 + 4
    data[at : at + 8] = (2**64 - 1).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"^{path} is corrupt: tensor 'token_embd.weight' starts"):
        load_gguf(path)


def test_corrupt_count_is_refused_before_the_reader_loops(tmp_path):
    """Found by the fuzzer: one flipped bit in a string length misaligned the header, and gguf-py
    then looped over a count of 7.9e18 (hours). The header walk refuses such a file at once."""
    state = random_hf_state(np.random.default_rng(15), tied=True)
    path = write(tmp_path, state)
    data = bytearray(path.read_bytes())
    at = data.index(b"llama", data.index(b"general.architecture") + 20) - 8  # its length, 5
    data[at] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"^{path} is not a readable GGUF file"):
        load_gguf(path)
