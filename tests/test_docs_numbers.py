"""Docs say only what files show (issue 40): the figures of docs/benchmarks.md's "Current numbers"
table and of README's Quickstart table (and a few sentences beside them) against the files they
come from.

`FIGURES` is the list of figures checked. Each entry names the doc, where the figure is (a table
row by its first cell and a column by its header, or the section's prose), the figure exactly as
the doc prints it, the file it comes from and how to get its value there (a key path into the JSON,
or a function of the loaded file), and how the doc rounds it. `check` fails with the figure named
when the doc no longer prints it, when its table row does not cite the file, or when the file's
value, rounded the doc's way, differs. In the
tables' result columns (`COVERED`) every number must also be one of the listed figures, so a figure
added to those columns without a file behind it fails too.

Pure Python on files in the repository: no downloads, no JAX.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import pathlib
import re
from collections.abc import Callable
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

README = "README.md"
BENCH = "docs/benchmarks.md"
QUICKSTART = "## Quickstart"
CURRENT = "## Current numbers"

# The tables' columns in which every number must be a listed figure.
COVERED = {
    (BENCH, CURRENT): ("α", "τ", "speedup (decode-only)"),
    (README, QUICKSTART): ("time", "disk", "peak memory"),
}


@dataclasses.dataclass(frozen=True)
class Figure:
    doc: str  # path of the doc, from the repository root
    section: str  # the heading the figure is under (its line's start)
    row: str | None  # the table row's first cell, exactly; None: the section's prose
    column: str | None  # the table column's header
    text: str  # the figure as the doc prints it
    file: str  # the file the value comes from (or a glob, or several paths joined by '|')
    key: str | tuple[str, ...] | Callable[[Any], Any]  # key path(s) into it, or a function of it
    fmt: str | Callable[[Any], str] = "{}"  # the doc's rounding: a format string, or a function

    @property
    def name(self) -> str:
        where = f"row {self.row!r}, column {self.column!r}" if self.row else "prose"
        return f"{self.doc} {self.section!r} {where}: {self.text!r} ({self.file})"


# --------------------------------------------------------------------------------------------
# Reading files and key paths.

_SEGMENT = re.compile(
    r"\.(?P<name>[A-Za-z_]\w*)|\[(?P<index>-?\d+)\]|\[(?P<field>\w+)=(?P<value>[^\]]*)\]"
    r'|\["(?P<literal>[^"]*)"\]'
)


def lookup(obj: Any, path: str) -> Any:
    """obj at a key path: `.name` (a dict key), `["any key"]`, `[3]` (a list index) and
    `[field=value]` (the one list element whose field equals value, as JSON or as a string)."""
    if path[:1] not in (".", "["):
        path = "." + path
    pos = 0
    while pos < len(path):
        m = _SEGMENT.match(path, pos)
        if not m:
            raise KeyError(f"bad key path {path!r} at {path[pos:]!r}")
        pos = m.end()
        if m["name"] is not None or m["literal"] is not None:
            obj = obj[m["name"] if m["name"] is not None else m["literal"]]
        elif m["index"] is not None:
            obj = obj[int(m["index"])]
        else:
            try:
                want = json.loads(m["value"])
            except ValueError:
                want = m["value"]
            found = [x for x in obj if isinstance(x, dict) and x.get(m["field"]) == want]
            if len(found) != 1:
                raise KeyError(f"{len(found)} elements with {m['field']}={want!r} in {path!r}")
            obj = found[0]
    return obj


@functools.cache
def load(file: str) -> Any:
    """A file's contents: JSON parsed, other files as text. A glob, or several paths joined by
    '|', gives {path: contents}."""
    if "|" in file:
        return {part: load(part) for part in file.split("|")}
    if any(c in file for c in "*?["):
        paths = sorted(ROOT.glob(file))
        return {str(p.relative_to(ROOT)): load(str(p.relative_to(ROOT))) for p in paths}
    text = (ROOT / file).read_text()
    return json.loads(text) if file.endswith(".json") else text


def value(fig: Figure) -> str:
    data = load(fig.file)
    if callable(fig.key):
        v = fig.key(data)
    elif isinstance(fig.key, tuple):
        v = tuple(lookup(data, k) for k in fig.key)
    else:
        v = lookup(data, fig.key)
    if callable(fig.fmt):
        return fig.fmt(v)
    return fig.fmt.format(*v) if isinstance(v, tuple) else fig.fmt.format(v)


# --------------------------------------------------------------------------------------------
# Reading docs: sections, tables, figures in them.


def section_text(doc_text: str, heading: str) -> str | None:
    """From the line starting with `heading` to the next heading line (or the end)."""
    lines = doc_text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(heading):
            end = next(
                (j for j in range(i + 1, len(lines)) if lines[j].startswith("#")), len(lines)
            )
            return "\n".join(lines[i:end])
    return None


def split_row(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def table(section: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The section's first markdown table: its header and {first cell: {header: cell}}."""
    lines = section.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        return [], {}
    header = split_row(lines[start])
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = split_row(line)
        rows[cells[0]] = dict(zip(header, cells))
    return header, rows


