import json

import numpy as np
import pytest

from speculative.measure import metrics
from tests import helpers


def test_expected_tokens_and_speedup_match_paper_formulas():
    assert metrics.expected_tokens_per_call(0.0, 5) == 1.0
    assert metrics.expected_tokens_per_call(1.0, 5) == 6.0
    assert metrics.expected_tokens_per_call(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    # c = 0: speedup equals expected tokens per call; c = 1 with alpha = 0: 1 / (gamma + 1).
    assert metrics.predicted_speedup(0.8, 3, 0.0) == pytest.approx((1 - 0.8**4) / 0.2)
    assert metrics.predicted_speedup(0.0, 3, 1.0) == pytest.approx(0.25)


def test_cost_model_reduces_to_theorem_3_8_when_verify_costs_one_step():
    alpha, gamma, step, c = 0.8, 4, 0.2, 0.1
    tau = metrics.expected_tokens_per_call(alpha, gamma)
    same = metrics.cost_model_speedup(tau, gamma, step, c * step, verify_s=step)
    assert same == pytest.approx(metrics.predicted_speedup(alpha, gamma, c))
    # A verify call costing two steps: one extra step per round in the denominator.
    slower = metrics.cost_model_speedup(tau, gamma, step, c * step, verify_s=2 * step)
    assert slower == pytest.approx(tau / (gamma * c + 2.0))


def test_optimal_gamma_is_the_integer_argmax():
    for alpha, c in [(0.6, 0.05), (0.8, 0.02), (0.9, 0.1), (0.3, 0.5)]:
        best = metrics.optimal_gamma(alpha, c, max_gamma=40)
        values = [metrics.predicted_speedup(alpha, g, c) for g in range(1, 41)]
        assert best == int(np.argmax(values)) + 1
    # The paper's Figure 3 regime: high alpha and cheap drafts favour long blocks.
    assert metrics.optimal_gamma(0.9, 0.01) > metrics.optimal_gamma(0.6, 0.01)


def test_cost_model_optimal_gamma_charges_the_measured_verify_calls():
    step, draft = 0.2, 0.01
    # Every verify call at one step: the theorem's answer, within the measured gammas.
    flat = {g + 1: step for g in range(1, 41)}
    for alpha in (0.6, 0.8, 0.9):
        theorem = metrics.optimal_gamma(alpha, draft / step, max_gamma=40)
        assert metrics.cost_model_optimal_gamma(alpha, step, draft, flat) == theorem
    # Rows that cost more from 5 on: the long blocks the theorem likes no longer pay.
    steep = {g + 1: step * (1.0 if g < 5 else 2.0) for g in range(1, 41)}
    assert metrics.optimal_gamma(0.9, draft / step, max_gamma=40) > 4
    assert metrics.cost_model_optimal_gamma(0.9, step, draft, steep) == 4
    with pytest.raises(ValueError, match="2 or more tokens"):
        metrics.cost_model_optimal_gamma(0.9, step, draft, {1: step})


def test_cost_model_optimal_gamma_of_the_batch_8_run_is_the_measured_best():
    """benchmarks/issue39_batch8: the theorem says gamma 5, the run's best was gamma 3 (its verify
    call of 48 rows costs 2.06 steps), and the cost model with the measured calls says 3."""
    result = json.loads((helpers.ROOT / "benchmarks/issue39_batch8/benchmark.json").read_text())
    (cell,) = result["cells"]
    best = max(cell["points"], key=lambda p: p["speedup"])["gamma"]
    chosen = metrics.cost_model_optimal_gamma(
        cell["alpha"], cell["target_step_s"], cell["draft_step_s"], cell["target_extend_s"]
    )
    assert (cell["optimal_gamma"], chosen, best) == (5, 3, 3)


def test_summarize_pools_over_verified_positions():
    stats = {
        "target_calls": np.array([2, 1]),
        "draft_calls": np.array([4, 2]),
        "drafted": np.array([4, 2]),
        "accepted": np.array([3, 0]),
        "alpha": np.array([0.75, 0.0]),
        "verified_at": np.array([[2, 2], [1, 0]]),
        "accepted_at": np.array([[2, 1], [0, 0]]),
    }
    out = metrics.summarize(stats, np.array([5, 1]))
    assert out["alpha"] == pytest.approx(3 / 5)
    assert out["tau"] == pytest.approx(2.0)
    assert out["acceptance_by_position"] == pytest.approx([2 / 3, 0.5])


def test_rows_of_several_gammas_pool_in_one_summary():
    """concat_rows pads per-position counts to the widest gamma, so a gamma sweep's alpha is beta
    pooled over all its verified positions (not an average of per-gamma alphas)."""
    gamma_2 = {  # one row: 4 positions verified, beta sum 2.0
        "target_calls": np.array([2]),
        "alpha": np.array([0.5]),
        "verified_at": np.array([[2, 2]]),
        "accepted_at": np.array([[1, 1]]),
    }
    gamma_4 = {  # one row: 1 position verified, beta sum 1.0
        "target_calls": np.array([1]),
        "alpha": np.array([1.0]),
        "verified_at": np.array([[1, 0, 0, 0]]),
        "accepted_at": np.array([[1, 0, 0, 0]]),
    }
    rows = metrics.concat_rows([gamma_2, gamma_4])
    assert rows["verified_at"].tolist() == [[2, 2, 0, 0], [1, 0, 0, 0]]
    extra = {
        "draft_calls": np.array([4, 4]),
        "drafted": np.array([4, 4]),
        "accepted": np.array([2, 1]),
    }
    out = metrics.summarize({**rows, **extra}, np.array([4, 2]))
    assert out["alpha"] == pytest.approx(3 / 5)
    assert out["acceptance_by_position"] == pytest.approx([2 / 3, 0.5, 0.0, 0.0])


def test_position_betas_are_the_overlap_of_the_two_distributions():
    rng = np.random.default_rng(0)
    target, draft = rng.normal(size=(2, 3, 12)), rng.normal(size=(2, 3, 12))
    draft[..., 10:] = 50.0  # padding ids (>= vocab_size 10): never counted, however likely

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    for temperature in (1.0, 0.5):
        p, q = softmax(target[..., :10] / temperature), softmax(draft[..., :10] / temperature)
        betas = np.asarray(metrics.position_betas(target, draft, temperature, vocab_size=10))
        np.testing.assert_allclose(betas, np.minimum(p, q).sum(-1), rtol=1e-5)
    greedy = np.asarray(metrics.position_betas(target, draft, 0.0, vocab_size=10))
    same = target[..., :10].argmax(-1) == draft[..., :10].argmax(-1)
    np.testing.assert_array_equal(greedy, same.astype(np.float32))
    assert np.all(np.asarray(metrics.position_betas(target, target, 1.0, 10)) > 1 - 1e-5)
