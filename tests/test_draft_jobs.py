"""Drafts that are not separate models (configs/drafts/*.gin) and lenience, in the gin jobs.

Tiny random-weight target (configs/demo/tiny_random_models.gin); each draft kind must give the
greedy tokens of plain decoding, and lenient runs must say they are lossy.
"""

from __future__ import annotations

import json
import logging
import pathlib

import numpy as np
import pytest

from speculative import fit_ngram
from speculative.drafts import ngram
from speculative.errors import JobError
from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROMPTS = helpers.DRAFT_PROMPTS
_infer = helpers.tiny_infer
UNPADDED = "--gin.target/decoder.DecoderConfig.vocab_size=259"  # the byte vocabulary's size


@pytest.fixture(autouse=True)
def _cwd_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _inputs(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"inputs": t}) + "\n" for t in PROMPTS))
    return path


def _tables(tmp_path, vocab_size: int = 264) -> pathlib.Path:
    out = tmp_path / "tables.npz"
    assert (
        fit_ngram.main(
            [
                "--vocab_kind=byte",
                f"--input_file={_inputs(tmp_path)}",
                f"--vocab_size={vocab_size}",
                f"--out={out}",
            ]
        )
        == 0
    )
    return out


def _draft(kind: str, *extra: str) -> list[str]:
    return [f"--gin_file=configs/drafts/{kind}.gin", *extra]


def test_fit_ngram_cli_writes_tables_of_the_corpus(tmp_path):
    tables = ngram.load(_tables(tmp_path))
    assert tables.unigram.shape == (264,)
    # "a" (byte 97 -> id 100) is always followed by "b" in the corpus
    assert int(np.asarray(tables.successors)[100, 0]) == 101


def test_fit_ngram_counts_the_targets_alone_when_asked(tmp_path):
    corpus = tmp_path / "pairs.jsonl"
    corpus.write_text(json.dumps({"inputs": "xxxx", "targets": "abab"}) + "\n")
    for count, x_seen in (("both", True), ("targets", False)):
        out = tmp_path / f"{count}.npz"
        argv = ["--vocab_kind=byte", f"--input_file={corpus}", f"--out={out}", f"--count={count}"]
        assert fit_ngram.main(argv) == 0
        tables = ngram.load(str(out))
        # "x" is byte 120 -> id 123; "a" -> "b" is the only bigram of the targets
        assert (int(np.asarray(tables.successors)[123, 0]) == 123) is x_seen
        assert int(np.asarray(tables.successors)[100, 0]) == 101
    with pytest.raises(JobError, match="count must be one of"):
        fit_ngram.token_sequences(None, str(corpus), "inputs", count="sources")
    # A predictions file read by its 'output' field: the reference 'targets' are not counted.
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text(json.dumps({"inputs": "q", "output": "xxxx", "targets": "abab"}) + "\n")
    out = tmp_path / "auto.npz"
    argv = ["--vocab_kind=byte", f"--input_file={predictions}", "--input_field=output"]
    assert fit_ngram.main([*argv, f"--out={out}"]) == 0
    successors = np.asarray(ngram.load(str(out)).successors)
    assert int(successors[123, 0]) == 123 and int(successors[100, 0]) != 101


@pytest.mark.parametrize(
    "kind, extra",
    [
        ("prompt_lookup", ()),
        ("unigram", ("TABLES",)),
        ("bigram", ("TABLES",)),
        ("layer_skip", (UNPADDED,)),
        ("layer_skip", ()),  # padded target vocabulary: the draft is masked alike
    ],
)
def test_each_draft_kind_gives_plain_greedy_tokens(tmp_path, kind, extra):
    extra = [f"--gin.NGRAM_TABLES='{_tables(tmp_path)}'" if x == "TABLES" else x for x in extra]
    plain, _ = _infer(tmp_path, "plain", "--gin.SPECULATIVE=False", *extra)
    rows, summary = _infer(tmp_path, kind, *_draft(kind, *extra))
    assert [r["output_ids"] for r in rows] == [r["output_ids"] for r in plain]
    assert all(r["exact"] is True and r["lenience"] == 1.0 for r in rows)
    assert summary["exact"] is True and kind.split("_")[0] in summary["draft"]


