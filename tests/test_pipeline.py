"""The notebook API (`speculative.load_pair`, `Pair.generate`): names and paths resolved to a
format, the jobs' loading and checks, and exact output from strings."""

from __future__ import annotations

import json

import pytest

import speculative
from speculative import pipeline
from speculative.errors import JobError
from tests.helpers import tiny_decoder_model

BYTES = speculative.VocabSpec("byte", extra_ids=0)


def random_spec(layers: int, seed: int) -> speculative.ModelSpec:
    return speculative.ModelSpec(
        "random", None, tiny_decoder_model(264, 32, layers, 4, 2), seed=seed
    )


def test_generate_from_strings_is_exact_and_reports_stats():
    pair = speculative.load_pair(random_spec(2, 0), random_spec(1, 0), vocabulary=BYTES)
    prompts = ["def add(a, b):", "x", "The quick brown fox jumps over the lazy dog. " * 3]
    spec = pair.generate(prompts, max_new_tokens=24, gamma=3)
    plain = pair.generate(prompts, max_new_tokens=24, speculative=False)
    assert spec.tokens == plain.tokens and spec.texts == plain.texts  # greedy: the target's own
    assert len(spec.texts) == 3 and all(0 < len(t) <= 24 for t in spec.tokens)
    assert spec.texts[1] == pair.vocabulary.decode(spec.tokens[1])
    assert 0.0 <= spec.stats["alpha"] <= 1.0 and spec.stats["tau"] > 1.0  # shared layer: agrees
    assert spec.stats["tokens"] == sum(map(len, spec.tokens)) and "alpha" not in plain.stats
    tree = pair.generate("x", max_new_tokens=24, gamma=None, tree=(2, 1, 1))
    assert tree.tokens[0] == plain.tokens[1]


def test_sampled_generation_follows_the_seed():
    pair = speculative.load_pair(random_spec(2, 0), random_spec(1, 0), vocabulary=BYTES)
    a, b, c = (pair.generate("abc", max_new_tokens=16, temperature=1.0, seed=s) for s in (5, 5, 6))
    assert a.tokens == b.tokens and a.tokens != c.tokens


def test_formats_are_inferred_from_names_and_paths(tmp_path):
    assert pipeline.infer_format("qwen2.5-coder-0.5b") == "gguf"
    assert pipeline.infer_format(str(tmp_path / "m.gguf")) == "gguf"
    for model_type, fmt in (("llama", "hf"), ("qwen2", "hf"), ("t5", "hf_t5")):
        d = tmp_path / model_type
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": model_type}))
        assert pipeline.infer_format(str(d)) == fmt
    t5x = tmp_path / "checkpoint_100"
    t5x.mkdir()
    (t5x / "checkpoint").write_bytes(b"")
    assert pipeline.infer_format(str(t5x)) == "t5x"
    with pytest.raises(JobError, match="needs its architecture"):
        pipeline.model_spec(str(t5x))
    with pytest.raises(JobError, match="not a registry name"):
        pipeline.infer_format(str(tmp_path / "missing"))
    with pytest.raises(JobError, match="cannot tell the format"):
        pipeline.infer_format(str(tmp_path))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad/config.json").write_text("{")
    with pytest.raises(JobError, match="config.json is not readable JSON"):
        pipeline.infer_format(str(tmp_path / "bad"))
    (tmp_path / "bad/config.json").write_text("[1]")
    with pytest.raises(JobError, match="config.json is not a JSON object"):
        pipeline.infer_format(str(tmp_path / "bad"))


def test_load_errors_are_the_jobs_one_line_errors():
    with pytest.raises(JobError, match="carries no vocabulary: pass vocabulary="):
        speculative.load_pair(random_spec(1, 0))
    wide = speculative.ModelSpec("random", None, tiny_decoder_model(200, 32, 1, 4, 2))
    with pytest.raises(JobError, match="output ids but the vocabulary"):
        speculative.load_pair(wide, vocabulary=BYTES)
