"""What one-line errors name (issue 40): a spec bound to a slot of another kind names the slot,
before anything is loaded, instead of an AttributeError deep in loading; a file inside a model
directory is named whole (`DIR/model.safetensors`), never as a stray `/model.safetensors`."""

from __future__ import annotations

import json
import pathlib

import pytest

from speculative import benchmark, errors, infer
from speculative.config import gin_flags
from speculative.errors import JobError, strip_path
from speculative.jobs.train import guards
from speculative.loading import specs as ml
from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = "a ModelSpec (a model's weights: format and path)"
DRAFT = "a DraftSpec (a draft that is not a model: prompt lookup, n-grams, layer skip, a feature"
VOCAB = "a VocabSpec (a tokenizer)"
LOOKUP = ["--gin.speculative.DraftSpec.kind='prompt_lookup'"]


@pytest.fixture(autouse=True)
def _cwd_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _one_line_error(capsys, main, flags) -> str:
    """Runs a job as its __main__ does; asserts exit 2 and one stderr line; returns it."""
    capsys.readouterr()
    assert gin_flags.run_job(main, flags) == 2
    err = helpers.without_log_lines(capsys.readouterr().err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def _infer_flags(tmp_path, *extra: str) -> list[str]:
    inputs = helpers.write_jsonl(tmp_path / "in.jsonl", ["a"])
    where = [f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_DIR='{tmp_path / 'o'}'"]
    return helpers.TINY_INFER + helpers.QUIET_INFER + where + list(extra)


def _benchmark_flags(tmp_path, *extra: str) -> list[str]:
    inputs = helpers.write_jsonl(tmp_path / "in.jsonl", ["a"])
    return [
        "--gin_file=configs/runs/benchmark.gin",
        "--gin_file=configs/demo/tiny_random_models.gin",
        f"--gin.INPUT_FILE='{inputs}'",
        f"--gin.OUTPUT_DIR='{tmp_path / 'o'}'",
        *extra,
    ]


# ------------------------------------------------------------------------------------------------
# Specs bound to slots of another kind.


@pytest.mark.parametrize(
    "binding, expected",
    [
        (
            "speculative.InferConfig.target=@speculative.DraftSpec()",
            f"speculative.InferConfig.target: got {DRAFT}",
        ),
        (
            "speculative.InferConfig.draft=@speculative.VocabSpec()",
            f"speculative.InferConfig.draft: got {VOCAB}; the draft slot takes {MODEL} or {DRAFT}",
        ),
        (
            "VOCABULARY=@target/speculative.ModelSpec()",
            f"speculative.InferConfig.vocabulary: got {MODEL}; the vocabulary slot takes {VOCAB}",
        ),
        (
            "DRAFT_VOCABULARY=@speculative.DraftSpec()",
            f"speculative.InferConfig.draft_vocabulary: got {DRAFT}",
        ),
    ],
)
def test_infer_refuses_a_spec_in_a_slot_of_another_kind_naming_the_slot(
    tmp_path, capsys, binding, expected
):
    err = _one_line_error(capsys, infer.main, _infer_flags(tmp_path, f"--gin.{binding}", *LOOKUP))
    assert err.startswith(f"error: {expected}"), err
    if "InferConfig.target" in expected:  # the case, in full
        assert err.endswith(f"; the target slot takes {MODEL}"), err
    assert not (tmp_path / "o" / "predictions.jsonl").exists()


def test_infer_takes_a_draft_spec_in_the_draft_slot(tmp_path):
    flags = _infer_flags(
        tmp_path, "--gin.speculative.InferConfig.draft=@speculative.DraftSpec()", *LOOKUP
    )
    infer.main(flags)
    (row,) = helpers.read_outputs(tmp_path / "o")[0]
    assert row["exact"] is True


@pytest.mark.parametrize(
    "bindings, expected",
    [
        (
            ["speculative.BenchmarkConfig.target=@speculative.DraftSpec()"],
            f"speculative.BenchmarkConfig.target: got {DRAFT}",
        ),
        (
            ["speculative.BenchmarkConfig.draft=@speculative.VocabSpec()"],
            f"speculative.BenchmarkConfig.draft: got {VOCAB}; the draft slot takes {MODEL} or",
        ),
        (
            ["DRAFT_VOCABULARY=@target/speculative.ModelSpec()"],
            f"speculative.BenchmarkConfig.draft_vocabulary: got {MODEL}; the draft vocabulary "
            f"slot takes {VOCAB}",
        ),
        (
            [
                "VARIANTS=[@fast/speculative.Variant()]",
                "fast/speculative.Variant.name='fast'",
                "fast/speculative.Variant.draft=@speculative.VocabSpec()",
            ],
            f"speculative.Variant.draft (variant 'fast'): got {VOCAB}; the variant 'fast' draft "
            f"slot takes {MODEL} or {DRAFT}",
        ),
    ],
)
def test_benchmark_refuses_a_spec_in_a_slot_of_another_kind_naming_the_slot(
    tmp_path, capsys, bindings, expected
):
    flags = _benchmark_flags(tmp_path, *(f"--gin.{b}" for b in bindings), *LOOKUP)
    err = _one_line_error(capsys, benchmark.main, flags)
    assert err.startswith(f"error: {expected}"), err
    assert not (tmp_path / "o" / "benchmark.json").exists()


def test_loading_a_draft_spec_as_a_model_names_the_slot():
    lookup = ml.DraftSpec("prompt_lookup")
    with pytest.raises(JobError) as e:  # the head trainer's target, say
        ml.load_model(lookup, "target", slot="speculative.HeadTrainConfig.target")
    assert str(e.value).startswith(f"speculative.HeadTrainConfig.target: got {DRAFT}")
    assert str(e.value).endswith(f"the target slot takes {MODEL}")
    with pytest.raises(JobError, match=r"^target: got a DraftSpec .*; the target slot takes"):
        ml.load_model(lookup, "target")  # no slot given: the role names it
    with pytest.raises(JobError, match=r"^vocabulary: got None; the vocabulary slot takes a Vocab"):
        ml.load_vocabulary(None)


def test_the_trainer_refuses_a_spec_where_its_architecture_belongs():
    import dataclasses

    from speculative.jobs.train import run as trainer

    base = trainer.TrainConfig(model=None, vocabulary=None, train_file="x.tsv", output_dir="/o")
    spec = ml.ModelSpec("hf", "/somewhere")
    with pytest.raises(JobError) as e:
        guards.validate(dataclasses.replace(base, model=spec))
    assert str(e.value).startswith(f"speculative.TrainConfig.model: got {MODEL}; the model slot")
    with pytest.raises(JobError, match=r"^speculative.TrainConfig.teacher: got a DraftSpec"):
        guards.validate(dataclasses.replace(base, teacher=ml.DraftSpec("prompt_lookup")))


# ------------------------------------------------------------------------------------------------
# Files inside a model directory, named whole.


def _hf_directory(path: pathlib.Path) -> pathlib.Path:
    """A Llama config.json (a valid one: the loader gets as far as the weights) and nothing else."""
    path.mkdir()
    config = {
        "model_type": "llama", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 32,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    }  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_a_corrupt_model_safetensors_is_named_dir_slash_file(tmp_path):
    model_dir = _hf_directory(tmp_path / "hf")
    (model_dir / "model.safetensors").write_bytes(b"garbage!garbage")
    with pytest.raises(JobError) as e:
        ml.load_model(ml.ModelSpec("hf", str(model_dir)), "target")
    message = str(e.value)
    assert message.startswith(f"target {model_dir}: {model_dir}/model.safetensors: corrupt"), (
        message
    )
    assert ": /model.safetensors" not in message


def test_a_missing_shard_is_named_by_its_index_file(tmp_path):
    model_dir = _hf_directory(tmp_path / "hf")
    index = {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(JobError) as e:
        ml.load_model(ml.ModelSpec("hf", str(model_dir)), "draft")
    message = str(e.value)
    assert message.startswith(f"draft {model_dir}: {model_dir}/model.safetensors.index.json: ")
    assert "model-00001-of-00002.safetensors" in message and ": /model" not in message


def test_strip_path_drops_only_the_path_itself():
    assert strip_path("/d: bad header", "/d") == "bad header"
    assert strip_path("/d bad header", "/d") == "bad header"
    assert strip_path("/d/model.safetensors: bad", "/d") == "/d/model.safetensors: bad"
    assert strip_path("/dx: bad", "/d") == "/dx: bad"  # another file, not /d
    assert strip_path("/d", "/d") == "/d"  # nothing left: the message as it was


def test_an_output_url_naming_local_files_is_its_plain_path(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert errors.output_location("file:///runs/x") == "/runs/x"
    assert errors.output_location("local:///runs/x") == "/runs/x"
    assert errors.output_location("file://~/runs") == str(tmp_path / "runs")
    assert errors.output_location("~/runs") == str(tmp_path / "runs")
    assert errors.output_location("gs://b/runs") == "gs://b/runs"  # a store keeps its URL
    assert errors.output_location(None) is None
