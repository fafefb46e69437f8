"""scripts/spec_bench_hf.py: Spec-Bench's protocol with transformers' programs beside ours. The
per-task best of each side from hand-made scores, and (slow; the `[compare]` extra) the script end
to end on two tiny GGUF files of one BPE tokenizer through a chat template: every program answers
every turn, our greedy answers equal our plain ones and transformers' equal its plain ones, the
rendering is checked against transformers' `apply_chat_template`, and the summary holds both
sides' scores and where their weights came from."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from tests.test_cross_vocab import TARGET_TEXT, _trained
from tests.test_cross_vocab_jobs import write_bpe_model
from tests.test_spec_bench import CHATML, write_questions

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def script(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    for name in ("spec_bench_hf", "hf_generate"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import spec_bench_hf

    return spec_bench_hf


def test_best_of_each_side_per_task(script):
    scores = {
        "qa": {
            "plain": {"mean_tokens_per_s": 10.0},
            "speculative": {"mean_tokens_per_s": 12.0},
            "lookup gamma 7": {"mean_tokens_per_s": 15.0},
            "hf plain [float32]": {"mean_tokens_per_s": 8.0},
            "hf assisted 3 [float32]": {"mean_tokens_per_s": 7.0},
            "hf prompt lookup 10 [float32]": {"mean_tokens_per_s": 9.0},
        }
    }
    best = script.best_by_task(scores)["qa"]
    assert best["best_ours"] == "lookup gamma 7"
    assert best["best_hf"] == "hf prompt lookup 10 [float32]"  # HF's plain is not a candidate
    assert best["fastest_hf_plain"] == "hf plain [float32]"
    assert best["ours_over_best_hf"] == pytest.approx(15.0 / 9.0)
    for name, speedup in (
        ("speculative", 1.2),
        ("lookup gamma 7", 1.5),
        ("hf plain [float32]", 0.8),
        ("hf assisted 3 [float32]", 0.7),
        ("hf prompt lookup 10 [float32]", 0.9),
    ):
        scores["qa"][name]["speedup"] = speedup  # fmt: skip
    table = script.doc_table({"scores": scores, "best": {"qa": best}})
    assert "| qa | 10.00 | 1.20x | 1.50x | 0.80x | 0.70x | 0.90x | 1.67x |" in table
    assert script.hf_name("bfloat16", ("lookup", 10)) == "hf prompt lookup 10 [bfloat16]"
    assert script.hf_name("float32", "default") == "hf assisted default [float32]"


@pytest.mark.slow
def test_ours_and_transformers_on_the_same_conversations(tmp_path, script):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    vocabulary = _trained(TARGET_TEXT, 300, "<|endoftext|>")
    target = write_bpe_model(vocabulary, tmp_path / "target.gguf", 0)
    draft = write_bpe_model(vocabulary, tmp_path / "draft.gguf", 1)
    gin_file = tmp_path / "pair.gin"
    gin_file.write_text(
        "include 'configs/runs/spec_bench.gin'\n"
        f"TARGET = @target/speculative.ModelSpec()\n"
        f"target/speculative.ModelSpec.format = 'gguf'\n"
        f"target/speculative.ModelSpec.path = '{target}'\n"
        f"DRAFT = @draft/speculative.ModelSpec()\n"
        f"draft/speculative.ModelSpec.format = 'gguf'\n"
        f"draft/speculative.ModelSpec.path = '{draft}'\n"
        "MAX_NEW_TOKENS = 10\nGAMMA = 3\n"
    )
    questions = write_questions(tmp_path / "q.jsonl")
    out = tmp_path / "out"
    summary = script.main([
        f"--gin_file={gin_file}", f"--gin.QUESTIONS='{questions}'",
        f"--gin.OUTPUT_DIR='{out}'", f"--gin.CHAT_TEMPLATE='''{CHATML}'''",
        "--gin.TASKS=['writing', 'translation']", "--gin.PER_TASK=1",
        "--gin.PER_MT_BENCH_CATEGORY=1", "--lookup_gammas", "2",
        "--hf_assistant_tokens", "default", "2", "--hf_prompt_lookup_tokens", "3",
    ])  # fmt: skip
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["question_id"] for r in rows] == [81, 161]
    hf_plain = "hf plain [float32]"
    names = {"plain", "speculative", "lookup gamma 2", hf_plain, "hf assisted default [float32]",
             "hf assisted 2 [float32]", "hf prompt lookup 3 [float32]"}  # fmt: skip
    for row in rows:
        assert set(row["programs"]) == names
        for name, program in row["programs"].items():
            turns = program["turns"]
            assert len(turns) == {81: 2, 161: 1}[row["question_id"]]
            baseline = hf_plain if name.startswith("hf ") else "plain"
            same = [t["tokens"] for t in row["programs"][baseline]["turns"]]
            assert [t["tokens"] for t in turns] == same, name  # greedy: each side's own plain
            assert all(t["wall_time"] > 0 and t["new_tokens"] >= 1 for t in turns)
    # the writing question's second turn is asked after the program's own first answer
    first, second = rows[0]["programs"]["hf assisted 2 [float32]"]["turns"]
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["new_tokens"]
    scores = summary["scores"]["overall"]
    assert scores["speculative"]["identical"] == 2 and scores["lookup gamma 2"]["identical"] == 2
    assert summary["scores_over_hf_plain"]["overall"]["hf assisted 2 [float32]"]["identical"] == 2
    assert set(summary["best"]) == {"mt_bench", "translation", "overall"}
    assert summary["best"]["overall"]["best_hf"] != hf_plain
    route = summary["hf_weights"]["float32"]["target"]
    assert route["parameter_dtypes"] == ["float32"] and not route["packed_modules"]
    assert summary["versions"]["transformers"] and "git_commit" in summary["provenance"]
    assert "| overall | speculative |" in (out / "summary.md").read_text()
    assert script.doc_table(summary).splitlines()[-1].startswith("| overall | ")
