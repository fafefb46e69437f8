"""What the gin jobs need to run on a mesh, on several hosts, and with a persistent compile cache.

- `make_partitioner`: the job's optional `partitioning.Partitioner` (a Partitioner, or a callable
  such as gin's `@partitioning.create_partitioner` that builds one); None = one device, unsharded.
- `check_batch`: BATCH_SIZE against the mesh, a one-line JobError before any weight is read.
- `start_distributed`: `distributed.initialize` once, before anything touches a device.
- `rows_of_process` / `local_rows`: the rows of a global batch this host feeds; `is_writer`:
  only process 0 writes outputs; `agree_on_pending`: every host decodes the batches host 0 says.
- `compilation_cache`: JAX's persistent compilation cache around a job, with hit/miss counts.
Everything is the identity (or a no-op) on one process without a partitioner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from speculative.errors import JobError, is_remote
from speculative.loading import fetch
from speculative.outputs.storage import OutputDir
from speculative.parallel import distributed, partitioning

# ------------------------------------------------------------------------------------------------
# Partitioner.


def make_partitioner(setting: Any) -> partitioning.Partitioner | None:
    """The job's Partitioner from its config field: None, a Partitioner, or a callable making one.

    Raises JobError for anything else, or for a mesh the devices cannot hold.
    """
    if setting is None or isinstance(setting, partitioning.Partitioner):
        return setting
    if not callable(setting):
        raise JobError(
            f"partitioner must be None or @partitioning.create_partitioner(), got {setting!r}"
        )
    try:
        made = setting()
    except ValueError as e:  # e.g. a mesh larger than the devices
        raise JobError(f"partitioner: {e}") from e
    if not isinstance(made, partitioning.Partitioner):
        raise JobError(f"partitioner: expected a partitioning.Partitioner, got {made!r}")
    return made


def describe(partitioner: partitioning.Partitioner | None) -> dict[str, Any] | None:
    """{"mesh": {"data": d, "model": m}, "processes": n} for summaries; None unsharded."""
    if partitioner is None:
        return None
    return {"mesh": partitioner.mesh_shape, "processes": jax.process_count()}


def check_batch(partitioner: partitioning.Partitioner | None, size: int, name: str) -> None:
    """JobError naming the macro (e.g. BATCH_SIZE) when the 'data' axis does not divide `size`."""
    if partitioner is None:
        return
    try:
        partitioner.check_batch(size)
    except ValueError as e:
        raise JobError(str(e).replace("batch size", name, 1)) from e


# ------------------------------------------------------------------------------------------------
# Several hosts.


def start_distributed(enabled: bool) -> bool:
    """`distributed.initialize(enabled=True)` unless JAX is already distributed; returns whether
    this process runs distributed. Call it before anything touches a device."""
    if enabled and not jax.distributed.is_initialized():
        distributed.initialize(enabled=True)
    return jax.distributed.is_initialized()


def rows_of_process(
    indices: Mapping[Any, tuple[slice, ...]],
    process_of: Callable[[Any], int],
    process_index: int,
    batch_size: int,
) -> slice:
    """The rows [start, stop) of a batch of `batch_size` rows held by `process_index`'s devices.

    Args:
      indices: device -> its index into the batch (as `Sharding.devices_indices_map((B,))`).
      process_of: device -> the process that owns it (`lambda d: d.process_index` for real ones).
    Raises:
      ValueError when the process holds no rows or its rows are not one contiguous range.
    """
    spans = set()
    for device, index in indices.items():
        if process_of(device) == process_index:
            rows = index[0] if index else slice(None)
            spans.add((rows.start or 0, batch_size if rows.stop is None else rows.stop))
    if not spans:
        raise ValueError(f"process {process_index} holds no device of the mesh")
    start, stop = min(a for a, _ in spans), max(b for _, b in spans)
    if sum(b - a for a, b in spans) != stop - start:
        raise ValueError(f"process {process_index}'s rows are not contiguous: {sorted(spans)}")
    return slice(start, stop)


def local_rows(partitioner: partitioning.Partitioner, batch_size: int) -> slice:
    """This host's rows of a global batch of `batch_size` rows sharded over 'data'."""
    indices = partitioner.row_sharding(1).devices_indices_map((batch_size,))
    return rows_of_process(indices, lambda d: d.process_index, jax.process_index(), batch_size)


