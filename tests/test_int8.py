"""int8 drafts (models/int8.py): the quantisation of kernels and rows, the product's accuracy and
its independence of the row count, the parameter tree, the loader's `ModelSpec.quantize`, and
exactness of an int8 draft (greedy identity with plain decoding over ragged rows with an EOS
mid-block at gamma 1 and 8; chi-square at T = 1 and top-p)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decoding.sampling import SamplingConfig
from speculative.errors import JobError
from speculative.jobs import common
from speculative.loading import draft_forms
from speculative.loading import specs as ml
from speculative.models import base, decoder, int8, precision
from tests import helpers

MAX_LEN = helpers.GREEDY_MAX_LEN


def test_quantize_kernel_is_within_half_a_step_of_every_weight():
    rng = np.random.default_rng(0)
    kernel = (
        rng.standard_normal((3, 4, 16)).astype(np.float32)
        * np.array([1e-3, 1.0, 40.0])[:, None, None]
    )
    kernel[1, 2] = 0.0  # an all-zero output channel
    q, scale = int8.quantize_kernel(jnp.asarray(kernel), out_dims=2)
    assert q.dtype == jnp.int8 and q.shape == kernel.shape and scale.shape == (3, 4)
    q, scale = np.asarray(q, np.float32), np.asarray(scale)
    assert np.abs(q).max() <= 127 and scale[1, 2] == 1.0 and not q[1, 2].any()
    err = np.abs(q * scale[..., None] - kernel)
    assert np.all(err <= scale[..., None] / 2 + 1e-7 * np.abs(kernel))
    # every channel uses its full range: its largest weight maps to +-127
    assert np.all(np.abs(q).max(-1)[np.arange(3) != 1] == 127)


def test_int8_product_tracks_the_float_product_and_ignores_the_row_count():
    rng = np.random.default_rng(1)
    kernel = jnp.asarray(rng.standard_normal((48, 64)), jnp.float32)
    rows = jnp.asarray(rng.standard_normal((5, 64)), jnp.float32)
    q, scale = int8.quantize_kernel(kernel)
    full = np.asarray(int8.dense(rows, q, scale))
    exact = np.asarray(rows @ kernel.T)
    assert full.dtype == np.float32 and full.shape == (5, 48)
    assert np.linalg.norm(full - exact) / np.linalg.norm(exact) < 0.02
    # a row's result is the same bits whether it is alone (a plain step) or in a block (verify)
    for m in (1, 2, 3, 4):
        np.testing.assert_array_equal(np.asarray(int8.dense(rows[:m], q, scale)), full[:m])
    # a prefill's many rows: the same route, the same bits for the rows it shares with a step
    many = jnp.concatenate([rows, jnp.asarray(rng.standard_normal((200, 64)), jnp.float32)])
    wide = np.asarray(base.dense(many, q, scale))
    np.testing.assert_array_equal(wide[:5], full)
    dequantized = np.asarray(q, np.float32) * np.asarray(scale)[:, None]
    reference = np.asarray(many) @ dequantized.T
    assert np.linalg.norm(wide - reference) / np.linalg.norm(reference) < 0.02
    zero = np.asarray(int8.dense(jnp.zeros((2, 64)), q, scale))
    assert not zero.any(), "an all-zero row stays zero (no division by a zero scale)"


@pytest.mark.parametrize("tied", [False, True])
def test_quantize_params_converts_projections_and_the_head_only(tied):
    config = decoder.DecoderConfig(
        vocab_size=40, emb_dim=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
        mlp_dim=64, qkv_bias=True, tie_word_embeddings=tied,
    )  # fmt: skip
    model = decoder.DecoderLM(config)
    params = helpers.init_params(model, 0)
    if tied:  # a tied table is gathered: only a shortlist head has a kernel of its own
        config, params = decoder.restrict_head(config, params, range(0, 40, 3))
        model = decoder.DecoderLM(config)
    quantized = int8.quantize_params(params)
    attn = quantized["layers_1"]["self_attention"]
    assert attn["query"]["kernel"].dtype == jnp.int8
    assert attn["query"][int8.SCALE].shape == (4, 8)  # [H, D]: the kernel's output axes
    assert attn["out"][int8.SCALE].shape == (32,)
    assert attn["query"]["bias"] is params["layers_1"]["self_attention"]["query"]["bias"]
    assert quantized["layers_0"]["mlp"]["wo"]["kernel"].dtype == jnp.int8
    assert quantized["logits_dense"]["kernel"].dtype == jnp.int8
    assert quantized["token_embedder"]["embedding"] is params["token_embedder"]["embedding"]
    assert quantized["decoder_norm"]["scale"] is params["decoder_norm"]["scale"]
    with pytest.raises(ValueError, match="already int8"):
        int8.quantize_params(quantized)
    if not tied:  # a shortlist cut from an int8 head keeps its rows' scales
        ids = [0, 7, 8, 39]
        _, cut = decoder.restrict_head(config, quantized, ids)
        head = quantized["logits_dense"]
        np.testing.assert_array_equal(
            cut["logits_dense"][int8.SCALE], np.asarray(head[int8.SCALE])[ids]
        )

    tokens = jnp.asarray([[5, 9, 2, 11, 30], [1, 1, 20, 3, 7]], jnp.int32)
    full = np.asarray(helpers.prefill_logits(model, params, tokens))
    short = np.asarray(helpers.prefill_logits(model, quantized, tokens))
    finite = np.isfinite(full)
    np.testing.assert_array_equal(np.isfinite(short), finite)
    err = np.linalg.norm(short[finite] - full[finite]) / np.linalg.norm(full[finite])
    assert 0 < err < 0.05, err


@pytest.fixture(scope="module")
def int8_drafts(target, draft):
    """The target's own weights in int8 (a draft that agrees often) and the unrelated draft's."""
    (t_model, t_params), (d_model, d_params) = target, draft
    return (t_model, int8.quantize_params(t_params)), (d_model, int8.quantize_params(d_params))


@pytest.mark.parametrize("gamma", [1, 8])
def test_greedy_int8_draft_is_identical_to_plain(
    target, batch, greedy_reference, int8_drafts, gamma
):
    eos_id, ref, _ = greedy_reference
    alphas = []
    for d_model, d_params in int8_drafts:
        out = decoding.speculative_decode(
            *target, d_model, d_params, batch, gamma=gamma, max_decode_len=MAX_LEN, eos_id=eos_id
        )
        np.testing.assert_array_equal(out.tokens, ref.tokens)
        np.testing.assert_array_equal(out.lengths, ref.lengths)
        alphas.append(float(np.mean(out.stats.alpha)))
    assert alphas[0] > 0.5 and alphas[1] < alphas[0], alphas


@pytest.mark.parametrize(
    "cfg, gamma",
    [(SamplingConfig(temperature=1.0), 3), (SamplingConfig(temperature=1.2, top_p=0.7), 2)],
)
def test_sampled_int8_draft_follows_target_distribution(small_pair, small_target_probs, cfg, gamma):
    (tgt, tgt_params), (drf, drf_params) = small_pair
    samples, out = helpers.speculative_samples(
        ((tgt, tgt_params), (drf, int8.quantize_params(drf_params))), helpers.repeated_prompt(
            helpers.N), gamma=gamma, max_decode_len=helpers.SEQ_LEN, eos_id=helpers.EOS, cfg=cfg,
        seed=5,
    )  # fmt: skip
    assert helpers.chi_square_pvalue(samples, small_target_probs(cfg)) > 1e-3
    alpha = float(np.mean(out.stats.alpha))
    assert 0.1 < alpha < 0.99, f"want a draft that is sometimes rejected, alpha={alpha}"


def test_the_loader_quantizes_what_the_spec_asks_and_refuses_the_rest(draft):
    model, params = draft
    loaded = ml.Loaded(model, params, "tiny")
    spec = ml.ModelSpec(format="random", model=model, quantize="int8")
    quantized = draft_forms.with_quantization(loaded, spec)
    assert quantized.params["layers_0"]["mlp"]["wi_0"]["kernel"].dtype == jnp.int8
    assert (
        draft_forms.with_quantization(loaded, ml.ModelSpec(format="random", model=model)) is loaded
    )
    assert "int8 weights" in ml.describe(spec)
    with pytest.raises(JobError, match="unknown ModelSpec.quantize 'int4'"):
        ml.validate_model_spec(ml.ModelSpec(format="random", model=model, quantize="int4"), "d")
    with pytest.raises(JobError, match="runs on one device"):
        ml.check_quantization(spec, "draft", partitioner=object())
    ml.check_quantization(spec, "draft")  # one device: fine
    # the memory lines count an int8 draft's params as loaded, not as the model's dtype would
    assert int8.is_quantized(quantized.params) and not int8.is_quantized(params)
    assert not int8.is_quantized(()) and not int8.is_quantized(np.zeros(3))  # drafters' params
    parts = common.int8_draft_parts(quantized)
    as_float = sum(x.nbytes for x in jax.tree.leaves(params))
    assert as_float / 4 < parts["draft params"] < as_float / 2  # float32 -> mostly int8
    assert common.int8_draft_parts(loaded) is None and common.int8_draft_parts(None) is None
    with pytest.raises(JobError, match="quantize is a draft's option"):
        ml.validate_model_spec(spec, "target", model_only=True)
    t5_model, t5_params = helpers.tiny_t5_pair(32, 0)[:2]
    t5_spec = ml.ModelSpec(format="random", model=t5_model, quantize="int8")
    with pytest.raises(JobError, match="needs a decoder-only model, got T5"):
        draft_forms.with_quantization(ml.Loaded(t5_model, t5_params, "t5"), t5_spec)


def test_infer_job_with_an_int8_draft_writes_the_same_greedy_outputs(tmp_path):
    """ModelSpec.quantize through gin: the job quantises its draft and, greedy, writes the same
    outputs as with the draft in float32 (both equal plain greedy decoding)."""
    flag = "--gin.draft/speculative.ModelSpec.quantize='int8'"
    summary = helpers.infer_matches_plain_draft(tmp_path, "int8", flag)
    assert "int8 weights" in str(summary)


def test_auto_quantizes_the_draft_only_where_the_cpu_has_int8_dot_units():
    choose = precision.choose_draft_quantization
    for units in (("amx_int8",), ("avx512_vnni",), ("avx_vnni", "avx2")):
        route = choose("auto", "cpu", frozenset(units))
        assert route.dtype == "int8" and units[0] in route.reason
    bare = choose("auto", "cpu", frozenset({"avx2", "amx_bf16"}))
    assert bare.dtype == "" and "no int8 dot units" in bare.reason
    assert choose("auto", "gpu", frozenset({"amx_int8"})).dtype == ""
    assert choose("int8", "cpu", frozenset()).dtype == "int8"  # as asked
    assert choose("", "cpu", frozenset({"amx_int8"})).dtype == ""
