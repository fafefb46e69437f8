"""The draft interface lives with the loop that calls it (speculative/decoding/drafter.py); these
names stay importable from here for code written against earlier releases."""

from speculative.decoding.drafter import (
    DraftContext,
    Drafter,
    StatelessDrafter,
    draft_confidence,
    one_hot_logits,
)

__all__ = ["DraftContext", "Drafter", "StatelessDrafter", "draft_confidence", "one_hot_logits"]
