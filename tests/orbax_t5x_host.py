"""One host of a 2-process, 8-device (2 x 4 host devices) pod for tests/test_orbax_t5x_hosts.py.

    python -m tests.orbax_t5x_host PROCESS_ID PORT CHECKPOINT_DIR RESULT_JSON

Both processes write a tiny T5's parameters, sharded by the target rules, as an Orbax T5X checkpoint
(each writes its own shards, as T5X does), then restore it with `load_t5x_sharded` on a data 2 x
model 4 mesh laid out so that each host holds two of the four 'model' columns. Each writes
RESULT_JSON: the bytes TensorStore read from files during the restore, and the float32 bytes of
the split and of the replicated parameters. It checks every local shard against the values written.
"""

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from speculative.checkpoints import sharded as sharded_checkpoints
from speculative.checkpoints import validation
from speculative.models import t5
from speculative.parallel import distributed, partitioning


def tiny_config() -> t5.T5Config:
    """tests.helpers.tiny_t5_config(64, emb=64, heads=8, 1 + 1 layers, mlp=128), without importing
    the test helpers (scipy) in each host process."""
    return t5.T5Config(
        vocab_size=64,
        emb_dim=64,
        num_heads=8,
        num_encoder_layers=1,
        num_decoder_layers=1,
        head_dim=8,
        mlp_dim=128,
        mlp_activations=("gelu", "linear"),
    )


def bytes_read() -> int:
    found = ts.experimental_collect_matching_metrics("/tensorstore/kvstore/file/bytes_read")
    return sum(v.get("value", 0) for m in found for v in m["values"])


def main(process_id: int, port: int, directory: str, result: str) -> None:
    start = time.perf_counter()
    # Cross-process computations on XLA:CPU (the restore's finiteness check) need collectives.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    distributed.initialize(True, f"localhost:{port}", 2, process_id)
    devices = jax.devices()  # process 0's four, then process 1's
    order = [devices[i] for i in (0, 1, 4, 5, 2, 3, 6, 7)]  # each host: two 'model' columns
    p = partitioning.create_partitioner(2, 4, devices=order)
    config = tiny_config()
    model = t5.T5(config)
    shapes = validation.expected_shapes(jax.eval_shape(model.init_params, jax.random.PRNGKey(0)))
    shardings = validation.flatten(p.param_shardings(model, "target"))
    rng = np.random.default_rng(0)  # the same values in both processes, no compilation
    values = {n: rng.standard_normal(shapes[n]).astype(np.float32) for n in sorted(shapes)}
    placed = {
        n: jax.make_array_from_callback(shapes[n], shardings[n], values[n].__getitem__)
        for n in values
    }
    tree = {"target": validation.unflatten(placed), "state": {"step": np.int32(1)}}
    ocp.PyTreeCheckpointer().save(directory, tree)
    before = bytes_read()
    loaded = sharded_checkpoints.load_t5x_sharded(directory, config, p, dtype=jnp.bfloat16)
    read = bytes_read() - before
    for name, array in validation.flatten(loaded).items():
        assert array.sharding == shardings[name] and array.dtype == jnp.bfloat16, name
        for shard in array.addressable_shards:
            want = values[name][shard.index].astype(jnp.bfloat16)
            np.testing.assert_array_equal(np.asarray(shard.data), want, err_msg=name)
    split = sum(v.nbytes for n, v in values.items() if not shardings[n].is_fully_replicated)
    whole = sum(v.nbytes for v in values.values())
    with open(result, "w") as f:
        json.dump(
            {
                "bytes_read": read,
                "split_bytes": split,
                "replicated_bytes": whole - split,
                "seconds": time.perf_counter() - start,
            },
            f,
        )


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
