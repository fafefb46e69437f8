"""n-gram draft tables are validated when read (`drafts.ngram.load`): shapes, dtypes and values,
fuzzed with hypothesis; a write is atomic."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speculative.drafts import ngram

TABLES = ngram.fit([[1, 2, 3, 2, 1], [4, 4, 2]], vocab_size=6, top_k=2)
FIELDS = ("unigram", "successors", "successor_counts", "backoff")


def _arrays() -> dict[str, np.ndarray]:
    return {name: np.asarray(getattr(TABLES, name)) for name in FIELDS}


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_tables_round_trip_atomically(tmp_path):
    path = tmp_path / "t.npz"
    ngram.save(TABLES, path)
    loaded = ngram.load(path)
    for name in FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(loaded, name)), _arrays()[name])
    assert [p.name for p in tmp_path.iterdir()] == ["t.npz"]  # no temporary file left behind


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("unigram", np.full(6, 0.5, np.float32), "must sum to 1"),
        ("unigram", np.array([1.5, -0.5, 0, 0, 0, 0], np.float32), "negative or non-finite"),
        ("unigram", np.array([np.nan, 1, 0, 0, 0, 0], np.float32), "negative or non-finite"),
        ("unigram", np.ones(5, np.float32) / 5, "inconsistent n-gram table shapes"),
        ("successors", np.full((6, 2), 6, np.int32), r"successor ids must be in 0..5"),
        ("successors", np.zeros((6, 2), np.float32), "successors must be integer ids"),
        ("successor_counts", -np.ones((6, 2), np.float32), "negative or non-finite"),
        ("backoff", np.float32(0), "backoff weight be > 0"),
        ("backoff", np.array(["x"]), "inconsistent n-gram table shapes"),
        ("unigram", np.array(["a"] * 6), "unigram must be floating point"),
    ],
)
def test_bad_tables_name_the_file_and_the_problem(tmp_path, name, value, message):
    path = tmp_path / "bad.npz"
    path.write_bytes(_npz({**_arrays(), name: value}))
    with pytest.raises(ValueError, match=message) as e:
        ngram.load(path)
    assert str(e.value).startswith(f"{path}: ")


ARRAYS = st.sampled_from(
    [
        np.zeros(0, np.float32), np.ones(6, np.float64) / 6, np.arange(12).reshape(6, 2),
        np.full((6, 2), -1), np.full((6, 2), np.inf, np.float32), np.float32(1), np.bool_(True),
        np.array([[0.5, 0.5]] * 6, np.float16), np.array(["x"] * 6),
    ]
)  # fmt: skip


@settings(max_examples=120, deadline=None)
@given(name=st.sampled_from(FIELDS), value=ARRAYS, drop=st.booleans(), cut=st.integers(0, 3000))
def test_fuzzed_tables_load_valid_or_raise_value_error(tmp_path_factory, name, value, drop, cut):
    """Any array replaced or dropped, or the file cut anywhere: `load` returns tables a drafter
    can use, or raises what the draft builder turns into a one-line error; nothing else."""
    arrays = {k: v for k, v in _arrays().items() if not (drop and k == name)}
    if not drop:
        arrays[name] = value
    data = _npz(arrays)
    path = tmp_path_factory.mktemp("t") / "t.npz"
    for blob in (data, data[:cut]):
        path.write_bytes(blob)
        try:
            tables = ngram.load(path)
        except (ValueError, OSError, zipfile.BadZipFile, EOFError):
            continue  # the errors the 'unigram' / 'bigram' kinds report as one line
        v = tables.vocab_size
        assert tables.successors.dtype == np.int32 and tables.unigram.dtype == np.float32
        assert np.all(np.asarray(tables.successors) < v) and np.isclose(
            tables.unigram.sum(), 1, atol=1e-3
        )
