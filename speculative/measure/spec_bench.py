"""Spec-Bench's scoring (its evaluation/speed.py), from the rows a Spec-Bench run writes.

A question's speed is its tokens over its seconds, summed over its turns. A task's speedup is the
mean over its questions of a program's speeds divided by the mean over the same questions of the
baseline's (plain decoding's); "overall" pools every question. Beside it: our end-to-end ratio
(all tokens over all seconds, against the baseline's), tau and alpha pooled over every turn, the
acceptance by draft position, and how many questions came out token-identical to the baseline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from speculative.data.spec_bench import TASKS
from speculative.measure import conversation


def question_speed(turns: Sequence[Mapping[str, Any]]) -> float:
    """Tokens per second of one question: its turns' new tokens over their wall seconds."""
    return sum(t["new_tokens"] for t in turns) / max(sum(t["wall_time"] for t in turns), 1e-9)


def _program_summary(rows: Sequence[Mapping[str, Any]], name: str) -> dict[str, Any]:
    turns = [t for r in rows for t in r["programs"][name]["turns"]]
    tokens = sum(t["new_tokens"] for t in turns)
    seconds = sum(t["wall_time"] for t in turns)
    speeds = [question_speed(r["programs"][name]["turns"]) for r in rows]
    return {
        "questions": len(rows),
        "mean_tokens_per_s": float(np.mean(speeds)),
        "tokens": tokens,
        "seconds": seconds,
        "prompt_tokens": sum(t["prompt_tokens"] for t in turns),
        **conversation.pooled(turns),
    }


def _identical(rows: Sequence[Mapping[str, Any]], name: str, baseline: str) -> int:
    def tokens(row: Mapping[str, Any], program: str) -> list[list[int]]:
        return [t["tokens"] for t in row["programs"][program]["turns"]]

    return sum(tokens(r, name) == tokens(r, baseline) for r in rows)


def summarize(rows: Sequence[Mapping[str, Any]], baseline: str = "plain") -> dict[str, Any]:
    """{group: {program: summary}} for each task present and "overall". Each summary: questions,
    mean_tokens_per_s, tokens, seconds, prompt_tokens, tau (alpha, acceptance_by_position for a
    speculative program); with the baseline present, every other program adds `speedup`
    (Spec-Bench's), `end_to_end` and `identical` (questions whose every turn equals the
    baseline's tokens)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for task in TASKS:
        chosen = [r for r in rows if r["task"] == task]
        if chosen:
            groups[task] = chosen
    if rows:
        groups["overall"] = list(rows)
    names = list(rows[0]["programs"]) if rows else []
    result: dict[str, Any] = {}
    for group, chosen in groups.items():
        summaries = {name: _program_summary(chosen, name) for name in names}
        base = summaries.get(baseline)
        for name, summary in summaries.items():
            if base is None or name == baseline:
                continue
            summary["speedup"] = summary["mean_tokens_per_s"] / base["mean_tokens_per_s"]
            summary["end_to_end"] = (summary["tokens"] / summary["seconds"]) / (
                base["tokens"] / base["seconds"]
            )
            summary["identical"] = _identical(chosen, name, baseline)
        result[group] = summaries
    return result


def table(summary: Mapping[str, Any], baseline: str = "plain") -> str:
    """The summary as a Markdown table: a row per group and program."""
    lines = [
        "| task | program | questions | tok/s | Spec-Bench speedup | end to end | tau | alpha | "
        "identical |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for group, programs in summary.items():
        for name, s in programs.items():
            speedup = f"{s['speedup']:.2f}x" if "speedup" in s else "-"
            end = f"{s['end_to_end']:.2f}x" if "end_to_end" in s else "-"
            alpha = f"{s['alpha']:.3f}" if "alpha" in s else "-"
            same = f"{s['identical']}/{s['questions']}" if "identical" in s else "-"
            lines.append(
                f"| {group} | {name} | {s['questions']} | {s['mean_tokens_per_s']:.2f} | {speedup} "
                f"| {end} | {s['tau']:.2f} | {alpha} | {same} |"
            )
    return "\n".join(lines)
