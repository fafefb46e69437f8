"""Gemma 3 (sliding-window layers, q/k norms, two RoPE bases) decoded on 8 host devices: greedy
speculative output (chains and a tree) under the partitioner equals plain unpartitioned decoding.

Gemma's parameters reach the mesh through their logical axis names (`models.gemma`, the rules of
`partitioning.py`), as every family's do. Needs 8 host devices, so the default suite runs this
module in a subprocess (tests/test_spmd.py); by hand:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/pytest tests/test_sharded_gemma.py
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.models.gemma import GemmaConfig, GemmaLM
from speculative.parallel import partitioning
from tests import helpers

pytestmark = helpers.needs_host_devices("tests/test_spmd.py")

V, WINDOW, MAX_LEN = 64, 4, 10


def _gemma3(emb: int, layers: int, heads: int, kv_heads: int, seed: int):
    """A random Gemma 3 model (every third layer global, the others a window of 4) and params;
    its (1 + w) norm weights randomised so they are not all 1."""
    local = tuple(bool((i + 1) % 3) for i in range(layers))
    config = GemmaConfig(
        V, emb, layers, heads, kv_heads, 8, 2 * emb, rope_theta=1e6,
        rope_scaling=(("rope_type", "linear"), ("factor", 2.0)), query_pre_attn_scalar=8.0,
        final_softcap=20.0, qk_norm=True, sliding_window=WINDOW, local_layers=local,
    )  # fmt: skip
    model = GemmaLM(config)
    params = jax.jit(model.init_params)(jax.random.PRNGKey(seed))
    keys = iter(jax.random.split(jax.random.PRNGKey(seed + 100), 64))
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x + 0.5 * jax.random.normal(next(keys), x.shape) if "norm" in str(p) else x,
        params,
    )
    return model, params


@pytest.fixture(scope="module")
def gemma_pair():
    # 8 query heads split on every mesh; 2 kv heads replicated where 'model' > 2 (the GQA rule).
    target = _gemma3(emb=64, layers=3, heads=8, kv_heads=2, seed=0)
    draft = _gemma3(emb=32, layers=2, heads=2, kv_heads=1, seed=1)
    batch = helpers.ragged_prompts(0, batch=8, width=7, vocab=V, low=2)  # longer than the window
    return target, draft, batch


@pytest.fixture(scope="module")
def plain(gemma_pair):
    (model, params), _, batch = gemma_pair
    return decoding.autoregressive_decode(model, params, batch, max_decode_len=MAX_LEN, eos_id=1)


@pytest.mark.parametrize(
    "mesh, options",
    [
        # The chains are slow-marked repeats: the decoder's sharded tests cover chains under the
        # partitioner, and the tree case runs Gemma's sharded model through the same step.
        pytest.param((1, 8), dict(gamma=3), marks=pytest.mark.slow),
        pytest.param((2, 4), dict(gamma=3), marks=pytest.mark.slow),
        ((2, 4), dict(tree=(2, 2, 1))),
    ],
    ids=["1x8-chain", "2x4-chain", "2x4-tree"],
)
def test_gemma_greedy_speculative_sharded_equals_plain(gemma_pair, plain, mesh, options):
    target, draft, batch = gemma_pair
    partitioner = partitioning.create_partitioner(*mesh)
    out = decoding.speculative_decode(
        *target, *draft, batch, max_decode_len=MAX_LEN, eos_id=1, partitioner=partitioner,
        **options,
    )  # fmt: skip
    np.testing.assert_array_equal(out.tokens, plain.tokens)
    np.testing.assert_array_equal(out.lengths, plain.lengths)
    assert int(jnp.sum(plain.lengths)) > 8  # something was decoded past the prompts
    placed = partitioner.place_params(*target, "target")
    query = placed["layers_0"]["self_attention"]["query"]["kernel"]  # [heads, D, E]
    assert query.addressable_shards[0].data.shape[0] == 8 // mesh[1]  # heads split over 'model'
