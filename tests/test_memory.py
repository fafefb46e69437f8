"""Memory report and planner: per-device bytes from shapes and rules, checked by hand arithmetic.

That the figures equal the bytes real sharded arrays occupy is checked on 8 host devices in
tests/test_sharded_decoding.py.
"""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from speculative.measure import memory
from speculative.models import base
from speculative.parallel import partitioning
from tests.helpers import tiny_decoder_model

MESH_2x4 = {"data": 2, "model": 4}


def test_array_bytes_per_device():
    assert (
        memory.array_bytes_per_device((8, 4, 16), jnp.bfloat16, P("data", "model"), MESH_2x4) == 128
    )
    assert memory.array_bytes_per_device((8, 4), jnp.float32, P(), MESH_2x4) == 128
    both = P(("data", "model"), None)
    assert memory.array_bytes_per_device((8, 4), jnp.float32, both, MESH_2x4) == 16


def test_decoder_param_and_cache_bytes_by_hand():
    v, e, h, k, d, m = 64, 64, 8, 2, 8, 128
    model = tiny_decoder_model(v, emb=e, layers=2, heads=h, kv_heads=k)
    split = 4  # 'model'; kv heads (2) do not divide it and are replicated (GQA rule)
    per_layer = (
        (e * h * d + h * d) / split  # query kernel + bias
        + 2 * (e * k * d + k * d)  # key, value: replicated
        + h * d * e / split  # out
        + 3 * e * m / split  # wi_0, wi_1, wo
        + 2 * e  # two norms, replicated
    )
    total = 2 * per_layer + v * e / split + e * v / split + e
    got = memory.param_bytes(model, partitioning.TARGET_RULES, MESH_2x4, jnp.bfloat16)
    assert got == 2 * total

    batch, prompt, decode, gamma = 8, 5, 10, 3
    length = prompt + decode + max(gamma + 1, base.CACHE_SLACK)  # the cache's slack
    cache = 2 * 2 * (batch // 2) * k * length * d * 4  # layers x (key, value), float32
    got = memory.state_bytes(
        model, partitioning.TARGET_RULES, MESH_2x4, batch, prompt, decode, gamma
    )
    assert got == cache + (batch // 2) * 4  # + index [B] int32


def test_draft_rules_replicate_the_whole_model():
    model = tiny_decoder_model(64, emb=64, layers=1, heads=8, kv_heads=8)
    full = sum(x.size for x in jax.tree_util.tree_leaves(partitioning.param_shapes(model))) * 4
    assert memory.param_bytes(model, partitioning.DRAFT_RULES, MESH_2x4, jnp.float32) == full
    assert (
        memory.param_bytes(model, partitioning.TARGET_RULES, {"data": 1, "model": 1}, jnp.float32)
        == full
    )


@pytest.fixture(scope="module")
def paper():
    return memory.paper_configs()


def test_t5_xxl_bf16_plans(paper):
    xxl, small = paper["xxl"], paper["small"]
    args = dict(batch_size=1, input_len=512, max_decode_len=128, gamma=7)
    h100 = memory.plan(xxl, small, "h100-80gb", **args)
    v4 = memory.plan(xxl, small, "tpu-v4-8", **args)
    # T5 v1.1 XXL has ~11.1B parameters: ~22 GB in bfloat16 on one GPU.
    assert 10.9e9 < h100.target_params / 2 < 11.4e9
    # On v4-8 (model axis 4) everything but the layer norms is split four ways.
    assert 0.25 < v4.target_params / h100.target_params < 0.251
    assert v4.draft_params == h100.draft_params  # the draft is replicated
    assert h100.fits and v4.fits
    assert memory.plan(xxl, small, "h200-141gb", **args).fits


def test_plan_that_does_not_fit_and_bad_mesh(paper):
    xxl, large = paper["xxl"], paper["large"]
    small_gpu = memory.Device("16 GiB GPU", 16 * memory.GIB, 1)
    args = dict(batch_size=1, input_len=512, max_decode_len=128, gamma=7)
    p = memory.plan(xxl, large, small_gpu, param_dtype=jnp.float32, **args)
    assert not p.fits and p.total > 44e9
    with pytest.raises(ValueError, match="is not divisible by the 'model' mesh axis of size 3"):
        memory.plan(xxl, large, memory.Device("three", 32 * memory.GIB, 3), **args)
    with pytest.raises(
        ValueError, match="batch size 3 is not divisible by the 'data' mesh axis of size 4"
    ):
        memory.plan(
            xxl, large, "tpu-v4-8", mesh_shape={"data": 4, "model": 1}, **{**args, "batch_size": 3}
        )


def test_report_table(paper):
    rows = memory.paper_report()
    assert len(rows) == 9 and all(r["fits"] for r in rows)
    table = memory.format_table(rows)
    assert "TPU v4-8" in table and "H200 141GB" in table and "t5_1_1 large" in table


def test_job_report_line_matches_the_planner():
    target = tiny_decoder_model(1000, emb=64, layers=2, heads=4, kv_heads=2)
    line = memory.job_report(
        target,
        None,
        batch_size=2,
        input_len=10,
        max_decode_len=20,
        gamma=3,
        param_dtype=jnp.float32,
    )
    params = memory.param_bytes(
        target, partitioning.TARGET_RULES, {"data": 1, "model": 1}, jnp.float32
    )
    assert f"target params {params / memory.GIB:.3f}" in line and "draft" not in line
    assert "mesh 1x1" in line
