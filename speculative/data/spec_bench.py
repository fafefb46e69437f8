"""Spec-Bench's questions (Xia et al., Findings of ACL 2024): one JSON object a line,
{"question_id": int, "category": str, "turns": [str, ...]}; read, checked and selected.

Spec-Bench groups its 13 categories into six tasks (its evaluation's task names): MT-bench's eight
two-turn categories are one task, `mt_bench`; each other category is a task of its own. The file
is not shipped: a job takes its path (the 480 questions are Apache-2.0, from the Spec-Bench
repository's data/spec_bench/question.jsonl).

Every line is checked before anything is decoded, and a bad one stops the job naming `file:line`:
a line that is not a JSON object, a missing or non-integer question_id, a category that is not
Spec-Bench's, no turns or an empty turn, a question_id seen before.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

from speculative.errors import JobError

MT_BENCH = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
)
# task -> its categories, in Spec-Bench's order
TASKS: dict[str, tuple[str, ...]] = {
    "mt_bench": MT_BENCH,
    "translation": ("translation",),
    "summarization": ("summarization",),
    "qa": ("qa",),
    "math_reasoning": ("math_reasoning",),
    "rag": ("rag",),
}
TASK_OF = {category: task for task, categories in TASKS.items() for category in categories}


@dataclasses.dataclass(frozen=True)
class Question:
    """One question: its user turns, asked in one conversation. source: `file:line`."""

    question_id: int
    category: str
    turns: tuple[str, ...]
    source: str = ""

    @property
    def task(self) -> str:
        return TASK_OF[self.category]


def _bad(path: str, line_no: int, why: str) -> JobError:
    return JobError(why, role="Spec-Bench questions", path=f"{path}:{line_no}")


def _question(path: str, line_no: int, text: str) -> Question:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        raise _bad(path, line_no, f"malformed JSON line ({e.msg} at column {e.colno})") from None
    if not isinstance(row, dict):
        raise _bad(path, line_no, f"a JSON {type(row).__name__}, not an object")
    qid, category, turns = row.get("question_id"), row.get("category"), row.get("turns")
    if isinstance(qid, bool) or not isinstance(qid, int):
        raise _bad(path, line_no, f"question_id must be an integer, got {qid!r}")
    if category not in TASK_OF:
        known = ", ".join(TASK_OF)
        raise _bad(path, line_no, f"unknown category {category!r} (Spec-Bench's: {known})")
    if not isinstance(turns, list) or not turns:
        raise _bad(path, line_no, f"question {qid}: turns must be a non-empty list of strings")
    for i, turn in enumerate(turns):
        if not isinstance(turn, str) or not turn.strip():
            raise _bad(path, line_no, f"question {qid}: turn {i + 1} is empty or not a string")
    return Question(qid, category, tuple(turns), f"{path}:{line_no}")


def read_questions(path: str | os.PathLike) -> list[Question]:
    """Every question of a Spec-Bench JSONL file, in file order (checked as the module says)."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise JobError(f"cannot read it: {e}", role="Spec-Bench questions", path=path) from None
    questions, seen = [], {}
    for line_no, text in enumerate(lines, 1):
        if not text.strip():
            continue
        question = _question(path, line_no, text)
        if question.question_id in seen:
            first = seen[question.question_id]
            raise _bad(path, line_no, f"question_id {question.question_id} repeats line {first}")
        seen[question.question_id] = line_no
        questions.append(question)
    if not questions:
        raise JobError("no questions in it", role="Spec-Bench questions", path=path)
    return questions


def check_names(names: Sequence[str]) -> tuple[str, ...]:
    """Task or category names, checked: JobError naming an unknown one."""
    if isinstance(names, str):
        names = (names,)
    unknown = [n for n in names if n not in TASKS and n not in TASK_OF]
    if unknown:
        known = ", ".join([*TASKS, *(c for c in TASK_OF if c not in TASKS)])
        raise JobError(f"unknown Spec-Bench task or category {unknown[0]!r} (known: {known})")
    return tuple(names)


def select(
    questions: Sequence[Question],
    names: Sequence[str] = tuple(TASKS),
    per_task: int | None = None,
    per_mt_bench_category: int | None = None,
) -> list[Question]:
    """The questions of the named tasks or categories, the first by question_id: `per_task` of each
    task other than MT-bench, `per_mt_bench_category` of each MT-bench category (None: all).
    Ordered by question_id."""
    wanted = {c for n in check_names(names) for c in TASKS.get(n, (n,))}
    for name, count in (("per_task", per_task), ("per_mt_bench_category", per_mt_bench_category)):
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 1
        ):
            raise JobError(f"{name} must be a positive integer or None, got {count!r}")
    chosen = []
    for category in sorted(wanted):
        rows = sorted((q for q in questions if q.category == category), key=lambda q: q.question_id)
        count = per_mt_bench_category if category in MT_BENCH else per_task
        chosen += rows if count is None else rows[:count]
    return sorted(chosen, key=lambda q: q.question_id)
