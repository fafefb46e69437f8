"""The larger EnDe corpus: help pages and catalogues in the packages' real layout (written here, a
few paragraphs each) -> aligned pairs -> cleaning -> a split by document -> corpus.json."""

import json
import os
import pathlib
import stat
import struct

import pytest

from speculative import ende_data
from speculative.errors import JobError
from speculative.recipes.ende import clean as ende_clean
from speculative.recipes.ende import data as ende
from speculative.recipes.ende import sources as ende_sources
from speculative.recipes.ende.sources import Pair

LO_PAGE = """<!DOCTYPE html>
<html lang="{lang}" dir="ltr"><head><meta charset="utf-8"><title>{title}</title>
<script type="text/javascript">var p = "<p id='par_id0'>not text</p>";</script></head>
<body><header id="TopLeftHeader"><p dir="auto">LibreOffice 7.4 Help</p></header>
<div id="DisplayArea">
<h1 id="hd_id3147407" dir="auto"><a name="x"></a>{title}</h1>
{body}
</div></body></html>
"""
LO_EN = {
    "par_id1": 'Choose <span id="s1" class="switchinline"><span hidden="true" class="MAC">'
    '<span class="emph">LibreOffice - Preferences</span></span><span hidden="true">'
    '<span class="emph">Tools - Options</span></span></span><span class="emph"> - Print</span>.',
    "par_id2": "This paragraph exists in English only.",
    "par_id3": "Some text that the translators left untouched.",
    "par_id4": "Lists the fields by which the report will be grouped. To remove one level of "
    "grouping, select the field name and click the button, e.g. the arrow. You may select up to "
    "four levels of grouping.",
    "par_id5": "The next document is created in a top-level window of the hierarchy; if the "
    "current frame is already a top window, the document is created in the current frame.",
    "par_id6": "An identifier used twice in one page is ambiguous.",
}
LO_DE = {
    "par_id1": 'Wählen Sie <span id="s1" class="switchinline"><span hidden="true" class="MAC">'
    '<span class="emph">LibreOffice - Einstellungen</span></span><span hidden="true">'
    '<span class="emph">Extras - Optionen</span></span></span><span class="emph"> - Drucken'
    "</span>.",
    "par_id3": "Some text that the translators left untouched.",
    "par_id4": "Zeigt die Felder an, nach welchen der Bericht gruppiert wird. Um eine Ebene zu "
    "entfernen, wählen Sie den Feldnamen aus und klicken z. B. auf die Schaltfläche. Es können "
    "bis zu vier Ebenen ausgewählt werden.",
    "par_id5": "Das Folgedokument wird im obersten Rahmen der Hierarchie aufgebaut. Ist der "
    "Ausgangsrahmen bereits der oberste Rahmen, wird das Dokument im selben Rahmen aufgebaut.",
    "par_id6": "Eine zweimal verwendete Kennung ist mehrdeutig.",
}
GIMP_PAGE = """<?xml version="1.0" encoding="UTF-8" standalone="no"?>
<html xmlns="http://www.w3.org/1999/xhtml"><head><title>{title}</title></head><body>
<div class="navheader"><table><tr><th>{title}</th></tr></table></div>
<div class="sect2"><h3 class="title"><a id="{anchor}"></a>11.6. {title}</h3>
<a id="idm{n}" class="indexterm"></a>
{body}
</div></body></html>
"""
GIMP_EN = [
    "This filter makes the image look like an oil painting.<br />The <span "
    'class="guilabel">Mask size</span> controls the outcome.',
    "The GIMPressionist filter can produce similar effects.",
]
GIMP_DE = [
    "Dieses Filter lässt Ihr Bild wie ein Ölgemälde erscheinen.<br />Die <span "
    'class="guilabel">Maskengröße</span> bestimmt das Ergebnis.',
    "Das Filter GIMPressionist erzeugt ähnliche Effekte.",
]
DICTIONARY = [
    "# Version :: devel",
    "Das ist ein ganz normaler Satz hier. :: This is a perfectly normal sentence.",
    "Haus {n} | Wir haben das Haus gestern gekauft. :: house | We bought the house yesterday.",
]


