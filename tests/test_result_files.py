"""The one boundary through which the report tools read result files (`errors.read_result_json`,
`read_result_jsonl`, `check_new_outputs`): a missing, torn or foreign file is a JobError naming
it, printed as one line with exit status 2 by the commands (fit_ngram, the scripts)."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from speculative import errors, fit_ngram
from speculative.errors import JobError

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _raises(call, path: pathlib.Path, what: str) -> str:
    with pytest.raises(JobError) as error:
        call()
    message = str(error.value)
    assert message.startswith(f"{path}: ") and what in message and "\n" not in message, message
    return message


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (b'{"alpha": 0.5, "tok', "is not valid JSON: Unterminated string"),
        (b"", "is empty"),
        (b"  \n", "is empty"),
        (b'["alpha", 0.5]', "holds a JSON list, not an object"),
        (b"0.5", "holds a JSON float, not an object"),
        (b'{"alpha": 0.5}', "has no 'tokens', 'examples': not the result file expected here"),
        (b'{"alpha": 0.5}\xff', "is not UTF-8 text"),
    ],
)
def test_read_result_json_names_the_file_and_what_is_wrong(tmp_path, content, what):
    path = tmp_path / "summary.json"
    path.write_bytes(content)
    _raises(lambda: errors.read_result_json(path, ("alpha", "tokens", "examples")), path, what)


def test_read_result_json_of_a_missing_file_or_a_directory(tmp_path):
    missing = tmp_path / "run" / "summary.json"
    _raises(lambda: errors.read_result_json(missing), missing, "does not exist")
    _raises(lambda: errors.read_result_json(tmp_path), tmp_path, "is a directory")


def test_read_result_json_returns_the_object(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"alpha": 0.5, "tokens": 3}))
    assert errors.read_result_json(str(path), ("alpha",)) == {"alpha": 0.5, "tokens": 3}


def test_read_result_jsonl_skips_blank_lines_and_names_a_bad_line(tmp_path):
    path = tmp_path / "predictions.jsonl"
    rows = [{"index": 1, "output": "b"}, {"index": 0, "output": "a"}]
    path.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n")
    assert errors.read_result_jsonl(path, ("index",)) == rows
    path.write_text(json.dumps(rows[0]) + '\n{"index": 0, "out')  # a run killed mid-write
    message = _raises(lambda: errors.read_result_jsonl(path), path, "line 2 is not valid JSON")
    assert "the last line, cut short" in message
    path.write_text('{"index": 0, "out\n' + json.dumps(rows[0]) + "\n")
    message = _raises(lambda: errors.read_result_jsonl(path), path, "line 1 is not valid JSON")
    assert "cut short" not in message  # not the last line: corrupted, not torn
    path.write_text(json.dumps(rows[0]) + "\n[1, 2]\n")
    _raises(lambda: errors.read_result_jsonl(path), path, "line 2 holds a JSON list")
    path.write_text(json.dumps(rows[0]) + '\n{"output": "a"}\n')
    _raises(lambda: errors.read_result_jsonl(path, ("index",)), path, "line 2 has no 'index'")


def test_check_new_outputs_refuses_an_existing_file_unless_overwrite(tmp_path):
    new, old = tmp_path / "report.json", tmp_path / "report.md"
    old.write_text("committed\n")
    errors.check_new_outputs([new], overwrite=False)
    what = "already exists: pass --overwrite to replace it"
    _raises(lambda: errors.check_new_outputs([new, old], overwrite=False), old, what)
    errors.check_new_outputs([new, old], overwrite=True)
    assert old.read_text() == "committed\n"  # the check writes nothing


def test_fit_ngram_on_a_torn_predictions_file_is_one_line_naming_it(tmp_path, capsys):
    """fit_ngram --input_field=output reads an infer run's predictions.jsonl: a torn last line is
    one line naming the file and the line, exit 2, no tables written."""
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text(json.dumps({"inputs": "ab", "output": "abab"}) + '\n{"inputs": "c", "ou')
    out = tmp_path / "tables.npz"
    # --count=inputs: the field alone, as "auto" would, but without its INFO line on stderr
    argv = ["--vocab_kind=byte", f"--input_file={predictions}", "--input_field=output"]
    argv += ["--count=inputs", f"--out={out}"]
    assert fit_ngram.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: input {predictions}:2: malformed JSONL line")
    assert not out.exists()


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("content", "what"),
    [
        ('{"inputs": "a", "output_ids": [1]}\n{"inputs": "b", "outp', "line 2 is not valid JSON"),
        ("", "has no rows"),
        ('{"inputs": "a"}\n', "line 1 has no 'output_ids'"),
        (None, "does not exist"),
    ],
)
def test_teacher_forced_alpha_on_a_bad_predictions_file(tmp_path, capsys, content, what):
    """scripts/teacher_forced_alpha.py reads the predictions before any model loads: a bad file is
    one line naming it, exit 2, nothing written."""
    module = _script("teacher_forced_alpha")
    path = tmp_path / "run" / "predictions.jsonl"
    path.parent.mkdir()
    if content is not None:
        path.write_text(content)
    out = tmp_path / "alpha.json"
    argv = ["--gin_file", "no_such.gin", "--predictions", str(path.parent), "--out", str(out)]
    assert module.main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == err.strip().splitlines()[0] and "Traceback" not in err
    assert err.startswith(f"error: {path}: ") and what in err
    assert not out.exists()
