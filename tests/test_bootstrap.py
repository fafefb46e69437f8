"""speculative.measure.bootstrap: a speedup's bootstrap mean and 95% interval, on small cases whose
answer is known exactly (times [batches][repeats], tokens [batches])."""

from __future__ import annotations

import numpy as np
import pytest

from speculative.measure import bootstrap


def test_equal_times_collapse_the_interval_to_the_point():
    interval = bootstrap.speedup_interval([[2.0, 2.0]] * 5, [10] * 5, [[1.0, 1.0]] * 5, [10] * 5)
    assert (interval.mean, interval.lo, interval.hi) == pytest.approx((2.0, 2.0, 2.0))


def test_the_draw_is_paired_so_a_per_batch_shift_cancels():
    # Batches 1..8 s long for plain, each exactly half that for speculative: every resample, whichever
    # batches it draws, gives 2.0. Unpaired draws would spread it (from 1/4 to 16).
    plain = [[float(j), float(j)] for j in range(1, 9)]
    spec = [[j / 2, j / 2] for j in range(1, 9)]
    values = bootstrap.speedup_resamples(plain, [7] * 8, spec, [7] * 8, resamples=500)
    np.testing.assert_allclose(values, 2.0)


def test_tokens_count_so_longer_outputs_in_equal_time_are_faster():
    # T > 0: speculative wrote twice the tokens in the same time -> twice the throughput.
    interval = bootstrap.speedup_interval([[1.0]] * 4, [5, 6, 7, 8], [[1.0]] * 4, [10, 12, 14, 16])
    assert (interval.lo, interval.hi) == pytest.approx((2.0, 2.0))


def test_a_repeat_is_drawn_per_batch_not_its_median():
    # One batch, plain's repeats 1 s and 3 s: a resample is 1x or 3x (the median, 2 s, never), each
    # half the time; the interval spans both.
    values = bootstrap.speedup_resamples([[1.0, 3.0]], [4], [[1.0]], [4], resamples=2000)
    assert set(np.round(values, 9)) == {1.0, 3.0}
    interval = bootstrap.speedup_interval([[1.0, 3.0]], [4], [[1.0]], [4])
    assert (interval.lo, interval.hi) == (1.0, 3.0)
    assert interval.mean == pytest.approx(2.0, abs=0.1)


def test_a_clear_win_excludes_one_and_noise_alone_does_not():
    rng = np.random.default_rng(1)
    plain = rng.uniform(1.9, 2.1, size=(16, 3))
    spec = rng.uniform(0.9, 1.1, size=(16, 3))
    win = bootstrap.speedup_interval(plain, [9] * 16, spec, [9] * 16)
    # Every resample lies between the extreme ratios, so the interval does too, far above 1.
    assert 1.9 / 1.1 <= win.lo <= win.mean <= win.hi <= 2.1 / 0.9
    same = rng.uniform(1.0, 3.0, size=(16, 3))
    other = rng.uniform(1.0, 3.0, size=(16, 3))
    tie = bootstrap.speedup_interval(same, [9] * 16, other, [9] * 16)
    assert tie.lo < 1.0 < tie.hi


def test_resample_count_and_seed_determine_the_result():
    plain = [[1.0, 1.4], [2.0, 2.2], [0.5, 0.9]]
    spec = [[0.8, 0.7], [1.5, 1.9], [0.6, 0.4]]
    args = (plain, [3, 4, 5], spec, [3, 4, 5])
    first = bootstrap.speedup_resamples(*args, resamples=300, seed=7)
    assert first.shape == (300,)
    np.testing.assert_array_equal(first, bootstrap.speedup_resamples(*args, resamples=300, seed=7))
    assert not np.array_equal(first, bootstrap.speedup_resamples(*args, resamples=300, seed=8))
    assert bootstrap.speedup_interval(*args) == bootstrap.speedup_interval(*args)  # fixed seed


def test_inputs_that_cannot_be_paired_are_refused():
    with pytest.raises(ValueError, match="same batches"):
        bootstrap.speedup_interval([[1.0]] * 3, [1] * 3, [[1.0]] * 2, [1] * 2)
    with pytest.raises(ValueError, match="same number of repeats"):
        bootstrap.speedup_interval([[1.0], [1.0, 2.0]], [1, 1], [[1.0], [1.0]], [1, 1])
    with pytest.raises(ValueError, match="> 0"):
        bootstrap.speedup_interval([[0.0]], [1], [[1.0]], [1])
    with pytest.raises(ValueError, match="no tokens"):
        bootstrap.speedup_interval([[1.0]], [0], [[1.0]], [1])
