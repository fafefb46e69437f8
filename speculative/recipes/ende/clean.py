"""Cleaning and splitting of aligned English->German pairs (speculative/recipes/ende/sources.py reads
them, speculative/ende_data.py writes the corpus): pure functions over lists of Pairs.

Per pair, in this order: a paragraph longer than SPLIT_ABOVE characters on either side is cut into
sentences, kept as sentence pairs only where both sides cut into the same number (a different
number means the translator merged or split sentences, and pairing them by position would be
wrong); otherwise the whole paragraph stays if it is within the length limit. Then untranslated
pairs (both sides identical), pairs outside MIN_CHARS-MAX_CHARS on either side, and pairs whose
longer side is more than MAX_RATIO times the shorter (a misalignment or a partial translation)
are dropped, and every English sentence is kept once, at its first occurrence: an input never sits
in two splits, nor twice in one.

The split is a function of the pair's document (90% train, 5% validation, 5% test by a hash), so a
document's pairs all land on one side and the split does not depend on order or version.
"""

from __future__ import annotations

import collections
import hashlib
import re
from collections.abc import Iterable, Sequence

from speculative.recipes.ende.sources import Pair

SPLITS = ("train", "validation", "test")
MIN_CHARS, MAX_CHARS, SPLIT_ABOVE, MAX_RATIO, MAX_COPIED = 15, 250, 150, 2.0, 0.6
FILTERS = {
    "min_chars": MIN_CHARS,
    "max_chars": MAX_CHARS,
    "sentence_split_above_chars": SPLIT_ABOVE,
    "max_length_ratio": MAX_RATIO,
    "max_english_words_kept_verbatim": MAX_COPIED,
}
# A sentence ends at . ! ? (a closing quote or bracket may follow) before a space and a capital,
# a digit or an opening quote; unless the word ending there is an abbreviation or a number.
BOUNDARY = re.compile(r"(?<=[.!?])([\"'”“)]?)\s+(?=[A-ZÄÖÜ0-9\"“„(])")
WORD = re.compile(r"[A-Za-z]{4,}")
ABBREVIATIONS = frozenset(
    "e.g i.e etc vs cf approx no nr fig abb ca bzw usw vgl ggf evtl inkl z.b d.h u.a s.o "
    "s.u bsp mr mrs dr st max min".split()
)


def split_of(document: str) -> str:
    """'train' (90%), 'validation' (5%) or 'test' (5%), by a hash of the document id."""
    bucket = int(hashlib.sha256(document.encode("utf-8")).hexdigest(), 16) % 100
    return "train" if bucket < 90 else "validation" if bucket < 95 else "test"


def sentences(text: str) -> list[str]:
    """text cut at its sentence ends; an abbreviation, a single letter or a number before a full
    stop ("z. B.", "e.g.", "1.") does not end one."""
    pieces, start = [], 0
    for match in BOUNDARY.finditer(text):
        end = match.start() + len(match.group(1))
        last_word = text[start:end].rsplit(None, 1)[-1].strip("\"'“”„‚‘’()").rstrip(".").lower()
        words = text[start:end].split()
        abbreviation = last_word in ABBREVIATIONS or (
            len(words) > 1 and f"{words[-2]}{words[-1]}".rstrip(".").lower() in ABBREVIATIONS
        )
        if abbreviation or len(last_word) <= 1 or last_word.isdigit():
            continue
        pieces.append(text[start:end].strip())
        start = match.end()
    pieces.append(text[start:].strip())
    return [p for p in pieces if p]


def segment(pair: Pair) -> tuple[list[Pair], bool]:
    """The pair as sentence pairs when it is long and both sides cut into as many sentences, else
    itself; and whether it was a long paragraph whose sides disagree (kept only within the limit)."""
    if max(len(pair.english), len(pair.german)) <= SPLIT_ABOVE:
        return [pair], False
    english, german = sentences(pair.english), sentences(pair.german)
    if len(english) == len(german):
        return [Pair(en, de, pair.document) for en, de in zip(english, german)], False
    return [pair], True


def copied_share(pair: Pair) -> float:
    """The share of the English side's words of 4+ letters that the German side holds verbatim
    (0 below 4 such words): a half-translated paragraph keeps much of its English."""
    english = set(WORD.findall(pair.english))
    if len(english) < 4:
        return 0.0
    return len(english & set(WORD.findall(pair.german))) / len(english)


def rejection(pair: Pair) -> str | None:
    """Why the pair is dropped ('untranslated', 'length', 'ratio'), or None to keep it."""
    if pair.english == pair.german or copied_share(pair) >= MAX_COPIED:
        return "untranslated"
    lengths = sorted((len(pair.english), len(pair.german)))
    if lengths[0] < MIN_CHARS or lengths[1] > MAX_CHARS:
        return "length"
    if lengths[1] > MAX_RATIO * lengths[0]:
        return "ratio"
    return None


def clean(pairs: Iterable[Pair], seen: set[str]) -> tuple[list[Pair], collections.Counter]:
    """The kept pairs, in order, and the number dropped per reason ('unaligned_long' counts long
    paragraphs whose sides cut into different numbers of sentences and exceed the limit).

    seen: English sentences kept so far (by earlier sources); updated in place."""
    kept, dropped = [], collections.Counter()
    for pair in pairs:
        pieces, unaligned = segment(pair)
        for piece in pieces:
            reason = rejection(piece)
            if unaligned and reason == "length":
                reason = "unaligned_long"
            if reason is None and piece.english in seen:
                reason = "duplicate"
            if reason:
                dropped[reason] += 1
                continue
            seen.add(piece.english)
            kept.append(piece)
    return kept, dropped


def dedup(pairs: Sequence[Pair], seen: set[str]) -> tuple[list[Pair], int]:
    """The pairs whose English side is not in `seen` (updated in place), first occurrence kept;
    and the number dropped. For sources with their own rules (the dictionary)."""
    kept = []
    for pair in pairs:
        if pair.english not in seen:
            seen.add(pair.english)
            kept.append(pair)
    return kept, len(pairs) - len(kept)


def by_split(pairs: Iterable[Pair]) -> dict[str, list[Pair]]:
    """{split: its pairs, in order}, each pair in its document's split."""
    rows: dict[str, list[Pair]] = {split: [] for split in SPLITS}
    for pair in pairs:
        rows[split_of(pair.document)].append(pair)
    return rows


def counts(rows: dict[str, Sequence[Pair]]) -> dict[str, object]:
    """Pairs, documents and words (whitespace tokens) per split of one source's rows."""
    return {
        "pairs": {split: len(rows[split]) for split in SPLITS},
        "documents": {split: len({p.document for p in rows[split]}) for split in SPLITS},
        "english_words": {
            split: sum(len(p.english.split()) for p in rows[split]) for split in SPLITS
        },
        "german_words": {
            split: sum(len(p.german.split()) for p in rows[split]) for split in SPLITS
        },
    }
