"""The real chat templates of the shipped GGUF files (Qwen2.5-Coder's and SmolLM2's) rendered by
`vocab.chat` exactly as transformers renders them from the same files (transformers the oracle:
AutoTokenizer with gguf_file), for conversations of one and several turns, with and without a
system turn, with the assistant's turn opened or not, and Spec-Bench's own first questions; and
the ids tokenized from them equal transformers' `apply_chat_template(tokenize=True)`. Slow: the
GGUF files are downloaded (scripts/test.sh --slow); only the tokenizers are read."""

from __future__ import annotations

import pytest

from speculative import vocab
from speculative.loading import fetch
from speculative.vocab import chat

pytestmark = pytest.mark.slow

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You answer in one sentence."},
        {"role": "user", "content": "Übersetze: Guten Morgen, wie geht's?"},
    ],
    [
        {"role": "user", "content": "Write add(a, b) in Python."},
        {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
        {"role": "user", "content": "Now add type hints. 日本語 comments too."},
    ],
]


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b", "smollm2-135m"])
def test_real_templates_render_and_tokenize_as_transformers(name):
    transformers = pytest.importorskip("transformers")
    path = fetch.ensure_model(name)
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ours = vocab.from_gguf(path)
    template = chat.find_template(ours)
    assert template.source == str(path)
    for messages in CONVERSATIONS:
        for opened in (True, False):
            text = template.render(messages, add_generation_prompt=opened)
            assert text == tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=opened
            ), (name, messages, opened)
        ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert chat.encode_rendered(ours, template.render(messages)) == list(ids)
