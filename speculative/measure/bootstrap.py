"""A speedup's uncertainty: its mean and 95% percentile-bootstrap interval from the per-batch
repeat times and token counts of the plain and the speculative program (numpy only).

The benchmark times both programs on the same batches, interleaved, `repeats` times each. Two
things vary between a rerun and this one: which inputs were drawn (a batch is the unit: at batch
1, one input) and the machine's noise on each run. A resample reproduces both: it draws the
batches with replacement, the same draw for both programs (paired: a long input is long for both,
so its time cancels in the ratio), and for every drawn batch and program one of its repeats at
random. A resample's speedup is the ratio of throughputs,

    (spec tokens / spec seconds) / (plain tokens / plain seconds),

summed over its drawn batches, so it holds at T > 0 where the two programs' outputs differ in
length (at T = 0 the tokens are equal and it is the ratio of times).

Too few runs give no interval: from one batch a resample can only redraw that batch, and from one
repeat a batch's noise is never redrawn, so the percentiles would collapse to a zero-width
"[0.48, 0.48]" that looks like certainty. Below MIN_BATCHES batches or MIN_REPEATS repeats (of
either program) the interval is None (null in benchmark.json, "n/a" in tables); the mean stays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

RESAMPLES = 2000
SEED = 0
MIN_BATCHES = 2  # an interval needs at least this many batches ...
MIN_REPEATS = 2  # ... and this many repeats of each program per batch


@dataclasses.dataclass(frozen=True)
class Interval:
    """mean: the mean speedup over the resamples; lo, hi: their 2.5th and 97.5th percentiles,
    both None where too few runs were timed for an interval (module docstring)."""

    mean: float
    lo: float | None
    hi: float | None

    @property
    def ci95(self) -> list[float] | None:
        """[lo, hi], or None without an interval: what benchmark.json records."""
        return None if self.lo is None or self.hi is None else [self.lo, self.hi]


@dataclasses.dataclass(frozen=True)
class Runs:
    """One program's timed runs: seconds [batches][repeats] (every batch the same repeats) and
    the tokens it generated per batch [batches]."""

    seconds: Sequence[Sequence[float]]
    tokens: Sequence[int]


def has_interval(plain_s: Sequence[Sequence[float]], spec_s: Sequence[Sequence[float]]) -> bool:
    """Whether both programs' runs [batches][repeats] are enough for an interval: at least
    MIN_BATCHES batches and MIN_REPEATS repeats of each program."""
    plain, spec = _times(plain_s, "plain"), _times(spec_s, "speculative")
    batches = min(plain.shape[0], spec.shape[0])
    return batches >= MIN_BATCHES and min(plain.shape[1], spec.shape[1]) >= MIN_REPEATS


def _times(seconds: Sequence[Sequence[float]], role: str) -> np.ndarray:
    """[B, R] seconds of one program: B batches, R repeats each (every batch the same R)."""
    try:
        times = np.asarray(seconds, dtype=np.float64)
    except ValueError:  # ragged: batches with different repeat counts
        raise ValueError(
            f"{role} repeat times: every batch needs the same number of repeats"
        ) from None
    if times.ndim != 2 or times.shape[0] == 0 or times.shape[1] == 0:
        raise ValueError(f"{role} repeat times must be [batches][repeats], got shape {times.shape}")
    if not np.all(np.isfinite(times)) or np.any(times <= 0):
        raise ValueError(f"{role} repeat times must be finite and > 0")
    return times


def speedup_resamples(
    plain: Runs, spec: Runs, resamples: int = RESAMPLES, seed: int = SEED
) -> np.ndarray:
    """[resamples] bootstrap speedups (module docstring) of speculative over plain decoding.

    plain, spec: each program's runs, the same B batches in the same order (any repeats each).
    The same seed gives the same resamples.
    """
    plain_tok = np.asarray(plain.tokens, dtype=np.float64)
    spec_tok = np.asarray(spec.tokens, dtype=np.float64)
    plain, spec = _times(plain.seconds, "plain"), _times(spec.seconds, "speculative")
    batches = plain.shape[0]
    if spec.shape[0] != batches or plain_tok.shape != (batches,) or spec_tok.shape != (batches,):
        raise ValueError(
            f"plain and speculative must cover the same batches: times {plain.shape} / "
            f"{spec.shape}, tokens {plain_tok.shape} / {spec_tok.shape}"
        )
    if plain_tok.sum() <= 0:
        raise ValueError("plain decoding generated no tokens: no speedup to estimate")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, batches, size=(resamples, batches))  # [N, B], shared: paired
    plain_rep = rng.integers(0, plain.shape[1], size=(resamples, batches))
    spec_rep = rng.integers(0, spec.shape[1], size=(resamples, batches))
    plain_secs = plain[drawn, plain_rep].sum(axis=1)  # [N]
    spec_secs = spec[drawn, spec_rep].sum(axis=1)
    # A resample of only token-less plain batches has no plain throughput: inf, kept visible.
    with np.errstate(divide="ignore", invalid="ignore"):
        return (spec_tok[drawn].sum(axis=1) / spec_secs) / (
            plain_tok[drawn].sum(axis=1) / plain_secs
        )


def speedup_interval(
    plain: Runs, spec: Runs, resamples: int = RESAMPLES, seed: int = SEED
) -> Interval:
    """The bootstrap mean and 95% percentile interval of the speedup (`speedup_resamples`); the
    interval's lo and hi are None below MIN_BATCHES x MIN_REPEATS runs (module docstring)."""
    values = speedup_resamples(plain, spec, resamples, seed)
    mean = float(np.mean(values))
    if not has_interval(plain.seconds, spec.seconds):
        return Interval(mean, None, None)
    lo, hi = np.percentile(values, [2.5, 97.5])
    return Interval(mean, float(lo), float(hi))
