"""timing.decode_step_time and timing.measure_c on both model families (the benchmark's c and
verify-cost probes), including an encoder-decoder, whose state needs its encoder tokens."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from speculative.measure import timing
from tests.helpers import encoder_batch, tiny_decoder, tiny_t5_pair


@pytest.mark.parametrize("length", [1, 3])
def test_decode_step_time_decoder(length):
    model, params = tiny_decoder(vocab=64, emb=32, layers=1, heads=4, kv_heads=2, seed=0)
    batch = {"prompt": jnp.ones((2, 5), jnp.int32), "prompt_lengths": jnp.full((2,), 5)}
    seconds = timing.decode_step_time(model, params, batch, cache_len=12, repeats=1, length=length)
    assert 0 < seconds < 5


@pytest.mark.parametrize("length", [1, 2])
def test_decode_step_time_encoder_decoder_from_encoder_tokens_alone(length):
    # The decoder starts from the start token: the batch needs no decoder prompt.
    target, target_params, _, _ = tiny_t5_pair(vocab=40, seed=0)
    batch = encoder_batch(seed=1, batch=2, width=6, vocab=40)
    seconds = timing.decode_step_time(
        target, target_params, batch, cache_len=10, repeats=1, length=length
    )
    assert 0 < seconds < 5


def test_measure_c_encoder_decoder_with_verify_lengths():
    target, target_params, draft, draft_params = tiny_t5_pair(vocab=40, seed=0)
    batch = encoder_batch(seed=1, batch=2, width=6, vocab=40)
    result = timing.measure_c(
        target,
        target_params,
        draft,
        draft_params,
        batch,
        cache_len=10,
        verify_lengths=[2, 4],
    )
    assert result["c"] == pytest.approx(result["draft_step_s"] / result["target_step_s"])
    assert sorted(result["target_extend_s"]) == [2, 4]
    assert all(t > 0 for t in result["target_extend_s"].values())


def test_sampling_round_time_runs_each_rule_on_its_own_round():
    """A round's sampling work is timed through the rule it names (a chain's or a tree's): every
    built-in rule's round runs, and a name no rule has is refused, not timed as the token rule."""
    from speculative.decoding import acceptance
    from speculative.decoding.sampling import SamplingConfig
    from speculative.decoding.tree import TreeShape

    sampled = SamplingConfig(temperature=1.0)
    tree = TreeShape.from_widths((2, 1))
    for name in acceptance.names(tree=False):
        assert timing.sampling_round_time(2, 16, 3, sampled, name, repeats=1) > 0
    for name in acceptance.names(tree=True):
        assert timing.sampling_round_time(2, 16, 2, sampled, name, tree, repeats=1) > 0
    with pytest.raises(ValueError, match="acceptance must be one of"):
        timing.sampling_round_time(2, 16, 3, sampled, "no such rule", repeats=1)
