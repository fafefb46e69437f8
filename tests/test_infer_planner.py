"""GAMMA = 'auto' (the planner in the inference job) and GAMMA_POLICY, end to end on tiny random
models (configs/demo/tiny_random_models.gin), run in-process as a user would launch the job."""

from __future__ import annotations

import json
import logging
import pathlib

import pytest

from speculative import infer
from speculative.config import gin_flags
from speculative.errors import JobError
from speculative.measure import planner
from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = helpers.TINY_INFER
FAST = [
    *helpers.QUIET_INFER,
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 12}",
]
# An 8-layer target whose embedding (std 30) dominates the residual stream, and the 1-layer draft
# sharing its seed (embedding, first layer, head): they agree on nearly every greedy token (alpha
# near 1) while the draft is much cheaper, so speculation must win by a wide margin.
DEEP_TARGET = [
    "--gin.target/decoder.DecoderConfig.num_layers=8",
    "--gin.target/decoder.DecoderConfig.embedding_init_std=30.0",
    "--gin.draft/decoder.DecoderConfig.embedding_init_std=30.0",
]
GOOD_DRAFT: list[str] = []
USELESS_DRAFT = ["--gin.draft/speculative.ModelSpec.seed=7"]  # unrelated weights: alpha ~ 1/V
AUTO = [
    "--gin.GAMMA='auto'",
    "--gin.speculative.InferConfig.planner_gammas=(1, 2, 4)",
    "--gin.speculative.InferConfig.planner_warmup_gamma=2",
    "--gin.BATCH_SIZE=2",
]
PROMPTS = ["def add(a, b):", "Hi", "x = 1; x = 1; x", "Hello, world!"]
# Ragged: 8 prompts of 1..14 bytes in one batch of 8.
RAGGED = [
    "a",
    "Hi",
    "x = 1",
    "def f():",
    "abcabcabc",
    "import os",
    "Hello, Hello,",
    "for i in x: y",
]


@pytest.fixture(autouse=True)
def _cwd_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _inputs(tmp_path: pathlib.Path, texts) -> pathlib.Path:
    return helpers.write_jsonl(tmp_path / f"in{len(texts)}.jsonl", texts)


