"""scripts/spec_bench_replay.py predicts greedy rounds from a plain run's answers alone: the draft's
teacher-forced argmax for a chain, the text for prompt lookup (chains and trees). Each replay must
count exactly the target calls a real greedy decode of the same prompt makes, on a tiny pair whose
draft agrees with the target only in part; a replay off by one position must not."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decoding.tree import TreeShape
from speculative.drafts.prompt_lookup import PromptLookupDrafter
from speculative.loading.specs import Loaded
from tests import helpers

V, STEPS = 12, 40
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]


@pytest.fixture(scope="module")
def replay():
    return helpers.load_script("spec_bench_replay")


@pytest.fixture(scope="module")
def pair():
    target, params = helpers.tiny_decoder(V, emb=16, layers=1, heads=2, kv_heads=1, seed=3)
    noise = jax.random.PRNGKey(7)
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(noise, len(leaves))
    noisy = [x + 0.2 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return (target, params), (target, jax.tree_util.tree_unflatten(tree, noisy))


def _batch():
    return {
        "prompt": jnp.asarray([PROMPT], jnp.int32),
        "prompt_lengths": jnp.asarray([len(PROMPT)]),
    }


def _plain(pair) -> np.ndarray:
    (target, params), _ = pair
    out = decoding.autoregressive_decode(target, params, _batch(), max_decode_len=STEPS, eos_id=-1)
    return np.asarray(out.tokens[0, : int(out.lengths[0])])


def _target_calls(pair, draft, draft_params, **options) -> tuple[np.ndarray, int]:
    (target, params), _ = pair
    out = decoding.speculative_decode(
        target, params, draft, draft_params, _batch(), max_decode_len=STEPS, eos_id=-1, **options
    )
    return np.asarray(out.tokens[0, : int(out.lengths[0])]), int(out.stats.target_calls[0])


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_a_chain_replay_counts_the_rounds_a_real_greedy_decode_takes(replay, pair, gamma):
    answer = _plain(pair)
    draft, draft_params = pair[1]
    tokens, calls = _target_calls(pair, draft, draft_params, gamma=gamma)
    np.testing.assert_array_equal(tokens, answer)
    argmax = replay.draft_argmax(Loaded(draft, draft_params, "draft"), PROMPT, answer)
    agree = float(np.mean(argmax == answer))
    assert 0.2 < agree < 0.95, f"the draft should agree in part, agrees {agree:.2f}"
    lookup = replay.lookup_rounds(PROMPT, answer)
    rounds, steps, widths = replay.replay(answer, argmax, lookup, gamma, 0, None)
    assert rounds == calls and steps == gamma * calls and set(widths) == {gamma + 1}
    shifted = np.roll(argmax, 1)  # a replay that reads the draft one position late
    assert replay.replay(answer, shifted, lookup, gamma, 0, None)[0] != calls


@pytest.mark.parametrize("gamma", [3, 7])
def test_a_lookup_replay_counts_the_rounds_of_prompt_lookup(replay, pair, gamma):
    answer = _plain(pair)
    tokens, calls = _target_calls(pair, PromptLookupDrafter(V), (), gamma=gamma)
    np.testing.assert_array_equal(tokens, answer)
    lookup = replay.lookup_rounds(PROMPT, answer)
    assert calls < len(answer), "the tiny target's text should repeat enough for lookup to hit"
    assert replay.replay(answer, None, lookup, 0, gamma, None)[0] == calls


@pytest.mark.parametrize("widths", [None, (2, 2, 1, 1, 1), (2, 1, 1, 1, 1, 1)])
def test_lookup_variants_replay_chains_and_trees(replay, pair, widths):
    answer = _plain(pair)
    tree = TreeShape.from_widths(widths) if widths else None
    options = {"tree": tree} if tree else {"gamma": 7}
    tokens, calls = _target_calls(pair, PromptLookupDrafter(V, max_ngram=3), (), **options)
    np.testing.assert_array_equal(tokens, answer)
    rounds, verify = replay.lookup_variant_rounds(PROMPT, answer, 3, 1, widths)
    assert rounds == calls
    assert set(verify) == {8 if tree is None else tree.size + 1}
