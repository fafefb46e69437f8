"""T5X checkpoints (msgpack `checkpoint` + one zarr TensorStore per parameter), and Orbax ones.

A T5X checkpoint directory (t5x/checkpoints.py, format version 3) holds:
    checkpoint                                      msgpack of {"version": 3, "optimizer":
                                                    {"target": params, "state": optimizer state}}
    target.encoder.layers_0.attention.query.kernel/ zarr array (.zarray + gzip chunks), one per
    ...                                             parameter written to TensorStore
In the msgpack, a parameter written to TensorStore is replaced by its TensorStore spec (a dict whose
kvstore path is relative to the checkpoint directory); small ones may be stored inline as arrays.
Version 2 and older wrote bfloat16 as uint16. Everything is read through TensorStore, so `gs://`
directories work as well as local ones.

Zarr lets a writer leave out chunks (they read as the fill value), but a trainer's checkpoint with
absent chunk files is almost always a copy gone wrong, so they are refused unless the caller passes
`allow_missing_chunks=True`. The dtype and shape the msgpack declares are handed to TensorStore when
an array is opened, which checks the `.zarray` against them; shapes are checked against the model
before any data is read, so a corrupt `.zarray` cannot make the loader allocate more than the model.

Orbax checkpoints (a `_METADATA` or `manifest.ocdbt` file in the directory) are read with
orbax-checkpoint when it is installed (checkpoints/orbax_t5x.py); the parameters are the `target`
(T5X) or `params` subtree.
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import tensorstore as ts
from flax import serialization

from speculative.checkpoints import orbax_t5x, validation
from speculative.models import t5

_ORBAX_MARKERS = ("_METADATA", "manifest.ocdbt")
# Beyond this many chunks, missing ones are counted by one query but not located one by one.
_MAX_CHUNKS_TO_LOCATE = 4096
_CHUNKS_NAMED = 8
# A zarr chunk may exceed its array (it is stored padded), but not by more than this: TensorStore
# allocates a whole chunk to read it, and aborts the process when that allocation fails.
_MAX_OVERSIZE_CHUNK_BYTES = 64 << 20


def _directory_url(path: str) -> str:
    """A TensorStore kvstore URL for a local or gs:// directory, ending in '/'."""
    if "://" in path:
        return path.rstrip("/") + "/"
    return "file://" + os.path.abspath(path).rstrip("/") + "/"


def _read_bytes(directory: str, key: str) -> bytes | None:
    store = ts.KvStore.open(_directory_url(directory)).result()
    result = store.read(key).result()
    return None if result.state == "missing" else bytes(result.value)