def spans(text: str, figure: str) -> list[tuple[int, int]]:
    """Where `figure` occurs in text as a whole figure (not inside a longer number)."""
    pattern = r"(?<![\d.])" + re.escape(figure) + (r"(?![\d])" if figure[-1:].isdigit() else "")
    return [m.span() for m in re.finditer(pattern, text)]


_NUMBER = re.compile(r"(?<![\w.])\.?\d[\d,]*(?:\.\d+)?")
_CODE = re.compile(r"`[^`]*`")


def numbers(cell: str) -> list[tuple[int, int, str]]:
    """The numbers of a cell outside `code spans` (paths and commands are not figures)."""
    blanked = _CODE.sub(lambda m: " " * len(m.group()), cell)
    return [(m.start(), m.end(), m.group()) for m in _NUMBER.finditer(blanked)]


def where(fig: Figure, docs: dict[str, str]) -> tuple[str | None, str, str]:
    """The text the figure must be in (a table cell or the section) and the text that must cite
    its file (the whole row; the section for prose), or None and why not."""
    section = section_text(docs[fig.doc], fig.section)
    if section is None:
        return None, "", f"no section {fig.section!r}"
    if fig.row is None:
        return section, section, ""
    _, rows = table(section)
    if fig.row not in rows:
        return None, "", "the row is gone"
    if fig.column not in rows[fig.row]:
        return None, "", "the column is gone"
    return rows[fig.row][fig.column], " | ".join(rows[fig.row].values()), ""


def cites(text: str, file: str) -> bool:
    """Whether text names each of the figure's files (by path or by its directory)."""
    if any(c in file for c in "*?["):
        return True  # a figure over every run: the sentence says which runs in words
    return all(
        part in text or str(pathlib.PurePosixPath(part).parent) in text for part in file.split("|")
    )


def check(figures: list[Figure], docs: dict[str, str], coverage: bool = True) -> list[str]:
    """Every way the docs and the files disagree, one line each naming the figure; with coverage,
    also every number of the `COVERED` columns that no figure of `figures` accounts for."""
    errors = []
    for fig in figures:
        text, context, why = where(fig, docs)
        if text is None:
            errors.append(f"{fig.name}: {why}")
            continue
        if not spans(text, fig.text):
            errors.append(f"{fig.name}: the doc no longer prints it (it reads {text!r})")
        if not cites(context, fig.file):
            errors.append(f"{fig.name}: the doc does not cite the file there")
        try:
            expected = value(fig)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, OSError) as e:
            errors.append(f"{fig.name}: no value in the file ({type(e).__name__}: {e})")
            continue
        if expected != fig.text:
            errors.append(f"{fig.name}: the file gives {expected!r}")
    for (doc, heading), columns in COVERED.items() if coverage else ():
        section = section_text(docs[doc], heading)
        if section is None:
            errors.append(f"{doc}: no section {heading!r}")
            continue
        _, rows = table(section)
        for row, cells in rows.items():
            for column in columns:
                cell = cells.get(column, "")
                listed = [
                    span
                    for fig in figures
                    if (fig.doc, fig.section, fig.row, fig.column) == (doc, heading, row, column)
                    for span in spans(cell, fig.text)
                ]
                for start, end, number in numbers(cell):
                    if not any(a <= start and end <= b for a, b in listed):
                        errors.append(
                            f"{doc} {heading!r} row {row!r}, column {column!r}: figure "
                            f"{number!r} is not in the list of checked figures (which file is it from?)"
                        )
    return errors


def read_docs() -> dict[str, str]:
    return {doc: (ROOT / doc).read_text() for doc in (README, BENCH)}


# --------------------------------------------------------------------------------------------
# Helpers for values that are not one key.


def dot2(x: float) -> str:
    """0.92 as the tables print a rate per depth: '.92'."""
    return f"{x:.2f}".removeprefix("0")


def depth_range(point: dict) -> str:
    """'.92-.96': the lowest and highest acceptance per depth."""
    rates = point["acceptance_by_position"]
    return f"{dot2(min(rates))}-{dot2(max(rates))}"


def first_last(point: dict) -> str:
    """'.50-.30': acceptance at the first and the last depth."""
    rates = point["acceptance_by_position"]
    return f"{dot2(rates[0])}-{dot2(rates[-1])}"


def best_speedup(bench: dict, batch: int) -> float:
    return max(p["speedup"] for p in lookup(bench, f"cells[batch_size={batch}]")["points"])