def _flags(inputs: pathlib.Path, out: pathlib.Path, *extra: str) -> list[str]:
    return TINY + FAST + [f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_DIR='{out}'", *extra]


def _run(inputs: pathlib.Path, out: pathlib.Path, *extra: str) -> tuple[list[dict], dict]:
    infer.main(_flags(inputs, out, *extra))
    rows = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    return rows, json.loads((out / "summary.json").read_text())


def _ids(rows):
    return [r["output_ids"] for r in sorted(rows, key=lambda r: r["index"])]


@pytest.fixture
def steady_costs(monkeypatch):
    """The planner's timings replaced by a bandwidth-bound machine's (draft step 0.1 of a target
    step, verify on n tokens 1 + 0.05 (n - 1) steps). A tiny model's 0.4 ms step timed on a loaded
    2-core CI machine is noise that can flip the choice; alpha is still measured by decoding,
    and the timing path itself runs for real in the useless-draft test."""

    def costs(work, gammas):
        verify = {g + 1: 1e-3 * (1 + 0.05 * g) for g in gammas}
        return {"target_step_s": 1e-3, "draft_step_s": 1e-4, "c": 0.1, "target_extend_s": verify}

    monkeypatch.setattr(planner, "measure_costs", costs)


@pytest.fixture(scope="module")
def deep_plain(tmp_path_factory):
    """Plain greedy rows of the deep target; GAMMA = 'auto' is ignored with SPECULATIVE = False."""
    tmp = tmp_path_factory.mktemp("plain")
    rows, summary = _run(
        _inputs(tmp, PROMPTS), tmp / "out", *DEEP_TARGET, *AUTO, "--gin.SPECULATIVE=False"
    )
    assert not summary["speculative"] and "planner" not in summary
    assert not (tmp / "out" / infer.PLAN).exists()
    return rows


def test_planner_chooses_plain_for_a_useless_draft_by_measurement(tmp_path, deep_plain, caplog):
    caplog.set_level(logging.INFO, logger="speculative")
    rows, s = _run(_inputs(tmp_path, PROMPTS), tmp_path / "o", *DEEP_TARGET, *USELESS_DRAFT, *AUTO)
    plan = s["planner"]
    assert plan["alpha"] < 0.1, plan  # measured on the warm-up batch
    # No candidate gamma beats plain decoding under the measured costs, so plain runs.
    assert set(plan["candidates"]) == {"1", "2", "4"} and max(plan["candidates"].values()) < 1
    assert plan["gamma"] is None and plan["predicted_speedup"] == 1.0 and not plan["reused"]
    assert not s["speculative"] and s["gamma"] is None
    assert all("alpha" not in r and r["target_calls"] == r["length"] for r in rows)
    assert _ids(rows) == _ids(deep_plain)  # greedy: token for token
    assert "planner: plain decoding" in caplog.text and "decoding plainly" in caplog.text


def test_planner_speculates_with_a_good_cheap_draft(tmp_path, deep_plain, steady_costs, caplog):
    caplog.set_level(logging.INFO, logger="speculative")
    rows, s = _run(_inputs(tmp_path, PROMPTS), tmp_path / "o", *DEEP_TARGET, *GOOD_DRAFT, *AUTO)
    plan = s["planner"]
    assert plan["alpha"] > 0.8 and plan["c"] < 0.7, plan
    assert plan["gamma"] in (1, 2, 4) and plan["predicted_speedup"] > 1.0
    assert s["speculative"] and s["gamma"] == plan["gamma"]
    assert all(len(r["accepted_at"]) == plan["gamma"] for r in rows)
    assert _ids(rows) == _ids(deep_plain)
    assert f"planner: gamma {plan['gamma']}" in caplog.text


def test_resume_reuses_the_planned_gamma_and_a_different_job_is_refused(
    tmp_path, deep_plain, steady_costs
):
    inputs, out = _inputs(tmp_path, PROMPTS), tmp_path / "o"
    _, first = _run(inputs, out, *DEEP_TARGET, *AUTO)
    gamma = first["planner"]["gamma"]
    # Killed after its first batch: the resumed run reuses the recorded choice, no re-plan.
    predictions = out / "predictions.jsonl"
    predictions.write_text("".join(predictions.read_text().splitlines(True)[:2]))
    rows, s = _run(inputs, out, *DEEP_TARGET, *AUTO)
    assert s["this_run"]["decoded_examples"] == 2 and s["planner"]["reused"]
    assert s["gamma"] == gamma and s["planner"] == {**first["planner"], "reused": True}
    assert _ids(rows) == _ids(deep_plain)
    # Proof that plan.json is what decides: a recorded gamma the planner would not pick is used.
    record = json.loads((out / infer.PLAN).read_text())
    record["plan"]["gamma"] = other = 1 if gamma != 1 else 2
    (out / infer.PLAN).write_text(json.dumps(record))
    predictions.write_text("")  # mixing gammas in one file cannot happen otherwise
    rows, s = _run(inputs, out, *DEEP_TARGET, *AUTO)
    assert s["gamma"] == other and [len(r["accepted_at"]) for r in rows] == [other] * 4
    assert _ids(rows) == _ids(deep_plain)
    with pytest.raises(JobError, match="different job.*gamma"):
        infer.main(_flags(inputs, out, *DEEP_TARGET, *AUTO, "--gin.GAMMA=3"))


@pytest.fixture(scope="module")
def ragged_plain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ragged")
    rows, _ = _run(_inputs(tmp, RAGGED), tmp / "o", "--gin.BATCH_SIZE=8", "--gin.SPECULATIVE=False")
    return rows


@pytest.mark.parametrize(
    "gin_file, kind, field",
    [
        ("configs/drafts/confidence_stop.gin", "confidence", ("threshold", 0.4)),
        ("configs/drafts/schedule.gin", "schedule", ("initial", 2)),
    ],
)
def test_adaptive_policy_greedy_equals_plain_on_a_ragged_batch(
    tmp_path, ragged_plain, gin_file, kind, field
):
    extra = [f"--gin_file={gin_file}", "--gin.BATCH_SIZE=8", "--gin.GAMMA=4"]
    if kind == "schedule":
        extra.append("--gin.SCHEDULE_INITIAL_GAMMA=2")
    rows, s = _run(_inputs(tmp_path, RAGGED), tmp_path / "o", *extra)
    assert _ids(rows) == _ids(ragged_plain)
    assert s["gamma_policy"]["kind"] == kind and s["gamma_policy"][field[0]] == field[1]
    assert f"GammaPolicy.kind = '{kind}'" in (tmp_path / "o" / "config.gin").read_text()
    # The policy drafts fewer than gamma tokens in some rounds (draft_calls < 4 per target call).
    assert sum(r["drafted"] for r in rows) < 4 * sum(r["target_calls"] for r in rows)


@pytest.mark.parametrize("value", ["0", "-2", "'fast'", "True", "2.5", "None"])
def test_bad_gamma_is_one_line_error_before_anything_is_read(tmp_path, capsys, value):
    flags = _flags(tmp_path / "missing.jsonl", tmp_path / "o", f"--gin.GAMMA={value}")
    with pytest.raises(JobError, match=r"^GAMMA must be an integer >= 1 or 'auto', got "):
        infer.main(flags)
    assert gin_flags.run_job(infer.main, flags) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GAMMA must be" in err
    assert not (tmp_path / "o").exists()
