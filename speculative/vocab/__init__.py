"""Vocabularies: a common interface, loaders per format, and the draft/target compatibility check."""

from speculative.vocab.base import Vocabulary, check_compatible, stop_ids, used_size

__all__ = ["Vocabulary", "check_compatible", "stop_ids", "used_size"]
from speculative.vocab.gguf_vocab import from_gguf as from_gguf
from speculative.vocab.hf_tokenizer import from_hf as from_hf
from speculative.vocab.sentencepiece_vocab import ByteVocabulary as ByteVocabulary
from speculative.vocab.sentencepiece_vocab import SentencePieceVocabulary as SentencePieceVocabulary