def gguf_bytes(fetch_py: str, names: tuple[str, ...]) -> int:
    """Bytes of the registry's GGUF files (speculative/loading/fetch.py's MODELS rows, read as
    source)."""
    total = 0
    for node in ast.walk(ast.parse(fetch_py)):
        if (
            isinstance(node, ast.Tuple)
            and len(node.elts) == 5
            and isinstance(node.elts[0], ast.Constant)
            and node.elts[0].value in names
        ):
            total += node.elts[3].value
    return total


def demo_models_gb(data: dict) -> float:
    """GB of the demo's two models: their names from demo.json, their sizes from fetch.py."""
    demo = data[DEMO]
    return gguf_bytes(data["speculative/loading/fetch.py"], (demo["target"], demo["draft"])) / 1e9


# --------------------------------------------------------------------------------------------
# The list of figures checked.

I39 = "benchmarks/issue39_bf16_t0/benchmark.json"
I39_T1 = "benchmarks/issue39_bf16_t1_20/benchmark.json"
DEMO = "benchmarks/demo_prefill/demo.json"
PREFILL = "benchmarks/issue39_prefill/benchmark.json"
PREFILL_B8 = "benchmarks/issue39_batch8_prefill/benchmark.json"
PREFILL_T1 = "benchmarks/issue39_prefill_t1/benchmark.json"
SHORTLIST = "benchmarks/issue13/shortlist/benchmark.json"
I25 = "benchmarks/issue25_table/benchmark.json"
HF_BF16 = "benchmarks/compare_hf_rerun/compare_hf.json"
BATCH = "benchmarks/issue13/batch_curve/benchmark.json"
BATCH_BF16 = "benchmarks/issue39_batch/benchmark.json"
BATCH8 = "benchmarks/issue39_batch8/benchmark.json"
UNITS = "benchmarks/matrix_units/matrix_units.json"

A, T, S, SET = "α", "τ", "speedup (decode-only)", "setting"
T0 = "cells[temperature=0.0].points"
T1 = "cells[temperature=1.0].points"
HF_STAGED = 'cells[0].programs["ours staged gamma 5, lookup 3, draft shortlist 32768"]'
B8_G3 = "cells[0].points[gamma=3]"


def _current(row: str, column: str, text: str, file: str, key, fmt="{}") -> Figure:
    return Figure(BENCH, CURRENT, row, column, text, file, key, fmt)


_R0 = "**int8 draft**, staged drafting, greedy"
_R0T1 = "**int8 draft**, staged drafting, T = 1"
_R0B8 = "**int8 draft, batch 8**, chain, greedy"
_R1 = "**bfloat16**, staged drafting, greedy"
_R2 = "bfloat16, tree / chain, greedy"
_R3 = "**bfloat16**, staged drafting, T = 1"
_R4 = "bfloat16, block rule / tree / chain, T = 1"
_R5 = "the Quickstart demo's default since issue 39"
_R6 = "best chain, greedy"
_R7 = "best chain, T = 1"
_R8 = "token trees, greedy"
_R9 = "token trees, T = 1"
_R10 = "block verification, T = 1"
_R11 = "trained feature head"
_R12 = "prompt-lookup tree"
_R13 = "against Hugging Face"
_R14 = "batch curve, float32"
_R15 = "draft with another tokenizer, bfloat16"
_R16 = "batch curve, bfloat16"
X41 = "benchmarks/issue41_cross_vocab_20/benchmark.json"


def cross_point(temperature: float, gamma: int) -> Callable[[Any], dict[str, Any]]:
    """The cross-vocabulary draft's point at (temperature, gamma) of X41 (two gammas, one name)."""
    return lambda d: next(
        p
        for c in d["cells"]
        if c["temperature"] == temperature
        for p in c["points"]
        if p["variant"].startswith("smollm2") and p["gamma"] == gamma
    )


def _int8_point(
    temperature: float, gamma: int, field: str, variant: str = "staged_int8"
) -> Callable[[Any], Any]:
    """A field of an int8 table's point of `variant` (the staged int8 draft unless named) at one
    temperature and gamma."""

    def get(data: Any) -> Any:
        points = lookup(data, f"cells[temperature={temperature}].points")
        found = [p for p in points if p["variant"] == variant and p["gamma"] == gamma]
        assert len(found) == 1, found
        return found[0][field]

    return get


def _point_figures(
    row: str, file: str, point: Callable[[str], Callable[[Any], Any]], texts: tuple[str, ...]
) -> list[Figure]:
    """A Current-numbers row's figures of one benchmark point: texts are the doc's γ, α, τ,
    speedup, decode-only speedup and tok/s, in that order; point(field) reads a field of it."""
    columns = (
        (SET, "gamma", "γ {}"),
        (A, "alpha", "{:.3f}"),
        (T, "tau", "{:.2f}"),
        (S, "speedup", "**{:.2f}x**"),
        (S, "decode_speedup", "({:.2f}x)"),
        (S, "speculative_tok_s", "{:.2f} tok/s"),
    )
    return [
        _current(row, column, text, file, point(field), fmt)
        for text, (column, field, fmt) in zip(texts, columns, strict=True)
    ]


