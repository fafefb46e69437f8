"""Partitioning rules, divisibility errors, state axes, gin: shape-level checks (one device is enough).

The checks on real sharded arrays and compiled loops run on 8 host devices in
tests/test_sharded_decoding.py (launched by tests/test_spmd.py).
"""

import gin
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from speculative.models import t5
from speculative.models.base import decode_state_axes
from speculative.parallel import partitioning
from tests import helpers

MESH_2x4 = {"data": 2, "model": 4}


def tiny_t5(heads=8, head_dim=8, mlp=32, vocab=64):
    """A one-layer T5 whose sizes the divisibility checks vary."""
    config = helpers.tiny_t5_config(
        vocab, emb=16, heads=heads, encoder_layers=1, decoder_layers=1, head_dim=head_dim, mlp=mlp
    )
    return t5.T5(config)


def test_default_rules_follow_t5x():
    rules = partitioning.TARGET_RULES
    assert partitioning.mesh_axes(P("batch", "embed", "heads", "kv"), rules) == P(
        "data", None, "model", None
    )
    assert partitioning.mesh_axes(P("embed", "mlp"), rules) == P(None, "model")
    assert partitioning.mesh_axes(P("vocab", "embed"), rules) == P("model", None)
    assert partitioning.mesh_axes(P("embed", "joined_kv"), rules) == P(None, "model")
    # The draft keeps only batch on 'data': everything else replicated over 'model'.
    draft = partitioning.DRAFT_RULES
    assert partitioning.mesh_axes(P("batch", "kv_heads", "length", "kv"), draft) == P(
        "data", None, None, None
    )
    assert partitioning.mesh_axes(P("vocab", "embed"), draft) == P(None, None)


def test_gqa_kv_heads_replicated_when_axis_does_not_divide():
    model = helpers.tiny_decoder_model(64, emb=64, layers=1, heads=8, kv_heads=2)
    rules = dict(partitioning.resolve_rules(model, partitioning.TARGET_RULES, MESH_2x4))
    assert rules["kv_heads"] is None and rules["heads"] == "model"
    # 2 kv heads on a model axis of 2 do divide: they stay split.
    rules = dict(
        partitioning.resolve_rules(model, partitioning.TARGET_RULES, {"data": 4, "model": 2})
    )
    assert rules["kv_heads"] == "model"


def test_strict_kv_heads_names_the_dimension():
    model = helpers.tiny_decoder_model(64, emb=64, layers=1, heads=8, kv_heads=2)
    with pytest.raises(
        ValueError, match="num_kv_heads=2 is not divisible by the 'model' mesh axis of size 4"
    ):
        partitioning.resolve_rules(model, partitioning.TARGET_RULES, MESH_2x4, strict_kv_heads=True)


def test_heads_not_dividing_names_the_dimension():
    model = helpers.tiny_decoder_model(64, emb=48, layers=1, heads=6, kv_heads=6)
    with pytest.raises(
        ValueError, match="num_heads=6 is not divisible by the 'model' mesh axis of size 4"
    ):
        partitioning.resolve_rules(model, partitioning.TARGET_RULES, MESH_2x4)
    # T5: joined_kv (6 * 8 = 48) divides, but the heads of the relative-position table do not.
    with pytest.raises(ValueError, match="num_heads=6 is not divisible by the 'model' mesh axis"):
        partitioning.resolve_rules(tiny_t5(heads=6), partitioning.TARGET_RULES, MESH_2x4)
    # Replicated in the draft rules: no error.
    partitioning.resolve_rules(tiny_t5(heads=6), partitioning.DRAFT_RULES, MESH_2x4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mlp=30), "mlp_dim=30 is not divisible"),
        (dict(vocab=66), "vocab_size=66 is not divisible"),
        (
            dict(heads=4, head_dim=3),
            "num_heads \\* head_dim=12 is not divisible by the 'model' mesh axis of size 8",
        ),
    ],
)
def test_other_dimensions_name_their_config_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        partitioning.resolve_rules(
            tiny_t5(**kwargs), partitioning.TARGET_RULES, {"data": 1, "model": 8}
        )


def test_batch_not_dividing_names_the_dimension():
    with pytest.raises(
        ValueError, match="batch size 6 is not divisible by the 'data' mesh axis of size 4"
    ):
        partitioning.check_batch_size(6, {"data": 4, "model": 2})
    partitioning.check_batch_size(8, {"data": 4, "model": 2})


def test_decode_state_axes():
    model = helpers.tiny_decoder_model(64, emb=32, layers=2, heads=4, kv_heads=2)
    prompt = {"prompt": jax.ShapeDtypeStruct((2, 3), jnp.int32)}
    state = jax.eval_shape(lambda b: model.init_state(None, b, 8), prompt)
    axes = decode_state_axes(state, partitioning.cache_heads_axis(model))
    assert axes.cache["layers_1"]["key"] == P("batch", "kv_heads", "length", "kv")
    assert axes.index == P("batch") and axes.extras is None

    enc_dec = tiny_t5()
    tokens = {"encoder_input_tokens": jax.ShapeDtypeStruct((2, 5), jnp.int32)}
    state = jax.eval_shape(
        lambda p, b: enc_dec.init_state(p, b, 8), partitioning.param_shapes(enc_dec), tokens
    )
    axes = decode_state_axes(state, partitioning.cache_heads_axis(enc_dec))
    assert axes.cache["layers_0"]["value"] == P("batch", "heads", "length", "kv")
    assert axes.extras["cross"]["layers_0"]["key"] == P("batch", "heads", "length", "kv")
    assert axes.extras["encoder_mask"] == P("batch", None)


def test_partitioner_from_gin_with_overridden_rules():
    gin.clear_config()
    try:
        gin.parse_config(
            """
            partitioning.create_partitioner.data = 1
            partitioning.create_partitioner.model = 1
            partitioning.create_partitioner.target_rules = [
                ['batch', 'data'], ['heads', 'model'], ['mlp', None], ['vocab', 'model']]
            """
        )
        p = partitioning.create_partitioner()
    finally:
        gin.clear_config()
    assert dict(p.mesh.shape) == {"data": 1, "model": 1}
    assert dict(p.target_rules)["mlp"] is None
    assert hash(p) == hash(partitioning.Partitioner(p.mesh, p.target_rules))  # static jit arg


def test_mesh_larger_than_the_machine_is_refused():
    with pytest.raises(ValueError, match="needs 4096 devices"):
        partitioning.create_mesh(64, 64)
