"""DecoderLM: cached extend == one full pass, and logits == transformers' PyTorch LLaMA / Qwen2."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from speculative.models import decoder
from tests import helpers


@pytest.fixture(scope="module")
def model_and_params():
    return helpers.tiny_decoder(50, emb=32, layers=2, heads=4, kv_heads=2, seed=3)


@pytest.mark.parametrize(  # 1 and 8 are slow-marked repeats of the same code path
    "block", [pytest.param(1, marks=pytest.mark.slow), 3, pytest.param(8, marks=pytest.mark.slow)]
)
def test_cached_extend_equals_full_pass_at_ragged_positions(model_and_params, block):
    model, params = model_and_params
    # Jitted: one compile per shape instead of an op-by-op compile of every primitive.
    init_state = jax.jit(lambda params, tokens: model.init_state(params, {"prompt": tokens}, 32))
    extend = jax.jit(model.extend)
    rng = np.random.default_rng(block)
    starts = np.array([0, 5, 11, 2])
    tokens = jnp.asarray(rng.integers(0, 50, size=(4, 24)), jnp.int32)
    # Fill every row with 16 tokens, then rewind each to its own start (a rollback) and extend.
    state = init_state(params, tokens)
    _, state = extend(params, state, tokens[:, :16])
    state = state.replace(index=jnp.asarray(starts, jnp.int32))
    new = tokens[:, 16 : 16 + block]
    logits, state = extend(params, state, new)
    np.testing.assert_array_equal(state.index, starts + block)
    for row, start in enumerate(starts):
        seq = jnp.concatenate([tokens[row, :start], new[row]])[None]
        full, _ = extend(params, init_state(params, seq), seq)
        np.testing.assert_allclose(logits[row], full[0, start:], rtol=1e-5, atol=1e-5)


def test_logical_axes_cover_every_parameter(model_and_params):
    model, params = model_and_params
    axes = model.logical_axes()
    flat_params = jax.tree_util.tree_leaves_with_path(params)
    flat_axes = dict(
        jax.tree_util.tree_leaves_with_path(
            axes, is_leaf=lambda x: x is None or isinstance(x, jax.sharding.PartitionSpec)
        )
    )
    for path, value in flat_params:
        spec = flat_axes[path]
        assert len(spec) == value.ndim and all(isinstance(a, str) for a in spec), (path, spec)


def _hf_to_ours(state_dict, config: decoder.DecoderConfig):
    """Maps a transformers LLaMA/Qwen2 state dict to our tree (both store Linear weights [out, in])."""
    sd = {k: v.detach().numpy() for k, v in state_dict.items()}
    e, h, k, d = config.emb_dim, config.num_heads, config.num_kv_heads, config.head_dim
    params = {
        "token_embedder": {"embedding": sd["model.embed_tokens.weight"]},
        "decoder_norm": {"scale": sd["model.norm.weight"]},
    }
    if not config.tie_word_embeddings:
        params["logits_dense"] = {"kernel": sd["lm_head.weight"]}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        attn = {
            "query": {"kernel": sd[p + "self_attn.q_proj.weight"].reshape(h, d, e)},
            "key": {"kernel": sd[p + "self_attn.k_proj.weight"].reshape(k, d, e)},
            "value": {"kernel": sd[p + "self_attn.v_proj.weight"].reshape(k, d, e)},
            "out": {"kernel": sd[p + "self_attn.o_proj.weight"].reshape(e, h, d)},
        }
        if config.qkv_bias:
            attn["query"]["bias"] = sd[p + "self_attn.q_proj.bias"].reshape(h, d)
            attn["key"]["bias"] = sd[p + "self_attn.k_proj.bias"].reshape(k, d)
            attn["value"]["bias"] = sd[p + "self_attn.v_proj.bias"].reshape(k, d)
        params[f"layers_{i}"] = {
            "pre_self_attention_layer_norm": {"scale": sd[p + "input_layernorm.weight"]},
            "self_attention": attn,
            "pre_mlp_layer_norm": {"scale": sd[p + "post_attention_layernorm.weight"]},
            "mlp": {
                "wi_0": {"kernel": sd[p + "mlp.gate_proj.weight"]},
                "wi_1": {"kernel": sd[p + "mlp.up_proj.weight"]},
                "wo": {"kernel": sd[p + "mlp.down_proj.weight"]},
            },
        }
    return jax.tree_util.tree_map(jnp.asarray, params)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_logits_match_transformers(family):
    torch.manual_seed(0)
    common = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_theta=50000.0,
        max_position_embeddings=128,
    )
    if family == "qwen2":
        hf_config = transformers.Qwen2Config(tie_word_embeddings=True, **common)
        hf_model = transformers.Qwen2ForCausalLM(hf_config)
    else:
        hf_config = transformers.LlamaConfig(tie_word_embeddings=False, **common)
        hf_model = transformers.LlamaForCausalLM(hf_config)
    hf_model.eval()
    with torch.no_grad():  # random (not zero) biases and norms, so every term is exercised
        for name, p in hf_model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.copy_(
                    1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.1 * torch.randn_like(p)
                )
    config = decoder.DecoderConfig(
        vocab_size=97,
        emb_dim=64,
        num_layers=2,
        num_heads=8,
        num_kv_heads=2,
        head_dim=8,
        mlp_dim=112,
        rope_theta=50000.0,
        norm_eps=1e-6,
        qkv_bias=family == "qwen2",
        tie_word_embeddings=family == "qwen2",
        max_seq_len=128,
    )
    model = decoder.DecoderLM(config)
    params = _hf_to_ours(hf_model.state_dict(), config)
    tokens = np.random.default_rng(0).integers(0, 97, size=(2, 13))
    with torch.no_grad():
        expected = hf_model(torch.tensor(tokens)).logits.numpy()
    # The prefill jitted (the model static, hashable by config): one program, not op by op.
    ours = helpers.prefill_logits(model, params, tokens, 16)
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)
