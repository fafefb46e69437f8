"""SPMD decoding on 8 host devices: identical output to the unsharded run, real arrays sharded as the
rules say, no weight all-gather inside the compiled loop, per-shard checkpoint reads.

Needs XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts, so the default suite runs
this module in a subprocess (tests/test_spmd.py); by hand:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/pytest tests/test_sharded_decoding.py
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from speculative import decoding
from speculative.checkpoints import load_t5x
from speculative.checkpoints import sharded as sharded_checkpoints
from speculative.decoding.sampling import SamplingConfig
from speculative.measure import memory
from speculative.models import base, t5
from speculative.parallel import distributed, partitioning
from tests import helpers

pytestmark = helpers.needs_host_devices("tests/test_spmd.py")

V = 64
MAX_LEN = 9
GAMMA = 3
MESHES = [(1, 8), (2, 4), (8, 1)]
SAMPLED = SamplingConfig(temperature=1.0)


def tiny_t5(emb, heads, seed):
    config = helpers.tiny_t5_config(
        V, emb=emb, heads=heads, encoder_layers=1, decoder_layers=1, mlp=2 * emb
    )
    return _with_params(t5.T5(config), seed)


def _with_params(model, seed):
    # One jitted init instead of hundreds of eager ops (seconds on a busy 2-core machine).
    return model, jax.jit(model.init_params)(jax.random.PRNGKey(seed))


@pytest.fixture(scope="module")
def dec_pair():
    # 8 heads split on every mesh; 2 kv heads are replicated where 'model' > 2 (the GQA rule).
    target = _with_params(
        helpers.tiny_decoder_model(V, emb=64, layers=1, heads=8, kv_heads=2), seed=0
    )
    draft = _with_params(
        helpers.tiny_decoder_model(V, emb=32, layers=1, heads=2, kv_heads=1), seed=1
    )
    batch = helpers.ragged_prompts(0, batch=8, width=6, vocab=V)
    return target, draft, batch


@pytest.fixture(scope="module")
def t5_pair():
    target, draft = tiny_t5(64, 8, seed=0), tiny_t5(32, 2, seed=1)
    rng = np.random.default_rng(0)
    tokens = rng.integers(2, V, size=(8, 6))
    tokens[1::2, 4:] = 0  # padded rows
    return target, draft, {"encoder_input_tokens": jnp.asarray(tokens, jnp.int32)}


def _decode(pair, sampling, partitioner=None, tree=None):
    target, draft, batch = pair
    return decoding.speculative_decode(
        *target,
        *draft,
        batch,
        gamma=None if tree else GAMMA,
        tree=tree,
        max_decode_len=MAX_LEN,
        sampling=sampling,
        eos_id=1,
        rng=jax.random.PRNGKey(7),
        partitioner=partitioner,
    )


_REFERENCES = {}


def _reference(name, pair, sampling):
    if (name, sampling) not in _REFERENCES:
        _REFERENCES[name, sampling] = _decode(pair, sampling)
    return _REFERENCES[name, sampling]


def _assert_same_output(out, ref, mesh):
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    assert out.stats.keys() == ref.stats.keys()
    for key, value in ref.stats.items():
        np.testing.assert_allclose(out.stats[key], value, rtol=1e-6, err_msg=key)
    if mesh[0] > 1:  # outputs stay split by rows over 'data' (nothing gathered inside the jit)
        assert out.tokens.sharding.spec[0] == "data"


@pytest.mark.parametrize(
    "mesh, sampling",
    [pytest.param(MESHES[0], SamplingConfig(), marks=pytest.mark.slow)]  # 'model' alone: 2x4 has it
    + [(MESHES[1], SamplingConfig())]
    + [pytest.param((8, 1), SamplingConfig(), marks=pytest.mark.slow)]  # 'data' alone: 2x4 has it
    + [((2, 4), SAMPLED)],
    ids=["1x8-greedy", "2x4-greedy", "8x1-greedy", "2x4-sampled"],
)
def test_decoder_pair_identical_to_unsharded(dec_pair, mesh, sampling):
    ref = _reference("decoder", dec_pair, sampling)
    out = _decode(dec_pair, sampling, partitioning.create_partitioner(*mesh))
    _assert_same_output(out, ref, mesh)


@pytest.mark.parametrize(
    "mesh, sampling",
    [pytest.param(MESHES[0], SamplingConfig(), marks=pytest.mark.slow)]  # 'model' alone: 2x4 has it
    + [(MESHES[1], SamplingConfig())]
    + [pytest.param((8, 1), SamplingConfig(), marks=pytest.mark.slow)]  # 'data' alone: 2x4 has it
    + [((2, 4), SAMPLED)],
    ids=["1x8-greedy", "2x4-greedy", "8x1-greedy", "2x4-sampled"],
)
def test_t5_pair_identical_to_unsharded(t5_pair, mesh, sampling):
    ref = _reference("t5", t5_pair, sampling)
    out = _decode(t5_pair, sampling, partitioning.create_partitioner(*mesh))
    _assert_same_output(out, ref, mesh)


@pytest.mark.parametrize("pair_name", ["dec_pair"])
def test_token_trees_identical_to_unsharded(pair_name, request):
    """A tree round (tree attention, the accepted path's cache entries moved per row) keeps the
    cache sharded and gives the unsharded result."""
    pair = request.getfixturevalue(pair_name)
    ref = _decode(pair, SAMPLED, tree=(2, 2, 1))
    out = _decode(pair, SAMPLED, partitioning.create_partitioner(2, 4), tree=(2, 2, 1))
    _assert_same_output(out, ref, (2, 4))


def test_autoregressive_identical_to_unsharded(dec_pair):
    (model, params), _, batch = dec_pair
    kwargs = dict(max_decode_len=MAX_LEN, eos_id=1, sampling=SAMPLED, rng=jax.random.PRNGKey(3))
    ref = decoding.autoregressive_decode(model, params, batch, **kwargs)
    p = partitioning.create_partitioner(4, 2)
    out = decoding.autoregressive_decode(model, params, batch, partitioner=p, **kwargs)
    _assert_same_output(out, ref, (4, 2))


def _shard_shape(array):
    return array.addressable_shards[0].data.shape


def test_params_sharded_as_the_rules_say(dec_pair, t5_pair):
    p = partitioning.create_partitioner(2, 4)
    (model, params), (draft, draft_params), _ = dec_pair
    placed = p.place_params(model, params, "target")
    layer = placed["layers_0"]
    # DecoderLM kernels are output-major [out..., in...] (models/decoder.py).
    assert layer["self_attention"]["query"]["kernel"].sharding.spec == P("model", None, None)
    assert _shard_shape(layer["self_attention"]["query"]["kernel"]) == (2, 8, 64)
    assert _shard_shape(layer["self_attention"]["out"]["kernel"]) == (64, 2, 8)
    assert _shard_shape(layer["mlp"]["wi_0"]["kernel"]) == (32, 64)
    assert _shard_shape(layer["mlp"]["wo"]["kernel"]) == (64, 32)
    assert _shard_shape(placed["token_embedder"]["embedding"]) == (16, 64)
    assert _shard_shape(placed["logits_dense"]["kernel"]) == (16, 64)
    # GQA: 2 kv heads on a model axis of 4 are replicated, as are the norms.
    assert _shard_shape(layer["self_attention"]["key"]["kernel"]) == (2, 8, 64)
    assert layer["pre_mlp_layer_norm"]["scale"].sharding.is_fully_replicated
    # The draft is replicated over 'model' (and params have no batch axis).
    for leaf in jax.tree_util.tree_leaves(p.place_params(draft, draft_params, "draft")):
        assert leaf.sharding.is_fully_replicated

    # No replication of what should be split: every T5 parameter with a split logical axis holds
    # exactly 1/4 of its elements per device.
    (enc_dec, t5_params), _, _ = t5_pair
    placed = p.place_params(enc_dec, t5_params, "target")
    axes = jax.tree_util.tree_leaves(enc_dec.logical_axes(), is_leaf=partitioning.is_spec)
    for spec, leaf in zip(axes, jax.tree_util.tree_leaves(placed), strict=True):
        split = any(name in ("vocab", "heads", "joined_kv", "mlp") for name in spec)
        shard = leaf.addressable_shards[0].data
        assert shard.size * (4 if split else 1) == leaf.size, (spec, leaf.shape, shard.shape)
    rel = placed["decoder"]["relpos_bias"]["rel_embedding"]
    assert rel.sharding.spec == P("model", None)


def _prefilled_state(p, model, params, batch, role, cache_len=16):
    """A real decode state after the prefill, placed the way the decode loop constrains it."""
    params = p.place_params(model, params, role)
    batch = p.place_batch(batch)

    @jax.jit
    def prefill(params, batch):
        state, *_ = decoding.prefill(model, params, batch, cache_len)
        return p.constrain_state(model, state, role)

    return params, prefill(params, batch)


def test_state_sharded_as_the_rules_say_and_memory_report_matches(dec_pair, t5_pair):
    p = partitioning.create_partitioner(2, 4)
    (enc_dec, t5_params), (t5_draft, t5_draft_params), t5_batch = t5_pair
    # the cache the memory report assumes: 0 (no prompt) + max_decode_len 12 + the slack,
    # max(gamma 3 + 1, base.CACHE_SLACK)
    length = enc_dec.cache_length(6, 12, 3 + 1)
    params, state = _prefilled_state(p, enc_dec, t5_params, t5_batch, "target", length)
    key = state.cache["layers_0"]["key"]  # [B, H, S, D] = [8, 8, S, 8]
    assert key.sharding.is_equivalent_to(p.sharding(P("batch", "heads"), p.target_rules), 4)
    assert _shard_shape(key) == (4, 2, length, 8)
    cross = state.extras["cross"]["layers_0"]["value"]
    assert _shard_shape(cross) == (4, 2, 6, 8)
    assert _shard_shape(state.index) == (4,)
    assert _shard_shape(state.extras["encoder_mask"]) == (4, 6)

    # The memory report's per-device bytes are what the real arrays occupy on a device.
    def device0_bytes(tree):
        return sum(x.addressable_shards[0].data.nbytes for x in jax.tree_util.tree_leaves(tree))

    mesh = p.mesh_shape
    rules = p.target_rules
    assert device0_bytes(params) == memory.param_bytes(enc_dec, rules, mesh, jnp.float32)
    assert device0_bytes(state) == memory.state_bytes(enc_dec, rules, mesh, 8, 6, 12, 3)

    draft_params, draft_state = _prefilled_state(
        p, t5_draft, t5_draft_params, t5_batch, "draft", length
    )
    assert _shard_shape(draft_state.cache["layers_0"]["key"]) == (4, 2, length, 8)  # replicated
    assert device0_bytes(draft_params) == memory.param_bytes(
        t5_draft, p.draft_rules, mesh, jnp.float32
    )
    assert device0_bytes(draft_state) == memory.state_bytes(
        t5_draft, p.draft_rules, mesh, 8, 6, 12, 3
    )

    (model, dec_params), _, batch = dec_pair
    _, state = _prefilled_state(p, model, dec_params, batch, "target")
    assert _shard_shape(state.cache["layers_0"]["value"]) == (4, 2, 16, 8)  # GQA: kv replicated


def _compiled_text(pair, partitioner):
    target, draft, batch = pair
    (target_model, target_params), (draft_model, draft_params) = target, draft
    target_params = partitioner.place_params(target_model, target_params, "target")
    draft_params = partitioner.place_params(draft_model, draft_params, "draft")
    batch, rng = decoding.place_inputs(partitioner, batch, jax.random.PRNGKey(0))
    config = decoding.DecodeConfig(MAX_LEN, 1, SamplingConfig(), gamma=GAMMA)
    lowered = decoding.speculative_loop.lower(
        target_model, target_params, draft_model, draft_params, batch, rng, config, partitioner
    )
    return lowered.compile().as_text()


def _all_gathers(text, loops_only=False):
    return [s for op, s in partitioning.collectives(text, loops_only) if op == "all-gather"]


def _weight_sizes(model):
    """Element counts of the params that are split over 'model' (the ones worth gathering)."""
    axes = jax.tree_util.tree_leaves(model.logical_axes(), is_leaf=partitioning.is_spec)
    leaves = jax.tree_util.tree_leaves(partitioning.param_shapes(model))
    return {
        leaf.size
        for spec, leaf in zip(axes, leaves, strict=True)
        if leaf.size >= 1024 and {"vocab", "heads", "mlp", "joined_kv"} & set(spec)
    }


@pytest.mark.parametrize("pair_name", ["dec_pair", "t5_pair"])
def test_compiled_loop_gathers_no_full_weights(pair_name, request):
    pair = request.getfixturevalue(pair_name)
    text = _compiled_text(pair, partitioning.create_partitioner(2, 4))
    weights = _weight_sizes(pair[0][0])
    assert weights
    # No full weight is ever gathered: not per step, and not hoisted out of the loop either.
    full = [s for s in _all_gathers(text) if int(np.prod(s)) in weights]
    assert not full, f"all-gathers of full weights: {full}"
    # Per step, only per-row data is gathered: logits pieces, tokens, indices of the local rows.
    in_loop = _all_gathers(text, loops_only=True)
    assert all(int(np.prod(s)) < min(weights) for s in in_loop), in_loop
    # The loop carries the caches split: per device [B/2, H/4, S, D] (T5: 8 heads, S = 9 + slack)
    # and [B/2, K, S, D] (decoder, 2 kv heads replicated, S = 6 + 9 + slack), never whole; the
    # slack is max(gamma + 1, base.CACHE_SLACK).
    slack = max(GAMMA + 1, base.CACHE_SLACK)
    split, whole = {
        "t5_pair": (f"f32[4,2,{9 + slack},8]", f"[4,8,{9 + slack},8]"),
        "dec_pair": (f"f32[4,2,{15 + slack},8]", f"[8,2,{15 + slack},8]"),
    }[pair_name]
    assert split in text and whole not in text


def test_gather_check_sees_a_hoisted_weight_gather():
    """Negative control: a loop that needs a model-split weight whole. XLA gathers it once, before
    the loop (hoisted), so only the module-wide check sees it; that is the check used above."""
    mesh = partitioning.create_mesh(2, 4)
    w = jax.device_put(jnp.ones((64, 128)), NamedSharding(mesh, P(None, "model")))
    x = jax.device_put(jnp.ones((8, 64)), NamedSharding(mesh, P("data", None)))

    @jax.jit
    def loop(w, x):
        def body(c):
            i, x = c
            whole = jax.lax.with_sharding_constraint(w * (i + 1.0), NamedSharding(mesh, P()))
            return i + 1, jnp.tanh(x @ whole[:, :64])

        return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, x))[1]

    text = loop.lower(w, x).compile().as_text()
    assert (64, 128) in _all_gathers(text)
    assert (64, 128) not in _all_gathers(text, loops_only=True)


def test_bad_mesh_errors_name_the_dimension(dec_pair):
    target, draft, batch = dec_pair
    kwargs = dict(gamma=GAMMA, max_decode_len=MAX_LEN, eos_id=1)
    six = {k: v[:6] for k, v in batch.items()}
    with pytest.raises(ValueError, match="batch size 6 is not divisible by the 'data' mesh axis"):
        decoding.speculative_decode(
            *target, *draft, six, partitioner=partitioning.create_partitioner(4, 2), **kwargs
        )
    # The error is raised before params are read.
    wide = helpers.tiny_decoder_model(V, emb=48, layers=1, heads=6, kv_heads=6)
    with pytest.raises(ValueError, match="num_heads=6 is not divisible by the 'model' mesh axis"):
        decoding.speculative_decode(
            wide, None, *draft, batch, partitioner=partitioning.create_partitioner(2, 4), **kwargs
        )


def test_t5x_checkpoint_read_per_shard(tmp_path, t5_pair, monkeypatch):
    from tests.test_t5_checkpoints import write_t5x_checkpoint

    (enc_dec, params), _, _ = t5_pair
    write_t5x_checkpoint(str(tmp_path), params)
    reads = []
    original = sharded_checkpoints.read_slice

    def recording_read(source, index, version):  # the real read, with a record of its slice
        out = original(source, index, version)
        reads.append(out.size)
        return out

    monkeypatch.setattr(sharded_checkpoints, "read_slice", recording_read)
    p = partitioning.create_partitioner(2, 4)
    loaded = sharded_checkpoints.load_t5x_sharded(
        str(tmp_path), enc_dec.config, p, "target", dtype=jnp.bfloat16
    )
    reference = load_t5x(str(tmp_path), enc_dec.config, dtype=jnp.bfloat16)
    shardings = p.param_shardings(enc_dec, "target")
    for got, want, sharding in zip(
        jax.tree_util.tree_leaves(loaded),
        jax.tree_util.tree_leaves(reference),
        jax.tree_util.tree_leaves(shardings),
        strict=True,
    ):
        assert got.dtype == jnp.bfloat16 and got.sharding == sharding
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # The embedding [64, 64] is split over 'model': 4 distinct quarter reads, never the whole.
    embedding = 64 * 64
    assert embedding // 4 in reads and embedding not in reads
    # A split parameter is read once per distinct slice (4), not once per device (8).
    assert reads.count(embedding // 4) == 4 * sum(
        1 for leaf in jax.tree_util.tree_leaves(params) if leaf.size == embedding
    )


def test_distributed_helpers_single_process(dec_pair):
    _, _, batch = dec_pair
    p = partitioning.create_partitioner(4, 2)
    rows = distributed.process_rows(p, 8)
    assert rows == slice(0, 8)  # one process owns every row
    local = {k: np.asarray(v)[rows] for k, v in batch.items()}
    global_batch = distributed.global_batch(p, local, 8)
    assert global_batch["prompt"].sharding.spec == P("data", None)
    host = distributed.gather_to_host0(global_batch)
    np.testing.assert_array_equal(host["prompt"], batch["prompt"])
    with pytest.raises(ValueError, match="batch size 6 is not divisible"):
        distributed.global_batch(p, {k: v[:6] for k, v in local.items()}, 6)
