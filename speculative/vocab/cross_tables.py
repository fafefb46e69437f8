"""Static tables between two vocabularies, built at the byte level, for a draft whose tokenizer
differs from the target's (drafts/cross_vocab.py; docs/design.md §6, "Drafts with another
tokenizer").

Every token is read as the bytes it decodes to (`token_bytes`): byte-level BPE pieces through the
GPT-2 byte alphabet ("Ġthe" -> b" the"), SentencePiece pieces with "▁" as a space and `<0xNN>`
byte-fallback pieces as that byte, a byte vocabulary's ids as their byte. Special tokens (EOS,
BOS, pad, sentinels, chat markers) have no bytes: they are matched by role, never by string.
Tokens whose bytes are partial UTF-8 (one byte of a multi-byte character) need nothing special.

`build_tables` then gives, for the draft's and the target's model output ids:
  to_target [Vd]: draft id -> the target id with exactly its bytes, else -1 (the token-level
    intersection of Timor et al., ICML 2025); the draft's EOS -> the target's EOS.
  to_draft [Vt]: its inverse (-1 outside the intersection's image).
  spelling [Vt, K], spelling_lengths [Vt]: each target token as the fewest draft tokens whose
    bytes concatenate to its bytes (0..K of them), so the draft can catch up on what the target
    emitted. K, the catch-up width (`choose_width`), is the smallest that spells WIDTH_COVERAGE
    (99%) of the target's spelled tokens, at most MAX_WIDTH (8), not the longest spelling: every
    round feeds the draft K + 1 tokens per row and its cache is sized K slots per target token, so
    a handful of rare long tokens (27 SmolLM2 tokens for one Qwen2.5 token) would set the cost of
    every round. A target token whose spelling is longer than K is spelled as nothing and listed
    in `too_long`. A stop token is spelled as the draft's EOS, BOS and pad as the draft's own (when it
    has one); any other special token is spelled as nothing and listed in `unspelled` (the
    documented fallback: the draft does not see it). So is a target token with bytes that no draft
    tokens spell (a single byte that is never valid UTF-8, say), up to MAX_UNSPELLABLE of the
    target's ids; past that, a ValueError names the first. Either way (and for `too_long`) only
    the draft's view of the text loses those tokens: q, never the target's rule, so the output
    stays exact.
Where several ids of one vocabulary decode to the same bytes (SentencePiece's "▁" and "<0x20>"),
one stands for them: the first that is not a byte-fallback piece.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from speculative.vocab.base import Vocabulary, stop_ids, used_size
from speculative.vocab.sentencepiece_vocab import ByteVocabulary, SentencePieceVocabulary

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# The share of a target's ids that may have bytes no draft tokens spell (spelled as nothing): a
# byte-level BPE draft without some single bytes (SmolLM2 has no 0xC0, 0xF5..0xFF or a few control
# bytes) still drafts for Qwen2.5; a pair that barely shares its bytes is refused.
MAX_UNSPELLABLE = 0.01
# The catch-up width K (`choose_width`): the smallest width that spells this share of the target's
# spelled tokens, counted over the vocabulary (text weighs toward short tokens, so the share of
# emitted tokens it spells is higher), and never more than MAX_WIDTH draft tokens.
WIDTH_COVERAGE = 0.99
MAX_WIDTH = 8


def gpt2_byte_alphabet() -> dict[str, int]:
    """The GPT-2 byte-level alphabet, inverted: character -> the byte it stands for. Printable
    bytes stand for themselves; the other 68 are shifted to code points 256 and up, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in printable]
    alphabet = {chr(b): b for b in printable}
    alphabet.update({chr(256 + i): b for i, b in enumerate(shifted)})
    return alphabet


@dataclasses.dataclass(frozen=True)
class TokenBytes:
    """Per id of a vocabulary: its bytes (None for a special token), which ids are special, and
    which are byte-fallback pieces (`<0xNN>`)."""

    bytes: tuple[bytes | None, ...]
    special: frozenset[int]
    fallback: frozenset[int]


def _decoder_types(node: Any) -> set[str]:
    """Every decoder type named in a tokenizer.json's "decoder" (nested Sequences included)."""
    if not isinstance(node, dict):
        return set()
    found = {node.get("type")}
    for child in node.get("decoders") or ():
        found |= _decoder_types(child)
    return {t for t in found if isinstance(t, str)}


