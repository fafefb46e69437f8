"""plan.json (GAMMA = 'auto') is validated when read back: a truncated, edited, foreign or fuzzed
plan is a one-line JobError naming the file, never a traceback or a silently different decode."""

from __future__ import annotations

import json
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speculative.decoding.tree import TreeShape
from speculative.errors import JobError
from speculative.jobs.infer import plan as plan_file
from speculative.measure import planner

JOB = {"target": "random", "gamma": "auto", "planner_gammas": [1, 2, 4]}
GOOD = planner.Plan(2, 1.4, 0.8, 0.01, 0.002, {1: 1.2, 2: 1.4, 4: 1.3})
# TREE = 'auto': the tree of widths (3, 1), depth 2, chosen over the chains and one other tree.
TREE = planner.Plan(
    2, 1.6, 0.7, 0.01, 0.002, {1: 1.2, 2: 1.4}, tree=(0, 0, 0, 1),
    tree_candidates={(3, 1): 1.6, (2,): 1.3}, rank_acceptance=((0.7, 0.1, 0.05), (0.6, 0.2, 0.0)),
)  # fmt: skip


def _write(out: pathlib.Path, record) -> None:
    (out / plan_file.PLAN).write_text(record if isinstance(record, str) else json.dumps(record))


def test_a_saved_plan_reads_back(tmp_path):
    assert plan_file.load_plan(tmp_path, JOB) is None
    plan_file.save_plan(tmp_path, JOB, GOOD)
    assert plan_file.load_plan(tmp_path, JOB) == GOOD
    plain = planner.Plan(None, 1.0, 0.1, 0.01, 0.002, {1: 0.7})
    plan_file.save_plan(tmp_path, JOB, plain)
    assert plan_file.load_plan(tmp_path, JOB) == plain
    # A chain plan is written as before trees were planned, and such a file reads as a chain.
    assert "tree" not in GOOD.to_json() and plan_file.load_plan(tmp_path, JOB).tree is None
    plan_file.save_plan(tmp_path, JOB, TREE)
    assert plan_file.load_plan(tmp_path, JOB) == TREE
    assert json.loads((tmp_path / plan_file.PLAN).read_text())["plan"]["tree_candidates"] == {
        "2": 1.3,
        "3,1": 1.6,
    }


def _tree_plan(**fields):
    return lambda r: {**r, "plan": {**TREE.to_json(), **fields}}


@pytest.mark.parametrize(
    "edit, message",
    [
        (_tree_plan(tree=[0, 2]), "'tree' is not a token tree: tree node 2's parent"),
        (_tree_plan(tree=[0, True, 0]), "'tree' must be a list of parents"),
        (_tree_plan(tree="3,1"), "'tree' must be a list of parents"),
        (_tree_plan(tree=[0, 0, 1]), r"'tree' \[0, 0, 1\] is not among the tree candidates"),
        (_tree_plan(gamma=1), "'gamma' 1 must be the tree's depth 2"),
        (_tree_plan(tree_candidates={"3,0": 1.0}), "a tree candidate must be widths"),
        (_tree_plan(tree_candidates=None), "'tree_candidates' must be a non-empty"),
        (_tree_plan(rank_acceptance=[[1.5]]), r"rank_acceptance\[0\] must be in"),
        (_tree_plan(rank_acceptance=[]), "'rank_acceptance' must be a non-empty list"),
    ],
)
def test_bad_tree_plans_are_refused(tmp_path, edit, message):
    plan_file.save_plan(tmp_path, JOB, TREE)
    _write(tmp_path, edit(json.loads((tmp_path / plan_file.PLAN).read_text())))
    with pytest.raises(JobError, match=message) as e:
        plan_file.load_plan(tmp_path, JOB)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: json.dumps(r)[:40], "not a readable plan"),
        (lambda r: [], r"not a plan \(no 'plan' object\)"),
        (lambda r: {**r, "fingerprint": {**JOB, "gamma": 3}}, "written by another job"),
        (
            lambda r: {**r, "plan": {**r["plan"], "gamma": 3}},
            "'gamma' 3 is not among the candidates",
        ),
        (
            lambda r: {**r, "plan": {**r["plan"], "gamma": 0}},
            "'gamma' must be an integer gamma >= 1",
        ),
        (lambda r: {**r, "plan": {**r["plan"], "alpha": 1.5}}, r"'alpha' must be in \[0.0, 1.0\]"),
        (lambda r: {**r, "plan": {**r["plan"], "target_step_s": 0}}, "'target_step_s' must be > 0"),
        (
            lambda r: {**r, "plan": {**r["plan"], "candidates": {}}},
            "'candidates' must be a non-empty",
        ),
        (
            lambda r: {**r, "plan": {**r["plan"], "candidates": {"x": 1}}},
            "a candidate must be an integer",
        ),
        (lambda r: {k: v for k, v in r.items() if k != "plan"}, "no 'plan' object"),
    ],
)
def test_bad_plans_are_one_line_errors_naming_the_file(tmp_path, edit, message):
    plan_file.save_plan(tmp_path, JOB, GOOD)
    _write(tmp_path, edit(json.loads((tmp_path / plan_file.PLAN).read_text())))
    with pytest.raises(JobError, match=message) as e:
        plan_file.load_plan(tmp_path, JOB)
    assert str(e.value).startswith(f"plan {tmp_path / plan_file.PLAN}: ")
    assert "\n" not in str(e.value) and "delete it to plan again" in str(e.value)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 10)
    | st.floats(allow_nan=True)
    | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=20), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = st.sampled_from(sorted(TREE.to_json()))  # a chain plan's fields and the tree fields


@settings(max_examples=150, deadline=None)
@given(
    plan=st.sampled_from([GOOD, TREE]),
    field=FIELDS,
    value=JSON,
    drop=st.booleans(),
    cut=st.integers(0, 700),
)
def test_fuzzed_plans_load_or_fail_with_a_job_error(
    tmp_path_factory, plan, field, value, drop, cut
):
    """Any field of a chain or a tree plan replaced by any JSON value (or dropped, or added to a
    chain plan), or the file cut anywhere: the plan either loads as a valid Plan or is refused with
    a JobError; nothing else escapes."""
    out = tmp_path_factory.mktemp("plan")
    record = {"fingerprint": JOB, "plan": plan.to_json()}
    if drop:
        record["plan"].pop(field, None)
    else:
        record["plan"][field] = value
    text = json.dumps(record)
    for candidate in (text, text[:cut]):
        _write(out, candidate)
        try:
            loaded = plan_file.load_plan(out, JOB)
        except JobError as e:
            assert "\n" not in str(e)
            continue
        assert 0 <= loaded.alpha <= 1 and loaded.target_step_s > 0
        if loaded.tree is None:
            assert loaded.gamma is None or loaded.gamma in loaded.candidates
        else:  # the settings decode with it: a tree a draft grows, its depth the gamma
            shape = TreeShape(loaded.tree)
            assert shape.first_child_chain and loaded.gamma == shape.depth
            assert shape.widths in loaded.tree_candidates
