"""speculative.measure.bootstrap: a speedup's bootstrap mean and 95% interval, on small cases whose
answer is known exactly (times [batches][repeats], tokens [batches])."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from speculative.measure import bootstrap


def paired(plain_s, plain_tokens, spec_s, spec_tokens):
    """(plain, spec) `bootstrap.Runs` from each program's times and tokens."""
    return bootstrap.Runs(plain_s, plain_tokens), bootstrap.Runs(spec_s, spec_tokens)


def test_equal_times_collapse_the_interval_to_the_point():
    interval = bootstrap.speedup_interval(
        *paired([[2.0, 2.0]] * 5, [10] * 5, [[1.0, 1.0]] * 5, [10] * 5)
    )
    assert (interval.mean, interval.lo, interval.hi) == pytest.approx((2.0, 2.0, 2.0))


def test_the_draw_is_paired_so_a_per_batch_shift_cancels():
    # Batches 1..8 s long for plain, each exactly half that for speculative: every resample, whichever
    # batches it draws, gives 2.0. Unpaired draws would spread it (from 1/4 to 16).
    plain = [[float(j), float(j)] for j in range(1, 9)]
    spec = [[j / 2, j / 2] for j in range(1, 9)]
    values = bootstrap.speedup_resamples(*paired(plain, [7] * 8, spec, [7] * 8), resamples=500)
    np.testing.assert_allclose(values, 2.0)


def test_tokens_count_so_longer_outputs_in_equal_time_are_faster():
    # T > 0: speculative wrote twice the tokens in the same time -> twice the throughput.
    once = [[1.0, 1.0]] * 4
    interval = bootstrap.speedup_interval(*paired(once, [5, 6, 7, 8], once, [10, 12, 14, 16]))
    assert (interval.lo, interval.hi) == pytest.approx((2.0, 2.0))


def test_a_repeat_is_drawn_per_batch_not_its_median():
    # One batch, plain's repeats 1 s and 3 s: a resample is 1x or 3x (the median, 2 s, never), each
    # half the time; the interval spans both.
    values = bootstrap.speedup_resamples(*paired([[1.0, 3.0]], [4], [[1.0]], [4]), resamples=2000)
    assert set(np.round(values, 9)) == {1.0, 3.0}
    # Two such batches: plain 2, 4 or 6 s against 2 s, so 1x, 2x or 3x; the interval spans them.
    interval = bootstrap.speedup_interval(
        *paired([[1.0, 3.0]] * 2, [4] * 2, [[1.0, 1.0]] * 2, [4] * 2)
    )
    assert (interval.lo, interval.hi) == (1.0, 3.0)
    assert interval.mean == pytest.approx(2.0, abs=0.1)


def test_a_clear_win_excludes_one_and_noise_alone_does_not():
    rng = np.random.default_rng(1)
    plain = rng.uniform(1.9, 2.1, size=(16, 3))
    spec = rng.uniform(0.9, 1.1, size=(16, 3))
    win = bootstrap.speedup_interval(*paired(plain, [9] * 16, spec, [9] * 16))
    # Every resample lies between the extreme ratios, so the interval does too, far above 1.
    assert 1.9 / 1.1 <= win.lo <= win.mean <= win.hi <= 2.1 / 0.9
    same = rng.uniform(1.0, 3.0, size=(16, 3))
    other = rng.uniform(1.0, 3.0, size=(16, 3))
    tie = bootstrap.speedup_interval(*paired(same, [9] * 16, other, [9] * 16))
    assert tie.lo < 1.0 < tie.hi


def test_resample_count_and_seed_determine_the_result():
    plain = [[1.0, 1.4], [2.0, 2.2], [0.5, 0.9]]
    spec = [[0.8, 0.7], [1.5, 1.9], [0.6, 0.4]]
    args = (plain, [3, 4, 5], spec, [3, 4, 5])
    first = bootstrap.speedup_resamples(*paired(*args), resamples=300, seed=7)
    assert first.shape == (300,)
    np.testing.assert_array_equal(
        first, bootstrap.speedup_resamples(*paired(*args), resamples=300, seed=7)
    )
    assert not np.array_equal(
        first, bootstrap.speedup_resamples(*paired(*args), resamples=300, seed=8)
    )
    assert bootstrap.speedup_interval(*paired(*args)) == bootstrap.speedup_interval(
        *paired(*args)
    )  # fixed seed


