"""What every vocabulary offers, and the draft/target compatibility check."""

from __future__ import annotations

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


def check_compatible(
    draft: Vocabulary,
    target: Vocabulary,
    *,
    draft_model_vocab_size: int | None = None,
    target_model_vocab_size: int | None = None,
) -> None:
    """Raises ValueError naming the first difference between two vocabularies.

    Speculative decoding compares draft and target probabilities token by token, so the two must
    assign every id the same piece and agree on EOS. Models may pad their embedding beyond the
    vocabulary (T5: 32100 pieces, 32128 rows); when the models' sizes are given they must be equal
    (p and q range over the same ids) and cover every piece.
    """
    for who, size in (("draft", draft_model_vocab_size), ("target", target_model_vocab_size)):
        pieces = len(list((draft if who == "draft" else target).tokens))
        if size is not None and size < pieces:
            raise ValueError(
                f"{who} model has {size} output ids, fewer than its vocabulary's {pieces} tokens"
            )
    if (draft_model_vocab_size is None) != (target_model_vocab_size is None):
        raise ValueError("give both model vocab sizes or neither")
    if draft_model_vocab_size != target_model_vocab_size:
        raise ValueError(
            f"draft and target models differ in (padded) vocab size: draft "
            f"{draft_model_vocab_size}, target {target_model_vocab_size}"
        )
    draft_tokens, target_tokens = list(draft.tokens), list(target.tokens)
    if len(draft_tokens) != len(target_tokens):
        raise ValueError(
            f"draft and target vocabularies differ in size: draft has {len(draft_tokens)} tokens, "
            f"target has {len(target_tokens)}"
        )
    for token_id, (d, t) in enumerate(zip(draft_tokens, target_tokens)):
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
