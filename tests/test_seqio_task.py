"""seqio Tasks over local files: tests/data/en_de_pairs.tsv through the inference job, and the
EnDe task over `ende_data`'s splits.

Needs the seqio extra (`pip install .[seqio]`; scripts/test.sh installs it). seqio imports
TensorFlow, which must not share a process with the rest of the suite's JAX: this module runs in
its own interpreter, started by tests/test_seqio_process.py (`helpers.in_tensorflow_process`).
"""

from __future__ import annotations

import json
import pathlib

import pytest

from speculative import infer
from speculative.jobs.config import seqio_tasks_module
from speculative.recipes.ende import data as ende
from tests import helpers

pytestmark = helpers.in_tensorflow_process()

ROOT = pathlib.Path(__file__).resolve().parents[1]
PREFIX = "translate English to German: "


def test_seqio_tsv_task_end_to_end(tmp_path, monkeypatch):
    pytest.importorskip("seqio", reason="seqio extra not installed (pip install .[seqio])")
    monkeypatch.chdir(ROOT)
    pairs = [
        line.split("\t") for line in (ROOT / "tests/data/en_de_pairs.tsv").read_text().splitlines()
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
        # Byte ids + EOS past TASK_FEATURE_LENGTHS['inputs'] = 48: cut, and said, as for a file.
        full = len((PREFIX + english).encode()) + 1
        assert row.get("truncated_from") == (full if full > 48 else None)
    assert spec["examples"] == plain["examples"] == 6 and 0.0 < spec["alpha"] <= 1.0
    assert spec["truncated_inputs"] == sum(
        len((PREFIX + e).encode()) + 1 > 48 for e, _ in pairs[:6]
    )


def test_teacher_forced_alpha_over_an_infer_runs_outputs(tmp_path, monkeypatch):
    """scripts/teacher_forced_alpha.py on a real greedy run: aligned (the target's teacher-forced
    arg-max is its greedy output), alpha 1 for a draft equal to the target, below it otherwise."""
    pytest.importorskip("seqio", reason="seqio extra not installed (pip install .[seqio])")
    import importlib.util

    monkeypatch.chdir(ROOT)
    script = importlib.util.spec_from_file_location(
        "teacher_forced_alpha", ROOT / "scripts" / "teacher_forced_alpha.py"
    )
    module = importlib.util.module_from_spec(script)
    script.loader.exec_module(module)
    gin_file = "tests/data/tiny_t5_seqio.gin"
    infer.main(
        [
            f"--gin_file={gin_file}",
            f"--gin.OUTPUT_DIR='{tmp_path / 'run'}'",
            "--gin.SPECULATIVE=False",
            "--gin.speculative.InferConfig.progress=False",
        ]
    )
    rows = [json.loads(x) for x in (tmp_path / "run/predictions.jsonl").read_text().splitlines()]
    same = ["draft/t5.T5Config.num_decoder_layers = 2"]  # then the draft IS the target (seed 0)
    results = {}
    for name, bindings in (("other", []), ("same", same)):
        out = tmp_path / f"{name}.json"
        argv = ["--gin_file", gin_file, "--predictions", str(tmp_path / "run"), "--out", str(out)]
        assert module.main(argv + [f"--binding={b}" for b in bindings]) == 0
        results[name] = json.loads(out.read_text())
    for result in results.values():
        assert result["tokens"] == sum(r["length"] for r in rows)
        assert result["target_argmax_reproduces"] == 1.0
    assert results["same"]["alpha"] == 1.0
    assert 0.0 <= results["other"]["alpha"] < 1.0


def test_seqio_task_over_the_splits(tmp_path):
    pytest.importorskip("seqio", reason="seqio extra not installed (pip install .[seqio])")
    import seqio

    pairs = [
        tuple(line.split("\t"))
        for line in (ROOT / "tests/data/en_de_pairs.tsv").read_text().splitlines()
    ]
    counts = ende.write_splits(pairs, tmp_path)
    model = ende.train_sentencepiece(tmp_path / "train.tsv", tmp_path / "spm", 150)
    name = seqio_tasks_module().add_ende_task(str(tmp_path), str(model), name="test_ende_mini")
    task = seqio.get_mixture_or_task(name)
    vocabulary = task.output_features["inputs"].vocabulary
    for split in ende.SPLITS:
        examples = list(task.get_dataset(None, split=split, shuffle=False).as_numpy_iterator())
        assert len(examples) == counts[split]
    heldout = list(task.get_dataset(None, split="heldout", shuffle=False).as_numpy_iterator())
    assert len(heldout) == counts["validation"] + counts["test"]
    first = examples[0]
    assert vocabulary.decode(first["inputs"].tolist()).startswith("translate English to German: ")
    assert first["inputs"][-1] == 1 and first["targets"][-1] == 1  # EOS appended
