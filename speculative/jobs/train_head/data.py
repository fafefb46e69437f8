"""The head's training data: windows of tokenised Python source and the target's hidden states
over them, computed once and kept in OUTPUT_DIR/features (resumable, window by window).

The corpus is this interpreter's standard library (`drafts.shortlist.python_sources`), never a
benchmark's prompts. Files are split before anything is cut: every tenth file (in sorted path
order) is held out, so no file is on both sides. Each side's files are tokenised, joined with a
newline between files and cut into windows of `window` tokens.

Files (N windows of L tokens, E = the target's width):
    features/<side>.tokens.npy    [N, L] int32
    features/<side>.features.npy  [N, L, E] float16, the target's final normed hidden states
    features/<side>.done          how many windows are complete (written after they are flushed)
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from speculative.drafts import shortlist
from speculative.errors import JobError
from speculative.outputs.job_io import write_text_atomic

HELD_OUT_EVERY = 10  # every tenth source file is held out


def corpus_windows(
    vocabulary: Any, corpus_bytes: int, window: int, limits: dict[str, int]
) -> dict[str, np.ndarray]:
    """{"train": [N_train, L], "heldout": [N_heldout, L]} int32 windows of the standard library,
    split by file (module doc); at most limits[side] windows each."""
    texts = shortlist.python_sources(corpus_bytes)
    newline = vocabulary.encode("\n")
    sides: dict[str, list[int]] = {"train": [], "heldout": []}
    for i, text in enumerate(texts):
        side = "heldout" if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else "train"
        sides[side].extend(vocabulary.encode(text) + newline)
    windows = {}
    for side, ids in sides.items():
        count = min(len(ids) // window, limits[side])
        if count < 1:
            raise JobError(
                f"the corpus ({corpus_bytes} bytes of the standard library) gives no {side} "
                f"window of {window} tokens; raise corpus_bytes"
            )
        windows[side] = np.asarray(ids[: count * window], np.int32).reshape(count, window)
    return windows


def target_feature_fn(target: Any) -> Callable[[Any, jax.Array], jax.Array]:
    """A jitted (target params, tokens [B, L]) -> hidden states [B, L, E] float32."""

    @jax.jit
    def features(params, tokens):
        batch = {"prompt": tokens, "prompt_lengths": jnp.full((tokens.shape[0],), tokens.shape[1])}
        state = target.init_state(params, batch, tokens.shape[1])
        _, hidden, _ = target.extend_features(params, state, tokens)
        return hidden

    return features


def _open(path: pathlib.Path, shape: tuple[int, ...], dtype: Any, keep: int = 0) -> np.ndarray:
    """A .npy file of this shape and dtype, opened for writing. An existing file of another
    window count is resized, its first `keep` windows kept (the corpus is read in the same
    order, so a run with more windows extends the earlier one's)."""
    old = None
    if path.exists():
        array = np.load(path, mmap_mode="r+")
        if array.shape == shape and array.dtype == np.dtype(dtype):
            return array
        if array.shape[1:] == shape[1:] and array.dtype == np.dtype(dtype) and keep:
            old = np.array(array[: min(keep, shape[0])])
        del array
    # A new file renamed into place: a linked copy of another run's file is never written to.
    tmp = path.with_name(path.name + ".tmp")
    fresh = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
    if old is not None:
        fresh[: len(old)] = old
    fresh.flush()
    os.replace(tmp, path)
    return fresh


def _done_count(path: pathlib.Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


def extract_features(
    directory: pathlib.Path,
    side: str,
    tokens: np.ndarray,
    compute: Callable[[jax.Array], jax.Array],
    width: int,
    batch_size: int,
    progress: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [N, L], features [N, L, E] float16) of one side, computing only the windows an
    earlier run has not: it was killed, or read fewer windows. A stored window is reused only
    where its tokens equal this run's."""
    directory.mkdir(parents=True, exist_ok=True)
    done_path = directory / f"{side}.done"
    done = _reusable_windows(directory / f"{side}.tokens.npy", tokens, _done_count(done_path))
    stored = _open(directory / f"{side}.tokens.npy", tokens.shape, np.int32, done)
    stored[:] = tokens
    stored.flush()
    shape = (*tokens.shape, width)
    features = _open(directory / f"{side}.features.npy", shape, np.float16, done)
    write_text_atomic(done_path, str(done))
    for start in range(done, len(tokens), batch_size):
        stop = min(start + batch_size, len(tokens))
        hidden = np.asarray(compute(jnp.asarray(tokens[start:stop])))
        if not np.all(np.isfinite(hidden)):
            raise JobError(f"the target's hidden states are not finite in {side} windows {start}+")
        features[start:stop] = hidden.astype(np.float16)
        features.flush()
        write_text_atomic(done_path, str(stop))
        if progress is not None:
            progress(stop - start)
    return np.asarray(stored), features


def _reusable_windows(path: pathlib.Path, tokens: np.ndarray, done: int) -> int:
    """How many of the first `done` stored windows hold exactly these tokens."""
    if not path.exists():
        return 0
    stored = np.load(path, mmap_mode="r")
    if stored.shape[1:] != tokens.shape[1:]:
        return 0
    count = min(done, len(stored), len(tokens))
    same = np.all(stored[:count] == tokens[:count], axis=1)
    return int(count if same.all() else np.argmin(same))
