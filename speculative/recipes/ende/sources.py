"""English->German paragraph pairs from Debian's human-translated documentation, aligned by
construction: pure functions over the unpacked packages' files (speculative/ende_data.py fetches
them, cleans the pairs, splits them by document and writes the corpus).

- The dictionary (`trans-de-en`, the Ding project's German-English dictionary, GPL-2+): lines
  `german :: english`, parallel alternatives separated by `|` (and synonyms by `;`). Of every
  alternative we keep the pairs whose two sides are single full sentences: capitalised, ending
  in a full stop, 25-80 characters on the German side, free of the dictionary's markup
  (`/ ( ) { } [ ] ; |`) and abbreviations (`jd. etw. sb. sth.`); trans-de-en 1.9-6 yields 10,658.
  It has no documents: each sentence is its own (the English sentence is the document id, so
  its split is a hash of the English sentence, as before the other sources came).
- LibreOffice help (`libreoffice-help-en-us` + `libreoffice-help-de`, MPL-2.0): one HTML page per
  help topic under `usr/share/libreoffice/help/{en-US,de}/`, the same relative path in both
  languages. Every translatable paragraph and heading carries an `id` (`par_id...`, `hd_id...`)
  that both languages share: a pair is (file path, id).
- GIMP help (`gimp-help-en` + `gimp-help-de`, GFDL-1.2+ without invariant sections): DocBook
  XHTML under `usr/share/gimp/2.0/help/{en,de}/`, the same file names, but generated ids
  (`idm42685`) that differ between the languages. A file pairs up by position: its paragraphs and
  headings in document order, only when both languages have the same number of them.
- LibreOffice UI strings (`libreoffice-l10n-de`, MPL-2.0): gettext catalogues (`*.mo`), msgid ->
  msgstr. Mostly labels: only the entries that read as sentences on both sides are kept.

A pair is (english, german, document); the document (source:path) is what the split keeps whole.
SOURCES names each source's packages, license (from the packages' copyright files) and reader.
"""

from __future__ import annotations

import html.parser
import logging
import pathlib
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import NamedTuple

from speculative.errors import JobError

log = logging.getLogger(__name__)

MARKUP = re.compile(r"[/(){}\[\];|]|\b(jd|etw|sb|sth)\.")
DICTIONARY = "usr/share/trans/de-en"
BLOCKS = frozenset({"p", "h1", "h2", "h3", "h4", "h5", "h6"})
SKIPPED = frozenset({"script", "style"})
VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "wbr"}
)
MNEMONIC = re.compile(r"_(?=\w)")
PLACEHOLDER = re.compile(r"[%$<>{}\\#]")
SECTION_NUMBER = re.compile(r"^\d+(\.\d+)*\.\s+")
LIBREOFFICE_IDS = re.compile(r"(par|hd)_id")
LIBREOFFICE_HELP = "usr/share/libreoffice/help"
GIMP_HELP = "usr/share/gimp/2.0/help"
L10N_CATALOGUES = "usr/lib/libreoffice/program/resource/de/LC_MESSAGES"


class Pair(NamedTuple):
    english: str
    german: str
    document: str  # "source:path"; the split keeps a document's pairs together


def is_sentence(text: str) -> bool:
    return bool(text) and text[0].isupper() and text.endswith(".") and not MARKUP.search(text)


def dictionary_pairs(lines: Iterable[str]) -> list[Pair]:
    """Pairs of every dictionary line whose sides are single full sentences; each its own
    document, named by its English sentence."""
    pairs = []
    for line in lines:
        if line.startswith("#") or " :: " not in line:
            continue
        german, english = line.rstrip("\n").split(" :: ", 1)
        # A line holds parallel alternatives separated by "|" (e.g. singular | plural).
        for de, en in zip(german.split("|"), english.split("|")):
            de, en = de.strip(), en.strip()
            if 25 <= len(de) <= 80 and is_sentence(de) and is_sentence(en):
                pairs.append(Pair(en, de, en))
    return pairs


