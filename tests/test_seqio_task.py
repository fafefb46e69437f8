"""A seqio Task over local files (tests/data/trans_de_en.tsv) through the inference job.

Needs the seqio extra (`pip install .[seqio]`; scripts/test.sh installs it). Without it the
end-to-end test is skipped and the job's install hint is checked instead.
"""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from speculative import infer
from speculative.errors import JobError
from speculative.job_config import seqio_tasks_module

ROOT = pathlib.Path(__file__).resolve().parents[1]
PREFIX = "translate English to German: "


def test_seqio_tsv_task_end_to_end(tmp_path, monkeypatch):
    pytest.importorskip("seqio", reason="seqio extra not installed (pip install .[seqio])")
    monkeypatch.chdir(ROOT)
    pairs = [
        line.split("\t") for line in (ROOT / "tests/data/trans_de_en.tsv").read_text().splitlines()
    ]
    common = [
        "--gin_file=tests/data/tiny_t5_seqio.gin",
        "--gin.speculative.InferConfig.measure_c=False",
        "--gin.speculative.InferConfig.progress=False",
    ]
    spec = infer.main(common + [f"--gin.OUTPUT_DIR='{tmp_path / 'spec'}'"])
    plain = infer.main(
        common + [f"--gin.OUTPUT_DIR='{tmp_path / 'plain'}'", "--gin.SPECULATIVE=False"]
    )
    rows = [
        json.loads(x) for x in (tmp_path / "spec" / "predictions.jsonl").read_text().splitlines()
    ]
    plain_rows = [
        json.loads(x) for x in (tmp_path / "plain" / "predictions.jsonl").read_text().splitlines()
    ]
    assert [r["index"] for r in rows] == list(range(6))
    for row, plain_row, (english, german) in zip(rows, plain_rows, pairs):
        assert row["inputs"] == PREFIX + english and row["targets"] == german
        assert row["output_ids"] == plain_row["output_ids"]  # greedy: speculative == plain (T5)
        assert 1 <= row["length"] <= 12
    assert spec["examples"] == plain["examples"] == 6 and 0.0 < spec["alpha"] <= 1.0


def test_task_name_without_seqio_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "seqio", None)  # makes `import seqio` fail, as when absent
    monkeypatch.delitem(sys.modules, "speculative.seqio_tasks", raising=False)
    with pytest.raises(JobError, match=r"needs the seqio extra.*pip install"):
        seqio_tasks_module()
