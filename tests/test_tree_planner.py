"""TREE = 'auto' (measure/tree_planner.py): the expected tokens per round of a widths tree, checked
exactly against the real tree rule and the real rank counter on enumerated cases; the chooser's
choice between chains, trees and plain decoding (pure functions, no compiles)."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import decoding
from speculative.decoding.acceptance import TreeRound
from speculative.decoding.acceptance import tree as tree_rule
from speculative.decoding.sampling import SamplingConfig
from speculative.decoding.tree import TreeShape
from speculative.errors import JobError
from speculative.measure import planner, tree_planner
from tests import helpers

NONE = 3  # outcome "the target's token is none of the siblings"


def _rows(shape: TreeShape, outcomes):
    """Node tokens and target logits [B, N+1, V] of one greedy round per outcome (r_1, r_2): at
    depth d the target's argmax is the draft's rank-r_d sibling below the first node of depth
    d - 1 (NONE: a token no node has). Sibling (d, r) is token 4 d + r + 1 in every tree."""
    depth_of, rank_of = shape.depths, shape.ranks
    tokens = np.array([4 * depth_of[j] + rank_of[j] + 1 for j in range(1, shape.size + 1)])
    first = [0] + [j for j in range(1, shape.size + 1) if rank_of[j] == 0]  # root, first children
    vocab = 4 * (shape.depth + 1) + 1
    logits = np.zeros((len(outcomes), shape.size + 1, vocab), np.float32)
    for b, ranks in enumerate(outcomes):
        for d, r in enumerate(ranks, start=1):
            if d <= shape.depth:
                logits[b, first[d - 1], 4 * d + r + 1 if r != NONE else 0] = 1.0
    return jnp.asarray(np.tile(tokens, (len(outcomes), 1)), jnp.int32), jnp.asarray(logits)


def _walk(shape: TreeShape, outcomes):
    """The real greedy tree rule on every outcome: (accepted [B], path [B, D], tested [B, D])."""
    path, n, tested = _verify(shape, *_rows(shape, outcomes))
    return np.asarray(n), np.asarray(path), np.asarray(tested)


@functools.partial(jax.jit, static_argnums=0)
def _verify(shape: TreeShape, tokens: jax.Array, logits: jax.Array):
    """The rule jitted (the shape is static, hashable): one program per tree, not eager ops."""
    log_q = jnp.zeros((*tokens.shape, logits.shape[-1]))  # unread at temperature 0
    round_ = TreeRound(logits, log_q, tokens, shape.children, shape.depth)
    path, n, _, _, tested = tree_rule.verify_tree(jax.random.PRNGKey(0), round_, SamplingConfig())
    return path, n, tested


def test_expected_tokens_is_exact_for_widths_trees():
    """A random joint law over (rank accepted at depth 1, at depth 2), dependent across depths.
    The probe (3, 3) is walked by the real rule on every outcome and its ranks counted as the
    loop counts them; the formula on those rates equals, for every widths tree, the exact
    expectation of the real rule's accepted length on the same law (+1, the target's token)."""
    outcomes = list(itertools.product(range(4), repeat=2))
    law = np.random.default_rng(0).dirichlet(np.ones(len(outcomes)))
    probe = TreeShape.from_widths((3, 3))
    _, path, tried = _walk(probe, outcomes)
    # as the loop counts them: the accepted node's rank at each depth, and the depths tried
    hits = np.eye(3)[probe.ranks[path]] * (path > 0)[..., None]  # [B, D, W]
    counts, tested = np.einsum("b,bdw->dw", law, hits), law @ tried
    assert tested[0] == pytest.approx(1.0) and 0 < tested[1] < 1
    rates = tree_planner.rank_rates(counts, tested)
    for widths in [(1,), (3,), (1, 1), (2, 1), (3, 2), (2, 3), (3, 3), (1, 3)]:
        accepted, _, _ = _walk(TreeShape.from_widths(widths), outcomes)
        exact = 1.0 + float(np.dot(law, accepted))
        assert tree_planner.expected_tokens(widths, rates) == pytest.approx(exact), widths
    # Sequoia's product over depths (every node with children) would overcount here.
    a1, a2 = rates[0, :2].sum(), rates[1, :1].sum()
    assert 1 + a1 + a1 * a2 > tree_planner.expected_tokens((2, 1), rates) + 1e-3


def test_the_rank_counter_counts_the_accepted_paths_ranks():
    """The loop's counter on a probe: a greedy decode of a target and a self-draft (every rank-0
    node accepted) counts rank 0 at every depth each round, and nothing else."""
    target = helpers.tiny_decoder(32, emb=16, layers=1, heads=2, kv_heads=1, seed=0)
    batch = helpers.ragged_prompts(1, batch=2, width=4, vocab=32)
    config = tree_planner.probe_config(decoding.DecodeConfig(7, (31,)), depth=2, width=2)
    out = decoding.speculative_loop(*target, *target, batch, jax.random.PRNGKey(0), config=config)
    ranks = np.asarray(out.stats.accepted_rank)
    assert ranks.shape == (2, 2, 2) and ranks[..., 1].sum() == 0
    np.testing.assert_array_equal(ranks[..., 0].sum(1), 2 * np.asarray(out.stats.target_calls))


# ------------------------------------------------------------------------------------------------
# The chooser.

GAMMAS = (1, 2, 3, 4)
# Depth 1 accepts rank 0 half the time and ranks 1-2 another 40%; deeper, rank 0 0.6, rank 1 0.2.
COUNTS = np.array([[50, 30, 10, 0], [30, 10, 0, 0], [18, 6, 0, 0], [10, 4, 0, 0]])
TESTED = np.array([100, 50, 30, 18])


def _plan(verify, draft_step_s=0.05, counts=COUNTS, tested=TESTED, **kw):
    lengths = tree_planner.timed_lengths(GAMMAS, tree_planner.candidates(GAMMAS))
    verify_s = {n: verify(n) for n in lengths}
    return tree_planner.plan_trees(counts, tested, 1.0, draft_step_s, verify_s, GAMMAS, **kw)


def test_a_tree_wins_when_other_ranks_are_accepted_and_verifying_is_flat():
    p = _plan(lambda n: 1.0)
    assert p.tree is not None and p.gamma == TreeShape(p.tree).depth
    widths = TreeShape(p.tree).widths
    assert widths[0] >= 3 and p.predicted_speedup == p.tree_candidates[widths]
    assert p.predicted_speedup > max(p.candidates.values()) > 1
    assert "tree widths" in p.describe()
    assert planner.Plan.from_json(p.to_json()) == p


def test_a_chain_wins_when_wide_verify_calls_are_expensive():
    p = _plan(lambda n: 1.0 + 0.3 * (n - 1))
    assert p.tree is None and p.gamma in GAMMAS
    assert p.predicted_speedup == p.candidates[p.gamma] > max(p.tree_candidates.values())
    # The same rates with no rank but 0 ever accepted: a tree is never better than its chain.
    chains_only = COUNTS * np.array([1, 0, 0, 0])
    assert _plan(lambda n: 1.0, counts=chains_only).tree is None


def test_plain_decoding_when_nothing_wins():
    rare = np.array([[5, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    p = _plan(
        lambda n: 1.0 + 0.1 * n, draft_step_s=0.3, counts=rare, tested=np.array([100, 5, 1, 0])
    )
    assert p.gamma is None and p.tree is None and p.predicted_speedup == 1.0
    assert max([*p.candidates.values(), *p.tree_candidates.values()]) < 1


def test_verify_costs_are_interpolated_between_timed_lengths():
    lengths = tree_planner.timed_lengths((1, 2, 8), tree_planner.candidates((1, 2, 8)))
    assert lengths[:3] == [2, 3, 9] and lengths[-1] == 4 + 4 + 8 - 1 and len(lengths) <= 6
    assert tree_planner.verify_cost({2: 1.0, 6: 3.0}, 4) == pytest.approx(2.0)
    assert tree_planner.verify_cost({2: 1.0, 6: 3.0}, 6) == 3.0
    with pytest.raises(ValueError, match="counts"):
        tree_planner.plan_trees(COUNTS[:2], TESTED[:2], 1.0, 0.1, {2: 1.0}, GAMMAS)


# ------------------------------------------------------------------------------------------------
# The infer job with TREE = 'auto'.

AUTO_TREE = [
    "--gin.GAMMA='auto'",
    "--gin.TREE='auto'",
    "--gin.speculative.InferConfig.planner_gammas=(1, 2)",
]


def test_infer_job_plans_a_tree_decodes_as_plain_and_resumes_without_replanning(
    tmp_path, monkeypatch
):
    """The tiny pair accepts the draft's second choice now and then (measured on the probe), so
    with flat verify costs (a timed 0.1 ms call is noise on a loaded CI machine) a tree wins;
    greedy rows equal plain decoding, summary.json names the tree, a resumed run reuses plan.json."""
    monkeypatch.chdir(helpers.ROOT)

    def flat_costs(work, gammas, lengths):
        assert work.config.tree is None and not work.config.count_ranks  # timed as chains
        verify = {n: 1e-3 for n in lengths}
        return {"target_step_s": 1e-3, "draft_step_s": 1e-4, "c": 0.1, "target_extend_s": verify}

    monkeypatch.setattr(planner, "measure_costs", flat_costs)
    plain, _ = helpers.tiny_infer(tmp_path, "plain", "--gin.SPECULATIVE=False")
    rows, s = helpers.tiny_infer(tmp_path, "auto", *AUTO_TREE)
    plan = s["planner"]
    tree = TreeShape(plan["tree"])
    assert s["tree"] == plan["tree"] and s["gamma"] == plan["gamma"] == tree.depth
    assert max(tree.widths) > 1 and plan["predicted_speedup"] > max(plan["candidates"].values())
    assert len(plan["rank_acceptance"]) == 2 and sum(plan["rank_acceptance"][0][1:]) > 0
    assert [r["output_ids"] for r in rows] == [r["output_ids"] for r in plain]
    assert all(len(r["accepted_at"]) == tree.depth for r in rows)

    def never(*args, **kwargs):
        raise AssertionError("a resumed job re-planned")

    predictions = tmp_path / "auto" / "predictions.jsonl"
    predictions.write_text("".join(predictions.read_text().splitlines(True)[:2]))
    monkeypatch.setattr(tree_planner, "measure_and_plan", never)
    rows, s = helpers.tiny_infer(tmp_path, "auto", *AUTO_TREE)
    assert s["planner"] == {**plan, "reused": True} and s["tree"] == plan["tree"]
    assert s["this_run"]["decoded_examples"] == 2
    assert [r["output_ids"] for r in rows] == [r["output_ids"] for r in plain]
    with pytest.raises(JobError, match="TREE = 'auto' plans chains and trees with GAMMA = 'auto'"):
        helpers.tiny_infer(tmp_path, "bad", "--gin.TREE='auto'")


def test_measured_tree_plan_on_tiny_models():
    """The real path: the probe decoded by the loop, the verify call timed at `timed_lengths`
    (the costs of every candidate are then defined), the plan consistent and JSON-safe."""
    target = helpers.tiny_decoder(64, emb=32, layers=1, heads=2, kv_heads=1, seed=0)
    draft = helpers.tiny_decoder(64, emb=32, layers=1, heads=2, kv_heads=1, seed=1)
    batch = helpers.ragged_prompts(1, batch=2, width=6, vocab=64)
    config = decoding.DecodeConfig(8, (63,))

    def decode(c):
        assert c.count_ranks and c.tree.widths == (tree_planner.PROBE_WIDTH,) * 2
        return decoding.speculative_loop(*target, *draft, batch, jax.random.PRNGKey(0), config=c)

    p = tree_planner.measure_and_plan(
        planner.Workload(*target, *draft, batch, config), decode, gammas=(1, 2)
    )
    assert set(p.candidates) == {1, 2} and set(p.tree_candidates) == set(
        tree_planner.candidates((1, 2))
    )
    assert np.shape(p.rank_acceptance) == (2, tree_planner.PROBE_WIDTH)
    assert p.target_step_s > 0 and p.draft_step_s > 0
    assert planner.Plan.from_json(p.to_json()) == p


def test_a_tree_summary_with_measured_costs_prints(capsys):
    """A tree's summary has c and a predicted speedup but no optimal chain gamma (a fixed TREE
    with measure_c, or a planned tree): printing it used to raise KeyError after the job wrote
    summary.json."""
    from speculative.jobs.infer import rows

    summary = {
        "target": "t", "draft": "d", "speculative": True, "gamma": 2, "tree": [0, 0, 1],
        "batch_size": 2, "sampling": {}, "exact": True, "examples": 1, "tokens": 4,
        "target_calls": 2, "tau": 2.0, "truncated_inputs": 0, "c": 0.1, "predicted_speedup": 1.5,
        "this_run": {"tokens_per_s": None, "compile_batches": 0},
    }  # fmt: skip
    rows.print_summary(summary, "out")
    printed = capsys.readouterr().out
    assert "token tree [0, 0, 1]" in printed and "speedup estimate 1.50x\n" in printed
