"""The bfloat16 matrix-unit route (docs/design.md §9): which dtype 'auto' picks on which machine,
the dot that takes the route (float32 accumulation, one row padded to two, row-count-invariant
sums), the embedding gather that does not widen the table, and greedy identity in bfloat16."""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.data import inputs
from speculative.decoding.sampling import SamplingConfig
from speculative.decoding.tree import TreeShape
from speculative.errors import JobError
from speculative.loading import specs as model_loading
from speculative.models import base, decoder, gemma, precision
from tests import helpers

AMX = frozenset({"fpu", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
NO_UNITS = frozenset({"fpu", "avx2", "avx512f"})


def test_auto_picks_bfloat16_where_the_cpu_has_matrix_units():
    route = precision.choose("auto", "cpu", AMX)
    assert route.dtype == "bfloat16"
    assert "amx_bf16" in route.reason and "avx512_bf16" in route.reason


def test_auto_stays_float32_on_a_cpu_without_them_and_says_why():
    route = precision.choose("auto", "cpu", NO_UNITS)
    assert route.dtype == "float32"
    assert "neither amx_bf16 nor avx512_bf16" in route.reason


def test_auto_is_bfloat16_on_accelerators_and_explicit_dtypes_are_kept():
    assert precision.choose("auto", "gpu", frozenset()).dtype == "bfloat16"
    assert precision.choose("float32", "cpu", AMX) == precision.Route("float32", "float32 as asked")
    slow = precision.choose("bfloat16", "cpu", NO_UNITS)
    assert slow.dtype == "bfloat16" and "slower than float32" in slow.reason


def test_auto_keeps_t5_in_float32_on_a_cpu():
    route = precision.choose("auto", "cpu", AMX, has_route=False)
    assert route.dtype == "float32" and "decoder-only" in route.reason
    assert precision.choose("auto", "tpu", AMX, has_route=False).dtype == "bfloat16"
    t5 = helpers.t5_1_1_small(num_decoder_layers=1, num_encoder_layers=1)
    spec = model_loading.ModelSpec(format="random", model=t5, dtype="auto")
    chosen = model_loading.resolved(spec).dtype
    assert chosen == precision.resolve_dtype("auto", has_route=False)


def test_cpu_flags_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512_bf16 amx_bf16\n\nprocessor\t: 1\n")
    assert precision.cpu_flags(info) == {"fpu", "avx512_bf16", "amx_bf16"}
    assert precision.cpu_flags(tmp_path / "missing") == frozenset()


def test_model_spec_auto_loads_in_the_machines_dtype():
    model = helpers.tiny_decoder_model(64, emb=32, layers=1, heads=2, kv_heads=1)
    spec = model_loading.ModelSpec(format="random", model=model, dtype="auto")
    loaded = model_loading.load_model(spec, "target")
    chosen = precision.resolve_dtype("auto")
    assert chosen in ("float32", "bfloat16")
    assert loaded.model.config.dtype == chosen
    assert {x.dtype for x in jax.tree.leaves(loaded.params)} == {jnp.dtype(chosen)}
    assert f"dtype={chosen!r}" in loaded.description
    with pytest.raises(JobError, match="unknown dtype 'half-ish'.*'auto'"):
        model_loading.load_model(model_loading.ModelSpec("random", None, model, "half-ish"), "t")


def _kernel_and_rows(n=96, k=160, m=8, seed=0):
    rng = np.random.default_rng(seed)
    kernel = jnp.asarray(rng.standard_normal((n, k)), jnp.bfloat16)
    rows = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    return kernel, rows


def test_bfloat16_dense_accumulates_in_float32():
    kernel, rows = _kernel_and_rows()
    y = base.dense(rows, kernel)
    assert y.dtype == jnp.float32
    exact = np.asarray(rows.astype(jnp.bfloat16), np.float64) @ np.asarray(kernel, np.float64).T
    # float32 accumulation of bfloat16 products: far tighter than a bfloat16 output (~1e-2)
    assert np.abs(np.asarray(y) - exact).max() < 1e-3 * np.abs(exact).max()


def test_bfloat16_dense_rounds_every_row_alike_whatever_the_row_count():
    """A plain step (one row, padded to two) and a verify block (several rows) must give a row
    the same sums, or greedy identity would rest on luck at near-ties. Past `WIDE_ROWS` the
    product changes orientation (a prefill, a wide batch's verify block) and must still agree."""
    wide = base.WIDE_ROWS
    kernel, rows = _kernel_and_rows(m=3 * wide)
    alone = np.asarray(base.dense(rows[:1], kernel))[0]
    for m in (1, 2, 3, 6, 8, 16, wide, wide + 1, wide + 8, 3 * wide):
        assert np.array_equal(np.asarray(base.dense(rows[:m], kernel))[0], alone), m


def _compiled_text(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def test_one_bfloat16_row_does_not_widen_the_kernel():
    """One bfloat16 row would be a GEMV that converts the whole kernel to float32 on every call;
    the route pads it to two rows, so no float32 array of the kernel's shape exists."""
    kernel, rows = _kernel_and_rows(n=512, k=256)
    text = _compiled_text(base.dense, rows[:1], kernel)
    assert not re.search(r"f32\[512,256\]", text)
    naive = _compiled_text(
        lambda x, w: jnp.einsum("mk,nk->mn", x.astype(w.dtype), w), rows[:1], kernel
    )
    assert re.search(r"f32\[512,256\]", naive)  # the check can fail: the naive dot widens it


def test_bfloat16_embedding_gather_is_not_widened_inside_a_loop():
    model, params = helpers.tiny_decoder(1000, emb=64, layers=1, heads=2, kv_heads=1, seed=0)
    model = decoder.DecoderLM(dataclasses.replace(model.config, dtype="bfloat16"))
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    batch = helpers.ragged_prompts(0, batch=1, width=4, vocab=1000)
    state = model.init_state(params, batch, 32)

    def steps(params, state, tokens):
        def step(_, carry):
            state, tokens = carry
            logits, state = model.extend(params, state.replace(index=state.index - 1), tokens)
            return state, jnp.argmax(logits, -1).astype(jnp.int32)

        return jax.lax.fori_loop(0, 4, step, (state, tokens))

    text = _compiled_text(steps, params, state, batch["prompt"][:, :1])
    assert not re.search(r"f32\[1000,64\]", text)


def _bf16_pair():
    target, tp = helpers.tiny_decoder(97, emb=64, layers=2, heads=4, kv_heads=2, seed=1)
    draft, dp = helpers.tiny_decoder(97, emb=32, layers=1, heads=2, kv_heads=1, seed=2)
    cast = lambda m, p: (  # noqa: E731
        decoder.DecoderLM(dataclasses.replace(m.config, dtype="bfloat16")),
        jax.tree.map(lambda x: x.astype(jnp.bfloat16), p),
    )
    return cast(target, tp), cast(draft, dp)


@pytest.mark.parametrize(
    "options",
    [
        {"gamma": 1},
        pytest.param({"gamma": 7}, marks=pytest.mark.slow),
        {"gamma": 3, "acceptance": "block"},
        {"tree": (3, 2, 1)},
    ],
    ids=["gamma1", "gamma7", "block", "tree"],
)
def test_bfloat16_greedy_speculative_equals_bfloat16_plain(options):
    (target, tp), (draft, dp) = _bf16_pair()
    batch = helpers.ragged_prompts(3, batch=3, width=6, vocab=97)
    eos = 5  # a frequent id among 97: rows stop inside draft blocks
    plain = decoding.autoregressive_decode(target, tp, batch, max_decode_len=24, eos_id=eos)
    spec = decoding.speculative_decode(
        target, tp, draft, dp, batch, max_decode_len=24, eos_id=eos, **options
    )
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(plain.tokens))
    np.testing.assert_array_equal(np.asarray(spec.lengths), np.asarray(plain.lengths))


# Measured on a 2-core AMD EPYC with AVX2 only (2026-12-07, docs/spec_bench.md's machine): there
# XLA:CPU's float32 products of a block's rows and of one row differ in the last bits (at most
# 2.4e-6 here), so float32 block / step bit-identity, and with it greedy identity at a near-tie,
# does not hold on such CPUs; on the AVX-512 machine it does. Expected to fail there, not hidden.
FLOAT32_BITS = pytest.mark.xfail(
    "avx512f" not in precision.cpu_flags(),
    reason="float32 block and step logits differ in the last bits on AVX2-only XLA:CPU",
    strict=False,
)


@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float32", marks=FLOAT32_BITS)])
def test_a_verify_block_scores_every_position_as_plain_steps_do(dtype):
    """Greedy identity rests on this: the logits of a block of L tokens scored in one call equal,
    bit for bit, those of the same tokens fed one at a time (plain decoding's steps)."""
    model, params = helpers.tiny_decoder(211, emb=128, layers=3, heads=4, kv_heads=2, seed=4)
    model = decoder.DecoderLM(dataclasses.replace(model.config, dtype=dtype))
    params = jax.tree.map(lambda x: x.astype(dtype), params)
    prompt = helpers.ragged_prompts(5, batch=2, width=9, vocab=211)["prompt"]
    block = jnp.asarray([[7, 19, 3, 88, 41, 5], [2, 2, 150, 9, 61, 33]], jnp.int32)

    @jax.jit
    def together(params, prompt, block):
        state = model.init_state(params, {"prompt": prompt}, 32)
        _, state = model.extend(params, state, prompt)
        return model.extend(params, state, block)[0]

    @jax.jit
    def one_at_a_time(params, prompt, block):
        state = model.init_state(params, {"prompt": prompt}, 32)
        _, state = model.extend(params, state, prompt)
        out = []
        for i in range(block.shape[1]):
            logits, state = model.extend(params, state, block[:, i : i + 1])
            out.append(logits)
        return jnp.concatenate(out, axis=1)

    a, b = together(params, prompt, block), one_at_a_time(params, prompt, block)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# A tree in breadth-first order: 0 root; 1, 2 its children; 3 under 1, 4 under 2; 5 under 3.
_TREE = TreeShape((0, 0, 1, 2, 3))


@pytest.mark.parametrize(  # the two cases that caught the two wrong attentions; the others slow
    "family, dtype",
    [
        ("decoder", "bfloat16"),
        pytest.param("decoder", "float32", marks=pytest.mark.slow),
        pytest.param("gemma", "bfloat16", marks=pytest.mark.slow),
        pytest.param("gemma", "float32", marks=FLOAT32_BITS),
    ],
)
def test_a_tree_scores_every_token_as_plain_steps_along_its_path_do(dtype, family):
    """Tree identity rests on this: each token of a tree scored in one call gets, bit for bit, the
    logits of plain steps along its own path (models/attention.py: path views, each token a row
    of its own), compiled as the decode loops are. The decoder has Qwen2.5-1.5B's attention
    widths: there, batching the tree's tokens as one more product dimension still missed plain
    steps by a last bit in bfloat16; an ancestor mask over the tree-ordered slots missed in
    float32 (the small Gemma) as well."""
    if family == "decoder":
        config = decoder.DecoderConfig(
            vocab_size=211, emb_dim=1536, num_layers=1, num_heads=12, num_kv_heads=2,
            head_dim=128, mlp_dim=256, qkv_bias=True, dtype=dtype,
        )  # fmt: skip
        model = decoder.DecoderLM(config)
    else:  # a sliding window shorter than the prompts, soft-capped attention, q/k norms
        config = gemma.GemmaConfig(211, 128, 2, 4, 2, 32, 256, sliding_window=6, qk_norm=True,
                                   attn_softcap=50.0, local_layers=(True, False), dtype=dtype)  # fmt: skip
        model = gemma.GemmaLM(config)
    params = helpers.init_params(model, 4)
    params = jax.tree.map(lambda x: x.astype(dtype) if x.ndim > 1 else x, params)
    prompt = helpers.ragged_prompts(5, batch=2, width=9, vocab=211)["prompt"]
    tree = jnp.asarray([[7, 19, 3, 88, 41, 5], [2, 2, 150, 9, 61, 33]], jnp.int32)
    ancestors = _TREE.ancestors
    jit = functools.partial(jax.jit, compiler_options=precision.COMPILER_OPTIONS)

    def prefilled(params, prompt):
        state = model.init_state(params, {"prompt": prompt}, 48)
        return model.extend(params, state, prompt)[1]

    together = jit(lambda p, x, t: model.extend(p, prefilled(p, x), t, ancestors)[0])

    @jit
    def along_paths(params, prompt, tree):
        out = []
        for i in range(tree.shape[1]):  # plain steps along token i's path
            state = prefilled(params, prompt)
            for j in np.nonzero(ancestors[i])[0]:
                logits, state = model.extend(params, state, tree[:, j : j + 1])
            out.append(logits)
        return jnp.concatenate(out, axis=1)

    a, b = together(params, prompt, tree), along_paths(params, prompt, tree)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _library_reductions(hlo: str) -> list[str]:
    """The YNNPACK library fusions of a compiled program whose computation reduces."""
    bodies = dict(re.findall(r"\n(%?[\w.]+) [^\n]*\{\n(.*?)\n\}", hlo, flags=re.S))
    found = []
    for name, called in re.findall(r"%(ynn_fusion[\w.]*) = [^\n]*calls=(%[\w.]+)", hlo):
        body = bodies.get(called) or bodies.get(called.lstrip("%"), "")
        if " reduce(" in body:
            found.append(name)
    return found


@pytest.mark.skipif(precision.COMPILER_OPTIONS is None, reason="this jaxlib has no YNN option")
def test_the_decode_loop_sums_every_reduction_in_one_order_for_any_row_count():
    """At real widths XLA:CPU gave row reductions (RMSNorm's mean of squares) to its library only
    above a size threshold: a plain step (one row) and a verify block (several) summed a norm in
    different orders, and in bfloat16 that flipped a real near-tie (docs/design.md §9). The loops
    compile with library dots only; the default options, as the control, do give a reduction to
    the library at these widths."""
    cfg = decoder.DecoderConfig(
        vocab_size=512, emb_dim=1536, num_layers=1, num_heads=12, num_kv_heads=2, head_dim=128,
        mlp_dim=256, dtype="bfloat16", qkv_bias=True,
    )  # fmt: skip
    model = decoder.DecoderLM(cfg)
    params = jax.tree_util.tree_map(
        lambda s: jax.ShapeDtypeStruct(s.shape, jnp.bfloat16 if s.ndim > 1 else s.dtype),
        jax.eval_shape(model.init_params, jax.random.PRNGKey(0)),
    )
    state = jax.eval_shape(lambda: model.init_state(None, {"prompt": jnp.zeros((1, 8))}, 64))
    tokens = jax.ShapeDtypeStruct((1, 4), jnp.int32)
    default = jax.jit(model.extend).lower(params, state, tokens).compile().as_text()
    assert _library_reductions(default), "control: the default options keep no library reduce"
    config = decoding.DecodeConfig(8, 10**6, SamplingConfig(), gamma=3)
    prompts = inputs.decoder_batch([[5, 6, 7]], pad_to=8)
    rng = jax.random.PRNGKey(0)
    loop = decoding.speculative_loop.lower(model, params, model, params, prompts, rng, config)
    assert _library_reductions(loop.compile().as_text()) == []


def test_plain_and_speculative_decoding_attend_over_one_cache_length():
    """Attention's products sum over the cache, blocked by its length, so plain decoding and a
    chain or tree must attend over caches of one length for their logits to round alike (one
    slack for every block up to base.CACHE_SLACK; docs/design.md §9)."""
    model = helpers.tiny_decoder_model(64, 16, 1, 2, 1)
    batch = inputs.decoder_batch([[5, 6, 7]], pad_to=8)
    lengths = {
        decoding.DecodeConfig(40, 1, SamplingConfig(), **options).cache_length(model, batch)
        for options in (
            {},
            {"gamma": 1},
            {"gamma": 5},
            {"gamma": 31},
            {"tree": TreeShape.from_widths((3, 2, 2, 1))},
        )
    }
    assert lengths == {8 + 40 + base.CACHE_SLACK}
    wide = decoding.DecodeConfig(40, 1, SamplingConfig(), gamma=40).cache_length(model, batch)
    assert wide == 8 + 40 + 41  # a block wider than the slack brings its own