def _piece_bytes(piece: str, byte_fallback: bool) -> tuple[bytes, bool]:
    """A SentencePiece-style piece's bytes, and whether it is a byte-fallback piece."""
    match = _BYTE_PIECE.fullmatch(piece) if byte_fallback else None
    if match:
        return bytes([int(match.group(1), 16)]), True
    return piece.replace("\u2581", " ").encode("utf-8"), False


def _tokenizers_bytes(vocabulary: Any) -> TokenBytes:
    """A `tokenizers`-backed vocabulary (Hugging Face tokenizer.json, GGUF): its decoder says how
    pieces become bytes; added tokens are special (no bytes) or literal text."""
    tokenizer = vocabulary.tokenizer
    types = _decoder_types(json.loads(tokenizer.to_str()).get("decoder"))
    added = tokenizer.get_added_tokens_decoder()
    alphabet = gpt2_byte_alphabet()
    out: list[bytes | None] = []
    fallback: set[int] = set()
    for i, piece in enumerate(vocabulary.tokens):
        if i in added:
            out.append(None if added[i].special else added[i].content.encode("utf-8"))
        elif "ByteLevel" in types:
            if any(c not in alphabet for c in piece):
                raise ValueError(f"token {i} {piece!r} is not in the GPT-2 byte alphabet")
            out.append(bytes(alphabet[c] for c in piece))
        elif types & {"Metaspace", "Replace", "ByteFallback"}:
            data, is_byte = _piece_bytes(piece, "ByteFallback" in types)
            out.append(data)
            if is_byte:
                fallback.add(i)
        else:
            raise ValueError(
                f"cannot tell how this tokenizer's pieces decode to bytes (decoder types "
                f"{sorted(types)}; byte-level BPE, SentencePiece-style and byte vocabularies are)"
            )
    special = frozenset(i for i, token in added.items() if token.special)
    return TokenBytes(tuple(out), special, frozenset(fallback))


def _t5_bytes(vocabulary: ByteVocabulary | SentencePieceVocabulary) -> TokenBytes:
    """T5's vocabularies: pad, EOS, unk and the sentinels are special; ByT5's ids are bytes."""
    tokens = list(vocabulary.tokens)
    first_sentinel = len(tokens) - vocabulary.extra_ids
    special = {vocabulary.pad_id, vocabulary.eos_id, vocabulary.unk_id}
    special |= set(range(first_sentinel, len(tokens)))
    out: list[bytes | None] = []
    fallback: set[int] = set()
    for i, piece in enumerate(tokens):
        if i in special:
            out.append(None)
        elif isinstance(vocabulary, ByteVocabulary):
            out.append(bytes([i - ByteVocabulary.OFFSET]))
        else:
            data, is_byte = _piece_bytes(piece, byte_fallback=True)
            out.append(data)
            if is_byte:
                fallback.add(i)
    return TokenBytes(tuple(out), frozenset(special), frozenset(fallback))


def token_bytes(vocabulary: Vocabulary) -> TokenBytes:
    """Each id's bytes (module doc); a vocabulary of another kind is a ValueError."""
    if isinstance(vocabulary, (ByteVocabulary, SentencePieceVocabulary)):
        return _t5_bytes(vocabulary)
    if hasattr(vocabulary, "tokenizer") and hasattr(vocabulary.tokenizer, "to_str"):
        return _tokenizers_bytes(vocabulary)
    raise ValueError(f"cannot read the bytes of a {type(vocabulary).__name__} vocabulary's tokens")


def _by_bytes(table: TokenBytes, size: int) -> dict[bytes, int]:
    """bytes -> the id standing for them (non-special, non-empty ids below `size`; the first id
    that is not a byte-fallback piece wins, else the first)."""
    found: dict[bytes, int] = {}
    ids = range(min(size, len(table.bytes)))
    for i in sorted(ids, key=lambda i: (i in table.fallback, i)):
        data = table.bytes[i]
        if data and i not in table.special:
            found.setdefault(data, i)
    return found


def spell(data: bytes, pieces: dict[bytes, int], longest: int) -> list[int] | None:
    """The fewest ids of `pieces` (bytes -> id) whose bytes concatenate to `data`, ties to the
    longer first piece; None when there is no such spelling. longest: the longest piece's length."""
    size = len(data)
    best: list[tuple[int, list[int]] | None] = [None] * size + [(0, [])]
    for start in range(size - 1, -1, -1):
        for end in range(min(size, start + longest), start, -1):
            piece, rest = pieces.get(data[start:end]), best[end]
            if piece is None or rest is None:
                continue
            if best[start] is None or rest[0] + 1 < best[start][0]:
                best[start] = (rest[0] + 1, [piece, *rest[1]])
    return None if best[0] is None else best[0][1]


