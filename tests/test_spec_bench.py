"""Spec-Bench (issue 54): its question file read and checked line by line, questions selected as the
job selects them, Spec-Bench's scoring against hand-computed numbers, and the job end to end on a
tiny random-weight pair through a chat template: conversations whose second turn sees the model's
first answer, greedy speculative answers identical to plain, a killed run resumed with every
question asked once, and a conversation that outgrows the model's context refused by name.
The tests write their own small question files in Spec-Bench's format (the real 480 are not
shipped)."""

from __future__ import annotations

import json

import pytest

from speculative import spec_bench as command
from speculative.data import spec_bench
from speculative.errors import JobError
from speculative.measure import spec_bench as scoring

CHATML = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
    {"question_id": 82, "category": "writing", "turns": ["Write a haiku.", "Again."]},
    {"question_id": 91, "category": "roleplay", "turns": ["Be a pirate.", "Louder."]},
    {"question_id": 161, "category": "translation", "turns": ["Guten Tag, Welt."]},
    {"question_id": 162, "category": "translation", "turns": ["Wie geht es dir?"]},
    {"question_id": 241, "category": "summarization", "turns": ["Summarize: a b a b a b."]},
]


def write_questions(path, rows=QUESTIONS, extra_lines=()):
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "line, match",
    [
        ("{not json", r"q\.jsonl:7: malformed JSON line"),
        ("[1, 2]", r"q\.jsonl:7: a JSON list, not an object"),
        ('{"question_id": "x", "category": "qa", "turns": ["a"]}', "question_id must be an int"),
        ('{"question_id": 9, "category": "poetry", "turns": ["a"]}', "unknown category 'poetry'"),
        ('{"question_id": 9, "category": "qa", "turns": []}', "turns must be a non-empty list"),
        ('{"question_id": 9, "category": "qa", "turns": ["a", "  "]}', "turn 2 is empty"),
        ('{"question_id": 81, "category": "qa", "turns": ["a"]}', "81 repeats line 1"),
    ],
)
def test_bad_question_lines_are_refused_by_file_and_line(tmp_path, line, match):
    path = write_questions(tmp_path / "q.jsonl", extra_lines=[line])
    with pytest.raises(JobError, match=match) as e:
        spec_bench.read_questions(path)
    assert "Spec-Bench questions" in str(e.value)


def test_selection_first_by_id_per_task_and_per_mt_bench_category(tmp_path):
    questions = spec_bench.read_questions(write_questions(tmp_path / "q.jsonl", QUESTIONS[::-1]))
    chosen = spec_bench.select(questions, per_task=1, per_mt_bench_category=1)
    assert [q.question_id for q in chosen] == [81, 91, 161, 241]
    assert [q.task for q in chosen] == ["mt_bench", "mt_bench", "translation", "summarization"]
    every = spec_bench.select(questions, ["writing", "translation"])
    assert [q.question_id for q in every] == [81, 82, 161, 162]
    with pytest.raises(JobError, match="unknown Spec-Bench task or category 'chat'"):
        spec_bench.select(questions, ["chat"])
    with pytest.raises(JobError, match="per_task must be a positive integer"):
        spec_bench.select(questions, per_task=0)


def _turn(tokens, seconds, calls):
    return {
        "prompt_tokens": 5, "new_tokens": tokens, "wall_time": seconds, "text": "",
        "tokens": list(range(tokens)), "stats": {"target_calls": calls, "tokens": tokens},
    }  # fmt: skip


def test_scores_are_spec_bench_means_of_question_speeds():
    """Spec-Bench's speedup is mean(tokens/s per question) over the baseline's mean, not the
    ratio of totals: two questions at 10 and 40 tok/s plainly, 20 and 40 speculatively give
    30 / 25 = 1.2x, while the totals give (100 / 3.75) / (100 / 6.25) = 1.67x."""
    rows = [
        {"task": "qa", "programs": {
            "plain": {"turns": [_turn(50, 5.0, 50)]},
            "speculative": {"turns": [_turn(50, 2.5, 10)]},
        }},
        {"task": "qa", "programs": {
            "plain": {"turns": [_turn(25, 0.625, 25), _turn(25, 0.625, 25)]},
            "speculative": {"turns": [_turn(25, 0.25, 5), _turn(25, 1.0, 5)]},
        }},
    ]  # fmt: skip
    summary = scoring.summarize(rows)
    spec = summary["qa"]["speculative"]
    assert spec["mean_tokens_per_s"] == pytest.approx(30.0)
    assert summary["qa"]["plain"]["mean_tokens_per_s"] == pytest.approx(25.0)
    assert spec["speedup"] == pytest.approx(1.2)
    assert spec["end_to_end"] == pytest.approx((100 / 3.75) / (100 / 6.25))
    assert spec["tau"] == pytest.approx(100 / 20)
    assert spec["identical"] == 2
    assert summary["overall"]["speculative"]["speedup"] == pytest.approx(1.2)
    assert "| qa | speculative | 2 | 30.00 | 1.20x |" in scoring.table(summary)


