"""Opening GGUF files and reading their metadata (shared by the checkpoint and vocab loaders).

Every error names the file: `open_gguf` wraps the reader's failures, and `metadata_value` takes the
path from the reader's memory map, so callers that only hold the reader still name it.
"""

from __future__ import annotations

import mmap
import os
import struct
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


# Sizes of GGUF's scalar value types (gguf.GGUFValueType); 8 is a string, 9 an array.
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


class _Walker:
    """Bounds-checked walk over a GGUF header, run before gguf.GGUFReader: the reader loops over
    whatever counts the file declares, so a corrupt count could keep it busy for hours."""

    def __init__(self, data: bytes | mmap.mmap, path: str):
        self.data, self.path, self.at = data, path, 0

    def fail(self, what: str) -> ValueError:
        return ValueError(
            f"{self.path} is not a readable GGUF file (truncated or corrupt?): {what}"
        )

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise self.fail(f"{n} bytes needed at byte {self.at}, the file has {len(self.data)}")
        self.at += n
        return self.data[self.at - n : self.at]

    def count(self, fmt: str, min_item: int) -> int:
        n = struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]
        if n * min_item > len(self.data) - self.at:
            raise self.fail(f"a count of {n} at byte {self.at} does not fit in the file")
        return n

    def value(self, kind: int) -> None:
        if kind in _SCALAR_SIZES:
            self.take(_SCALAR_SIZES[kind])
        elif kind == _STRING:
            self.take(self.count("Q", 1))
        elif kind == _ARRAY:
            item = struct.unpack("<I", self.take(4))[0]
            if item in _SCALAR_SIZES:
                self.take(self.count("Q", _SCALAR_SIZES[item]) * _SCALAR_SIZES[item])
            elif item in (_STRING, _ARRAY):
                for _ in range(self.count("Q", 8)):
                    self.value(item)
            else:
                raise self.fail(f"unknown array item type {item} at byte {self.at}")
        else:
            raise self.fail(f"unknown value type {kind} at byte {self.at}")

    def walk(self) -> None:
        if self.take(4) != b"GGUF":
            raise self.fail("GGUF magic invalid")
        if struct.unpack("<I", self.take(4))[0] & 0xFFFF == 0:
            return  # big-endian file: left to the reader
        n_tensors, n_kv = self.count("Q", 24), self.count("Q", 12)
        for _ in range(n_kv):
            self.take(self.count("Q", 1))
            self.value(struct.unpack("<I", self.take(4))[0])
        for _ in range(n_tensors):
            self.take(self.count("Q", 1))
            self.take(self.count("I", 8) * 8 + 12)


def _walk_header(path: str) -> None:
    """Runs the bounds-checked header walk over the memory-mapped file."""
    if os.path.getsize(path) == 0:
        raise ValueError(f"{path} is not a readable GGUF file: it is empty")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        _Walker(data, path).walk()


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
    _walk_header(path)
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
