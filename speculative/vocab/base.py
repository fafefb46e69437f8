"""What every vocabulary offers, and the draft/target compatibility check."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class Vocabulary(Protocol):
    """A tokenizer usable by decoding jobs.

    tokens: the piece of every id, index = id (len(tokens) may be < the model's padded vocab size).
    """

    eos_id: int

    @property
    def tokens(self) -> Sequence[str]: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def stop_ids(vocabulary: Vocabulary) -> tuple[int, ...]:
    """Ids that end a completion: the vocabulary's own `stop_ids` (EOS plus end-of-text control
    tokens, e.g. Qwen's <|endoftext|> beside its chat EOS <|im_end|>) where it has them, else EOS."""
    return tuple(getattr(vocabulary, "stop_ids", (vocabulary.eos_id,)))


# Pieces that only pad a vocabulary to a round size (llama.cpp writes "[PAD151643]", ...).
_PADDING_PIECE = re.compile(r"\[PAD\d*\]|<pad_\d+>")


def used_size(vocabulary: Vocabulary) -> int:
    """Ids the tokenizer can produce: its pieces less any trailing padding pieces ("[PAD7]").

    Ids from here to the model's output size are padding: never encoded, so never a valid output
    either (the jobs mask them out of every distribution).
    """
    tokens = list(vocabulary.tokens)
    size = len(tokens)
    while size > 0 and _PADDING_PIECE.fullmatch(tokens[size - 1]):
        size -= 1
    return size


def check_compatible(
    draft: Vocabulary,
    target: Vocabulary,
    *,
    draft_model_vocab_size: int | None = None,
    target_model_vocab_size: int | None = None,
) -> None:
    """Raises ValueError naming the first difference between two vocabularies.

    Speculative decoding compares draft and target probabilities token by token, so the two must
    assign every id the same piece and agree on EOS. They may differ in trailing padding: padding
    pieces ("[PAD7]") are ignored, and each model may pad its output beyond the vocabulary (T5:
    32100 pieces, 32128 rows), by a different amount even, as long as it covers every piece the
    tokenizer can produce (`used_size`); the padding ids are then masked out of both distributions.
    """
    draft_size, target_size = used_size(draft), used_size(target)
    for who, size, used in (
        ("draft", draft_model_vocab_size, draft_size),
        ("target", target_model_vocab_size, target_size),
    ):
        if size is not None and size < used:
            raise ValueError(
                f"{who} model has {size} output ids, fewer than its vocabulary's {used} tokens"
            )
    if draft_size != target_size:
        raise ValueError(
            f"draft and target vocabularies differ in size: draft has {draft_size} tokens, "
            f"target has {target_size} (trailing padding pieces not counted)"
        )
    draft_tokens, target_tokens = list(draft.tokens), list(target.tokens)
    for token_id, (d, t) in enumerate(zip(draft_tokens[:draft_size], target_tokens)):
        if d != t:
            raise ValueError(
                f"draft and target vocabularies differ at token id {token_id}: "
                f"draft has {d!r}, target has {t!r}"
            )
    if draft.eos_id != target.eos_id:
        raise ValueError(
            f"draft and target vocabularies disagree on EOS: draft {draft.eos_id}, "
            f"target {target.eos_id}"
        )