def choose_width(
    lengths: Sequence[int] | np.ndarray,
    coverage: float = WIDTH_COVERAGE,
    max_width: int | None = MAX_WIDTH,
) -> int:
    """K: the smallest width >= 1 whose spellings cover `coverage` of the spelled tokens (lengths
    > 0; each target token's spelling length in draft tokens), capped at max_width (None: no cap;
    coverage 1 and no cap: the longest spelling)."""
    if not 0 < coverage <= 1:
        raise ValueError(f"the catch-up width's coverage must be in (0, 1], got {coverage}")
    if max_width is not None and max_width < 1:
        raise ValueError(f"the catch-up width's cap must be >= 1, got {max_width}")
    spelled = np.sort(np.asarray(lengths)[np.asarray(lengths) > 0])
    if spelled.size == 0:
        return 1
    # the ceil(coverage * n)-th shortest spelling (a tolerance so that 0.99 * 100 is 99)
    index = max(int(np.ceil(coverage * spelled.size - 1e-9)), 1) - 1
    width = max(1, int(spelled[index]))
    return width if max_width is None else min(width, max_width)


@dataclasses.dataclass(frozen=True)
class CrossTables:
    """The tables of the module doc, as numpy arrays sized to the two models' output ids."""

    to_target: np.ndarray
    to_draft: np.ndarray
    spelling: np.ndarray
    spelling_lengths: np.ndarray
    draft_eos: int
    unspelled: tuple[int, ...]  # target ids spelled as nothing: specials without a role, and
    # plain tokens no draft tokens spell
    too_long: tuple[int, ...] = ()  # target ids whose spelling is longer than K: spelled as nothing
    longest: int = 0  # the longest spelling in draft tokens (K when nothing is too long)
    width_coverage: float = 1.0  # the share of the spelled target tokens whose spelling fits K

    @property
    def width(self) -> int:
        """K: the most draft tokens a target token is spelled with (`choose_width`)."""
        return int(self.spelling.shape[1])

    @property
    def slots_per_token(self) -> float:
        """The mean spelling length of the spelled target tokens (at most K), rounded up to
        hundredths: what a target token costs the draft on average (`describe`). The draft's
        cache is not sized by it (`CrossVocabDrafter.cache_length`: K per generated token, so
        that no row stalls)."""
        spelled = self.spelling_lengths[self.spelling_lengths > 0]
        return float(np.ceil(100 * np.mean(spelled)) / 100) if spelled.size else 1.0

    def coverage(self, target_used: int) -> float:
        """The share of the target's used ids that are in the intersection."""
        return float(np.mean(self.to_draft[:target_used] >= 0))

    def arrays(self) -> dict[str, np.ndarray]:
        """The tables the compiled round gathers from (the draft's params["tables"])."""
        return {
            "to_target": self.to_target,
            "to_draft": self.to_draft,
            "spelling": self.spelling,
            "spelling_lengths": self.spelling_lengths,
        }


def _role_spellings(draft: Vocabulary, target: Vocabulary) -> dict[int, int]:
    """Target special id -> the draft id with its role: stop tokens -> the draft's EOS; BOS and
    pad -> the draft's own, where both vocabularies name one."""
    roles = {i: draft.eos_id for i in stop_ids(target)}
    for name in ("bos_id", "pad_id"):
        mine, theirs = getattr(target, name, None), getattr(draft, name, None)
        if mine is not None and theirs is not None:
            roles.setdefault(int(mine), int(theirs))
    return roles


def _spellings(
    target_bytes: TokenBytes, pieces: dict[bytes, int], roles: dict[int, int], size: int
) -> tuple[list[list[int]], list[int]]:
    """(each target id's draft spelling, the ids spelled as nothing: special ones, and plain ones
    no draft tokens spell, a ValueError past MAX_UNSPELLABLE of them)."""
    longest = max((len(p) for p in pieces), default=1)
    spelled: list[list[int]] = []
    unspelled: list[int] = []
    missing: list[int] = []  # plain tokens no draft tokens spell
    for i in range(size):
        data = target_bytes.bytes[i] if i < len(target_bytes.bytes) else None
        if i in roles:
            spelled.append([roles[i]])
        elif i >= len(target_bytes.bytes):
            spelled.append([])  # the model's padding ids: never emitted
        elif i in target_bytes.special or not data:
            spelled.append([])
            unspelled.append(i)
        else:
            ids = spell(data, pieces, longest)
            spelled.append([] if ids is None else ids)
            if ids is None:
                missing.append(i)
    if len(missing) > size * MAX_UNSPELLABLE:
        first = missing[0]
        raise ValueError(
            f"target token {first} (bytes {target_bytes.bytes[first]!r}) has no spelling in the "
            f"draft's vocabulary: no draft tokens concatenate to its bytes ({len(missing)} such "
            f"target tokens, more than {MAX_UNSPELLABLE:.0%} of {size})"
        )
    return spelled, sorted(unspelled + missing)