def test_inputs_that_cannot_be_paired_are_refused():
    with pytest.raises(ValueError, match="same batches"):
        bootstrap.speedup_interval(*paired([[1.0]] * 3, [1] * 3, [[1.0]] * 2, [1] * 2))
    with pytest.raises(ValueError, match="same number of repeats"):
        bootstrap.speedup_interval(*paired([[1.0], [1.0, 2.0]], [1, 1], [[1.0], [1.0]], [1, 1]))
    with pytest.raises(ValueError, match="> 0"):
        bootstrap.speedup_interval(*paired([[0.0]], [1], [[1.0]], [1]))
    with pytest.raises(ValueError, match="no tokens"):
        bootstrap.speedup_interval(*paired([[1.0]], [0], [[1.0]], [1]))


@pytest.mark.parametrize(
    "plain, spec",
    [
        ([[2.0]], [[1.0]]),  # 1 batch x 1 repeat: the "[0.48, 0.48]" of issue 40
        ([[2.0, 2.2]], [[1.0, 1.1]]),  # 1 batch x 2 repeats: the batch is never redrawn
        ([[2.0], [3.0]], [[1.0], [1.4]]),  # 2 batches x 1 repeat: the noise is never redrawn
        ([[2.0, 2.2], [3.0, 3.1]], [[1.0], [1.4]]),  # the speculative program timed once
    ],
)
def test_too_few_runs_give_no_interval_but_keep_the_mean(plain, spec):
    tokens = [8] * len(plain)
    interval = bootstrap.speedup_interval(*paired(plain, tokens, spec, tokens))
    assert interval.lo is None and interval.hi is None and interval.ci95 is None
    ratios = [p[0] / s[0] for p, s in zip(plain, spec)]
    assert min(ratios) - 0.2 <= interval.mean <= max(ratios) + 0.2


def test_two_batches_of_two_repeats_give_an_interval():
    plain, spec = [[2.0, 2.4], [3.0, 3.3]], [[1.0, 1.1], [1.5, 1.4]]
    interval = bootstrap.speedup_interval(*paired(plain, [8, 8], spec, [8, 8]))
    assert interval.ci95 == [interval.lo, interval.hi]
    assert 2.0 / 1.1 - 1e-9 <= interval.lo < interval.hi <= 2.4 / 1.0 + 1e-9
    assert interval.lo <= interval.mean <= interval.hi


def test_a_point_without_an_interval_is_null_in_benchmark_json():
    from speculative.jobs.benchmark import harness, points

    plain = harness.Timed(batch_repeat_seconds=[[2.0]], batch_tokens=[8])
    spec = harness.Timed(batch_repeat_seconds=[[1.0]], batch_tokens=[8], tokens=8, rows=1)
    fields = points.speedup_spread(plain, spec)
    assert fields["speedup_ci95"] is None and fields["speedup_mean"] == pytest.approx(2.0)
    assert '"speedup_ci95": null' in json.dumps(fields)


def test_a_benchmark_of_one_repeat_writes_null_and_reports_it(tmp_path, monkeypatch, capsys):
    """The benchmark job at REPEATS = 1: benchmark.json holds null, and its table and plots are
    made from it (no zero-width interval anywhere)."""
    from speculative import benchmark
    from speculative.measure import plots

    root = pathlib.Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"inputs": "Hello"}\n{"inputs": "x = 1"}\n')
    out = tmp_path / "bench"
    benchmark.main(
        [
            "--gin_file=configs/runs/benchmark.gin",
            "--gin_file=configs/demo/tiny_random_models.gin",
            f"--gin.INPUT_FILE='{inputs}'",
            f"--gin.OUTPUT_DIR='{out}'",
            "--gin.GAMMAS=[2]",
            "--gin.TEMPERATURES=[0.0]",
            "--gin.BATCH_SIZES=[1]",
            "--gin.REPEATS=1",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 4}",
        ]
    )
    assert '"speedup_ci95": null' in (out / "benchmark.json").read_text()
    (point,) = json.loads((out / "benchmark.json").read_text())["cells"][0]["points"]
    assert point["speedup_ci95"] is None and point["speedup_mean"] > 0
    printed = capsys.readouterr().out  # the table: no "1.23x [1.23, 1.23]" made up for it
    assert f"{point['speedup_mean']:.2f}x [{point['speedup_mean']:.2f}" not in printed
    for name in plots.PLOTS:
        assert (out / name).stat().st_size > 0