class _Blocks(html.parser.HTMLParser):
    """Collects (id, text) of every paragraph and heading; markup inside one is dropped, its text
    kept (a <span class="menuitem"> is part of the sentence)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[tuple[str | None, str]] = []
        self.open: list[tuple[str, str | None, list[str]]] = []
        self.skipped: list[str] = []  # the open tags of an element whose text is not read

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag in VOID:
            if tag == "br" and self.open and not self.skipped:
                self.open[-1][2].append(" ")
        elif self.skipped or tag in SKIPPED or _is_variant(attributes):
            self.skipped.append(tag)
        elif tag in BLOCKS:
            self.open.append((tag, attributes.get("id"), []))

    def handle_endtag(self, tag: str) -> None:
        if self.skipped:
            if tag in self.skipped:  # tolerate an unclosed inner tag
                del self.skipped[len(self.skipped) - 1 - self.skipped[::-1].index(tag) :]
        elif tag in BLOCKS and self.open and self.open[-1][0] == tag:
            _, block_id, parts = self.open.pop()
            self.blocks.append((block_id, " ".join("".join(parts).split())))

    def handle_data(self, data: str) -> None:
        if self.open and not self.skipped:
            self.open[-1][2].append(data)


def _is_variant(attributes: dict[str, str | None]) -> bool:
    """LibreOffice's switches: one hidden <span> per system or module (class MAC, CALC, ...) and
    a hidden default without a class, the text a reader sees; the variants are not read."""
    return "hidden" in attributes and bool(attributes.get("class"))


def html_blocks(text: str) -> list[tuple[str | None, str]]:
    """(id or None, plain text) of every <p> and <h1>-<h6> of an HTML page, in document order,
    whitespace collapsed; a block nested in another comes before it (it closes first)."""
    parser = _Blocks()
    parser.feed(text)
    parser.close()
    return parser.blocks


def _read(path: pathlib.Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _twin_files(en_dir: pathlib.Path, de_dir: pathlib.Path) -> Iterator[tuple[str, pathlib.Path]]:
    """(relative path, German file) of every .html file present in both trees, sorted."""
    for en_file in sorted(en_dir.rglob("*.html")):
        relative = en_file.relative_to(en_dir).as_posix()
        if (de_dir / relative).is_file():
            yield relative, de_dir / relative


def libreoffice_help_pairs(en_dir: pathlib.Path, de_dir: pathlib.Path) -> list[Pair]:
    """Pairs of every paragraph or heading whose (file, id) both languages hold exactly once.

    en_dir, de_dir: the help trees (`.../help/en-US`, `.../help/de`)."""
    pairs = []
    for relative, de_file in _twin_files(en_dir, de_dir):
        en_ids = _unique_ids(html_blocks(_read(en_dir / relative)))
        de_ids = _unique_ids(html_blocks(_read(de_file)))
        document = f"libreoffice-help:{relative}"
        for block_id, english in en_ids.items():
            if block_id in de_ids:
                pairs.append(Pair(english, de_ids[block_id], document))
    return pairs


def _unique_ids(blocks: list[tuple[str | None, str]]) -> dict[str, str]:
    """{id: text} of the translatable blocks; an id seen twice in one file is ambiguous: dropped."""
    seen: dict[str, str] = {}
    repeated = set()
    for block_id, text in blocks:
        if block_id is None or not LIBREOFFICE_IDS.match(block_id):
            continue
        if block_id in seen:
            repeated.add(block_id)
        seen[block_id] = text
    return {k: v for k, v in seen.items() if k not in repeated}


def gimp_help_pairs(en_dir: pathlib.Path, de_dir: pathlib.Path) -> tuple[list[Pair], int]:
    """Pairs of the i-th paragraph or heading of each file in both languages, and the number of
    files skipped because their block counts differ (a paragraph added or merged on one side
    would shift every later pair).

    en_dir, de_dir: the help trees (`.../help/en`, `.../help/de`)."""
    pairs, skipped = [], 0
    for relative, de_file in _twin_files(en_dir, de_dir):
        # Headings are numbered ("11.6.1. Overview") alike in both languages: the number goes.
        english = [SECTION_NUMBER.sub("", t) for _, t in html_blocks(_read(en_dir / relative))]
        german = [SECTION_NUMBER.sub("", t) for _, t in html_blocks(_read(de_file))]
        if len(english) != len(german):
            skipped += 1
            continue
        document = f"gimp-help:{relative}"
        pairs += [Pair(en, de, document) for en, de in zip(english, german)]
    return pairs, skipped


def mo_catalogue(data: bytes) -> list[tuple[str, str, str]]:
    """(context, msgid, msgstr) of every translated entry of a GNU gettext .mo file; plural forms
    keep their first form. Raises ValueError for bytes that are not a .mo file."""
    if len(data) < 20:
        raise ValueError("too short for a .mo file")
    order = {b"\xde\x12\x04\x95": "<", b"\x95\x04\x12\xde": ">"}.get(data[:4])
    if order is None:
        raise ValueError("not a .mo file (bad magic number)")
    count, originals, translations = struct.unpack(order + "III", data[8:20])
    entries = []
    for i in range(count):
        length, offset = struct.unpack(
            order + "II", data[originals + 8 * i : originals + 8 * i + 8]
        )
        key = data[offset : offset + length].decode("utf-8")
        length, offset = struct.unpack(
            order + "II", data[translations + 8 * i : translations + 8 * i + 8]
        )
        value = data[offset : offset + length].decode("utf-8")
        if not key:  # the header entry
            continue
        context, _, msgid = key.rpartition("\x04")
        entries.append((context, msgid.split("\x00")[0], value.split("\x00")[0]))
    return entries


def gettext_pairs(catalogue_dir: pathlib.Path) -> list[Pair]:
    """Pairs of every entry of every .mo file, the document being the catalogue plus the UI file
    its context names (`cui.mo:optpathspage`), so one dialog's strings stay in one split."""
    pairs = []
    for mo in sorted(catalogue_dir.glob("*.mo")):
        try:
            entries = mo_catalogue(mo.read_bytes())
        except (ValueError, struct.error) as e:  # UnicodeDecodeError is a ValueError
            raise JobError(f"not a gettext catalogue: {e}", role="catalogue", path=mo) from None
        for context, msgid, msgstr in entries:
            english, german = _ui_text(msgid), _ui_text(msgstr)
            if is_ui_sentence(english) and is_ui_sentence(german):
                dialog = context.split("|")[0]
                pairs.append(Pair(english, german, f"libreoffice-l10n:{mo.name}:{dialog}"))
    return pairs


