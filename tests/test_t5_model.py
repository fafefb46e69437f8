"""T5 model: logits equal to transformers' PyTorch T5 on the same weights; cached `extend` equals
teacher-forced decoding at ragged per-row positions; T5X parameter names and logical axes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import traverse_util

from speculative.checkpoints import load_hf_t5
from speculative.models import t5
from tests import helpers

VOCAB = 64


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Random weights everywhere (norm scales and relative biases too), fan-in scaled."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if "layer_norm" in name:
                param.copy_(1.0 + 0.3 * noise)
            elif "relative_attention_bias" in name or name == "shared.weight":
                param.copy_(noise)
            else:
                param.copy_(noise * param.shape[1] ** -0.5)


def _hf_model(variant: str, seed: int) -> transformers.T5ForConditionalGeneration:
    """v1.0: ReLU, tied + scaled head. v1.1: gated GELU, untied head. v1.1-tied: gated GELU, tied
    head without scaling (what transformers 5 writes for v1.1). Uneven encoder/decoder depths."""
    hf_config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=48,
        num_heads=4,
        num_layers=3,
        num_decoder_layers=2,
        feed_forward_proj="relu" if variant == "v1.0" else "gated-gelu",
        tie_word_embeddings=variant == "v1.0",
        dropout_rate=0.0,
    )
    model = transformers.T5ForConditionalGeneration(hf_config).eval()
    _randomise(model, seed)
    if variant == "v1.1":
        gen = torch.Generator().manual_seed(seed + 1)
        head = torch.randn((VOCAB, 32), generator=gen) * 32**-0.5
        model.lm_head.weight = torch.nn.Parameter(head)  # a separate tensor: untied
    return model


def _padded_inputs(seed: int, batch: int, enc_len: int, dec_len: int):
    rng = np.random.default_rng(seed)
    lengths = np.array([enc_len, 1, 5, enc_len - 3][:batch])
    enc = rng.integers(3, VOCAB, size=(batch, enc_len))
    enc = np.where(np.arange(enc_len)[None] < lengths[:, None], enc, 0)  # 0 = pad
    dec = rng.integers(1, VOCAB, size=(batch, dec_len))
    dec[:, 0] = 0  # decoder start token
    return enc.astype(np.int32), dec.astype(np.int32)


@functools.partial(jax.jit, static_argnums=0)
def _one_pass_and_cached(model, params, enc, dec):
    """Teacher-forced logits of the one-pass and the cached path, jitted (the model is static,
    hashable by config): one program, not hundreds of eager ops each compiled on its own."""
    state = model.init_state(params, {"encoder_input_tokens": enc}, 24)
    return model.forward(params, enc, dec), model.extend(params, state, dec)[0]


@pytest.mark.parametrize("variant", ["v1.0", "v1.1", "v1.1-tied"])
def test_logits_match_transformers(tmp_path, variant):
    torch.manual_seed(0)
    hf = _hf_model(variant, seed=1)
    # Sharded save exercises the index.json path; 20 tokens of decoder and 14 of encoder reach the
    # log-spaced relative position buckets (causal max_exact 16, bidirectional 8).
    hf.save_pretrained(tmp_path, max_shard_size="40KB" if variant == "v1.1" else "1GB")
    if variant == "v1.1":
        assert (tmp_path / "model.safetensors.index.json").exists()
    enc, dec = _padded_inputs(seed=2, batch=4, enc_len=14, dec_len=20)
    with torch.no_grad():
        expected = hf(
            input_ids=torch.from_numpy(enc).long(),
            attention_mask=torch.from_numpy(enc > 0).long(),
            decoder_input_ids=torch.from_numpy(dec).long(),
        ).logits.numpy()

    config, params = load_hf_t5(str(tmp_path), dtype=jnp.float32)
    assert config.logits_via_embedding == (variant == "v1.0")
    assert config.mlp_activations == (("relu",) if variant == "v1.0" else ("gelu", "linear"))
    assert (config.num_encoder_layers, config.num_decoder_layers) == (3, 2)
    model = t5.T5(config)
    got, cached = _one_pass_and_cached(model, params, jnp.asarray(enc), jnp.asarray(dec))
    rel_err = np.max(np.abs(np.asarray(got) - expected)) / np.max(np.abs(expected))
    assert rel_err < 1e-4, rel_err
    # The cached path gives the same logits as the one-pass path.
    assert np.max(np.abs(np.asarray(cached) - expected)) / np.max(np.abs(expected)) < 1e-4


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_position_buckets_match_transformers(bidirectional):
    relative = np.arange(-1000, 1001)
    ours = t5.relative_position_bucket(relative, bidirectional, 32, 128)
    theirs = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
        torch.from_numpy(relative), bidirectional=bidirectional, num_buckets=32, max_distance=128
    ).numpy()
    np.testing.assert_array_equal(ours, theirs)


def _tiny(acts=("gelu", "linear"), tied=False, seed=0):
    model = t5.T5(helpers.tiny_t5_config(VOCAB, activations=acts, tied=tied))
    return model, model.init_params(jax.random.PRNGKey(seed))


# 1 token (a plain step) and a block of 8 by default; a block of 3 is a slow-marked repeat
@pytest.mark.parametrize("length", [1, pytest.param(3, marks=pytest.mark.slow), 8])
def test_extend_equals_teacher_forcing_at_ragged_positions(length):
    model, params = _tiny(seed=length)
    batch, total = 4, 24
    enc, dec = _padded_inputs(seed=length, batch=batch, enc_len=9, dec_len=total)
    enc, dec = jnp.asarray(enc), jnp.asarray(dec)
    full = np.asarray(jax.jit(model.forward)(params, enc, dec))  # one pass, no cache

    extend = jax.jit(model.extend)
    # the encoder pass that fills the state, jitted too (one program, not op by op eagerly)
    init_state = jax.jit(model.init_state, static_argnums=2)
    state = init_state(params, {"encoder_input_tokens": enc}, total + 4)
    # Fill every row with a long prefix, then roll rows back to different positions (as after
    # rejected drafts): stale cache entries past the index must not leak into the result.
    _, state = extend(params, state, dec[:, :12])
    starts = np.array([0, 3, 7, 12 - length + 1]) if length > 1 else np.array([0, 5, 11, 2])
    state = state.replace(index=jnp.asarray(starts, jnp.int32))
    for step in range(2):
        offsets = starts + step * length
        block = np.stack([np.asarray(dec)[b, o : o + length] for b, o in enumerate(offsets)])
        logits, state = extend(params, state, jnp.asarray(block))
        want = np.stack([full[b, o : o + length] for b, o in enumerate(offsets)])
        np.testing.assert_allclose(np.asarray(logits), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(np.asarray(state.index), offsets + length)


def test_parameter_tree_matches_t5x_names_shapes_and_axes():
    model, params = _tiny()
    flat = traverse_util.flatten_dict(params, sep="/")
    h_d, e, m = 4 * 8, 32, 48
    expected = {
        "token_embedder/embedding": ((VOCAB, e), ("vocab", "embed")),
        "encoder/relpos_bias/rel_embedding": ((4, 32), ("heads", "relpos_buckets")),
        "encoder/layers_1/attention/query/kernel": ((e, h_d), ("embed", "joined_kv")),
        "encoder/layers_1/attention/out/kernel": ((h_d, e), ("joined_kv", "embed")),
        "encoder/layers_0/pre_attention_layer_norm/scale": ((e,), ("embed",)),
        "encoder/layers_0/mlp/wi_0/kernel": ((e, m), ("embed", "mlp")),
        "encoder/layers_0/mlp/wi_1/kernel": ((e, m), ("embed", "mlp")),
        "encoder/layers_0/mlp/wo/kernel": ((m, e), ("mlp", "embed")),
        "encoder/encoder_norm/scale": ((e,), ("embed",)),
        "decoder/relpos_bias/rel_embedding": ((4, 32), ("heads", "relpos_buckets")),
        "decoder/layers_2/pre_self_attention_layer_norm/scale": ((e,), ("embed",)),
        "decoder/layers_2/self_attention/key/kernel": ((e, h_d), ("embed", "joined_kv")),
        "decoder/layers_2/pre_cross_attention_layer_norm/scale": ((e,), ("embed",)),
        "decoder/layers_2/encoder_decoder_attention/value/kernel": (
            (e, h_d),
            ("embed", "joined_kv"),
        ),
        "decoder/layers_2/pre_mlp_layer_norm/scale": ((e,), ("embed",)),
        "decoder/decoder_norm/scale": ((e,), ("embed",)),
        "decoder/logits_dense/kernel": ((e, VOCAB), ("embed", "vocab")),
    }
    axes = traverse_util.flatten_dict(model.logical_axes(), sep="/")
    assert set(axes) == set(flat)
    for path, (shape, names) in expected.items():
        assert flat[path].shape == shape, path
        assert tuple(axes[path]) == names, path
    for path, spec in axes.items():  # every parameter carries a name for each dimension
        assert len(tuple(spec)) == flat[path].ndim and all(spec), path
    # Encoder layer: 2 norms, 4 attention, 3 mlp kernels; decoder layer: 3 norms, 8 attention,
    # 3 mlp; plus embedding, 2 relpos tables, 2 final norms, logits_dense.
    assert len(flat) == 2 * 9 + 3 * 14 + 6
    v1_0, _ = _tiny(acts=("relu",), tied=True)
    assert "encoder/layers_0/mlp/wi/kernel" in traverse_util.flatten_dict(
        v1_0.param_shapes(), sep="/"
    )


def test_model_is_hashable_by_config_and_state_holds_cross_attention():
    model, params = _tiny()
    same, _ = _tiny(seed=9)
    assert model == same and hash(model) == hash(same)
    assert model != _tiny(tied=True)[0]
    enc = jnp.asarray([[5, 6, 1, 0], [7, 8, 9, 1]], jnp.int32)
    state = model.init_state(params, {"encoder_input_tokens": enc}, 10)
    assert state.extras["cross"]["layers_2"]["key"].shape == (2, 4, 4, 8)  # [B, H, S, D]
    np.testing.assert_array_equal(np.asarray(state.extras["encoder_mask"]), np.asarray(enc > 0))
    assert state.cache["layers_0"]["key"].shape == (2, 4, 10, 8)
    assert state.max_len == 10
    np.testing.assert_array_equal(np.asarray(state.index), [0, 0])
    with pytest.raises(ValueError, match="cache length"):
        model.extend(params, state, jnp.zeros((2, 11), jnp.int32))


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="unknown activation 'swiglu'"):
        t5.T5Config(vocab_size=8, mlp_activations=("swiglu",))
    with pytest.raises(ValueError, match="num_heads"):
        t5.T5Config(vocab_size=8, num_heads=0)
    assert t5.T5Config(vocab_size=8, mlp_activations=["gelu", "linear"]).mlp_activations == (
        "gelu",
        "linear",
    )
