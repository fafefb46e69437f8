"""Inputs asked through a chat template: each example's text as one user turn, or a JSONL row's
conversation (its input field a list of messages) as it stands, rendered by the model's template
with the assistant's turn opened (`vocab.chat`), and tokenized as transformers tokenizes
`apply_chat_template`'s text. The infer and benchmark jobs' `CHAT = True`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from speculative.data.inputs import Example
from speculative.errors import JobError
from speculative.vocab import chat


def template_for(vocabulary: Any, given: str | None) -> chat.ChatTemplate:
    """The template given (text or a path), else the vocabulary's own; a JobError naming where
    it looked when there is none, or when it cannot render a one-turn conversation."""
    try:
        template = chat.find_template(vocabulary, given)
        template.render([{"role": "user", "content": "?"}])  # a broken template fails here
    except ValueError as e:
        raise JobError(str(e), role="chat template") from None
    return template


def render(
    examples: Sequence[Example], vocabulary: Any, template: chat.ChatTemplate
) -> list[Example]:
    """Each example with `inputs` the rendered conversation (what the model reads) and `ids` its
    tokens; JobError naming the example's file and line for messages the template refuses."""
    out = []
    for ex in examples:
        messages = ex.messages or [{"role": "user", "content": ex.inputs}]
        try:
            text = template.render(messages)
            ids = chat.encode_rendered(vocabulary, text)
        except ValueError as e:
            where = ex.source or f"input {ex.index}"
            raise JobError(f"input {ex.index}: {e}", role="chat template", path=where) from None
        out.append(dataclasses.replace(ex, inputs=text, ids=tuple(ids)))
    return out


def prepare(
    examples: Sequence[Example],
    vocabulary: Any,
    *,
    chat: bool,
    template: str | None,
    encoder_decoder: bool,
) -> list[Example]:
    """A job's examples as asked: rendered through the chat template with `chat` (JobError for an
    encoder-decoder target, which reads no chat template), as they are otherwise (JobError for a
    template given without `chat`, which would be ignored)."""
    if not chat:
        if template is not None:
            raise JobError(
                "CHAT_TEMPLATE is set but CHAT is False: it would be ignored; set CHAT = True to "
                "ask the inputs through it"
            )
        return list(examples)
    if encoder_decoder:
        raise JobError(
            "CHAT needs a decoder-only target: an encoder-decoder reads no chat template"
        )
    return render(examples, vocabulary, template_for(vocabulary, template))