def is_ts_spec(node: Any) -> bool:
    """Whether a msgpack leaf is a TensorStore spec (the array is stored beside the msgpack)."""
    return isinstance(node, dict) and "driver" in node and ("kvstore" in node or "path" in node)


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dict -> {"a/b": leaf}, treating TensorStore spec dicts as leaves."""
    if isinstance(node, dict) and not is_ts_spec(node):
        flat = {}
        for key, child in node.items():
            flat.update(_flatten(child, f"{prefix}/{key}" if prefix else str(key)))
        return flat
    return {prefix: node}


def _relative_path(spec: dict[str, Any]) -> str:
    kvstore = spec.get("kvstore")
    if isinstance(kvstore, dict) and "path" in kvstore:  # tensorstore >= 0.1.14 specs
        return kvstore["path"]
    if "path" in spec:
        return spec["path"]
    raise ValueError(f"TensorStore spec without a path: {spec}")


def _declared_metadata(spec: dict[str, Any], version: int) -> dict[str, Any]:
    """The zarr dtype and shape the msgpack declares, for TensorStore to check the .zarray against.

    Pre-v3 checkpoints stored bfloat16 as uint16 under specs that may say otherwise, so only their
    shape is checked.
    """
    metadata = spec.get("metadata")
    if not isinstance(metadata, dict):
        return {}
    keys = ("dtype", "shape") if version >= 3 else ("shape",)
    return {key: metadata[key] for key in keys if key in metadata}


def open_param(directory: str, name: str, spec: dict[str, Any], version: int = 3) -> Any:
    """Opens one TensorStore-stored parameter of a T5X checkpoint (reads only its metadata)."""
    where = f"T5X checkpoint {directory}"
    try:
        url = _directory_url(directory) + _relative_path(spec).strip("/") + "/"
        open_spec = {"driver": spec.get("driver", "zarr"), "kvstore": url}
        declared = _declared_metadata(spec, version)
        if declared:
            open_spec["metadata"] = declared
        store = ts.open(open_spec, open=True).result()
    except Exception as e:  # tensorstore raises ValueError / RuntimeError variants
        raise ValueError(f"{where}: cannot open parameter {name!r} ({spec}): {e}") from e
    _check_chunk_size(store, where, name)
    return store


def _check_chunk_size(store: Any, where: str, name: str) -> None:
    """Refuses a chunk shape whose reads would need more than the array (or 64 MiB) at once."""
    itemsize = store.dtype.numpy_dtype.itemsize
    chunk = store.chunk_layout.read_chunk.shape
    chunk_bytes = math.prod(chunk) * itemsize
    if chunk_bytes > max(math.prod(store.domain.shape) * itemsize, _MAX_OVERSIZE_CHUNK_BYTES):
        raise ValueError(
            f"{where}: parameter {name!r} has chunks of shape {tuple(chunk)} ({chunk_bytes} bytes) "
            f"for an array of shape {tuple(store.domain.shape)}: corrupt .zarray?"
        )


def _chunk_slices(store: Any, cell: tuple[int, ...]) -> tuple[slice, ...]:
    layout = store.chunk_layout
    shape, origin = layout.read_chunk.shape, layout.grid_origin
    return tuple(
        slice(max(lo, o + i * c), min(hi, o + (i + 1) * c))
        for i, c, o, lo, hi in zip(
            cell, shape, origin, store.domain.inclusive_min, store.domain.exclusive_max
        )
    )


def missing_chunks(store: Any) -> tuple[int, list[tuple[int, ...]] | None]:
    """(number of chunks in the grid, grid positions of those absent from the kvstore).

    Absent chunks read as the fill value. Uses TensorStore's storage statistics (a listing of the
    array's kvstore), so nothing is read or guessed from file names. The positions are None when
    some chunks are missing but the grid is too large to locate them one by one.
    """
    chunk = store.chunk_layout.read_chunk.shape
    grid = [math.ceil(n / c) if c else 1 for n, c in zip(store.domain.shape, chunk)]
    total = math.prod(grid)
    query = {"query_not_stored": False, "query_fully_stored": True}
    if store.storage_statistics(**query).result().fully_stored:
        return total, []
    if total > _MAX_CHUNKS_TO_LOCATE:
        return total, None
    cells = list(itertools.product(*(range(n) for n in grid)))
    pending = [store[_chunk_slices(store, cell)].storage_statistics(**query) for cell in cells]
    return total, [cell for cell, f in zip(cells, pending) if not f.result().fully_stored]


def check_chunks(store: Any, directory: str, name: str) -> None:
    """Raises ValueError naming the parameter and its missing chunk files, if any are absent."""
    try:
        total, missing = missing_chunks(store)
    except Exception as e:
        raise ValueError(
            f"T5X checkpoint {directory}: cannot list the chunks of parameter {name!r}: {e}"
        ) from e
    _raise_missing(store, directory, name, total, missing)


def check_all_chunks(flat: dict[str, Any], directory: str) -> None:
    """check_chunks for every opened TensorStore in flat, with the listings issued concurrently
    (one round trip, not one per parameter, on gs://)."""
    stores = {name: leaf for name, leaf in flat.items() if is_tensorstore(leaf)}
    query = {"query_not_stored": False, "query_fully_stored": True}
    pending = {name: store.storage_statistics(**query) for name, store in stores.items()}
    for name, future in pending.items():
        try:
            complete = future.result().fully_stored
        except Exception as e:
            raise ValueError(
                f"T5X checkpoint {directory}: cannot list the chunks of parameter {name!r}: {e}"
            ) from e
        if not complete:
            check_chunks(stores[name], directory, name)


def _raise_missing(
    store: Any, directory: str, name: str, total: int, missing: list[tuple[int, ...]] | None
) -> None:
    """The error for missing chunks (a `missing_chunks` result); nothing when none are missing."""
    if missing == []:
        return
    if missing is None:
        which = f"some of its {total} chunk files are missing"
    else:
        shown = ", ".join(str(cell) for cell in missing[:_CHUNKS_NAMED])
        more = f" and {len(missing) - _CHUNKS_NAMED} more" if len(missing) > _CHUNKS_NAMED else ""
        which = (
            f"{len(missing)} of its {total} chunk files are missing (grid positions {shown}{more})"
        )
    raise ValueError(
        f"T5X checkpoint {directory}: parameter {name!r}: {which} in "
        f"{store.kvstore.path}; they would read as the fill value. Pass "
        "allow_missing_chunks=True if the writer left out all-zero chunks on purpose"
    )


def open_params(
    path: str, expected: dict[str, tuple[int, ...]] | None = None
) -> tuple[dict[str, Any], int]:
    """Flat {name: opened TensorStore | inline leaf} of a T5X checkpoint's target, and its version.

    Reads only metadata. With `expected` ({name: shape}), validates names and shapes before any
    parameter data is read.
    """
    leaves, version = read_target_leaves(path)
    flat = {
        name: open_param(path, name, leaf, version) if is_ts_spec(leaf) else leaf
        for name, leaf in leaves.items()
    }
    if expected is not None:
        validation.validate(flat, expected, f"T5X checkpoint {path}")
    return flat, version


def read_param(store: Any, directory: str, name: str, version: int) -> np.ndarray:
    """Reads one opened TensorStore parameter whole (pre-v3 uint16 storage viewed as bfloat16)."""
    try:
        array = np.asarray(store.read().result())
    except Exception as e:
        raise ValueError(f"T5X checkpoint {directory}: cannot read parameter {name!r}: {e}") from e
    if version < 3 and array.dtype == np.uint16:  # pre-v3 bfloat16 storage
        array = array.view(ml_dtypes.bfloat16)
    return array


def read_target_leaves(path: str) -> tuple[dict[str, Any], int]:
    """The T5X msgpack's flat optimizer/target leaves (inline arrays or TensorStore specs), and the
    checkpoint format version. Reads no parameter data stored in TensorStore."""
    raw = _read_bytes(path, "checkpoint")
    if raw is None:
        raise FileNotFoundError(f"{path}: no T5X 'checkpoint' msgpack file")
    try:
        state = serialization.msgpack_restore(raw)
    except Exception as e:
        raise ValueError(f"T5X checkpoint {path}: corrupt msgpack 'checkpoint' file: {e}") from e
    optimizer = state.get("optimizer") if isinstance(state, dict) else None
    if not isinstance(optimizer, dict) or not isinstance(optimizer.get("target"), dict):
        raise ValueError(f"T5X checkpoint {path}: msgpack has no optimizer/target parameters")
    version = state.get("version", 0)
    if not isinstance(version, int | np.integer) or isinstance(version, bool):
        raise ValueError(f"T5X checkpoint {path}: msgpack 'version' is {version!r}, not an integer")
    return _flatten(optimizer["target"]), int(version)


def is_tensorstore(leaf: Any) -> bool:
    """Whether a leaf of `open_params` is an opened TensorStore (not an inline array)."""
    return isinstance(leaf, ts.TensorStore)


def read_t5x_params(
    path: str,
    expected: dict[str, tuple[int, ...]] | None = None,
    allow_missing_chunks: bool = False,
) -> dict[str, np.ndarray]:
    """Flat {"encoder/layers_0/attention/query/kernel": array} of a T5X checkpoint's `target`.

    Args:
      expected: optional {name: shape}; checked before any data is read.
      allow_missing_chunks: read absent zarr chunks as the fill value instead of refusing them.
    """
    flat, version = open_params(path, expected)
    if not allow_missing_chunks:
        check_all_chunks(flat, path)
    return {
        name: read_param(leaf, path, name, version) if is_tensorstore(leaf) else leaf
        for name, leaf in flat.items()
    }


def is_orbax(path: str) -> bool:
    return any(_read_bytes(path, marker) is not None for marker in _ORBAX_MARKERS)


def load_t5x(
    path: str,
    config: t5.T5Config,
    dtype: Any = jnp.float32,
    *,
    allow_missing_chunks: bool = False,
) -> dict[str, Any]:
    """Loads a T5X (or Orbax) checkpoint directory as params for `t5.T5(config)`, cast to dtype.

    Args:
      allow_missing_chunks: accept zarr arrays with absent chunk files (read as the fill value);
        by default they are refused, since a trainer writes every chunk of its parameters.
    Raises:
      ValueError naming the parameter on a missing, unexpected or mis-shaped parameter, an
      unreadable (e.g. truncated) TensorStore chunk, or (by default) missing chunk files.
    """
    expected = jax.eval_shape(t5.T5(config).init_params, jax.random.PRNGKey(0))
    if is_orbax(path):
        flat = orbax_t5x.read_orbax_params(path)
    else:
        shapes = validation.expected_shapes(expected)
        flat = read_t5x_params(path, shapes, allow_missing_chunks)
    return validation.to_params(flat, expected, dtype, f"T5X checkpoint {path}")


def read_t5x(path: str, dtype: Any, model: t5.T5) -> tuple[t5.T5, dict[str, Any]]:
    """format 't5x''s reader (`families.reader`): (model, its params from `path`); the checkpoint
    does not say the architecture, so `model` (ModelSpec.model) gives it."""
    return model, load_t5x(path, model.config, dtype)
