"""speculative.runner: the batch loop the jobs share, on a tiny random decoder pair.

A `Decoder` compiled ahead of time must give what the public `autoregressive_decode` /
`speculative_decode` give on the same batch and rng; `run_batches` compiles once per batch shape
and keeps compilation out of the timings.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from speculative import decoding
from speculative.data import inputs
from speculative.decoding.sampling import SamplingConfig
from speculative.measure import runner
from tests.helpers import tiny_decoder

CONFIG = decoding.DecodeConfig(max_decode_len=6, stop_ids=(1,), sampling=SamplingConfig(1.0))


@pytest.fixture(scope="module")
def pair():
    target, target_params = tiny_decoder(vocab=32, emb=32, layers=2, heads=4, kv_heads=2, seed=0)
    draft, draft_params = tiny_decoder(vocab=32, emb=16, layers=1, heads=2, kv_heads=1, seed=1)
    return target, target_params, draft, draft_params


def _batch(width: int):
    return inputs.decoder_batch([[5, 6, 7], [8, 9]], pad_to=width)


def _assert_same_output(a: decoding.DecodeOutput, b: decoding.DecodeOutput) -> None:
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_array_equal(np.asarray(a.lengths), np.asarray(b.lengths))
    for name in ("target_calls", "accepted", "accepted_at", "verified_at"):
        np.testing.assert_array_equal(np.asarray(a.stats[name]), np.asarray(b.stats[name]))
    np.testing.assert_allclose(np.asarray(a.stats.alpha), np.asarray(b.stats.alpha), rtol=1e-6)


def test_decoder_compiled_ahead_equals_the_public_calls(pair):
    target, target_params, draft, draft_params = pair
    batch, rng = _batch(8), jax.random.PRNGKey(3)
    common = dict(max_decode_len=6, sampling=CONFIG.sampling, eos_id=1, rng=rng)

    plain = runner.Decoder(target, target_params, CONFIG)
    run, seconds = plain.compile(batch, rng)
    assert seconds > 0 and not plain.speculative
    _assert_same_output(
        run(batch, rng), decoding.autoregressive_decode(target, target_params, batch, **common)
    )

    config = dataclasses.replace(CONFIG, gamma=3)
    spec = runner.Decoder(target, target_params, config, draft, draft_params)
    run, _ = spec.compile(batch, rng)
    expected = decoding.speculative_decode(
        target, target_params, draft, draft_params, batch, gamma=3, **common
    )
    _assert_same_output(run(batch, rng), expected)
    assert run(batch, rng).stats.is_speculative


def test_decoder_validates_the_batch(pair):
    target, target_params, _, _ = pair
    decoder = runner.Decoder(target, target_params, CONFIG)
    bad = {"prompt": _batch(8)["prompt"], "prompt_lengths": np.asarray([3, 9], np.int32)}
    with pytest.raises(ValueError, match="prompt_lengths"):
        decoder.validate(bad)
    with pytest.raises(ValueError, match="prompt_lengths"):  # run_batches checks every batch
        next(runner.run_batches({"plain": decoder}, [(bad, jax.random.PRNGKey(0))]))


def test_prefill_program_returns_the_decode_state(pair):
    target, target_params, _, _ = pair
    batch = _batch(8)
    run, seconds = runner.Prefill(target, target_params, CONFIG).compile(batch, None)
    state, pos, last, _ = run(batch, None)
    assert seconds > 0
    np.testing.assert_array_equal(np.asarray(pos), [2, 1])  # the last prompt token's position
    np.testing.assert_array_equal(np.asarray(last), [7, 9])
    assert np.asarray(state.index).tolist() == [2, 1]


class _Counting:
    """A program counting its compilations and runs; each run returns the batch width."""

    def __init__(self, calls: list, name: str):
        self.calls, self.name = calls, name

    def compile(self, batch, rng):
        self.calls.append(("compile", self.name, batch["prompt"].shape[1]))

        def run(b, r):
            self.calls.append(("run", self.name, b["prompt"].shape[1]))
            return b["prompt"].shape[1]

        return run, 1.5


def test_run_batches_compiles_once_per_shape_and_times_apart():
    calls = []
    programs = {"a": _Counting(calls, "a"), "b": _Counting(calls, "b")}
    batches = [({"prompt": np.zeros((2, w), np.int32)}, None) for w in (8, 16, 8)]
    results = list(runner.run_batches(programs, batches))
    assert [r.outputs for r in results] == [{"a": 8, "b": 8}, {"a": 16, "b": 16}, {"a": 8, "b": 8}]
    assert [r.compile_s for r in results] == [{"a": 1.5, "b": 1.5}, {"a": 1.5, "b": 1.5}, {}]
    assert all(set(r.seconds) == {"a", "b"} and min(r.seconds.values()) >= 0 for r in results)
    assert all(r.repeat_seconds == {n: [r.seconds[n]] for n in "ab"} for r in results)
    # Without warm-up or repeats: compile then one run, program by program, batch by batch.
    assert calls[:4] == [("compile", "a", 8), ("run", "a", 8), ("compile", "b", 8), ("run", "b", 8)]
    assert calls[-2:] == [("run", "a", 8), ("run", "b", 8)]
    calls.clear()
    (result,) = runner.run_batches(programs, batches[:1], repeats=3, warmup=True)
    # Every timed run kept, in order; the median is one of them.
    assert {n: len(t) for n, t in result.repeat_seconds.items()} == {"a": 3, "b": 3}
    assert all(result.seconds[n] == sorted(t)[1] for n, t in result.repeat_seconds.items())
    assert (
        calls
        == [("compile", "a", 8)]
        + [("run", "a", 8)] * 4
        + [("compile", "b", 8)]
        + [("run", "b", 8)] * 4
    )
    # The untimed first run is timed apart, like the compile, only where it happened.
    assert set(result.warmup_s) == {"a", "b"} and min(result.warmup_s.values()) >= 0
    assert all(r.warmup_s == {} for r in results)