CURRENT_FIGURES = [
    _current(_R0, SET, "20 prompts", PREFILL, "num_examples", "{} prompts"),
    *_point_figures(
        _R0,
        PREFILL,
        lambda field: _int8_point(0.0, 8, field),
        ("γ 8", "0.938", "6.83", "**2.33x**", "(2.52x)", "15.67 tok/s"),
    ),
    _current(
        _R0B8, SET, "HumanEval 0-7", PREFILL_B8, "num_examples", lambda n: f"HumanEval 0-{n - 1}"
    ),
    _current(
        _R0B8,
        SET,
        "one batch",
        PREFILL_B8,
        "cells[0].batch_size",
        lambda b: "one batch" if b == 8 else f"batch {b}",
    ),
    *_point_figures(
        _R0B8,
        PREFILL_B8,
        lambda field: _int8_point(0.0, 3, field, "chain_int8"),
        ("γ 3", "0.927", "3.55", "**1.38x**", "(1.56x)", "28.55 tok/s"),
    ),
    _current(_R0T1, SET, "20 prompts", PREFILL_T1, "num_examples", "{} prompts"),
    *_point_figures(
        _R0T1,
        PREFILL_T1,
        lambda field: _int8_point(1.0, 6, field),
        ("γ 6", "0.911", "5.25", "**2.00x**", "(2.11x)", "12.52 tok/s"),
    ),
    _current(_R1, SET, "10 prompts", I39, "num_examples", "{} prompts"),
    _current(_R1, SET, "128 tokens", I39, "feature_lengths.targets", "{} tokens"),
    _current(_R1, SET, "γ 5", I39, f"{T0}[variant=staged].gamma", "γ {}"),
    _current(
        _R1,
        SET,
        "3 lookups",
        I39,
        lambda d: re.search(r"prompt lookup \((\d+) a call\)", d["drafts"][1]).group(1),
        "{} lookups",
    ),
    _current(_R1, A, "0.935", I39, f"{T0}[variant=staged].alpha", "{:.3f}"),
    _current(_R1, T, "5.03", I39, f"{T0}[variant=staged].tau", "{:.2f}"),
    _current(_R1, S, "1.78x", I39, f"{T0}[variant=staged].speedup", "{:.2f}x"),
    _current(_R1, S, "(1.88x)", I39, f"{T0}[variant=staged].decode_speedup", "({:.2f}x)"),
    _current(_R1, S, "11.57 tok/s", I39, f"{T0}[variant=staged].speculative_tok_s", "{:.2f} tok/s"),
    _current(
        _R2,
        A,
        "0.940 / 0.935",
        I39,
        (f"{T0}[variant=tree].alpha", f"{T0}[variant=chain].alpha"),
        "{:.3f} / {:.3f}",
    ),
    _current(
        _R2,
        T,
        "5.72 / 5.03",
        I39,
        (f"{T0}[variant=tree].tau", f"{T0}[variant=chain].tau"),
        "{:.2f} / {:.2f}",
    ),
    _current(
        _R2,
        S,
        "1.67x / 1.67x",
        I39,
        (f"{T0}[variant=tree].speedup", f"{T0}[variant=chain].speedup"),
        "{:.2f}x / {:.2f}x",
    ),
    _current(_R3, A, "0.898", I39_T1, f"{T1}[variant=staged].alpha", "{:.3f}"),
    _current(_R3, T, "4.57", I39_T1, f"{T1}[variant=staged].tau", "{:.2f}"),
    _current(_R3, S, "1.65x", I39_T1, f"{T1}[variant=staged].speedup", "{:.2f}x"),
    _current(_R3, S, "(1.68x)", I39_T1, f"{T1}[variant=staged].decode_speedup", "({:.2f}x)"),
    _current(
        _R3, S, "10.84 tok/s", I39_T1, f"{T1}[variant=staged].speculative_tok_s", "{:.2f} tok/s"
    ),
    _current(
        _R4,
        A,
        "0.882 / 0.902 / 0.890",
        I39_T1,
        (f"{T1}[variant=block].alpha", f"{T1}[variant=tree].alpha", f"{T1}[variant=chain].alpha"),
        "{:.3f} / {:.3f} / {:.3f}",
    ),
    _current(
        _R4,
        T,
        "4.51 / 4.97 / 4.45",
        I39_T1,
        (f"{T1}[variant=block].tau", f"{T1}[variant=tree].tau", f"{T1}[variant=chain].tau"),
        "{:.2f} / {:.2f} / {:.2f}",
    ),
    _current(
        _R4,
        S,
        "1.56x / 1.44x / 1.52x",
        I39_T1,
        (
            f"{T1}[variant=block].speedup",
            f"{T1}[variant=tree].speedup",
            f"{T1}[variant=chain].speedup",
        ),
        "{:.2f}x / {:.2f}x / {:.2f}x",
    ),
    _current(_R5, SET, "3 prompts", DEMO, lambda d: len(d["rows"]), "{} prompts"),
    _current(_R5, SET, "219 in all", DEMO, "tokens", "{} in all"),
    _current(_R5, SET, "bfloat16", DEMO, "dtype"),
    _current(
        _R5,
        SET,
        "staged γ 8",
        DEMO,
        ("staged_lookahead", "gamma"),
        lambda v: f"staged γ {v[1]}" if v[0] else "chain",
    ),
    _current(_R5, SET, "int8 draft", DEMO, "draft_quantize", "{} draft"),
    _current(_R5, A, "0.926", DEMO, "alpha", "{:.3f}"),
    _current(_R5, T, "6.64", DEMO, "tau", "{:.2f}"),
    _current(_R5, S, "1.93x", DEMO, "speedup", "{:.2f}x"),
    _current(_R5, S, "(cost model 2.39x)", DEMO, "cost_model_speedup", "(cost model {:.2f}x)"),
    _current(
        _R5,
        S,
        "every completion identical to plain",
        DEMO,
        lambda d: all(r["identical_to_plain"] for r in d["rows"]),
        lambda ok: "every completion identical to plain" if ok else "some completion differs",
    ),
    _current(_R6, SET, "20 prompts", SHORTLIST, "num_examples", "{} prompts"),
    _current(_R6, SET, "γ 5", SHORTLIST, f"{T0}[gamma=5].gamma", "γ {}"),
    _current(
        _R6,
        SET,
        "shortlist 32,768",
        SHORTLIST,
        lambda d: int(re.search(r"head shortlist (\d+)", d["draft"]).group(1)),
        "shortlist {:,}",
    ),
    _current(_R6, A, "0.936", SHORTLIST, f"{T0}[gamma=5].alpha", "{:.3f}"),
    _current(_R6, T, "5.05", SHORTLIST, f"{T0}[gamma=5].tau", "{:.2f}"),
    _current(_R6, S, "1.71x", SHORTLIST, f"{T0}[gamma=5].speedup", "{:.2f}x"),
    _current(_R6, S, "(1.87x)", SHORTLIST, f"{T0}[gamma=5].decode_speedup", "({:.2f}x)"),
    _current(_R7, A, "0.885", SHORTLIST, f"{T1}[gamma=5].alpha", "{:.3f}"),
    _current(_R7, T, "4.38", SHORTLIST, f"{T1}[gamma=5].tau", "{:.2f}"),
    _current(_R7, S, "1.50x", SHORTLIST, f"{T1}[gamma=5].speedup", "{:.2f}x"),
    _current(_R7, S, "(1.61x)", SHORTLIST, f"{T1}[gamma=5].decode_speedup", "({:.2f}x)"),
    _current(_R8, SET, "20 prompts", I25, "num_examples", "{} prompts"),
    _current(_R8, SET, "128 tokens", I25, "feature_lengths.targets", "{} tokens"),
    _current(_R8, SET, "(1.71x)", I25, f"{T0}[variant=chain].speedup", "({:.2f}x)"),
    _current(_R8, A, ".92-.96", I25, lambda d: depth_range(lookup(d, f"{T0}[variant=tree]"))),
    _current(_R8, T, "5.68", I25, f"{T0}[variant=tree].tau", "{:.2f}"),
    _current(_R8, S, "1.73x", I25, f"{T0}[variant=tree].speedup", "{:.2f}x"),
    _current(_R8, S, "(1.90x)", I25, f"{T0}[variant=tree].decode_speedup", "({:.2f}x)"),
    _current(_R9, A, ".87-.93", I25, lambda d: depth_range(lookup(d, f"{T1}[variant=tree]"))),
    _current(_R9, T, "5.02", I25, f"{T1}[variant=tree].tau", "{:.2f}"),
    _current(_R9, S, "1.56x", I25, f"{T1}[variant=tree].speedup", "{:.2f}x"),
    _current(_R9, S, "(1.65x)", I25, f"{T1}[variant=tree].decode_speedup", "({:.2f}x)"),
    _current(_R9, S, "against 1.50x", I25, f"{T1}[variant=chain].speedup", "against {:.2f}x"),
    _current(_R10, SET, "γ 5", I25, f"{T1}[variant=block].gamma", "γ {}"),
    _current(_R10, A, "0.879", I25, f"{T1}[variant=block].alpha", "{:.3f}"),
    _current(_R10, T, "4.45", I25, f"{T1}[variant=block].tau", "{:.2f}"),
    _current(
        _R10, T, "(token rule: 4.38)", I25, f"{T1}[variant=chain].tau", "(token rule: {:.2f})"
    ),
    _current(
        _R10,
        S,
        "1.55x against 1.50x",
        I25,
        (f"{T1}[variant=block].speedup", f"{T1}[variant=chain].speedup"),
        "{:.2f}x against {:.2f}x",
    ),
    _current(_R11, SET, "head γ 2", I25, f"{T0}[variant=head].gamma", "head γ {}"),
    _current(_R11, SET, "(c 0.049)", I25, f"{T0}[variant=head].c", "(c {:.3f})"),
    _current(_R11, A, "0.34", I25, f"{T0}[variant=head].alpha", "{:.2f}"),
    _current(_R11, A, ".50-.30", I25, lambda d: first_last(lookup(d, f"{T0}[variant=head_tree]"))),
    _current(
        _R11,
        T,
        "1.45 / 1.67",
        I25,
        (f"{T0}[variant=head].tau", f"{T0}[variant=head_tree].tau"),
        "{:.2f} / {:.2f}",
    ),
    _current(
        _R11,
        S,
        "1.14x / 1.13x",
        I25,
        (f"{T0}[variant=head].speedup", f"{T0}[variant=head_tree].speedup"),
        "{:.2f}x / {:.2f}x",
    ),
    _current(
        _R12, A, ".24-.79", I25, lambda d: first_last(lookup(d, f"{T0}[variant=lookup_tree]"))
    ),
    _current(_R12, T, "1.50", I25, f"{T0}[variant=lookup_tree].tau", "{:.2f}"),
    _current(_R12, S, "1.16x", I25, f"{T0}[variant=lookup_tree].speedup", "{:.2f}x"),
    _current(
        _R13,
        SET,
        "HumanEval 100-103",
        HF_BF16,
        lambda d: "-".join(d["prompts"][i].removeprefix("HumanEval/") for i in (0, -1)),
        "HumanEval {}",
    ),
    _current(
        _R13,
        SET,
        "(prompt lookup, bfloat16)",
        HF_BF16,
        "cells[0].best_hf_assisted",
        lambda name: {"hf prompt lookup 10 [bfloat16]": "(prompt lookup, bfloat16)"}.get(
            name, name
        ),
    ),
    _current(_R13, A, "0.920", HF_BF16, f"{HF_STAGED}.alpha", "{:.3f}"),
    _current(_R13, T, "4.79", HF_BF16, f"{HF_STAGED}.tokens_per_target_call", "{:.2f}"),
    _current(_R13, S, "1.55x", HF_BF16, "cells[0].ours_over_best_hf_assisted", "{:.2f}x"),
    _current(_R14, SET, "HumanEval 0-7", BATCH, "num_examples", lambda n: f"HumanEval 0-{n - 1}"),
    _current(_R14, SET, "64 tokens", BATCH, "feature_lengths.targets", "{} tokens"),
    _current(_R14, A, "0.914", BATCH, "cells[batch_size=1].alpha", "{:.3f}"),
    _current(_R14, S, "1.50x (batch 1)", BATCH, lambda d: best_speedup(d, 1), "{:.2f}x (batch 1)"),
    _current(_R14, S, "0.97x (batch 8)", BATCH, lambda d: best_speedup(d, 8), "{:.2f}x (batch 8)"),
    _current(_R14, S, "0.78x (16)", BATCH, lambda d: best_speedup(d, 16), "{:.2f}x (16)"),
    _current(_R16, SET, "128 tokens", BATCH_BF16, "feature_lengths.targets", "{} tokens"),
    _current(_R16, A, "0.925", BATCH_BF16, "cells[batch_size=1].points[0].alpha", "{:.3f}"),
    _current(
        _R16,
        T,
        "4.95 / 3.53",
        f"{BATCH_BF16}|{BATCH8}",
        lambda d: (
            lookup(d[BATCH_BF16], "cells[batch_size=1].points[0].tau"),
            lookup(d[BATCH8], f"{B8_G3}.tau"),
        ),
        "{:.2f} / {:.2f}",
    ),
    _current(
        _R16, S, "1.66x (batch 1)", BATCH_BF16, lambda d: best_speedup(d, 1), "{:.2f}x (batch 1)"
    ),
    _current(_R16, S, "1.29x (4)", BATCH_BF16, lambda d: best_speedup(d, 4), "{:.2f}x (4)"),
    _current(_R16, S, "0.98x (8)", BATCH_BF16, lambda d: best_speedup(d, 8), "{:.2f}x (8)"),
    _current(
        _R16,
        S,
        "γ 3 at batch 8",
        BATCH8,
        (f"{B8_G3}.gamma", "cells[0].batch_size"),
        "γ {} at batch {}",
    ),
    _current(_R16, S, "1.23x", BATCH8, f"{B8_G3}.speedup", "{:.2f}x"),
    _current(_R16, S, "(1.48x)", BATCH8, f"{B8_G3}.decode_speedup", "({:.2f}x)"),
    _current(
        _R15,
        A,
        "0.568 / 0.490",
        X41,
        lambda d: (cross_point(0.0, 2)(d)["alpha"], cross_point(1.0, 1)(d)["alpha"]),
        "{:.3f} / {:.3f}",
    ),
    _current(
        _R15,
        T,
        "1.85 / 1.49",
        X41,
        lambda d: (cross_point(0.0, 2)(d)["tau"], cross_point(1.0, 1)(d)["tau"]),
        "{:.2f} / {:.2f}",
    ),
    *(
        _current(_R15, S, text, X41, lambda d, t=t, g=g, k=k: cross_point(t, g)(d)[k], fmt)
        for text, t, g, k, fmt in [
            ("**1.13x**", 0.0, 2, "speedup", "**{:.2f}x**"),
            ("(1.14x)", 0.0, 2, "decode_speedup", "({:.2f}x)"),
            ("**1.10x**", 1.0, 1, "speedup", "**{:.2f}x**"),
            ("(1.09x)", 1.0, 1, "decode_speedup", "({:.2f}x)"),
        ]
    ),
    # The sentences around the table.
    Figure(
        BENCH,
        CURRENT,
        None,
        None,
        "1.62x faster a step",
        UNITS,
        ("costs.float32.plain_step_s", "costs.bfloat16.plain_step_s"),
        lambda v: f"{v[0] / v[1]:.2f}x faster a step",
    ),
    Figure(
        BENCH,
        "# Benchmark notes",
        None,
        None,
        "18.1-33.3 GB/s",
        "benchmarks/**/*.json",
        lambda files: [
            d["read_bandwidth_bytes_s"]
            for d in files.values()
            if isinstance(d, dict) and "read_bandwidth_bytes_s" in d
        ],
        lambda bw: f"{min(bw) / 1e9:.1f}-{max(bw) / 1e9:.1f} GB/s",
    ),
    Figure(
        BENCH,
        "# Benchmark notes",
        None,
        None,
        "the 34 runs",
        "benchmarks/**/*.json",
        lambda files: sum(
            isinstance(d, dict) and "read_bandwidth_bytes_s" in d for d in files.values()
        ),
        "the {} runs",
    ),
]

