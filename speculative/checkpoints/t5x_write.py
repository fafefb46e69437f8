"""Writing T5X checkpoints (format version 3), the layout `checkpoints.load_t5x` reads:

    <dir>/checkpoint_<step>/checkpoint                  msgpack {"version": 3, "optimizer":
                                                           {"target": params, "state": {"step"}}}
    <dir>/checkpoint_<step>/target.<dotted.param.path>/ a gzip zarr array per parameter

In the msgpack each parameter is its TensorStore spec with a path relative to the checkpoint, as
T5X writes it. The trainer's own state (optax state, data position) goes into the same msgpack
under "speculative_train_state" as plain arrays, which T5X readers ignore. A checkpoint is written
into a temporary directory and renamed into place, so a killed job never leaves half of one.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
from typing import Any

import numpy as np
import tensorstore as ts
from flax import serialization, traverse_util

_STEP = re.compile(r"^checkpoint_(\d+)$")
CHUNK_BYTES = 64 << 20  # T5X-like chunking: large arrays are split along their first axis


def _zarr_dtype(value: np.ndarray) -> str:
    return "bfloat16" if value.dtype.name == "bfloat16" else value.dtype.str


def _chunks(value: np.ndarray) -> list[int]:
    if value.ndim == 0:
        return []
    row_bytes = max(1, value.nbytes // max(1, value.shape[0]))
    rows = max(1, min(value.shape[0], CHUNK_BYTES // row_bytes))
    return [rows, *value.shape[1:]]


def _write_array(directory: pathlib.Path, relative: str, value: np.ndarray) -> dict[str, Any]:
    spec = {
        "driver": "zarr",
        "kvstore": {"driver": "file", "path": relative},
        "metadata": {
            "compressor": {"id": "gzip"},
            "shape": list(value.shape),
            "chunks": _chunks(value),
            "dtype": _zarr_dtype(value),
        },
    }
    absolute = {**spec, "kvstore": {"driver": "file", "path": str(directory / relative)}}
    ts.open(absolute, create=True, delete_existing=True).result().write(value).result()
    return spec


def save_t5x(
    directory: str | os.PathLike, params: Any, step: int, train_state: Any = None
) -> pathlib.Path:
    """Writes `params` (a nested dict of arrays, T5X names) as `directory/checkpoint_<step>`.

    train_state: an optional pytree (e.g. the optax state) stored in the msgpack as numpy arrays;
    read it back with `load_train_state`. Returns the checkpoint's path.
    """
    root = pathlib.Path(directory)
    final = root / f"checkpoint_{step}"
    tmp = root / f".tmp_checkpoint_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    flat = traverse_util.flatten_dict(params, sep="/")
    specs = {
        path: _write_array(tmp, "target." + path.replace("/", "."), np.asarray(value))
        for path, value in flat.items()
    }
    state = {
        "version": 3,
        "optimizer": {
            "target": traverse_util.unflatten_dict(specs, sep="/"),
            "state": {"step": np.int32(step), "param_states": {}},
        },
    }
    if train_state is not None:
        state["speculative_train_state"] = serialization.to_state_dict(_to_numpy(train_state))
    with open(tmp / "checkpoint", "wb") as f:
        f.write(serialization.msgpack_serialize(state))
        f.flush()
        os.fsync(f.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def _to_numpy(tree: Any) -> Any:
    import jax

    return jax.tree.map(np.asarray, tree)


def checkpoint_steps(directory: str | os.PathLike) -> list[int]:
    """Steps of the complete checkpoints under `directory`, ascending."""
    root = pathlib.Path(directory)
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        match = _STEP.match(child.name)
        if match and (child / "checkpoint").is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def load_train_state(path: str | os.PathLike, template: Any) -> tuple[int, Any]:
    """(step, train_state) of a checkpoint written by `save_t5x`, the state restored into the
    structure of `template`. Raises ValueError naming the file when it has none."""
    raw = (pathlib.Path(path) / "checkpoint").read_bytes()
    state = serialization.msgpack_restore(raw)
    if "speculative_train_state" not in state:
        raise ValueError(f"{path}: a T5X checkpoint without the trainer's state (cannot resume)")
    step = int(state["optimizer"]["state"]["step"])
    restored = serialization.from_state_dict(template, state["speculative_train_state"])
    return step, restored
