"""T5X checkpoints read straight onto their shards: each device reads only its slice (TensorStore).

`checkpoints.load_t5x` reads every parameter whole into host memory (44 GB for T5-XXL in float32);
here `jax.make_array_from_callback` asks, per device, for the index range that device holds and
TensorStore reads just those chunks, so no host ever holds a full split parameter. Replicated
parameters are read once per host and copied to each local device.

Builds on speculative/checkpoints/t5x.py (msgpack parsing helpers, spec paths). Orbax-format T5X
checkpoints are restored the same way, slice by slice onto each device, by orbax-checkpoint
(`checkpoints.orbax_t5x.restore_sharded`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from speculative.checkpoints import orbax_t5x, t5x, validation
from speculative.models import t5
from speculative.parallel.partitioning import Partitioner

Index = tuple[slice, ...]


def open_t5x(
    path: str,
    expected: dict[str, tuple[int, ...]] | None = None,
    allow_missing_chunks: bool = False,
) -> tuple[dict[str, Any], int]:
    """Flat {name: opened TensorStore | inline numpy array} of a T5X checkpoint's target, version.

    Opening reads only metadata (.zarray) and lists the chunk files; no parameter data is read
    here. With `expected` ({name: shape}) names and shapes are validated first; absent chunk files
    are refused unless `allow_missing_chunks` (see checkpoints/t5x.py).
    """
    flat, version = t5x.open_params(path, expected)
    if not allow_missing_chunks:
        t5x.check_all_chunks(flat, path)
    return {
        name: leaf if t5x.is_tensorstore(leaf) else np.asarray(leaf) for name, leaf in flat.items()
    }, version


def read_slice(source: Any, index: Index, version: int) -> np.ndarray:
    """One device's slice of a parameter: a TensorStore read of just those chunks (or a numpy view)."""
    if isinstance(source, np.ndarray):
        return source[index]
    array = np.asarray(source[index].read().result())
    if version < 3 and array.dtype == np.uint16:  # pre-v3 bfloat16 storage
        array = array.view(ml_dtypes.bfloat16)
    return array


def _cast(array: np.ndarray, dtype: Any, name: str, where: str) -> np.ndarray:
    """validation.cast on the host (numpy): float data only, finite, converted to dtype."""
    if not (np.issubdtype(array.dtype, np.floating) or array.dtype == ml_dtypes.bfloat16):
        raise ValueError(f"{where}: parameter {name!r} has non-float dtype {array.dtype}")
    if not np.all(np.isfinite(array.astype(np.float32))):
        raise ValueError(f"{where}: parameter {name!r} contains NaN or infinite values")
    return array.astype(jnp.dtype(dtype))


def _shard_reader(name: str, source: Any, version: int, dtype: Any, where: str):
    """Callback for make_array_from_callback; a replicated slice is read once, not once per device."""
    cache: dict[tuple, np.ndarray] = {}

    def read(index: Index) -> np.ndarray:
        key = tuple((s.start, s.stop, s.step) for s in index)
        if key not in cache:
            try:
                array = read_slice(source, index, version)
            except Exception as e:  # tensorstore raises ValueError / RuntimeError variants
                raise ValueError(f"{where}: cannot read parameter {name!r}: {e}") from e
            cache[key] = _cast(array, dtype, name, where)
        return cache[key]

    return read


def load_t5x_sharded(
    path: str,
    config: t5.T5Config,
    partitioner: Partitioner,
    role: str = "target",
    dtype: Any = jnp.float32,
    *,
    allow_missing_chunks: bool = False,
) -> dict[str, Any]:
    """Loads a T5X checkpoint as params for `t5.T5(config)`, each parameter born on its shards.

    Args:
      partitioner: mesh and rules; `role` picks the target's or the draft's rules.
      dtype: parameter dtype (bfloat16 on accelerators); cast slice by slice.
      allow_missing_chunks: accept absent zarr chunk files (read as the fill value); refused by
        default, as in `checkpoints.load_t5x` (classic T5X format only).
    Returns:
      Nested params of global jax.Arrays sharded as `partitioner.param_shardings(model, role)`.
    Raises:
      ValueError naming the parameter on a missing, unexpected or mis-shaped one, an unreadable
      chunk or (by default) a missing chunk file; the mesh-divisibility ValueError of `partitioning.resolve_rules`.
    """
    where = f"T5X checkpoint {path}"
    model = t5.T5(config)
    shardings = validation.flatten(partitioner.param_shardings(model, role))
    expected = validation.expected_shapes(jax.eval_shape(model.init_params, jax.random.PRNGKey(0)))
    if t5x.is_orbax(path):  # orbax-checkpoint reads each device's slices (checkpoints/orbax_t5x.py)
        return validation.unflatten(orbax_t5x.restore_sharded(path, expected, shardings, dtype))
    flat, version = open_t5x(path, expected, allow_missing_chunks)
    placed = {
        name: jax.make_array_from_callback(
            expected[name], shardings[name], _shard_reader(name, src, version, dtype, where)
        )
        for name, src in flat.items()
    }
    return validation.unflatten(placed)
