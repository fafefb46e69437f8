"""HumanEval prompts from the installed package, and the JSONL prompt loader."""

from __future__ import annotations

import gzip
import json

import pytest

from speculative import prompts


def test_humaneval_prompts():
    rows = prompts.humaneval_prompts()
    assert len(rows) == 164
    assert [r["task_id"] for r in rows[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert rows[-1]["task_id"] == "HumanEval/163"
    assert all("def " + r["entry_point"] + "(" in r["prompt"] for r in rows)
    assert "def has_close_elements(" in rows[0]["prompt"]
    assert rows[0]["entry_point"] == "has_close_elements"
    assert [r["task_id"] for r in prompts.humaneval_prompts(limit=10)] == [
        f"HumanEval/{i}" for i in range(10)
    ]


def test_load_prompts(tmp_path):
    rows = [{"text": "first"}, {"text": "second", "id": 2}, {"text": "third"}]
    plain = tmp_path / "p.jsonl"
    plain.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    packed = tmp_path / "p.jsonl.gz"
    with gzip.open(packed, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows))
    for path in (plain, packed):
        got = prompts.load_prompts(path, field="text", limit=2)
        assert [r["prompt"] for r in got] == ["first", "second"]
        assert got[1]["id"] == 2
    with pytest.raises(ValueError, match="no string field 'prompt'"):
        prompts.load_prompts(plain)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not valid JSON"):
        prompts.load_prompts(bad)
