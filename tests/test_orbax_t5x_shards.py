"""Orbax-format T5X checkpoints restored per shard on 8 host devices (checkpoints/orbax_t5x.py).

Every parameter equals the whole read, has the requested sharding, and each device is handed only
its slice (a model-split parameter: a quarter on a 2 x 4 mesh); the process reads each stored chunk
once (TensorStore's read counters) and none of the optimizer state. Bad checkpoints give the whole
read's one-line errors.

Needs XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts, so the default suite runs
this module in a subprocess (tests/test_spmd.py); by hand:
    XLA_FLAGS=--xla_force_host_platform_device_count=8 .venv/bin/pytest tests/test_orbax_t5x_shards.py
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts
from flax import traverse_util

from speculative.checkpoints import load_t5x
from speculative.checkpoints import sharded as sharded_checkpoints
from speculative.errors import JobError
from speculative.loading import specs as model_loading
from speculative.models import t5
from speculative.parallel import partitioning
from tests import helpers

ocp = pytest.importorskip("orbax.checkpoint", reason="orbax-checkpoint is not installed")
pytestmark = helpers.needs_host_devices("tests/test_spmd.py")

V, EMB = 64, 64
BYTES_READ = "/tensorstore/kvstore/file/bytes_read"


@pytest.fixture(scope="module")
def setup():
    """(model, float32 params, partitioner data 2 x model 4)."""
    config = helpers.tiny_t5_config(
        V, emb=EMB, heads=8, encoder_layers=1, decoder_layers=1, mlp=2 * EMB
    )
    model = t5.T5(config)
    return (
        model,
        jax.jit(model.init_params)(jax.random.PRNGKey(0)),
        partitioning.create_partitioner(2, 4),
    )


def save(path, params, state=None):
    """An Orbax T5X checkpoint: {"target": params, "state": ...}. Arrays placed on shards are
    stored one chunk per shard, as T5X writes them."""
    tree = {"target": params, "state": state or {"step": np.int32(7)}}
    ocp.PyTreeCheckpointer().save(str(path), tree)
    return str(path)


def bytes_read() -> int:
    """TensorStore's process-wide count of bytes read from local files."""
    found = ts.experimental_collect_matching_metrics(BYTES_READ)
    return sum(v.get("value", 0) for m in found for v in m["values"])


def test_t5x_orbax_restored_per_shard(tmp_path, setup, monkeypatch):
    model, params, p = setup
    shardings = p.param_shardings(model, "target")
    # An optimizer slot as big as all the parameters: a partial restore never reads it.
    slots = jax.tree.map(lambda x: np.ones(x.shape, np.float32), params)
    path = save(tmp_path / "ckpt", p.place_params(model, params), {"step": np.int32(7), "v": slots})
    reference = load_t5x(path, model.config, dtype=jnp.bfloat16)

    handed = collections.defaultdict(list)  # device -> shapes of the host arrays put on it
    put = jax.device_put

    def recording_put(x, device=None, *args, **kwargs):  # the real put, with a record of it
        if isinstance(x, np.ndarray) and device is not None:
            target = getattr(device, "sharding", device)
            for d in getattr(target, "device_set", ()):
                handed[d].append(x.shape)
        return put(x, device, *args, **kwargs)

    monkeypatch.setattr(jax, "device_put", recording_put)
    before = bytes_read()
    loaded = sharded_checkpoints.load_t5x_sharded(path, model.config, p, dtype=jnp.bfloat16)
    read = bytes_read() - before
    monkeypatch.undo()

    for got, want, sharding in zip(
        jax.tree.leaves(loaded), jax.tree.leaves(reference), jax.tree.leaves(shardings), strict=True
    ):
        assert got.dtype == jnp.bfloat16 and got.sharding == sharding
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # Each of the 8 devices is handed one slice per parameter: a quarter of the [64, 64]
    # embedding (split over 'model'), never the whole of a split parameter.
    assert set(handed) == set(p.mesh.devices.flat)
    count = len(jax.tree.leaves(params))
    for shapes in handed.values():
        assert len(shapes) == count and (V // 4, EMB) in shapes and (V, EMB) not in shapes
    # Bytes per device vs whole, as the shards the restore materialised (bfloat16).
    per_device = {d: sum(int(np.prod(s)) * 2 for s in shapes) for d, shapes in handed.items()}
    whole = sum(x.size for x in jax.tree.leaves(params)) * 2
    print(f"bytes per device {sorted(set(per_device.values()))}, whole {whole}, read {read}")
    assert max(per_device.values()) < whole / 2
    # The process reads each stored chunk once (not once per data replica), slots never: less
    # than the float32 parameters plus half their size again (random floats barely compress).
    stored = sum(x.size for x in jax.tree.leaves(params)) * 4
    assert stored * 0.8 < read < stored * 1.5


def _broken(params, what):
    flat = traverse_util.flatten_dict(jax.tree.map(np.asarray, params), sep="/")
    name = "encoder/layers_0/attention/value/kernel"
    if what == "missing":
        del flat[name]
    elif what == "mis-shaped":
        flat[name] = flat[name][:, :-8]
    else:
        flat[name] = flat[name].copy()
        flat[name][3, 5] = np.nan
    return traverse_util.unflatten_dict(flat, sep="/")


VALUE = "'encoder/layers_0/attention/value/kernel'"
WHAT = {
    "missing": f"missing parameter {VALUE}, expected shape (64, 64)",
    "mis-shaped": f"parameter {VALUE} has shape (64, 56), but the config expects (64, 64)",
    "nan": f"parameter {VALUE} contains NaN or infinite values",
}


@pytest.mark.parametrize("what", sorted(WHAT))
def test_t5x_orbax_bad_parameter_same_job_error(tmp_path, setup, what):
    model, params, p = setup
    path = save(tmp_path / what, _broken(params, what))
    spec = model_loading.ModelSpec("t5x", path=path, model=model)
    with pytest.raises(JobError) as whole:
        model_loading.load_model(spec, "target")
    with pytest.raises(JobError) as sharded:
        model_loading.load_model(spec, "target", partitioner=p)
    message = str(sharded.value)
    assert message == str(whole.value) and "\n" not in message
    assert message.startswith(f"target {path}: T5X checkpoint {path}: ")
    assert WHAT[what] in message