def place_batch(
    partitioner: partitioning.Partitioner, local: Mapping[str, np.ndarray], batch_size: int
) -> dict[str, jax.Array]:
    """Global batch arrays (rows on 'data') from this host's rows (`local_rows`) only."""
    return distributed.global_batch(partitioner, local, batch_size)


def is_writer(process_index: int | None = None) -> bool:
    """Whether this process writes the job's files: process 0 only (all see the same results)."""
    return (jax.process_index() if process_index is None else process_index) == 0


def agree_on_pending(todo: Sequence[int], num_batches: int) -> list[int]:
    """Host 0's pending batch numbers on every host (only host 0 reads the output directory).

    Sent as a fixed-size mask over all batches, so that every host takes part in one broadcast.
    """
    if jax.process_count() == 1:
        return list(todo)
    from jax.experimental import multihost_utils

    mask = np.zeros(num_batches, np.int32)
    mask[list(todo)] = 1
    mask = np.asarray(multihost_utils.broadcast_one_to_all(mask))
    return [int(k) for k in np.flatnonzero(mask)]


class NullStore:
    """The ResultStore of a host that does not write: nothing is done, nothing is kept."""

    def __init__(self, output_dir: str):
        self.out = OutputDir(output_dir)  # not touched: only host 0 reads and writes it
        self.path = self.out.where("predictions.jsonl")
        self.done: dict[int, dict[str, Any]] = {}

    def append(self, rows: Sequence[Mapping[str, Any]]) -> None:
        pass

    def rows(self) -> list[dict[str, Any]]:
        return []

    def finish(self) -> None:
        pass


# ------------------------------------------------------------------------------------------------
# Persistent compilation cache.

_CACHE_OPTIONS = {
    "jax_compilation_cache_dir": None,
    # Cache every program, however quick to compile or small: a job's loops are many small ones.
    "jax_persistent_cache_min_compile_time_secs": 0.0,
    "jax_persistent_cache_min_entry_size_bytes": -1,
}


# 'auto' for an OUTPUT_DIR on an object store: the cache stays local (read at every compile).


def cache_dir(setting: str | None) -> str | None:
    """The cache directory a job uses: None/'' off; 'auto' = the user's cache,
    `$SPECULATIVE_CACHE/jax_cache` (default ~/.cache/speculative/jax_cache), shared by every run
    and never inside or beside OUTPUT_DIR (nor on an object store); else the directory given."""
    if not setting:
        return None
    if setting == "auto":
        return str(fetch.default_cache_dir() / "jax_cache")
    return os.path.expanduser(setting)


@dataclasses.dataclass
class CacheStats:
    """Persistent-cache events seen while a job ran (JAX's monitoring events)."""

    dir: str | None
    hits: int = 0
    misses: int = 0

    def listen(self, event: str, **_: Any) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self.hits += 1
        elif event == "/jax/compilation_cache/cache_misses":
            self.misses += 1

    @property
    def warm(self) -> bool:
        """Every program came from the cache (compile times are cache reads, not compilations)."""
        return self.hits > 0 and self.misses == 0

    def to_json(self) -> dict[str, Any]:
        """{"dir", "hits", "misses", "warm"}."""
        return {**dataclasses.asdict(self), "warm": self.warm}


@contextlib.contextmanager
def compilation_cache(path: str | None) -> Iterator[CacheStats]:
    """JAX's persistent compilation cache in `path` while the block runs (None: left as it is).

    The previous settings come back afterwards, so a job run inside a larger program (a test) does
    not leave the cache on for everything after it.
    """
    stats = CacheStats(path)
    if not path:
        yield stats
        return
    from jax.experimental.compilation_cache import compilation_cache as cc

    try:
        if not is_remote(path):  # a URL goes to JAX as it is, never a local 'gs:' folder
            pathlib.Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise JobError(
            f"compilation cache directory {path!r} cannot be created ({e}); bind "
            "COMPILATION_CACHE_DIR to another directory, or to None to turn the cache off"
        ) from e
    old = {name: getattr(jax.config, name) for name in _CACHE_OPTIONS}
    for name, value in {**_CACHE_OPTIONS, "jax_compilation_cache_dir": path}.items():
        jax.config.update(name, value)
    cc.reset_cache()  # JAX reads the directory once; a new one needs a fresh start
    jax.monitoring.register_event_listener(stats.listen)
    try:
        yield stats
    finally:
        jax.monitoring.unregister_event_listener(stats.listen)
        for name, value in old.items():
            jax.config.update(name, value)
        cc.reset_cache()