_DEMO_ROW = "`bash scripts/demo.sh`"
_TEST_ROW = "`bash scripts/test.sh`"


def _quick(row: str, column: str, text: str, file: str, key, fmt="{}") -> Figure:
    return Figure(README, QUICKSTART, row, column, text, file, key, fmt)


QUICKSTART_FIGURES = [
    _quick(_DEMO_ROW, "time", "42.7 s", UNITS, "peak_rss.bfloat16.load_s", "{:.1f} s"),
    _quick(_DEMO_ROW, "time", "8.9 s plain", DEMO, "compile_s.plain", "{:.1f} s plain"),
    _quick(
        _DEMO_ROW,
        "time",
        "22.4 s speculative",
        DEMO,
        "compile_s.speculative",
        "{:.1f} s speculative",
    ),
    _quick(_DEMO_ROW, "time", "12.9 s plain", DEMO, "warmup_s.plain", "{:.1f} s plain"),
    _quick(
        _DEMO_ROW, "time", "8.1 s speculative", DEMO, "warmup_s.speculative", "{:.1f} s speculative"
    ),
    _quick(_DEMO_ROW, "time", "219 tokens", DEMO, "tokens", "{} tokens"),
    _quick(_DEMO_ROW, "time", "5.97 tok/s plain", DEMO, "plain_tok_s", "{:.2f} tok/s plain"),
    _quick(
        _DEMO_ROW,
        "time",
        "11.53 tok/s speculative",
        DEMO,
        "speculative_tok_s",
        "{:.2f} tok/s speculative",
    ),
    _quick(
        _DEMO_ROW,
        "disk",
        "1.6 GB",
        f"{DEMO}|speculative/loading/fetch.py",
        demo_models_gb,
        "{:.1f} GB",
    ),
    _quick(
        _DEMO_ROW,
        "peak memory",
        "6.2 GiB in bfloat16",
        UNITS,
        "peak_rss.bfloat16.peak_rss_gib",
        "{:.1f} GiB in bfloat16",
    ),
    _quick(
        _DEMO_ROW,
        "peak memory",
        "10.2 GiB in float32",
        UNITS,
        "peak_rss.float32.peak_rss_gib",
        "{:.1f} GiB in float32",
    ),
    _quick(
        _TEST_ROW,
        "time",
        "2 pytest-xdist workers",
        "scripts/test.sh",
        lambda sh: int(re.search(r"pytest -n (\d+)", sh).group(1)),
        "{} pytest-xdist workers",
    ),
    # The demo's paragraph under the table.
    *(
        Figure(README, QUICKSTART, None, None, text, DEMO, key, fmt)
        for text, key, fmt in [
            ("219 tokens, batch 1", ("tokens", "batch_size"), "{} tokens, batch {}"),
            ("α 0.926", "alpha", "α {:.3f}"),
            ("τ 6.64", "tau", "τ {:.2f}"),
            ("c 0.211", "c", "c {:.3f}"),
            (
                "40 ms per proposed draft token",
                "draft_step_s",
                lambda s: f"{s * 1e3:.0f} ms per proposed draft token",
            ),
            ("/ 189 ms", "target_step_s", lambda s: f"/ {s * 1e3:.0f} ms"),
            ("plain 5.97 tok/s", "plain_tok_s", "plain {:.2f} tok/s"),
            ("11.53 tok/s", "speculative_tok_s", "{:.2f} tok/s"),
            ("**1.93x**", "speedup", "**{:.2f}x**"),
            ("cost model 2.39x", "cost_model_speedup", "cost model {:.2f}x"),
            ("Thm 3.8 2.51x", "predicted_speedup", "Thm 3.8 {:.2f}x"),
        ]
    ),
]