TINY = """
include 'configs/runs/spec_bench.gin'
include 'configs/demo/tiny_random_models.gin'
TARGET = @target/speculative.ModelSpec()
target/speculative.ModelSpec:
  format = 'random'
  model = %TARGET_MODEL
DRAFT = @draft/speculative.ModelSpec()
draft/speculative.ModelSpec:
  format = 'random'
  model = %DRAFT_MODEL
VOCABULARY = @speculative.VocabSpec()
MAX_NEW_TOKENS = 12
GAMMA = 3
"""


def run_job(tmp_path, *bindings):
    gin_file = tmp_path / "tiny.gin"
    gin_file.write_text(TINY)
    questions = write_questions(tmp_path / "q.jsonl")
    argv = [
        f"--gin_file={gin_file}",
        f"--gin.QUESTIONS='{questions}'",
        f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'",
        f"--gin.CHAT_TEMPLATE='''{CHATML}'''",
        *bindings,
    ]
    return command.main(argv)


def rows_of(tmp_path):
    return [
        json.loads(x) for x in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()
    ]


def test_job_conversations_resume_and_identity(tmp_path):
    summary = run_job(tmp_path, "--gin.PER_TASK=1", "--gin.PER_MT_BENCH_CATEGORY=1")
    rows = rows_of(tmp_path)
    assert [r["question_id"] for r in rows] == [81, 91, 161, 241]
    for row in rows:
        plain, spec = row["programs"]["plain"]["turns"], row["programs"]["speculative"]["turns"]
        assert [t["tokens"] for t in spec] == [t["tokens"] for t in plain]  # greedy: identical
        assert spec[0]["stats"]["drafted"] > 0 and "alpha" in spec[0]["stats"]
    first, second = rows[0]["programs"]["plain"]["turns"]
    # the second turn's prompt holds the first prompt, the model's answer and the new turn
    assert second["prompt_tokens"] >= first["prompt_tokens"] + len(first["text"].encode()) + 6
    scores = summary["scores"]
    assert set(scores) == {"mt_bench", "translation", "summarization", "overall"}
    assert scores["overall"]["speculative"]["identical"] == 4
    assert summary["this_run"]["questions"] == 4 and summary["this_run"]["compile_s"]
    assert summary["environment"]["jax"] and "git_commit" in summary["provenance"]

    # a run killed after its second question: the rerun asks only the two without a row
    predictions = tmp_path / "out" / "predictions.jsonl"
    lines = predictions.read_text().splitlines(keepends=True)
    predictions.write_text("".join(lines[:2]) + lines[2][:40])  # and a torn third line
    again = run_job(tmp_path, "--gin.PER_TASK=1", "--gin.PER_MT_BENCH_CATEGORY=1")
    assert again["this_run"]["questions"] == 2
    resumed = rows_of(tmp_path)
    assert [r["question_id"] for r in resumed] == [81, 91, 161, 241]
    assert [r["programs"]["plain"]["turns"][0]["tokens"] for r in resumed] == [
        r["programs"]["plain"]["turns"][0]["tokens"] for r in rows
    ]
    # another job in the same directory is refused, not mixed in
    with pytest.raises(JobError, match="job"):
        run_job(tmp_path, "--gin.PER_TASK=2", "--gin.PER_MT_BENCH_CATEGORY=1")


def test_job_refusals_before_any_weights(tmp_path):
    with pytest.raises(JobError, match=r"chat template.*does not parse"):
        run_job(tmp_path, "--gin.CHAT_TEMPLATE='{% for m in messages %}'")
    with pytest.raises(JobError, match="unknown Spec-Bench task or category 'poetry'"):
        run_job(tmp_path, "--gin.TASKS=['poetry']")
    with pytest.raises(JobError, match="no chat template"):
        run_job(tmp_path, "--gin.CHAT_TEMPLATE=None", "--gin.TASKS=['translation']")


def test_conversation_longer_than_the_context_is_refused(tmp_path):
    long_turn = "word " * 120  # 600 bytes: over the tiny model's 512 positions
    rows = [{"question_id": 321, "category": "qa", "turns": [long_turn]}]
    gin_file = tmp_path / "tiny.gin"
    gin_file.write_text(TINY)
    questions = write_questions(tmp_path / "q.jsonl", rows)
    with pytest.raises(JobError, match=r"question 321 .*turn 1: the conversation is \d+ tokens"):
        command.main([
            f"--gin_file={gin_file}", f"--gin.QUESTIONS='{questions}'",
            f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'", f"--gin.CHAT_TEMPLATE='''{CHATML}'''",
        ])  # fmt: skip