def test_shortlist_draft_gives_plain_greedy_tokens(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="speculative")
    plain, _ = _infer(tmp_path, "plain", "--gin.SPECULATIVE=False")
    rows, summary = _infer(tmp_path, "shortlist", "--gin.DRAFT_SHORTLIST=40")
    assert [r["output_ids"] for r in rows] == [r["output_ids"] for r in plain]
    assert "head shortlist 40" in summary["draft"]
    assert "output head over 40 of 264 ids" in caplog.text
    with pytest.raises(JobError, match="^draft: shortlist must be in 1..264, got 300$"):
        _infer(tmp_path, "too_big", "--gin.DRAFT_SHORTLIST=300")


def test_lenience_below_one_labels_rows_and_summary_lossy(tmp_path, capsys):
    flags = _draft("prompt_lookup", "--gin.LENIENCE=0.5", "--gin.TEMPERATURE=1.0")
    rows, summary = _infer(tmp_path, "lenient", *flags)
    assert all(r["exact"] is False and r["lenience"] == 0.5 for r in rows)
    assert summary["exact"] is False and summary["lenience"] == 0.5
    assert "LOSSY" in capsys.readouterr().out


def test_c_of_a_non_model_draft_is_measured(tmp_path):
    flags = _draft("prompt_lookup", "--gin.speculative.InferConfig.measure_c=True")
    _, summary = _infer(tmp_path, "c", *flags)
    assert summary["draft_step_s"] > 0 and summary["c"] > 0


@pytest.mark.parametrize(
    "extra, message",
    [
        (_draft("layer_skip", UNPADDED, "--gin.LAYER_SKIP_LAYERS=2"), "num_layers must be in 1"),
        (_draft("bigram", "--gin.NGRAM_TABLES='SMALL'"), "tables have 259 ids but the target"),
        (_draft("bigram", "--gin.NGRAM_TABLES='BAD'"), "^draft .*bad.npz: "),
        (_draft("bigram", "--gin.NGRAM_TABLES='/no/such.npz'"), "path does not exist"),
        (_draft("prompt_lookup", "--gin.PROMPT_LOOKUP_MIN_NGRAM=0"), "min_ngram <= max_ngram"),
        (["--gin.LENIENCE=1.5"], r"lenience must be in \(0, 1\]"),
    ],
)
def test_bad_draft_specs_are_one_line_errors(tmp_path, extra, message):
    small, bad = _tables(tmp_path, vocab_size=259), tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file")
    extra = [x.replace("'SMALL'", f"'{small}'").replace("'BAD'", f"'{bad}'") for x in extra]
    with pytest.raises(JobError, match=message) as e:
        _infer(tmp_path, "bad", *extra)
    assert "\n" not in str(e.value)


def _infer_config(**overrides):
    from speculative.decoding.sampling import SamplingConfig
    from speculative.jobs import config as job_config
    from speculative.loading import specs as ml

    spec = ml.ModelSpec("random", model=helpers.tiny_decoder_model(264, 32, 1, 2, 1))
    fields = {
        "target": spec, "draft": spec, "vocabulary": ml.VocabSpec("byte"),
        "output_dir": "/unused", "input_file": "x.jsonl", "sampling": SamplingConfig(0.0),
    }  # fmt: skip
    return job_config.InferConfig(**{**fields, **overrides})


def test_lenience_at_temperature_zero_is_ignored_and_said_once(caplog):
    from speculative.jobs.infer import settings

    caplog.set_level(logging.INFO, logger="speculative")

    cfg = _infer_config(lenience=0.5)
    s = settings.resolve(cfg, settings.validate(cfg))
    assert s.lenience == 1.0 and s.exact  # greedy verification: exact whatever l is
    assert caplog.text.count("lenience 0.5 is ignored at temperature 0") == 1
    assert "LOSSY" not in caplog.text


def test_auto_gamma_with_an_adaptive_policy_is_refused_before_loading():
    from speculative import decoding
    from speculative.jobs.infer import settings

    policy = decoding.GammaPolicy(kind="confidence", threshold=0.4)
    with pytest.raises(JobError, match="cannot plan for GAMMA_POLICY kind 'confidence'"):
        settings.validate(_infer_config(gamma="auto", gamma_policy=policy))