FIGURES = CURRENT_FIGURES + QUICKSTART_FIGURES


# --------------------------------------------------------------------------------------------
# Tests.


@pytest.mark.parametrize("fig", FIGURES, ids=lambda f: f"{f.doc}:{f.row or 'prose'}:{f.text}")
def test_figure_matches_its_file(fig):
    assert check([fig], read_docs(), coverage=False) == []


def test_every_number_in_the_tables_is_checked():
    assert check(FIGURES, read_docs()) == []


def test_an_altered_figure_fails_naming_it():
    docs = read_docs()
    altered = dict(docs)
    altered[BENCH] = docs[BENCH].replace(
        "| **1.78x** (1.88x), 11.57 tok/s |", "| **1.83x** (1.88x), 11.57 tok/s |"
    )
    assert altered[BENCH] != docs[BENCH]
    errors = check(FIGURES, altered)
    assert any("'1.78x'" in e and "no longer prints it" in e for e in errors), errors
    # The new figure is in no entry of the list, so the table's coverage names it too.
    assert any("'1.83'" in e and "not in the list" in e for e in errors), errors


def test_a_figure_that_differs_from_its_file_fails_naming_it():
    # The doc still prints the figure, but the list's rounding of the file's value gives another:
    # the same check a stale figure meets after its run is replaced.
    stale = dataclasses.replace(QUICKSTART_FIGURES[0], text="43.9 s")
    altered = read_docs()
    altered[README] = altered[README].replace(
        "loading both models 42.7 s", "loading both models 43.9 s"
    )
    errors = check([stale], altered, coverage=False)
    assert errors == [f"{stale.name}: the file gives '42.7 s'"], errors


