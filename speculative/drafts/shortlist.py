"""Shortlists for a draft's output head: the token ids a domain uses, chosen from token counts.

A model draft's output head streams a [V, E] table on every step; for Qwen2.5-Coder-0.5B that is
136M of its 494M parameters, over a quarter of the bytes a draft step reads. A draft that scores
only the S ids a domain uses (`models.decoder.restrict_head`) costs less per step (a smaller c),
and stays exact: it proposes from exactly the distribution it computed, which is zero off the
shortlist, and the rejection rule's residual gives those ids the target's probability
(docs/design.md §6). What the shortlist costs is acceptance when the target wants a token it
lacks.

    ids = shortlist.for_prompts(vocabulary, 32768, prompts)   # + the prompts' ids, stop ids
    config, params = decoder.restrict_head(config, params, ids)

The Python corpus is the interpreter's own standard library (sorted paths, first `max_bytes`),
present on every machine that runs this code and never a benchmark's prompts.
"""

from __future__ import annotations

import os
import pathlib
import sysconfig
from collections.abc import Iterable, Sequence

import numpy as np

from speculative import vocab as vocab_lib


def most_frequent(
    sequences: Iterable[Sequence[int]], size: int, vocab_size: int, always: Iterable[int] = ()
) -> np.ndarray:
    """The `size` ids seen most often in `sequences`, plus every id of `always`.

    Ties (and ids never seen, when fewer than `size` were) are broken by the lower id, so the
    result is a function of the counts alone. Returns sorted int32 ids, `size` of them (`always`
    counts towards the size).
    """
    if not 1 <= size <= vocab_size:
        raise ValueError(f"shortlist size must be in [1, {vocab_size}], got {size}")
    counts = np.zeros(vocab_size, np.int64)
    for seq in sequences:
        ids = np.asarray(seq, np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"token id outside [0, {vocab_size}) in the counted sequences")
        counts += np.bincount(ids, minlength=vocab_size)
    forced = np.unique(np.asarray(list(always), np.int64))
    if forced.size > size or (forced.size and (forced[0] < 0 or forced[-1] >= vocab_size)):
        raise ValueError(
            f"{forced.size} forced ids do not fit a shortlist of {size} in {vocab_size}"
        )
    counts[forced] = np.iinfo(np.int64).max  # forced ids first
    order = np.argsort(-counts, kind="stable")  # stable: equal counts keep id order
    return np.sort(order[:size]).astype(np.int32)


def python_sources(max_bytes: int = 8 << 20, root: str | os.PathLike | None = None) -> list[str]:
    """Texts of the `.py` files under `root` (default: this interpreter's standard library),
    in sorted path order, until `max_bytes` of text; test suites and site-packages are skipped."""
    root = pathlib.Path(root or sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if "site-packages" in parts or "test" in parts or "tests" in parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    if not texts:
        raise ValueError(f"no readable .py files under {root}")
    return texts


def fit_python_sources(
    vocabulary: vocab_lib.Vocabulary,
    size: int,
    always: Iterable[int] = (),
    max_bytes: int = 8 << 20,
    vocab_size: int | None = None,
) -> np.ndarray:
    """`most_frequent` over the tokenised Python standard library (`python_sources`)."""
    width = vocab_size if vocab_size is not None else vocab_lib.used_size(vocabulary)
    sequences = [vocabulary.encode(text) for text in python_sources(max_bytes)]
    return most_frequent(sequences, size, width, always)


def for_prompts(
    vocabulary: vocab_lib.Vocabulary,
    size: int,
    prompts: Iterable[Sequence[int]],
    max_bytes: int = 8 << 20,
    vocab_size: int | None = None,
) -> np.ndarray:
    """A job's shortlist: the standard library's most frequent ids, with every id of the job's
    prompts and the vocabulary's stop ids forced in (identifiers a prompt defines are the tokens
    a completion reuses most; its inputs are known before decoding starts)."""
    forced = set(vocab_lib.stop_ids(vocabulary))
    for ids in prompts:
        forced.update(int(t) for t in ids)
    return fit_python_sources(vocabulary, size, forced, max_bytes, vocab_size)
