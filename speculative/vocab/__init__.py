"""Vocabularies: a common interface, loaders per format, and the draft/target compatibility check."""

from speculative.vocab.base import Vocabulary, check_compatible

__all__ = ["Vocabulary", "check_compatible"]