def test_an_unbacked_figure_added_to_a_table_fails():
    docs = read_docs()
    altered = dict(docs)
    altered[README] = docs[README].replace("| not recorded in a file |\n", "| 6.3 GiB |\n", 1)
    assert altered[README] != docs[README]
    errors = check(FIGURES, altered)
    assert any("'6.3'" in e and _TEST_ROW in e for e in errors), errors


def test_a_removed_row_fails():
    docs = read_docs()
    lines = [line for line in docs[BENCH].splitlines() if not line.startswith(f"| {_R14} |")]
    errors = check(FIGURES, {**docs, BENCH: "\n".join(lines)})
    assert any(_R14 in e and "the row is gone" in e for e in errors), errors


def test_key_paths():
    data = {"cells": [{"t": 0.0, "p": [{"v": "a", "x": 1}, {"v": "b", "x": 2}]}], "k k": {"y": 3}}
    assert lookup(data, "cells[t=0.0].p[v=b].x") == 2
    assert lookup(data, "cells[0].p[-1].x") == 2
    assert lookup(data, '["k k"].y') == 3
    with pytest.raises(KeyError):
        lookup(data, "cells[t=1.0]")


def test_a_row_that_stops_citing_its_file_fails():
    docs = read_docs()
    cited = ", `benchmarks/issue13/batch_curve/benchmark.json` |"
    assert cited in docs[BENCH]
    errors = check(FIGURES, {**docs, BENCH: docs[BENCH].replace(cited, " |")})
    assert any(_R14 in e and "does not cite the file" in e for e in errors), errors
