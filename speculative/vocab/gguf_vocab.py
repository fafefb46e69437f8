"""The byte-level BPE tokenizer stored in a GGUF file's metadata, rebuilt with `tokenizers`.

A GGUF file of `tokenizer.ggml.model == "gpt2"` carries the token list (already in the GPT-2 byte
alphabet, e.g. "Ġthe"), the merges ("Ġ t"), each token's type (1 normal, 3 control, 4 user-defined,
5 unused), the pre-tokenizer name, the special ids and the chat template. The pre-tokenizer name
selects the split regex the merges were learned with; the regexes are those of the original
Hugging Face tokenizer.json files (llama.cpp uses the same splits).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from speculative.checkpoints.gguf_io import metadata_value, open_gguf
from speculative.vocab import chat

_CONTROL, _USER_DEFINED = 3, 4

# Split regexes of the original tokenizer.json files. GPT-2's own (used by "smollm" after splitting
# off every digit) is built into pre_tokenizers.ByteLevel(use_regex=True).
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level(use_regex: bool) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)


def _pre_tokenizer(pre: str) -> tuple[pre_tokenizers.PreTokenizer, normalizers.Normalizer | None]:
    """(pre-tokenizer, normalizer) for a `tokenizer.ggml.pre` name."""
    if pre == "qwen2":
        split = pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated")
        return pre_tokenizers.Sequence([split, _byte_level(False)]), normalizers.NFC()
    if pre in ("smollm", "starcoder"):
        # every digit on its own, then GPT-2's split
        digits = pre_tokenizers.Digits(individual_digits=True)
        return pre_tokenizers.Sequence([digits, _byte_level(True)]), None
    if pre in ("llama3", "llama-bpe", "llama-v3"):
        split = pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated")
        return pre_tokenizers.Sequence([split, _byte_level(False)]), None
    if pre in ("gpt2", "default"):
        return _byte_level(True), None
    raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r} (tokenizer.ggml.pre)")


def build_tokenizer(
    tokens: Sequence[str], token_types: Sequence[int], merges: Sequence[str], pre: str
) -> Tokenizer:
    """A byte-level BPE `tokenizers.Tokenizer` with control/user-defined tokens matched whole."""
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError("GGUF token list has duplicate tokens; cannot build a BPE vocabulary")
    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise ValueError(f"malformed GGUF merge {merge!r} (expected 'left right')")
        pairs.append((left, right))
    try:
        tok = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
    except Exception as e:  # tokenizers raises a bare Exception for inconsistent merges
        raise ValueError(f"GGUF tokens and merges do not form a BPE vocabulary: {e}") from e
    pre_tok, normalizer = _pre_tokenizer(pre)
    tok.pre_tokenizer = pre_tok
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.decoder = decoders.ByteLevel()
    specials = [t for t, kind in zip(tokens, token_types, strict=True) if kind == _CONTROL]
    user = [t for t, kind in zip(tokens, token_types, strict=True) if kind == _USER_DEFINED]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    return tok


class GGUFVocabulary:
    """`speculative.vocab.Vocabulary` over a GGUF file's BPE tokenizer."""

    chat_template_sought = "tokenizer.chat_template"  # where `vocab.chat` looked, for its error

    def __init__(
        self,
        tokens: Sequence[str],
        token_types: Sequence[int],
        merges: Sequence[str],
        pre: str,
        eos_id: int,
        bos_id: int | None = None,
        add_bos: bool = False,
        chat_template: str | None = None,
        source: str | None = None,
        other_specials: Mapping[str, int | None] | None = None,
    ):
        self.source = source  # the GGUF file, for messages
        self._tokens = tuple(tokens)
        self._special_ids = frozenset(i for i, kind in enumerate(token_types) if kind == _CONTROL)
        self.tokenizer = build_tokenizer(tokens, token_types, merges, pre)
        self.eos_id = int(eos_id)
        self.bos_id = None if bos_id is None else int(bos_id)
        self.add_bos = bool(add_bos)
        self.chat_template = chat_template
        # unk_token / pad_token ids, when the file names them (a template may print them)
        self._other_specials = {
            k: int(v)
            for k, v in (other_specials or {}).items()
            if v is not None and 0 <= v < len(tokens)
        }

    @property
    def tokens(self) -> Sequence[str]:
        return self._tokens

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """EOS plus the end-of-text control tokens a completion may end with.

        Chat-tuned Qwen files name <|im_end|> as EOS, but plain completion ends with
        <|endoftext|>; decoding should stop at either.
        """
        names = ("<|endoftext|>", "<|im_end|>", "<|end_of_text|>", "<|eot_id|>", "</s>")
        extra = [i for i in self._special_ids if self._tokens[i] in names]
        return tuple(sorted({self.eos_id, *extra}))

    def encode(self, text: str) -> list[int]:
        """Token ids of text; control tokens written in the text (e.g. "<|im_end|>") stay whole.

        A BOS id is prepended when the file says so (tokenizer.ggml.add_bos_token).
        """
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    @property
    def special_tokens(self) -> dict[str, str]:
        """The special tokens a chat template may print (transformers' names)."""
        ids = {"bos_token": self.bos_id, "eos_token": self.eos_id, **self._other_specials}
        return {name: self._tokens[i] for name, i in ids.items() if i is not None}

    def encode_rendered(self, text: str) -> list[int]:
        """Token ids of a rendered chat conversation: no BOS added (its template writes one)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """Renders the file's `tokenizer.chat_template` as transformers does (`vocab.chat`)."""
        return chat.find_template(self).render(messages, add_generation_prompt)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """The ids of apply_chat_template(messages) with the assistant turn opened."""
        return self.encode_rendered(self.apply_chat_template(messages, add_generation_prompt=True))


