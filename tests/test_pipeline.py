"""The notebook API (`speculative.load_pair`, `Pair.generate`): names and paths resolved to a
format, the jobs' loading and checks, and exact output from strings."""

from __future__ import annotations

import doctest
import json

import pytest

import speculative
from speculative.errors import JobError
from speculative.jobs import pairs
from speculative.notebook import pipeline
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
    tree = pair.generate("x", max_new_tokens=24, tree=(2, 1, 1))  # gamma unset: the depth
    assert tree.tokens[0] == plain.tokens[1]
    assert pair.generate("x", max_new_tokens=24, gamma=3, tree=(2, 1, 1)).tokens == tree.tokens


TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_chat_messages_in_text_out_through_the_template():
    pair = speculative.load_pair(random_spec(2, 0), random_spec(1, 0), vocabulary=BYTES)
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a prime."},
    ]
    answer = pair.chat(conversation, chat_template=TEMPLATE, max_new_tokens=16, gamma=3)
    rendered = "<system>Be brief.\n<user>Name a prime.\n<assistant>"
    same = pair.generate(rendered, max_new_tokens=16, speculative=False)
    assert answer.tokens == same.tokens and answer.texts == same.texts  # the rendered prompt
    assert answer.stats["drafted"] > 0
    batch = pair.chat([conversation, conversation[1:]], chat_template=TEMPLATE, max_new_tokens=16)
    assert batch.tokens[0] == answer.tokens[0] and len(batch.texts) == 2
    with pytest.raises(JobError, match="chat template: .*no chat template .this kind"):
        pair.chat(conversation)  # a byte vocabulary carries none
    with pytest.raises(JobError, match="refused the messages: .*'persona'"):
        pair.chat(conversation, chat_template="{{ persona }}")
    with pytest.raises(JobError, match="message 0 has no role"):
        pair.chat([{"content": "x"}], chat_template=TEMPLATE)


def test_sampled_generation_follows_the_seed():
    pair = speculative.load_pair(random_spec(2, 0), random_spec(1, 0), vocabulary=BYTES)
    a, b, c = (pair.generate("abc", max_new_tokens=16, temperature=1.0, seed=s) for s in (5, 5, 6))
    assert a.tokens == b.tokens and a.tokens != c.tokens


def test_formats_are_inferred_from_names_and_paths(tmp_path):
    assert pairs.infer_format("qwen2.5-coder-0.5b") == "gguf"
    assert pairs.infer_format(str(tmp_path / "m.gguf")) == "gguf"
    for model_type, fmt in (("llama", "hf"), ("qwen2", "hf"), ("t5", "hf_t5")):
        d = tmp_path / model_type
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": model_type}))
        assert pairs.infer_format(str(d)) == fmt
    t5x = tmp_path / "checkpoint_100"
    t5x.mkdir()
    (t5x / "checkpoint").write_bytes(b"")
    assert pairs.infer_format(str(t5x)) == "t5x"
    with pytest.raises(JobError, match="needs its architecture"):
        pairs.model_spec(str(t5x))
    with pytest.raises(JobError, match="not a registry name"):
        pairs.infer_format(str(tmp_path / "missing"))
    with pytest.raises(JobError, match="cannot tell the format"):
        pairs.infer_format(str(tmp_path))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad/config.json").write_text("{")
    with pytest.raises(JobError, match="config.json is not readable JSON"):
        pairs.infer_format(str(tmp_path / "bad"))
    (tmp_path / "bad/config.json").write_text("[1]")
    with pytest.raises(JobError, match="config.json is not a JSON object"):
        pairs.infer_format(str(tmp_path / "bad"))


def test_load_errors_are_the_jobs_one_line_errors():
    with pytest.raises(JobError, match="carries no vocabulary: pass vocabulary="):
        speculative.load_pair(random_spec(1, 0))
    wide = speculative.ModelSpec("random", None, tiny_decoder_model(200, 32, 1, 4, 2))
    with pytest.raises(JobError, match="output ids but the vocabulary"):
        speculative.load_pair(wide, vocabulary=BYTES)


def test_the_docstring_examples_run():
    """`Pair.generate`'s examples, one per mode (plain, chain, tree, block, prompt lookup), on tiny
    random-weight models: what the documentation shows is what the code does."""
    failed, attempted = doctest.testmod(
        pipeline, extraglobs={"speculative": speculative}, optionflags=doctest.ELLIPSIS
    )
    assert attempted >= 15 and failed == 0


LOOKUP = speculative.DraftSpec("prompt_lookup")


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"gamma": 0}, "GAMMA must be an integer >= 1, got 0"),
        ({"gamma": "auto"}, "GAMMA must be an integer >= 1, got 'auto'"),
        ({"gamma": True}, "GAMMA must be an integer >= 1, got True"),
        (
            {"gamma": 4, "tree": (2, 1, 1)},
            "gamma 4 differs from the depth of .* \\(3\\); leave gamma unset with a tree",
        ),
        ({"tree": "wide"}, "TREE: a tree is a tuple of widths per depth"),
        ({"tree": (2, 1), "acceptance": "block"}, "TREE is verified by the exact tree rule"),
        ({"acceptance": "blocks"}, "ACCEPTANCE must be one of"),
        ({"temperature": -1.0}, "sampling: SamplingConfig.temperature must be >= 0"),
        ({"top_k": 1.5}, "sampling: SamplingConfig.top_k must be an integer >= 0"),
        ({"top_p": 0.0}, "sampling: SamplingConfig.top_p must be in \\(0, 1\\]"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1, got 0"),
        ({"seed": 1.5}, "seed must be an integer, got 1.5"),
        ({"speculative": "no"}, "speculative must be True or False, got 'no'"),
    ],
)
def test_generate_refuses_bad_arguments_with_the_jobs_messages(arguments, message):
    pair = speculative.load_pair(random_spec(1, 0), LOOKUP, vocabulary=BYTES)
    with pytest.raises(JobError, match=f"^{message}"):
        pair.generate("x", **arguments)


@pytest.mark.parametrize("prompts", [[], "", [1, 2], None, [["x"]]])
def test_generate_refuses_prompts_that_are_not_texts(prompts):
    pair = speculative.load_pair(random_spec(1, 0), LOOKUP, vocabulary=BYTES)
    match = "prompts must be|input 0 is empty after tokenization"
    with pytest.raises(JobError, match=match):
        pair.generate(prompts)


def test_load_pair_refuses_a_spec_given_for_another_argument():
    with pytest.raises(JobError) as e:
        speculative.load_pair(LOOKUP, vocabulary=BYTES)
    assert str(e.value) == (
        "load_pair target: got a DraftSpec (a draft that is not a model: prompt lookup, n-grams, "
        "layer skip, a feature head); the target slot takes a str (a registry name or a path) or "
        "a ModelSpec (a model's weights: format and path)"
    )
    with pytest.raises(JobError, match="^load_pair draft: got a VocabSpec .*; the draft slot"):
        speculative.load_pair(random_spec(1, 0), BYTES, vocabulary=BYTES)
    with pytest.raises(JobError, match="^load_pair vocabulary: got a ModelSpec .*; the vocab"):
        speculative.load_pair(random_spec(1, 0), vocabulary=random_spec(1, 0))