def _ui_text(text: str) -> str:
    """A UI string without its mnemonic markers (~Open, _Open) and with its whitespace collapsed."""
    return " ".join(MNEMONIC.sub("", text.replace("~", "")).split())


def is_ui_sentence(text: str) -> bool:
    """Whether a UI string reads as a sentence: capitalised, three words or more, ending in . ! or
    ?, and free of placeholders (%1, $(ARG1), {0}, <b>); most UI strings are labels, not that."""
    return (
        len(text.split()) >= 3
        and text[0].isupper()
        and text[-1] in ".!?"
        and not PLACEHOLDER.search(text)
    )


class Source(NamedTuple):
    packages: tuple[str, ...]  # Debian packages, fetched and unpacked by ende_data
    license: str  # of the text, from the packages' usr/share/doc/*/copyright
    aligned_by: str
    read: Callable[[Mapping[str, pathlib.Path]], list[Pair]]  # {package: unpacked root} -> pairs
    own_rules: bool = False  # filtered by its reader alone (not ende_clean's paragraph filters)


def tree(root: pathlib.Path, relative: str, package: str) -> pathlib.Path:
    """root/relative, or a JobError naming the package when it is missing (a changed layout)."""
    path = root / relative
    if not path.exists():
        raise JobError(f"no {relative} in the unpacked package", role="package", path=package)
    return path


def _read_dictionary(roots: Mapping[str, pathlib.Path]) -> list[Pair]:
    path = tree(roots["trans-de-en"], DICTIONARY, "trans-de-en")
    try:
        with open(path, encoding="utf-8") as f:
            return dictionary_pairs(f)
    except (OSError, UnicodeDecodeError) as e:
        raise JobError(f"cannot read it: {e}", role="dictionary", path=path) from None


def _read_libreoffice_help(roots: Mapping[str, pathlib.Path]) -> list[Pair]:
    return libreoffice_help_pairs(
        tree(
            roots["libreoffice-help-en-us"], f"{LIBREOFFICE_HELP}/en-US", "libreoffice-help-en-us"
        ),
        tree(roots["libreoffice-help-de"], f"{LIBREOFFICE_HELP}/de", "libreoffice-help-de"),
    )


def _read_gimp_help(roots: Mapping[str, pathlib.Path]) -> list[Pair]:
    pairs, skipped = gimp_help_pairs(
        tree(roots["gimp-help-en"], f"{GIMP_HELP}/en", "gimp-help-en"),
        tree(roots["gimp-help-de"], f"{GIMP_HELP}/de", "gimp-help-de"),
    )
    log.info(f"gimp-help: {skipped} pages skipped (their paragraph counts differ)")
    return pairs


def _read_l10n(roots: Mapping[str, pathlib.Path]) -> list[Pair]:
    return gettext_pairs(tree(roots["libreoffice-l10n-de"], L10N_CATALOGUES, "libreoffice-l10n-de"))


# In this order: an English sentence two sources share is kept from the first.
SOURCES: dict[str, Source] = {
    "trans-de-en": Source(
        ("trans-de-en",), "GPL-2+", "one dictionary line, full-sentence alternatives",
        _read_dictionary, own_rules=True,
    ),
    "libreoffice-help": Source(
        ("libreoffice-help-en-us", "libreoffice-help-de"), "MPL-2.0",
        "help page path + paragraph id", _read_libreoffice_help,
    ),
    "gimp-help": Source(
        ("gimp-help-en", "gimp-help-de"), "GFDL-1.2+ (no invariant sections)",
        "help page file name + paragraph position (pages whose paragraph counts agree)",
        _read_gimp_help,
    ),
    "libreoffice-l10n": Source(
        ("libreoffice-l10n-de",), "MPL-2.0",
        "gettext msgid -> msgstr, entries that read as sentences", _read_l10n,
    ),
}  # fmt: skip
