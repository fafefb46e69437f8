"""Opening GGUF files and reading their metadata (shared by the checkpoint and vocab loaders).

Every error names the file: `open_gguf` wraps the reader's failures, and `metadata_value` takes the
path from the reader's memory map, so callers that only hold the reader still name it.
"""

from __future__ import annotations

import os
from typing import Any

import gguf
import numpy as np

# What gguf.GGUFReader raises on a truncated or corrupt file (it indexes the memory map directly).
_READER_ERRORS = (
    ValueError,
    IndexError,
    KeyError,
    TypeError,
    OverflowError,
    UnicodeDecodeError,
    MemoryError,
)


def reader_path(reader: gguf.GGUFReader) -> str:
    """The file a GGUFReader has open, for error messages."""
    return str(getattr(reader.data, "filename", None) or "GGUF file")


def open_gguf(path: str | os.PathLike) -> gguf.GGUFReader:
    """Memory-mapped GGUFReader; ValueError for anything but a complete, readable GGUF file.

    Besides what the reader checks, the tensors' data must lie inside the file and tile it in
    order (llama.cpp and gguf-py pad each tensor to the file's alignment, nothing more), so a
    corrupted tensor type or offset cannot make one tensor read another's bytes.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"GGUF file not found: {path}")
    try:
        reader = gguf.GGUFReader(path)
    except _READER_ERRORS as e:
        raise ValueError(f"{path} is not a readable GGUF file (truncated or corrupt?): {e}") from e
    except OSError as e:  # e.g. an empty file cannot be memory-mapped
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from e
    size = os.path.getsize(path)
    for tensor in reader.tensors:
        end = tensor.data_offset + tensor.n_bytes
        if end > size or tensor.data.nbytes != tensor.n_bytes:
            raise ValueError(
                f"{path} is truncated: tensor {tensor.name!r} ends at byte {end}, "
                f"but the file has {size} bytes"
            )
    _check_layout(reader, path)
    return reader


def _check_layout(reader: gguf.GGUFReader, path: str) -> None:
    """Raises ValueError unless every tensor starts on the alignment inside the data section and
    the tensors follow one another, none overlapping, with less than the alignment between them."""
    alignment, start = int(reader.alignment), int(reader.data_offset)
    spans = sorted((int(t.data_offset), int(t.n_bytes), t.name) for t in reader.tensors)
    for begin, _, name in spans:
        if begin < start or (begin - start) % alignment:
            raise ValueError(
                f"{path} is corrupt: tensor {name!r} starts at byte {begin}, which is not a "
                f"multiple of {alignment} bytes into the data section (byte {start})"
            )
    end, previous = start, "the header"
    for begin, nbytes, name in spans:
        if begin < end:
            raise ValueError(
                f"{path} is corrupt: tensor {name!r} (from byte {begin}) overlaps {previous}, "
                f"which ends at byte {end}"
            )
        if begin - end >= alignment:
            raise ValueError(
                f"{path} is corrupt: {begin - end} unused bytes before tensor {name!r} (a type, "
                f"shape or offset disagrees with the layout; padding is under {alignment} bytes)"
            )
        end, previous = begin + nbytes, f"tensor {name!r}"


def metadata_value(
    reader: gguf.GGUFReader, key: str, default: Any = None, *, required: bool = False
) -> Any:
    """Python value (int, float, bool, str or list) of a metadata key; default when absent."""
    field = reader.get_field(key)
    if field is None:
        if required:
            raise ValueError(f"{reader_path(reader)}: GGUF metadata key {key!r} is missing")
        return default
    try:
        value = field.contents()
    except _READER_ERRORS as e:
        raise ValueError(f"{reader_path(reader)}: GGUF metadata key {key!r} is corrupt: {e}") from e
    return value.item() if isinstance(value, np.generic) else value
