"""CHAT = True in the infer and benchmark jobs (issue 54): each input asked as a user turn through the
chat template, a JSONL row whose input field is a list of messages asked as that conversation,
greedy speculative rows still identical to plain, and every way of asking wrongly refused by name
before a weight loads."""

from __future__ import annotations

import json
import pathlib

import pytest

from speculative import benchmark, infer
from speculative.errors import JobError
from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHATML = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
ROWS = [
    {"inputs": "Hi"},
    {"inputs": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "abc"}]},
]


def _infer(tmp_path, name, rows=ROWS, *extra):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / name
    infer.main([
        *helpers.TINY_INFER, *helpers.SMALL_INFER, f"--gin.INPUT_FILE='{path}'",
        f"--gin.OUTPUT_DIR='{out}'", "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 12}",
        *extra,
    ])  # fmt: skip
    return helpers.read_outputs(out)


def test_infer_asks_inputs_and_conversations_through_the_template(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    chat = ["--gin.CHAT=True", f"--gin.CHAT_TEMPLATE='''{CHATML}'''"]
    rows, _ = _infer(tmp_path, "chat", ROWS, *chat)
    assert [r["inputs"] for r in rows] == [
        "<|user|>Hi\n<|assistant|>",
        "<|system|>Be brief.\n<|user|>abc\n<|assistant|>",
    ]
    plain, _ = _infer(tmp_path, "plain", ROWS, *chat, "--gin.SPECULATIVE=False")
    assert [r["output_ids"] for r in rows] == [r["output_ids"] for r in plain]
    assert not any("truncated_from" in r for r in rows)
    # the prompt decoded is the rendered one: cut to 16 tokens, it keeps the rendering's end
    cut, _ = _infer(
        tmp_path, "cut", ROWS[:1], *chat, "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 12}"
    )
    assert cut[0]["truncated_from"] == 24 and cut[0]["inputs_used"] == "Hi\n<|assistant|>"


@pytest.mark.parametrize(
    "rows, extra, match",
    [
        (ROWS, [], r"in\.jsonl:2.*input 1 is a conversation .*CHAT = True"),
        (ROWS[:1], ["--gin.CHAT=True"], "no chat template"),
        (ROWS[:1], [f"--gin.CHAT_TEMPLATE='''{CHATML}'''"], "CHAT is False: it would be ignored"),
        (
            [{"inputs": [{"content": "no role"}]}],
            ["--gin.CHAT=True", f"--gin.CHAT_TEMPLATE='''{CHATML}'''"],
            r"in\.jsonl:1.*message 0 has no role",
        ),
        (
            [{"inputs": 7}],
            [],
            r"in\.jsonl:1.*no string field 'inputs' \(nor a list of chat messages\)",
        ),
    ],
)
def test_infer_refuses_chat_inputs_asked_wrongly(tmp_path, monkeypatch, rows, extra, match):
    monkeypatch.chdir(ROOT)
    with pytest.raises(JobError, match=match):
        _infer(tmp_path, "out", rows, *extra)
    assert not (tmp_path / "out" / "predictions.jsonl").exists()


def test_benchmark_times_the_rendered_prompts(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"inputs": "Hello"}\n')
    flags = [
        "--gin_file=configs/runs/benchmark.gin", "--gin_file=configs/demo/tiny_random_models.gin",
        f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_DIR='{tmp_path / 'bench'}'",
        "--gin.GAMMAS=[2]", "--gin.TEMPERATURES=[0.0]", "--gin.BATCH_SIZES=[1]",
        "--gin.REPEATS=1", "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 4}",
        "--gin.CHAT=True",
    ]  # fmt: skip
    with pytest.raises(JobError, match="no chat template"):
        benchmark.main(flags)
    result = benchmark.main([*flags, f"--gin.CHAT_TEMPLATE='''{CHATML}'''"])
    # "<|user|>Hello\n<|assistant|>": 27 bytes, bucketed to 32 (the raw "Hello" would be 8)
    assert result["cells"][0]["input_widths"] == [32]


def test_an_encoder_decoder_target_reads_no_chat_template():
    from speculative import vocab
    from speculative.data import chat_inputs
    from speculative.data.inputs import Example

    examples = [Example(0, "Hi")]
    with pytest.raises(JobError, match="CHAT needs a decoder-only target"):
        chat_inputs.prepare(
            examples, vocab.ByteVocabulary(), chat=True, template=CHATML, encoder_decoder=True
        )
    asked = chat_inputs.prepare(
        examples, vocab.ByteVocabulary(), chat=True, template=CHATML, encoder_decoder=False
    )
    assert asked[0].inputs == "<|user|>Hi\n<|assistant|>" and len(asked[0].ids) == 24
