"""A Hugging Face `tokenizer.json` (read with the `tokenizers` library) as a Vocabulary.

EOS comes from the files transformers writes beside it, first found wins: tokenizer_config.json's
`eos_token` (the tokenizer's own), generation_config.json's `eos_token_id` (its first, when a list),
config.json's `eos_token_id`. Decoding stops at EOS, at every id generation_config.json and
config.json name as EOS, and at the end-of-text control tokens a completion may end with (as
vocab.gguf_vocab does). Text is encoded as transformers' tokenizer(text) does: with the special
tokens the tokenizer's post-processor adds (e.g. Llama 3's BOS; none for Qwen2).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer

from speculative.vocab import chat

_END_OF_TEXT = ("<|endoftext|>", "<|im_end|>", "<|end_of_text|>", "<|eot_id|>", "</s>")


class HFTokenizerVocabulary:
    """`speculative.vocab.Vocabulary` over a `tokenizers.Tokenizer`.

    chat_template / chat_template_source / special_tokens: what the directory's chat_template.jinja
    or tokenizer_config.json hold (`vocab.chat.from_hf_directory`; None / {} without them).
    """

    chat_template_sought = "chat_template.jinja or tokenizer_config.json's chat_template"
    chat_template: str | None = None
    chat_template_source: str | None = None
    special_tokens: dict[str, str] = {}  # noqa: RUF012 - replaced per instance, never mutated

    def __init__(
        self,
        tokenizer: Tokenizer,
        eos_id: int,
        extra_stop_ids: Sequence[int] = (),
        source: str | None = None,
    ):
        self.source = source  # the tokenizer.json, for messages
        self.tokenizer = tokenizer
        by_id = {i: piece for piece, i in tokenizer.get_vocab(with_added_tokens=True).items()}
        size = max(by_id, default=-1) + 1
        holes = sorted(set(range(size)) - set(by_id))
        if holes:
            raise ValueError(f"{source}: no token has id {holes[0]} (ids 0..{size - 1} expected)")
        self._tokens = tuple(by_id[i] for i in range(size))
        self._special_ids = frozenset(
            i for i, added in tokenizer.get_added_tokens_decoder().items() if added.special
        )
        for i in (eos_id, *extra_stop_ids):
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < size:
                raise ValueError(f"{source}: EOS id {i!r} is outside the {size}-token vocabulary")
        self.eos_id = int(eos_id)
        self._extra_stops = tuple(int(i) for i in extra_stop_ids)

    @property
    def tokens(self) -> Sequence[str]:
        return self._tokens

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """EOS, the configs' other EOS ids and the end-of-text control tokens."""
        named = [i for i in self._special_ids if self._tokens[i] in _END_OF_TEXT]
        return tuple(sorted({self.eos_id, *self._extra_stops, *named}))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=True).ids)

    def encode_rendered(self, text: str) -> list[int]:
        """Token ids of a rendered chat conversation: no special tokens added (as transformers'
        apply_chat_template tokenizes; the template writes BOS itself)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def _json_object(path: str) -> dict[str, Any]:
    """A JSON object file, or {} when it does not exist."""
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, "rb") as f:
            value = json.loads(f.read())
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise ValueError(f"{path}: a JSON {type(value).__name__}, not an object")
    return value


def _ids(value: Any) -> list[Any]:
    return [] if value is None else list(value) if isinstance(value, list) else [value]


def _eos(tokenizer: Tokenizer, directory: str) -> tuple[int, list[int]]:
    """(EOS id, other stop ids) from the configs beside tokenizer.json."""
    tok_config = _json_object(os.path.join(directory, "tokenizer_config.json"))
    generation = _json_object(os.path.join(directory, "generation_config.json"))
    model = _json_object(os.path.join(directory, "config.json"))
    others = _ids(generation.get("eos_token_id")) + _ids(model.get("eos_token_id"))
    token = tok_config.get("eos_token")
    if isinstance(token, dict):
        token = token.get("content")
    if token is not None:
        eos = tokenizer.token_to_id(token) if isinstance(token, str) else None
        if eos is None:
            raise ValueError(
                f"{os.path.join(directory, 'tokenizer_config.json')}: eos_token {token!r} is not "
                "a token of tokenizer.json"
            )
        return eos, others
    if not others:
        raise ValueError(
            f"{directory}: no EOS: none of tokenizer_config.json (eos_token), "
            "generation_config.json or config.json (eos_token_id) names one"
        )
    return others[0], others[1:]


def from_hf(path: str | os.PathLike) -> HFTokenizerVocabulary:
    """The vocabulary of a Hugging Face model directory or its tokenizer.json file."""
    path = os.fspath(path)
    file = path if os.path.isfile(path) else os.path.join(path, "tokenizer.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{path}: no tokenizer.json")
    try:
        tokenizer = Tokenizer.from_file(file)
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        raise ValueError(f"{file}: not a tokenizers tokenizer.json: {e}") from e
    directory = os.path.dirname(file) or "."
    eos, others = _eos(tokenizer, directory)
    vocabulary = HFTokenizerVocabulary(tokenizer, eos, others, source=file)
    template, where, specials = chat.from_hf_directory(directory)
    vocabulary.chat_template, vocabulary.chat_template_source = template, where
    vocabulary.special_tokens = specials
    return vocabulary