def build_tables(
    draft: Vocabulary,
    target: Vocabulary,
    draft_size: int | None = None,
    target_size: int | None = None,
    coverage: float = WIDTH_COVERAGE,
    max_width: int | None = MAX_WIDTH,
) -> CrossTables:
    """The tables for a draft over `draft` proposing for a target over `target` (module doc).

    draft_size / target_size: the models' output ids (default: each vocabulary's used size); ids
    past a vocabulary's used size are padding (-1, spelled as nothing).
    coverage / max_width: how K is chosen (`choose_width`; 1.0 and None: the longest spelling).
    """
    draft_size = used_size(draft) if draft_size is None else draft_size
    target_size = used_size(target) if target_size is None else target_size
    draft_bytes, target_bytes = token_bytes(draft), token_bytes(target)
    pieces = _by_bytes(draft_bytes, used_size(draft))
    canonical = _by_bytes(target_bytes, used_size(target))
    to_target = np.full(draft_size, -1, np.int32)
    to_draft = np.full(target_size, -1, np.int32)
    for data, d in pieces.items():
        if data in canonical:
            to_target[d], to_draft[canonical[data]] = canonical[data], d
    # EOS by role: no other draft id may stand for the target's EOS (the maps stay one-to-one).
    to_target[to_target == target.eos_id] = -1
    to_draft[to_draft == draft.eos_id] = -1
    to_target[draft.eos_id], to_draft[target.eos_id] = target.eos_id, draft.eos_id
    roles = _role_spellings(draft, target)
    spelled, unspelled = _spellings(target_bytes, pieces, roles, used_size(target))
    spelled += [[]] * (target_size - len(spelled))
    full = np.asarray([len(s) for s in spelled], np.int32)
    width = choose_width(full, coverage, max_width)
    too_long = np.flatnonzero(full > width)
    spelling = np.full((target_size, width), draft.eos_id, np.int32)
    for i, ids in enumerate(spelled):
        if len(ids) <= width:
            spelling[i, : len(ids)] = ids
    lengths = np.where(full > width, 0, full).astype(np.int32)
    return CrossTables(
        to_target,
        to_draft,
        spelling,
        lengths,
        draft.eos_id,
        tuple(unspelled),
        too_long=tuple(int(i) for i in too_long),
        longest=int(full.max(initial=0)),
        width_coverage=float(np.mean(full[full > 0] <= width)) if np.any(full > 0) else 1.0,
    )


def describe(tables: CrossTables, target_used: int) -> str:
    """One line for logs: the intersection's coverage, K (and the share of the target's spelled
    tokens it covers, the longest spelling) and the ids spelled as nothing."""
    shown = list(tables.unspelled[:10]) + (["..."] if len(tables.unspelled) > 10 else [])
    extra = f"; {len(tables.unspelled)} target ids spelled as nothing: {shown}"
    long = (
        f" (K covers {100 * tables.width_coverage:.2f}% of the spelled target tokens; "
        f"{len(tables.too_long)} spelled in more, up to {tables.longest}, are spelled as nothing)"
    )
    return (
        f"cross-vocabulary draft: {int(np.sum(tables.to_target >= 0))} draft tokens map to one "
        f"target token each ({100 * tables.coverage(target_used):.1f}% of the target's "
        f"{target_used}); target tokens spelled in up to K = {tables.width} draft tokens, "
        f"{tables.slots_per_token:.2f} on average"
        + (long if tables.too_long else "")
        + (extra if tables.unspelled else "")
    )


def check_sizes(tables: CrossTables, sizes: Sequence[int]) -> None:
    """Raises ValueError unless the tables fit (draft, target) models of these output sizes."""
    draft_size, target_size = sizes
    if tables.to_target.shape[0] != draft_size or tables.to_draft.shape[0] != target_size:
        raise ValueError(
            f"cross-vocabulary tables are for {tables.to_target.shape[0]} draft and "
            f"{tables.to_draft.shape[0]} target ids, the models have {draft_size} and {target_size}"
        )
