"""The model-family registry (speculative/checkpoints/families.py): which family reads which
config.json, what each supports, and a family registered from outside the package loading a
transformers-saved directory through format 'hf' with no other change."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np
import pytest

from speculative.checkpoints import families, hf_config, hf_decoder
from speculative.drafts import registry
from speculative.errors import JobError
from speculative.loading import specs as ml
from speculative.models import decoder, t5
from speculative.models.gemma import GemmaConfig, GemmaLM
from tests import helpers


def test_built_in_families_and_what_they_read():
    assert {"decoder", "gemma", "t5"} <= set(families.names())
    assert families.of_hf_model_type("qwen2").name == "decoder"
    assert families.of_hf_model_type("gemma3_text").name == "gemma"
    assert families.of_hf_model_type("t5") is None  # T5 has its own format, 'hf_t5'
    assert families.get("t5").model is t5.T5
    assert families.hf_model_types()[:5] == ("llama", "qwen2", "mistral", "gemma2", "gemma3_text")
    target = helpers.tiny_decoder_model(64, 16, 2, 2, 1)
    assert families.of_model(target).name == "decoder"
    assert all(families.supports(target, f) for f in families.FEATURES)
    gemma = GemmaLM(GemmaConfig(64, 16, 2, 2, 1, 8, 32))
    assert not any(families.supports(gemma, f) for f in families.FEATURES)
    with pytest.raises(ValueError, match="unknown family feature 'trees'"):
        families.supports(target, "trees")


def test_register_refuses_clashes():
    decoder_family = families.get("decoder")
    assert families.register(decoder_family) is decoder_family  # the same family: no-op
    clash = dataclasses.replace(decoder_family, name="other")
    with pytest.raises(ValueError, match="belongs to 'decoder'"):
        families.register(clash)
    with pytest.raises(ValueError, match="registered already"):
        families.register(dataclasses.replace(decoder_family, features=frozenset()))
    other_hf = families.Family("other", int, float, readers=(("hf", lambda *args: args),))
    with pytest.raises(ValueError, match="'hf'.*belongs to 'decoder'"):  # one reader a format
        families.register(other_hf)
    assert "other" not in families.names()
    with pytest.raises(ValueError, match="unknown feature 'speed'"):
        families.Family("x", int, float, features=frozenset({"speed"}))


def test_layer_skip_asks_the_registry():
    """A family without layer_skip is refused in one line naming its class."""
    gemma = GemmaLM(GemmaConfig(64, 16, 2, 2, 1, 8, 32))
    spec = registry.DraftSpec(kind="layer_skip", num_layers=1)
    with pytest.raises(JobError, match="layer_skip needs a DecoderLM target, got GemmaLM"):
        registry.build(spec, gemma, None, "draft")


# A family from outside the package: a model_type 'tinyclone' read as the Llama layout by its own
# model and config classes. Its file would be these lines and one `families.register` call.


@dataclasses.dataclass(frozen=True)
class CloneConfig(decoder.DecoderConfig):
    pass


class CloneLM(decoder.DecoderOnly):
    def make_module(self, config: CloneConfig) -> decoder.DecoderStack:
        return decoder.DecoderStack(config)


def _clone_config(hf, lm_head, dtype):
    config, note = hf_config.translate({**hf, "model_type": "llama"}, lm_head, dtype)
    return CloneConfig(**dataclasses.asdict(config)), note


@pytest.fixture
def clone_family():
    family = families.register(
        families.Family(
            name="tinyclone",
            model=CloneLM,
            config=CloneConfig,
            hf_model_types=("tinyclone",),
            hf_config=_clone_config,
            hf_tensor_map=hf_decoder.tensor_map,
        )
    )
    yield family
    families.unregister(family.name)


def test_a_family_registered_outside_the_package_loads_through_format_hf(tmp_path, clone_family):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_attention_heads=2,
        num_key_value_heads=1, num_hidden_layers=1, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    directory = pathlib.Path(tmp_path / "clone")
    transformers.LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    original = ml.load_model(ml.ModelSpec(format="hf", path=str(directory)), "target")
    edited = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**edited, "model_type": "tinyclone"}))
    loaded = ml.load_model(ml.ModelSpec(format="hf", path=str(directory)), "target")
    assert type(loaded.model) is CloneLM and type(original.model) is decoder.DecoderLM
    assert dataclasses.asdict(loaded.model.config) == dataclasses.asdict(original.model.config)
    assert not families.supports(loaded.model, "layer_skip")  # it declared no features
    families.unregister(clone_family.name)
    with pytest.raises(JobError, match="model_type 'tinyclone' is not a supported"):
        ml.load_model(ml.ModelSpec(format="hf", path=str(directory)), "target")


def test_formats_are_read_through_the_registry(tmp_path):
    """model_loading asks `families.reader(format)`: every format but 'random' is some family's,
    't5x' leaves the architecture to ModelSpec.model and takes only a model of a family reading it."""
    assert families.formats() == ("gguf", "hf", "hf_t5", "t5x") and ml.FORMATS[-1] == "random"
    assert [f.name for f in families.reading("hf")] == ["decoder", "gemma"]
    assert families.reader("hf") is hf_decoder.read_hf and families.needs_model("t5x")
    assert (
        not families.needs_model("gguf")
        and families.of_gguf_architecture("qwen2").name == "decoder"
    )
    assert ml.is_encoder_decoder(ml.ModelSpec(format="hf_t5", path="x"))
    assert not ml.is_encoder_decoder(ml.ModelSpec(format="gguf", path="x"))
    with pytest.raises(ValueError, match="no model family reads format 'onnx'"):
        families.reader("onnx")
    spec = ml.ModelSpec(
        format="t5x", path=str(tmp_path), model=helpers.tiny_decoder_model(8, 8, 1, 1, 1)
    )
    with pytest.raises(
        JobError, match="format 't5x' needs a T5 \\(family 't5'\\) model, got DecoderLM"
    ):
        ml.validate_model_spec(spec, "target")


def test_gguf_architecture_of_no_family_is_one_line(tmp_path):
    """A Gemma GGUF file (no family translates its metadata yet) is refused naming its
    architecture and the ones the families read."""
    gguf_testutil = pytest.importorskip("tests.gguf_testutil")
    hp = dict(emb=8, layers=1, heads=2, kv_heads=1, mlp=16, context=32, rope_theta=1e4, eps=1e-6)
    tensors = {"token_embd.weight": np.ones((16, 8), np.float32)}
    path = gguf_testutil.write_model(tmp_path / "g.gguf", "gemma2", hp, tensors)
    with pytest.raises(JobError) as raised:
        ml.load_model(ml.ModelSpec(format="gguf", path=str(path)), "target")
    message = str(raised.value)
    assert "unsupported GGUF architecture 'gemma2'; supported: llama, qwen2" in message
    assert "\n" not in message


def _random_gemma_infer(tmp_path: pathlib.Path, name: str, *flags: str) -> list[dict]:
    from speculative import infer

    inputs = helpers.write_jsonl(tmp_path / "in.jsonl", helpers.DRAFT_PROMPTS)
    out = tmp_path / name
    models = ["--gin_file=configs/runs/infer.gin", "--gin_file=configs/demo/tiny_random_gemma.gin"]
    io = [f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_DIR='{out}'"]
    infer.main([*models, *helpers.SMALL_INFER, *io, *flags])
    rows, summary = helpers.read_outputs(out)
    assert "RANDOM WEIGHTS" in json.dumps(summary) and "GemmaLM" in json.dumps(summary)
    return rows


@pytest.mark.parametrize(
    "speculative_flags",
    [["--gin.GAMMA=3"], pytest.param(["--gin.TREE=(2, 2, 1)"], marks=pytest.mark.slow)],
    ids=["chain", "tree"],
)
def test_random_gemma_gin_config_speculative_equals_plain(tmp_path, speculative_flags):
    """configs/demo/tiny_random_gemma.gin (format 'random', a Gemma 3 config with sliding-window
    layers shorter than the prompts) runs in the infer job; speculative greedy output = plain."""
    plain = _random_gemma_infer(tmp_path, "plain", "--gin.SPECULATIVE=False")
    spec = _random_gemma_infer(tmp_path, "spec", *speculative_flags)
    assert [r["output_ids"] for r in spec] == [r["output_ids"] for r in plain]
    assert sum(len(r["output_ids"]) for r in plain) > len(plain)  # more than one token a row