def from_gguf(path: str | os.PathLike) -> GGUFVocabulary:
    """The tokenizer of a GGUF file (byte-level BPE, `tokenizer.ggml.model == "gpt2"`)."""
    reader = open_gguf(path)
    model = metadata_value(reader, "tokenizer.ggml.model", required=True)
    if model != "gpt2":
        raise ValueError(f"{path}: unsupported GGUF tokenizer model {model!r}; only 'gpt2' (BPE)")
    tokens = metadata_value(reader, "tokenizer.ggml.tokens", required=True)
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"{path}: tokenizer.ggml.tokens is not a list of strings")
    types = metadata_value(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    if len(types) != len(tokens):
        raise ValueError(f"{path}: {len(types)} token types for {len(tokens)} tokens")
    eos_id = metadata_value(reader, "tokenizer.ggml.eos_token_id", required=True)
    if isinstance(eos_id, bool) or not isinstance(eos_id, int) or not 0 <= eos_id < len(tokens):
        raise ValueError(f"{path}: EOS id {eos_id!r} is outside the {len(tokens)}-token vocabulary")
    try:
        return GGUFVocabulary(
            tokens=tokens,
            token_types=[int(t) for t in types],
            merges=metadata_value(reader, "tokenizer.ggml.merges", required=True),
            pre=metadata_value(reader, "tokenizer.ggml.pre", "default"),
            eos_id=eos_id,
            bos_id=metadata_value(reader, "tokenizer.ggml.bos_token_id"),
            add_bos=metadata_value(reader, "tokenizer.ggml.add_bos_token", False),
            chat_template=metadata_value(reader, "tokenizer.chat_template"),
            source=str(path),
            other_specials={
                "unk_token": metadata_value(reader, "tokenizer.ggml.unknown_token_id"),
                "pad_token": metadata_value(reader, "tokenizer.ggml.padding_token_id"),
            },
        )
    except (ValueError, TypeError) as e:  # pre-tokenizer, duplicate tokens, malformed merges
        raise ValueError(f"{path}: {e}") from e
