"""The gamma planner: Thm 3.8's accounting with measured costs picks gamma, or plain decoding."""

import numpy as np
import pytest

from speculative import decoding
from speculative.drafts import prompt_lookup
from speculative.measure import metrics, planner
from tests import helpers

VERIFY = {1: 1.0, 2: 1.1, 3: 1.15, 4: 1.2, 5: 1.25, 6: 1.3, 7: 1.45, 8: 1.5}


def test_a_useless_draft_means_plain_decoding():
    p = planner.plan(alpha=0.02, target_step_s=1.0, draft_step_s=0.3, verify_s=VERIFY)
    assert p.gamma is None and p.predicted_speedup == 1.0
    assert "plain decoding" in p.describe()


def test_a_good_cheap_draft_means_speculation_at_the_cost_model_optimum():
    p = planner.plan(alpha=0.9, target_step_s=1.0, draft_step_s=0.1, verify_s=VERIFY)
    expected = {
        g: metrics.cost_model_speedup(
            metrics.expected_tokens_per_call(0.9, g), g, 1.0, 0.1, VERIFY[g + 1]
        )
        for g in range(1, 8)
    }
    assert p.candidates == pytest.approx(expected)
    assert p.gamma == max(expected, key=expected.get) and p.predicted_speedup > 2
    assert f"gamma {p.gamma}" in p.describe()


def test_a_verify_call_timed_below_one_step_counts_as_one_step():
    # Timing noise must not let a draft that is never accepted beat plain decoding.
    p = planner.plan(alpha=0.0, target_step_s=1.0, draft_step_s=0.01, verify_s={2: 0.3, 3: 0.4})
    assert p.gamma is None and max(p.candidates.values()) < 1


def test_an_expensive_verify_call_shortens_gamma():
    free = planner.plan(0.9, 1.0, 0.05, {n: 1.0 for n in range(1, 10)})
    steep = planner.plan(0.9, 1.0, 0.05, {n: 1.0 + 0.5 * (n - 1) for n in range(1, 10)})
    assert steep.gamma < free.gamma


def test_bad_inputs():
    with pytest.raises(ValueError, match="alpha"):
        planner.plan(1.5, 1.0, 0.1, VERIFY)
    with pytest.raises(ValueError, match="length >= 2"):
        planner.plan(0.5, 1.0, 0.1, {1: 1.0})


def test_measured_plan_refuses_an_unrelated_draft_as_expensive_as_the_target():
    """Measured end to end on tiny models: a random draft as large as the target (alpha ~ 1/V,
    c ~ 1) can only lose, so the planner must choose plain decoding."""
    target = helpers.tiny_decoder(64, emb=64, layers=2, heads=4, kv_heads=2, seed=0)
    draft = helpers.tiny_decoder(64, emb=64, layers=2, heads=4, kv_heads=2, seed=7)
    batch = helpers.ragged_prompts(1, batch=2, width=6, vocab=64)
    config = decoding.DecodeConfig(12, (64,))
    p = planner.measure_and_plan(planner.Workload(*target, *draft, batch, config), gammas=(1, 2, 4))
    assert p.alpha < 0.3 and set(p.candidates) == {1, 2, 4}
    assert p.gamma is None, p.describe()
    assert np.isfinite(p.target_step_s) and p.draft_step_s > 0


def test_measured_plan_with_a_drafter_that_is_not_a_model():
    """A `Drafter` (prompt lookup) is timed by its propose step; the plan round-trips as JSON."""
    target = helpers.tiny_decoder(64, emb=32, layers=1, heads=2, kv_heads=1, seed=0)
    batch = helpers.ragged_prompts(1, batch=2, width=6, vocab=64)
    config = decoding.DecodeConfig(8, (64,))
    drafter = prompt_lookup.PromptLookupDrafter(64, max_ngram=2)
    p = planner.measure_and_plan(
        planner.Workload(*target, drafter, (), batch, config), gammas=(1, 2)
    )
    assert 0.0 <= p.alpha <= 1.0 and set(p.candidates) == {1, 2} and p.draft_step_s > 0
    assert planner.Plan.from_json(p.to_json()) == p
