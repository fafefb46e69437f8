"""Multi-host (multi-process) SPMD: start-up, each host feeding its rows, results on host 0.

On a TPU pod slice (or several GPU hosts) every host runs the same program; JAX sees all devices of
all hosts as one mesh, but each host can only touch its own (addressable) devices. So:
  1. `initialize()` connects the processes (jax.distributed); on Cloud TPU no arguments are needed.
  2. Each host builds only its rows of the batch (`process_rows`) and `global_batch` assembles the
     global, sharded arrays without moving data between hosts.
  3. After decoding, `gather_to_host0` all-gathers the (small) outputs; host 0 writes them.
With one process all three are the identity, so single-host code paths are the same code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gin
import jax
import numpy as np

from speculative.parallel.partitioning import Partitioner


@gin.configurable(module="distributed")
def initialize(
    enabled: bool = False,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> bool:
    """Calls `jax.distributed.initialize` when enabled; returns whether it did.

    Must run before anything touches a device. On Cloud TPU and SLURM, leave the arguments None
    (they are auto-detected); elsewhere give the coordinator "host:port", the process count and this
    process's id (e.g. from gin: `distributed.initialize.enabled = True`).
    """
    if not enabled:
        return False
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
    )
    return True


def process_rows(partitioner: Partitioner, global_batch_size: int) -> slice:
    """The rows of the global batch whose shards live on this host's devices.

    Derived from the batch sharding itself (not from process_index arithmetic), so it stays right
    for any device order jax.make_mesh picks. With 'data' smaller than the number of hosts, several
    hosts hold (and must feed) the same rows.
    """
    partitioner.check_batch(global_batch_size)
    sharding = partitioner.row_sharding(1)
    indices = sharding.addressable_devices_indices_map((global_batch_size,)).values()
    starts = [ix[0].start or 0 for ix in indices]
    stops = [global_batch_size if ix[0].stop is None else ix[0].stop for ix in indices]
    rows = slice(min(starts), max(stops))
    covered = sum(b - a for a, b in {(a, b) for a, b in zip(starts, stops)})
    if covered != rows.stop - rows.start:
        raise ValueError(f"this host's batch rows are not contiguous: {sorted(set(starts))}")
    return rows


def global_batch(
    partitioner: Partitioner, local_batch: Mapping[str, np.ndarray], global_batch_size: int
) -> dict[str, jax.Array]:
    """Global arrays, rows sharded over 'data', from this host's rows (`process_rows`) only.

    Args:
      local_batch: {"prompt": [b, P], ...} with b = this host's row count.
    """
    partitioner.check_batch(global_batch_size)
    out = {}
    for key, value in local_batch.items():
        value = np.asarray(value)
        shape = (global_batch_size,) + value.shape[1:]
        sharding = partitioner.row_sharding(value.ndim)
        out[key] = jax.make_array_from_process_local_data(sharding, value, shape)
    return out


def gather_to_host0(tree: Any) -> Any | None:
    """numpy copy of a tree of (global) arrays on process 0, None on the others.

    Every process must call it (it is a collective when there are several).
    """
    if jax.process_count() == 1:
        return jax.tree_util.tree_map(np.asarray, tree)
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(tree, tiled=True)
    return jax.tree_util.tree_map(np.asarray, gathered) if jax.process_index() == 0 else None
