"""Shape validation and dtype casting shared by the checkpoint loaders.

Loaders produce a flat dict {"a/b/c": numpy array} in the model's parameter naming; `to_params`
compares it with the shapes the model expects (`jax.eval_shape(model.init_params, rng)`), raising a
ValueError that names the parameter path, then casts and nests it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import traverse_util

SEP = "/"


def flatten(tree: Mapping[str, Any]) -> dict[str, Any]:
    """Nested dict -> {"a/b/c": leaf}."""
    return traverse_util.flatten_dict(dict(tree), sep=SEP)


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{"a/b/c": leaf} -> nested dict."""
    return traverse_util.unflatten_dict(dict(flat), sep=SEP)


def expected_shapes(expected: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Flat {path: shape} from a tree of arrays or `jax.ShapeDtypeStruct`s."""
    return {path: tuple(leaf.shape) for path, leaf in flatten(expected).items()}


def validate(
    loaded: Mapping[str, Any],
    expected: Mapping[str, tuple[int, ...]],
    source: str,
    stored_names: Mapping[str, str] | None = None,
) -> None:
    """Raises ValueError naming the first missing, unexpected or mis-shaped parameter.

    Args:
      loaded: flat {path: array} read from a checkpoint.
      expected: flat {path: shape} the model config implies.
      source: what was read (a path), for the message.
      stored_names: optional {path: name in the checkpoint file} when the file uses other names.
    """
    stored_names = stored_names or {}

    def name(path: str) -> str:
        stored = stored_names.get(path)
        return f"{path!r}" + (f" (stored as {stored!r})" if stored and stored != path else "")

    missing = sorted(set(expected) - set(loaded))
    if missing:
        raise ValueError(
            f"{source}: missing parameter {name(missing[0])}, expected shape "
            f"{expected[missing[0]]}"
            + (f" (and {len(missing) - 1} more missing)" if len(missing) > 1 else "")
        )
    unexpected = sorted(set(loaded) - set(expected))
    if unexpected:
        raise ValueError(
            f"{source}: unexpected parameter {name(unexpected[0])} with shape "
            f"{tuple(np.shape(loaded[unexpected[0]]))}: the checkpoint does not match the config"
        )
    for path in sorted(expected):
        got = tuple(np.shape(loaded[path]))
        if got != expected[path]:
            raise ValueError(
                f"{source}: parameter {name(path)} has shape {got}, but the config expects "
                f"{expected[path]}"
            )


def cast(array: Any, dtype: Any, path: str, source: str) -> jax.Array:
    """Casts one float array to dtype (float32 / bfloat16 / float16), rejecting non-float data."""
    array = np.asarray(array)
    if not (np.issubdtype(array.dtype, np.floating) or array.dtype == ml_dtypes.bfloat16):
        raise ValueError(f"{source}: parameter {path!r} has non-float dtype {array.dtype}")
    if not np.all(np.isfinite(array.astype(np.float32))):
        raise ValueError(f"{source}: parameter {path!r} contains NaN or infinite values")
    return jnp.asarray(array, dtype=jnp.dtype(dtype))


def to_params(
    loaded: Mapping[str, Any],
    expected: Mapping[str, Any],
    dtype: Any,
    source: str,
    stored_names: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Validates a flat {path: array} against a tree of expected shapes, casts, and nests it.

    Args:
      loaded: flat {"a/b/c": array} in the model's naming.
      expected: the model's parameter tree of arrays or ShapeDtypeStructs (e.g. from eval_shape).
      dtype: target dtype of every parameter.
      source: the checkpoint path, for error messages.
      stored_names: optional {path: name in the file}, for error messages.
    Returns:
      Nested dict of jax arrays with exactly the expected tree and shapes.
    """
    validate(loaded, expected_shapes(expected), source, stored_names)
    return unflatten({path: cast(a, dtype, path, source) for path, a in loaded.items()})
