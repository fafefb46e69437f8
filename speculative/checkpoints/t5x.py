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

Orbax checkpoints (a `_METADATA` or `manifest.ocdbt` file in the directory) are read with
orbax-checkpoint when it is installed; the parameters are the `target` (T5X) or `params` subtree.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import tensorstore as ts
from flax import serialization

from speculative.checkpoints import validation
from speculative.models import t5

_ORBAX_MARKERS = ("_METADATA", "manifest.ocdbt")


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


def open_param(directory: str, name: str, spec: dict[str, Any]) -> Any:
    """Opens one TensorStore-stored parameter of a T5X checkpoint (reads only its metadata)."""
    url = _directory_url(directory) + _relative_path(spec).strip("/") + "/"
    try:
        return ts.open({"driver": spec.get("driver", "zarr"), "kvstore": url}, open=True).result()
    except Exception as e:  # tensorstore raises ValueError / RuntimeError variants
        raise ValueError(
            f"T5X checkpoint {directory}: cannot open parameter {name!r} from {url}: {e}"
        ) from e


def _read_ts_param(directory: str, name: str, spec: dict[str, Any], version: int) -> np.ndarray:
    store = open_param(directory, name, spec)
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
    if not isinstance(state, dict) or "target" not in state.get("optimizer", {}):
        raise ValueError(f"T5X checkpoint {path}: msgpack has no optimizer/target parameters")
    return _flatten(state["optimizer"]["target"]), int(state.get("version", 0))


def read_t5x_params(path: str) -> dict[str, np.ndarray]:
    """Flat {"encoder/layers_0/attention/query/kernel": array} of a T5X checkpoint's `target`."""
    leaves, version = read_target_leaves(path)
    return {
        name: _read_ts_param(path, name, leaf, version) if is_ts_spec(leaf) else leaf
        for name, leaf in leaves.items()
    }


def read_orbax_params(path: str) -> dict[str, np.ndarray]:
    """Flat params of an Orbax PyTree checkpoint (its `target` or `params` subtree)."""
    try:
        import orbax.checkpoint as ocp
    except ImportError as e:
        raise ImportError(f"{path} is an Orbax checkpoint: pip install orbax-checkpoint") from e
    try:
        metadata = ocp.PyTreeCheckpointer().metadata(path).item_metadata
        tree = metadata.tree if hasattr(metadata, "tree") else metadata
        restore_args = jax.tree_util.tree_map(
            lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree
        )
        restored = ocp.PyTreeCheckpointer().restore(path, restore_args=restore_args)
    except Exception as e:
        raise ValueError(f"Orbax checkpoint {path}: cannot read: {e}") from e
    for key in ("target", "params"):
        if isinstance(restored, dict) and key in restored:
            restored = restored[key]
            break
    return validation.flatten(restored)


def is_orbax(path: str) -> bool:
    return any(_read_bytes(path, marker) is not None for marker in _ORBAX_MARKERS)


def load_t5x(path: str, config: t5.T5Config, dtype: Any = jnp.float32) -> dict[str, Any]:
    """Loads a T5X (or Orbax) checkpoint directory as params for `t5.T5(config)`, cast to dtype.

    Raises ValueError naming the parameter on a missing, unexpected or mis-shaped parameter, or on
    an unreadable (e.g. truncated) TensorStore chunk.
    """
    flat = read_orbax_params(path) if is_orbax(path) else read_t5x_params(path)
    expected = jax.eval_shape(t5.T5(config).init_params, jax.random.PRNGKey(0))
    return validation.to_params(flat, expected, dtype, f"T5X checkpoint {path}")
