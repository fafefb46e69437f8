"""T5's vocabularies: SentencePiece with extra ids (T5, mT5) and bytes (ByT5), as seqio defines them.

Ids (both): pad 0, eos 1, unk 2. SentencePiece: the model's pieces, then `extra_ids` sentinels with
`<extra_id_0>` the LAST id (T5: 32000 pieces + 100 sentinels = 32100 ids, <extra_id_0> = 32099).
The T5 model's embedding has 32128 rows (rounded to a multiple of 128); ids 32100..32127 have no piece.
ByT5: byte b is id b + 3, then the sentinels, again counted down from the end.

`decode` stops at the first EOS (seqio does the same) and skips pad; ids without a piece (the model's
padding rows) decode as the unknown piece.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import sentencepiece as spm

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
_SENTINEL = re.compile(r"<extra_id_(\d+)>")


def _sentinels(extra_ids: int) -> list[str]:
    """Pieces of the extra ids in id order: <extra_id_{n-1}>, ..., <extra_id_0>."""
    return [f"<extra_id_{extra_ids - 1 - i}>" for i in range(extra_ids)]


def _split_sentinels(text: str, extra_ids: int, first_extra: int):
    """Yields ("text", str) and ("id", int) parts of text, recognising <extra_id_k> (k < extra_ids)."""
    pos = 0
    for match in _SENTINEL.finditer(text):
        k = int(match.group(1))
        if k >= extra_ids:
            continue
        if match.start() > pos:
            yield "text", text[pos : match.start()]
        yield "id", first_extra + extra_ids - 1 - k
        pos = match.end()
    if pos < len(text):
        yield "text", text[pos:]


class _T5Vocabulary:
    """What both vocabularies share: the special ids, `extra_ids` and the id -> piece table."""

    def __init__(self, base_tokens: list[str], extra_ids: int):
        """base_tokens: the pieces before the sentinels, which follow them (`_sentinels`)."""
        self.extra_ids = extra_ids
        self.eos_id = EOS_ID
        self.pad_id = PAD_ID
        self.unk_id = UNK_ID
        self._tokens = base_tokens + _sentinels(extra_ids)

    @property
    def tokens(self) -> Sequence[str]:
        return self._tokens

    def __len__(self) -> int:
        return len(self._tokens)


class SentencePieceVocabulary(_T5Vocabulary):
    """seqio.SentencePieceVocabulary equivalent implementing `vocab.Vocabulary`."""

    def __init__(self, model_file: str, extra_ids: int = 100):
        self._sp = spm.SentencePieceProcessor(model_file=model_file)
        specials = {
            "pad": (self._sp.pad_id(), PAD_ID),
            "eos": (self._sp.eos_id(), EOS_ID),
            "unk": (self._sp.unk_id(), UNK_ID),
        }
        for name, (got, want) in specials.items():
            if got != want:
                raise ValueError(
                    f"{model_file}: T5 vocabularies need {name} id {want}, the SentencePiece model "
                    f"has {got}"
                )
        self.model_file = model_file
        self._base_size = self._sp.get_piece_size()
        super().__init__([self._sp.id_to_piece(i) for i in range(self._base_size)], extra_ids)

    def encode(self, text: str) -> list[int]:
        """Text -> ids (no EOS appended), with <extra_id_k> sentinels mapped to their ids."""
        ids: list[int] = []
        for kind, part in _split_sentinels(text, self.extra_ids, self._base_size):
            ids.extend([part] if kind == "id" else self._sp.encode(part))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text, stopping at the first EOS; sentinels decode as <extra_id_k>."""
        pieces: list[str] = []
        run: list[int] = []

        def flush():
            text = self._sp.decode(run)
            # SentencePiece drops the word-boundary space at the start of its output; after a
            # sentinel that space belongs to the text (as when seqio decodes both in one call).
            if pieces and run and self._tokens[run[0]].startswith("\u2581"):
                text = " " + text
            pieces.append(text)

        for i in (int(x) for x in ids):
            if i == self.eos_id:
                break
            if i == self.pad_id:
                continue
            if self._base_size <= i < len(self._tokens):
                flush()
                pieces.append(self._tokens[i])
                run = []
            else:
                run.append(i if 0 <= i < self._base_size else self.unk_id)
        flush()
        return "".join(pieces)


class ByteVocabulary(_T5Vocabulary):
    """seqio.ByteVocabulary (ByT5) equivalent: UTF-8 bytes offset by 3 special ids."""

    OFFSET = 3

    def __init__(self, extra_ids: int = 0):
        super().__init__(
            ["<pad>", "</s>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)], extra_ids
        )

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        first_extra = self.OFFSET + 256
        for kind, part in _split_sentinels(text, self.extra_ids, first_extra):
            ids.extend([part] if kind == "id" else [b + self.OFFSET for b in part.encode("utf-8")])
        return ids

    def encode_rendered(self, text: str) -> list[int]:
        """A rendered chat conversation's ids: its bytes (byte ids add no special tokens)."""
        return self.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text, stopping at EOS; invalid UTF-8 is dropped (seqio uses errors='ignore')."""
        out: list[str] = []
        run = bytearray()
        for i in (int(x) for x in ids):
            if i == self.eos_id:
                break
            if self.OFFSET <= i < self.OFFSET + 256:
                run.append(i - self.OFFSET)
            elif self.OFFSET + 256 <= i < len(self._tokens):
                out.append(run.decode("utf-8", errors="ignore"))
                out.append(self._tokens[i])
                run = bytearray()
        out.append(run.decode("utf-8", errors="ignore"))
        return "".join(out)
