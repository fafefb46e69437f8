"""Orbax-format T5X checkpoints: the parameter subtree read whole, or restored onto its shards.

An Orbax PyTree checkpoint (`_METADATA` / `manifest.ocdbt` in the directory; T5X writes one per step
when it checkpoints with Orbax) holds the train state; its parameters are the `target` (T5X) or
`params` subtree, else the whole tree. Only that subtree is read (a partial restore): optimizer
slots are never touched. Names and shapes come from the checkpoint's metadata, so they are checked
against the model before any parameter data is read.

`restore_sharded` hands orbax-checkpoint one `jax.sharding.NamedSharding` per parameter: each host
reads from TensorStore only the index ranges of its own devices (a slice held by several local
devices is read once) and casts each slice on the host before placing it, so no host ever holds a
whole split parameter. Storage is read in whole chunks of the checkpoint: a checkpoint written from
sharded arrays (as T5X writes it) has one chunk per writer's shard.

orbax-checkpoint is optional (extra "orbax"); it is imported only when such a checkpoint is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from speculative.checkpoints import validation

# Subtrees that hold the parameters, in order of preference (T5X's train state, then Flax's).
PARAMS_KEYS = ("target", "params")


def import_orbax(path: str) -> Any:
    """orbax.checkpoint, or an ImportError saying which checkpoint needs it."""
    try:
        import orbax.checkpoint as ocp
    except ImportError as e:
        raise ImportError(f"{path} is an Orbax checkpoint: pip install orbax-checkpoint") from e
    return ocp


def _one_line(error: Exception) -> str:
    """orbax's messages may span lines (tree diffs); job errors are one line."""
    return " ".join(str(error).split())


def params_metadata(path: str) -> tuple[tuple[str, ...], dict[str, Any]]:
    """(key path of the parameter subtree, flat {name: metadata with .shape and .dtype}).

    Reads only the checkpoint's metadata files.
    """
    ocp = import_orbax(path)
    try:
        metadata = ocp.PyTreeCheckpointer().metadata(path)
        metadata = getattr(metadata, "item_metadata", metadata)
        tree = metadata.tree if hasattr(metadata, "tree") else metadata
    except Exception as e:  # orbax raises FileNotFoundError / ValueError / KeyError variants
        raise ValueError(
            f"Orbax checkpoint {path}: cannot read its metadata: {_one_line(e)}"
        ) from e
    prefix: tuple[str, ...] = ()
    key = next((k for k in PARAMS_KEYS if isinstance(tree, Mapping) and k in tree), None)
    if key is not None:
        prefix, tree = (key,), tree[key]
    if not isinstance(tree, Mapping):
        raise ValueError(f"Orbax checkpoint {path}: no parameter tree in its metadata")
    return prefix, validation.flatten(tree)


def _nested(prefix: tuple[str, ...], flat: Mapping[str, Any]) -> dict[str, Any]:
    tree = validation.unflatten(flat)
    for key in reversed(prefix):
        tree = {key: tree}
    return tree


def _restore(path: str, prefix: tuple[str, ...], item: dict, restore_args: dict) -> dict:
    """Partial restore of the `item` leaves (flat, under prefix); flat {name: restored leaf}."""
    ocp = import_orbax(path)
    try:
        restored = ocp.PyTreeCheckpointer().restore(
            path,
            args=ocp.args.PyTreeRestore(
                item=_nested(prefix, item),
                restore_args=_nested(prefix, restore_args),
                partial_restore=True,
            ),
        )
    except Exception as e:  # orbax / TensorStore raise ValueError / RuntimeError variants
        raise ValueError(f"Orbax checkpoint {path}: cannot read: {_one_line(e)}") from e
    for key in prefix:
        restored = restored[key]
    return validation.flatten(restored)


def _dtype(leaf: Any) -> np.dtype | None:
    dtype = getattr(leaf, "dtype", None)
    return None if dtype is None else np.dtype(dtype)


def _struct(leaf: Any) -> jax.ShapeDtypeStruct:
    """The item leaf a partial restore asks for (numpy restores ignore its dtype)."""
    shape, dtype = tuple(getattr(leaf, "shape", None) or ()), _dtype(leaf)
    return jax.ShapeDtypeStruct(shape, np.float32 if dtype is None else dtype)


def read_orbax_params(path: str) -> dict[str, np.ndarray]:
    """Flat {name: numpy array} of an Orbax checkpoint's parameter subtree, read whole."""
    ocp = import_orbax(path)
    prefix, metadata = params_metadata(path)
    item = {name: _struct(leaf) for name, leaf in metadata.items()}
    args = {name: ocp.RestoreArgs(restore_type=np.ndarray) for name in metadata}
    return _restore(path, prefix, item, args)


def _check_float(metadata: Mapping[str, Any], source: str) -> None:
    for name, leaf in sorted(metadata.items()):
        dtype = _dtype(leaf)
        if dtype is None or not (np.issubdtype(dtype, np.floating) or dtype == ml_dtypes.bfloat16):
            raise ValueError(f"{source}: parameter {name!r} has non-float dtype {dtype}")


@jax.jit
def _finite(flat: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """{name: whether every element is finite}: one sharded reduction per parameter, no gather."""
    return {name: jnp.all(jnp.isfinite(x)) for name, x in flat.items()}


def restore_sharded(
    path: str,
    expected: Mapping[str, tuple[int, ...]],
    shardings: Mapping[str, jax.sharding.Sharding],
    dtype: Any,
) -> dict[str, jax.Array]:
    """Flat {name: global jax.Array} of an Orbax checkpoint, each parameter born on its shards.

    Args:
      expected: {name: shape} of the model's parameters; names and shapes are checked against the
        metadata before any data is read (the messages of `validation.validate`).
      shardings: {name: sharding} of every expected parameter.
      dtype: parameter dtype; each host casts its slices as it reads them.
    Raises:
      ValueError naming the checkpoint (and the parameter) on a missing, unexpected, mis-shaped,
      non-float or non-finite parameter, or an unreadable checkpoint.
    """
    source = f"T5X checkpoint {path}"
    ocp = import_orbax(path)
    prefix, metadata = params_metadata(path)
    validation.validate(metadata, expected, source)
    _check_float(metadata, source)
    dtype = jnp.dtype(dtype)
    item = {name: jax.ShapeDtypeStruct(expected[name], dtype) for name in expected}
    args = {
        name: ocp.ArrayRestoreArgs(
            sharding=shardings[name], global_shape=tuple(expected[name]), dtype=dtype
        )
        for name in expected
    }
    placed = _restore(path, prefix, item, args)
    # Checked after the cast: a value the dtype cannot hold (float16 overflow) is refused too.
    for name, finite in sorted(jax.device_get(_finite(placed)).items()):
        if not finite:
            raise ValueError(f"{source}: parameter {name!r} contains NaN or infinite values")
    return placed