def _write(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _lo_page(lang: str, title: str, paragraphs: dict[str, str]) -> str:
    body = "\n".join(
        f'<p id="{k}" class="paragraph" dir="auto">{v}</p>' for k, v in paragraphs.items()
    )
    if "par_id6" in paragraphs:  # the same id again in the page
        body += '\n<p id="par_id6" class="paragraph">Another paragraph.</p>'
    return LO_PAGE.format(lang=lang, title=title, body=body)


def _gimp_page(title: str, paragraphs: list[str], n: int) -> str:
    body = "\n".join(f"<p>\n      {p}\n    </p>" for p in paragraphs)
    return GIMP_PAGE.format(title=title, anchor="gimp-filter-oilify", n=n, body=body)


def _mo(entries: list[tuple[str, str]]) -> bytes:
    """A GNU .mo file (little-endian) of (key, translation), sorted as msgfmt writes them."""
    entries = sorted([("", "Content-Type: text/plain; charset=UTF-8\n"), *entries])
    keys = [k.encode() for k, _ in entries]
    values = [v.encode() for _, v in entries]
    start = 28 + 16 * len(entries)
    data, table = b"", []
    for text in keys + values:
        table.append((len(text), start + len(data)))
        data += text + b"\0"
    header = struct.pack("<7I", 0x950412DE, 0, len(entries), 28, 28 + 8 * len(entries), 0, 0)
    return header + b"".join(struct.pack("<II", *t) for t in table) + data


def packages(tmp_path: pathlib.Path) -> dict[str, pathlib.Path]:
    """Unpacked packages, in their real layout: {package: root}."""
    roots = {
        name: tmp_path / name for pkg in ende_sources.SOURCES.values() for name in pkg.packages
    }
    en = roots["libreoffice-help-en-us"] / ende_sources.LIBREOFFICE_HELP / "en-US/text/swriter"
    de = roots["libreoffice-help-de"] / ende_sources.LIBREOFFICE_HELP / "de/text/swriter"
    _write(en / "guide/print.html", _lo_page("en-US", "Printing Documents Quickly", LO_EN))
    _write(de / "guide/print.html", _lo_page("de", "Dokumente schnell drucken", LO_DE))
    _write(en / "01/only_english.html", _lo_page("en-US", "An English page only", {}))
    en = roots["gimp-help-en"] / ende_sources.GIMP_HELP / "en"
    de = roots["gimp-help-de"] / ende_sources.GIMP_HELP / "de"
    _write(en / "gimp-filter-oilify.html", _gimp_page("Oilify", GIMP_EN, 42685))
    _write(de / "gimp-filter-oilify.html", _gimp_page("Ölgemälde", GIMP_DE, 42232))
    # A paragraph merged on one side: positions no longer pair up, the page is skipped.
    _write(en / "gimp-filter-cubism.html", _gimp_page("Cubism filter", GIMP_EN, 1))
    _write(de / "gimp-filter-cubism.html", _gimp_page("Kubismus", GIMP_DE[:1], 2))
    catalogue = roots["libreoffice-l10n-de"] / ende_sources.L10N_CATALOGUES / "cui.mo"
    catalogue.parent.mkdir(parents=True)
    catalogue.write_bytes(_mo([
        ("printdialog|label", "~Print"),  # a label: not a sentence
        ("textflowpage|tip\x04Keeps the _paragraphs together when a break is inserted.",
         "Hält die _Absätze zusammen, wenn ein Umbruch eingefügt wird."),
        ("STR_REPLACE\x04Replace %1 with %2 in all documents.", "Ersetzt %1 durch %2 überall."),
    ]))  # fmt: skip
    _write(roots["trans-de-en"] / ende_sources.DICTIONARY, "\n".join(DICTIONARY) + "\n")
    return roots


def test_libreoffice_help_pairs_align_by_page_and_id(tmp_path):
    roots = packages(tmp_path)
    pairs = ende_sources.SOURCES["libreoffice-help"].read(roots)
    by_english = {p.english: p for p in pairs}
    # The heading and the paragraphs both pages hold once, by id; the reader sees the default
    # variant of a switch (not the macOS one), never the script, the header or a repeated id.
    assert [p.german for p in pairs] == [
        "Dokumente schnell drucken",
        "Wählen Sie Extras - Optionen - Drucken.",
        "Some text that the translators left untouched.",
        ende_sources.html_blocks(f"<p>{LO_DE['par_id4']}</p>")[0][1],
        LO_DE["par_id5"],
    ]
    assert "Choose Tools - Options - Print." in by_english
    assert {p.document for p in pairs} == {"libreoffice-help:text/swriter/guide/print.html"}


def test_gimp_help_pairs_align_by_position_in_pages_of_equal_length(tmp_path):
    roots = packages(tmp_path)
    en = roots["gimp-help-en"] / ende_sources.GIMP_HELP / "en"
    de = roots["gimp-help-de"] / ende_sources.GIMP_HELP / "de"
    pairs, skipped = ende_sources.gimp_help_pairs(en, de)
    assert skipped == 1  # the cubism page: 3 blocks against 2
    assert [p[:2] for p in pairs] == [
        ("Oilify", "Ölgemälde"),  # the heading, its section number gone
        ("This filter makes the image look like an oil painting. The Mask size controls the "
         "outcome.", "Dieses Filter lässt Ihr Bild wie ein Ölgemälde erscheinen. Die Maskengröße "
         "bestimmt das Ergebnis."),
        ("The GIMPressionist filter can produce similar effects.",
         "Das Filter GIMPressionist erzeugt ähnliche Effekte."),
    ]  # fmt: skip
    assert {p.document for p in pairs} == {"gimp-help:gimp-filter-oilify.html"}


def test_gettext_pairs_keep_the_sentences_of_a_catalogue(tmp_path):
    roots = packages(tmp_path)
    assert ende_sources.SOURCES["libreoffice-l10n"].read(roots) == [
        Pair(
            "Keeps the paragraphs together when a break is inserted.",
            "Hält die Absätze zusammen, wenn ein Umbruch eingefügt wird.",
            "libreoffice-l10n:cui.mo:textflowpage",
        )
    ]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.mo").write_bytes(b"not a catalogue at all")
    with pytest.raises(JobError, match=r"^catalogue .*x.mo: not a gettext catalogue"):
        ende_sources.gettext_pairs(bad)


def test_sentences_split_only_where_both_sides_agree():
    assert ende_clean.sentences("Use e.g. the arrow. Then click 1. Done! Fine.") == [
        "Use e.g. the arrow.", "Then click 1. Done!", "Fine."
    ]  # fmt: skip
    assert ende_clean.sentences("Klicken Sie z. B. Datei an. Dann OK.") == [
        "Klicken Sie z. B. Datei an.", "Dann OK."
    ]  # fmt: skip
    long_en, long_de = (
        LO_EN["par_id4"],
        ende_sources.html_blocks(f"<p>{LO_DE['par_id4']}</p>")[0][1],
    )
    pieces, unaligned = ende_clean.segment(Pair(long_en, long_de, "d"))
    assert len(pieces) == 3 and not unaligned and pieces[2].german.startswith("Es können")
    merged = Pair(LO_EN["par_id5"], LO_DE["par_id5"], "d")  # 1 sentence against 2
    assert ende_clean.segment(merged) == ([merged], True)
    short = Pair("Short. Two sentences.", "Kurz.", "d")
    assert ende_clean.segment(short) == ([short], False)


@pytest.mark.parametrize(
    "english, german, reason",
    [
        ("The same text on both sides.", "The same text on both sides.", "untranslated"),
        ("You can use tags to reorganize the gradients display.",
         "You can use tags to reorganize the gradients Anzeige.", "untranslated"),
        ("Too short.", "Zu kurz hier.", "length"),
        ("x" * 251, "y" * 240, "length"),
        ("This method takes a lot of time.", "Mit dieser Einstellung wird eine kubische "
         "Interpolation verwendet, die recht aufwändig ist.", "ratio"),
        ("Shows the print resolution of the image.", "Zeigt die Druckauflösung des Bildes.", None),
    ],
)  # fmt: skip
def test_filters(english, german, reason):
    assert ende_clean.rejection(Pair(english, german, "d")) == reason


def test_clean_counts_its_drops_and_keeps_an_english_sentence_once():
    # Two sentences against three, too long to keep whole.
    long = Pair(
        "A" + "a" * 150 + ". Bb" + "b" * 120 + ".", "C" + "c" * 100 + ". Dd" * 40 + ". Eee.", "d1"
    )
    pairs = [
        Pair("Shows the print resolution.", "Zeigt die Druckauflösung.", "d1"),
        Pair("Shows the print resolution.", "Zeigt die Auflösung beim Druck.", "d2"),
        Pair("Untouched text here.", "Untouched text here.", "d1"),
        long,
    ]
    seen = {"Already kept by the dictionary."}
    kept, dropped = ende_clean.clean(
        [*pairs, Pair("Already kept by the dictionary.", "Schon vom Wörterbuch behalten.", "d3")],
        seen,
    )
    assert kept == pairs[:1]
    assert dropped == {"duplicate": 2, "untranslated": 1, "unaligned_long": 1}
    assert "Shows the print resolution." in seen


def test_the_split_keeps_every_document_on_one_side():
    pairs = [Pair(f"Sentence {d}-{i} here.", f"Satz {d}-{i} hier.", f"src:page{d}.html")
             for d in range(300) for i in range(4)]  # fmt: skip
    rows = ende_clean.by_split(pairs)
    documents = {split: {p.document for p in rows[split]} for split in ende_clean.SPLITS}
    assert not documents["train"] & documents["validation"]
    assert not documents["train"] & documents["test"]
    assert not documents["validation"] & documents["test"]
    assert 240 < len(documents["train"]) < 295 and documents["validation"] and documents["test"]
    assert ende_clean.by_split(pairs[::-1]) == {k: v[::-1] for k, v in rows.items()}


def _fetch_from(roots: dict[str, pathlib.Path]):
    def fetch(package: str, workdir: pathlib.Path) -> tuple[pathlib.Path, str]:
        assert workdir.is_dir()
        return roots[package], "1.0-test"

    return fetch


def test_the_build_writes_splits_and_corpus_json(tmp_path):
    fetch = _fetch_from(packages(tmp_path / "packages"))
    counts = ende_data.main(["--out", str(tmp_path / "a"), "--vocab_size", "0"], fetch=fetch)
    corpus = json.loads((tmp_path / "a/corpus.json").read_text())
    # dictionary 2, help 6 (one paragraph cut into 3), GIMP 2 (its heading is too short), UI 1
    assert sum(counts.values()) == 2 + 6 + 2 + 1 and corpus["splits"] == counts
    sources = corpus["sources"]
    assert list(sources) == list(ende_sources.SOURCES)
    help_ = sources["libreoffice-help"]
    assert help_["packages"] == {
        "libreoffice-help-en-us": "1.0-test",
        "libreoffice-help-de": "1.0-test",
    }
    assert help_["license"] == "MPL-2.0" and help_["extracted_pairs"] == 5
    assert help_["dropped"] == {"untranslated": 1}
    assert sum(help_["pairs"].values()) == 6 and sum(help_["documents"].values()) == 1
    english = sum(
        len(p.split())
        for p in [
            "Printing Documents Quickly",
            "Choose Tools - Options - Print.",
            LO_EN["par_id4"],
            LO_EN["par_id5"],
        ]
    )
    assert sum(help_["english_words"].values()) == english
    assert sources["gimp-help"]["license"].startswith("GFDL-1.2+")
    assert sources["trans-de-en"]["license"] == "GPL-2+"
    lines = [x for s in ende.SPLITS for x in (tmp_path / f"a/{s}.tsv").read_text().splitlines()]
    assert len(lines) == len({x.split("\t")[0] for x in lines}) == sum(counts.values())
    assert not list((tmp_path / "a").glob(".packages-*"))  # the unpacked packages are gone
    # Deterministic, and the dictionary alone is a corpus of its own.
    ende_data.main(["--out", str(tmp_path / "b"), "--vocab_size", "0"], fetch=fetch)
    for split in ende.SPLITS:
        assert (tmp_path / f"a/{split}.jsonl").read_bytes() == (
            tmp_path / f"b/{split}.jsonl"
        ).read_bytes()
    only = ende_data.main(
        ["--out", str(tmp_path / "c"), "--vocab_size", "0", "--sources", "trans-de-en"], fetch=fetch
    )
    assert sum(only.values()) == 2
    assert list(json.loads((tmp_path / "c/corpus.json").read_text())["sources"]) == ["trans-de-en"]


def _tool(directory: pathlib.Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_a_package_that_cannot_be_fetched_or_unpacked_is_a_one_line_error(tmp_path, monkeypatch):
    tools = tmp_path / "bin"
    tools.mkdir()
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}/usr/bin{os.pathsep}/bin")
    _tool(tools, "apt-get", 'echo "E: Unable to locate package $2" >&2; exit 100')
    out = tmp_path / "out"
    with pytest.raises(JobError) as e:
        ende_data.main(["--out", str(out), "--sources", "gimp-help"])
    assert str(e.value) == "package gimp-help-en: apt-get download gimp-help-en failed (exit 100)"
    assert (
        sorted(p.name for p in out.iterdir()) == []
    )  # nothing written, nothing left (the lock is released)
    _tool(tools, "apt-get", 'touch "$2_1.0_all.deb"')  # a download that is no package
    _tool(tools, "dpkg-deb", "exit 2")
    with pytest.raises(JobError, match=r"^package gimp-help-en: dpkg-deb -x .* failed \(exit 2\)$"):
        ende.fetch_package("gimp-help-en", tmp_path / "work")
    # unpacks (only an archive that is there), but not the layout the reader knows; --out given
    # relative, as on a command line: the tools run in the work directory, the paths must hold
    _tool(tools, "dpkg-deb", 'test -f "$2" && mkdir -p "$3"')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(JobError, match=r"^package gimp-help-en: no usr/share/gimp/2.0/help/en in"):
        ende_data.main(["--out", "out", "--sources", "gimp-help"])
    assert sorted(p.name for p in out.iterdir()) == []


@pytest.mark.slow
def test_the_real_packages_give_the_corpus_the_issue_describes(tmp_path):
    """Downloads the packages (~110 MB of .deb files) and builds the corpus without a vocabulary."""
    counts = ende_data.main(["--out", str(tmp_path), "--vocab_size", "0"])
    sources = json.loads((tmp_path / "corpus.json").read_text())["sources"]
    pairs = {name: sum(s["pairs"].values()) for name, s in sources.items()}
    assert 10_000 < pairs["trans-de-en"] < 11_500
    assert 30_000 < pairs["libreoffice-help"] < 40_000
    assert 350_000 < sum(sources["libreoffice-help"]["english_words"].values()) < 550_000
    assert 5_000 < pairs["gimp-help"] < 11_000
    assert 1_000 < pairs["libreoffice-l10n"] < 10_000
    assert 45_000 < sum(counts.values()) and counts["train"] > 0.85 * sum(counts.values())
