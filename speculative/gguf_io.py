"""Opening GGUF files and reading their metadata (shared by the checkpoint and vocab loaders)."""

from __future__ import annotations

import os
from typing import Any

import gguf
import numpy as np


def open_gguf(path: str | os.PathLike) -> gguf.GGUFReader:
    """Memory-mapped GGUFReader; ValueError for anything but a complete, readable GGUF file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"GGUF file not found: {path}")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a readable GGUF file (truncated or corrupt?): {e}") from e
    size = os.path.getsize(path)
    for tensor in reader.tensors:
        end = tensor.data_offset + tensor.n_bytes
        if end > size or tensor.data.nbytes != tensor.n_bytes:
            raise ValueError(
                f"{path} is truncated: tensor {tensor.name!r} ends at byte {end}, "
                f"but the file has {size} bytes"
            )
    return reader


def metadata_value(
    reader: gguf.GGUFReader, key: str, default: Any = None, *, required: bool = False
) -> Any:
    """Python value (int, float, bool, str or list) of a metadata key; default when absent."""
    field = reader.get_field(key)
    if field is None:
        if required:
            raise ValueError(f"GGUF metadata key {key!r} is missing")
        return default
    value = field.contents()
    return value.item() if isinstance(value, np.generic) else value
