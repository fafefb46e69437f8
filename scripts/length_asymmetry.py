#!/usr/bin/env python
"""Why speculative outputs ran longer than plain decoding's at T = 1, from the result files alone.

Reads every `benchmark.json` under the benchmarks folder (the benchmark job's result files) and
takes each cell at temperature 1.0 and each exact point in it (lenience 1.0, not marked
`"exact": false`). A point compares its `speculative_tokens` with its cell's `plain_tokens`:
generated tokens summed over the run's prompts (EOS included, each prompt capped at
`feature_lengths.targets`). Where the file has them, `plain_batch_tokens` (cell) and
`speculative_batch_tokens` (point) give the same per prompt (batch 1: one prompt a batch).

Printed, in order:

1. every such comparison (file, cell, variant, gamma, plain and speculative tokens) and the count
   of longer / shorter / equal;
2. the distinct plain baselines (same dtype, top-p/top-k, prompts, cap and plain total), how many
   comparisons share each, which are the first prompts of another baseline's per-prompt lengths
   (the benchmark draws prompt j's randomness from fold_in(PRNGKey(seed), j), so a run on fewer
   prompts or a lower cap repeats the longer run's sample), and how many rows agree between
   baselines of the same prompts in another dtype;
3. per baseline, its distinct speculative samples (a point re-run in another file counts once)
   and the rank of the plain total among them (1 = shortest; under exactness each rank is
   equally likely, so P(rank <= r) = r / (samples + 1));
4. per baseline with per-prompt lengths, the plain length of each prompt against the
   speculative samples' (how many ran to the cap, plain's mid-rank) and an exact stratified
   rank-sum test: the chance, were plain one more draw like the speculative ones, of a rank sum
   as low as the one seen;
5. what the count leaves out: lossy points, other result files with T = 1 cells
   (`benchmark_t1.json`, `compare_hf.json`).

No model is loaded; only JSON is read.

    python scripts/length_asymmetry.py [--root benchmarks] [--json /tmp/length_asymmetry.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import statistics
import sys
from collections.abc import Iterable, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEMPERATURE = 1.0


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One exact T = 1 point against its cell's plain baseline."""

    file: str
    cell: int
    variant: str | None
    gamma: int | None
    plain: int
    spec: int
    plain_rows: tuple[int, ...] | None
    spec_rows: tuple[int, ...] | None
    dtype: str
    top_p: float | None
    top_k: int | None
    prompts: int | None
    cap: int | None

    @property
    def baseline_key(self) -> tuple:
        return (self.dtype, self.top_p, self.top_k, self.prompts, self.cap, self.plain)


@dataclasses.dataclass
class Baseline:
    """One plain sample and the comparisons made against it."""

    name: str
    key: tuple
    comparisons: list[Comparison]
    rows: tuple[int, ...] | None
    samples: list[Comparison] = dataclasses.field(default_factory=list)
    prefix_of: str | None = None

    @property
    def plain(self) -> int:
        return self.key[-1]

    @property
    def label(self) -> str:
        dtype, top_p, top_k, prompts, cap, plain = self.key
        sampling = "full" if top_p in (None, 1.0) and not top_k else f"top_p {top_p}"
        return f"{dtype}, {sampling}, {prompts} prompts x {cap}, plain {plain}"


def dtype_of(target: str | None) -> str:
    found = re.search(r"\((float32|bfloat16|float16|int8)\)", target or "")
    return found.group(1) if found else "?"


def rows_of(values: Any) -> tuple[int, ...] | None:
    return tuple(int(v) for v in values) if isinstance(values, list) and values else None


def is_exact(point: dict) -> bool:
    return point.get("exact") is not False and point.get("lenience", 1.0) in (None, 1.0)


def t1_cells(result: dict) -> Iterable[tuple[int, dict]]:
    for index, cell in enumerate(result.get("cells") or []):
        if isinstance(cell, dict) and cell.get("temperature") == TEMPERATURE:
            yield index, cell


def read_comparisons(root: pathlib.Path) -> tuple[list[Comparison], list[dict]]:
    """Exact T = 1 comparisons of every benchmark.json under root, and the lossy points left out."""
    kept, lossy = [], []
    for path in sorted(root.rglob("benchmark.json")):
        result = json.loads(path.read_text())
        name = str(path.relative_to(root.parent))
        lengths = result.get("feature_lengths") or {}
        for index, cell in t1_cells(result):
            for point in cell.get("points") or []:
                if point.get("plain_tokens") is None or point.get("speculative_tokens") is None:
                    continue
                if not is_exact(point):
                    lossy.append(
                        {
                            "file": name,
                            "variant": point.get("variant"),
                            "lenience": point.get("lenience"),
                            "plain": point["plain_tokens"],
                            "spec": point["speculative_tokens"],
                        }
                    )
                    continue
                kept.append(
                    Comparison(
                        file=name,
                        cell=index,
                        variant=point.get("variant"),
                        gamma=point.get("gamma"),
                        plain=int(point["plain_tokens"]),
                        spec=int(point["speculative_tokens"]),
                        plain_rows=rows_of(cell.get("plain_batch_tokens")),
                        spec_rows=rows_of(point.get("speculative_batch_tokens")),
                        dtype=dtype_of(result.get("target")),
                        top_p=cell.get("top_p"),
                        top_k=cell.get("top_k"),
                        prompts=result.get("num_examples"),
                        cap=lengths.get("targets"),
                    )
                )
    return kept, lossy


def same_sample(a: Comparison, b: Comparison) -> bool:
    """The same speculative draw recorded twice (a point re-run, or shared by two files): same
    total and gamma, the same per-prompt lengths where both have them, and the same variant name
    unless one file names none."""
    if a.spec != b.spec or a.gamma != b.gamma:
        return False
    if a.spec_rows is not None and b.spec_rows is not None:
        return a.spec_rows == b.spec_rows
    return a.variant is None or b.variant is None or a.variant == b.variant


def prefix_total(rows: Sequence[int], prompts: int, cap: int) -> int:
    return sum(min(r, cap) for r in rows[:prompts])


def build_baselines(comparisons: Sequence[Comparison]) -> list[Baseline]:
    groups: dict[tuple, list[Comparison]] = {}
    for c in comparisons:
        groups.setdefault(c.baseline_key, []).append(c)
    order = sorted(groups, key=lambda k: (k[0], str(k[1]), -(k[3] or 0), -(k[4] or 0), k[5]))
    baselines = []
    for i, key in enumerate(order):
        members = groups[key]
        rows = next((c.plain_rows for c in members if c.plain_rows is not None), None)
        baseline = Baseline(f"B{i + 1}", key, members, rows)
        for c in sorted(members, key=lambda c: c.spec_rows is None):  # keep a copy with rows
            if not any(same_sample(c, s) for s in baseline.samples):
                baseline.samples.append(c)
        baselines.append(baseline)
    for b in baselines:  # a plain sample that is the first prompts of another's, capped
        for source in baselines:
            if source is b or source.rows is None or source.key[:3] != b.key[:3]:
                continue
            prompts, cap = b.key[3], b.key[4]
            if prompts is None or cap is None or source.key[4] is None:
                continue
            if (prompts, cap) == source.key[3:5] or prompts > len(source.rows):
                continue
            if prefix_total(source.rows, prompts, cap) == b.plain and cap <= source.key[4]:
                b.prefix_of = source.name
                break
    return baselines


def derived_samples(b: Baseline, source: Baseline) -> list[tuple[Comparison, Comparison]]:
    """Speculative samples of b that are the first prompts (capped) of one of source's samples
    with per-prompt lengths and the same gamma."""
    found = []
    for s in b.samples:
        for t in source.samples:
            if t.spec_rows is None or t.gamma != s.gamma:
                continue
            if prefix_total(t.spec_rows, b.key[3], b.key[4]) == s.spec:
                found.append((s, t))
                break
    return found


def plain_rank(plain: int, totals: Sequence[int]) -> float:
    """Mid-rank of plain among plain and totals (1 = shortest)."""
    return 1 + sum(t < plain for t in totals) + sum(t == plain for t in totals) / 2


def rank_sum_test(plain: Sequence[int], samples: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Plain's mid-rank per prompt among plain and the samples' lengths, summed; its exact
    distribution were plain exchangeable with the samples at every prompt (prompts independent)."""
    ranks, dist = [], {0: 1.0}
    for j, x in enumerate(plain):
        column = [x] + [s[j] for s in samples]
        # doubled mid-ranks (integers) of every value of the column: plain's rank is one of them
        doubled = [
            2 + 2 * sum(o < v for o in column) + sum(o == v for o in column) - 1 for v in column
        ]
        ranks.append(doubled[0] / 2)
        step: dict[int, float] = {}
        for total, p in dist.items():
            for d in doubled:
                step[total + d] = step.get(total + d, 0.0) + p / len(doubled)
        dist = step
    observed = round(2 * sum(ranks))
    return {
        "ranks": ranks,
        "rank_sum": observed / 2,
        "expected": sum(t * p for t, p in dist.items()) / 2,
        "p_at_most": sum(p for t, p in dist.items() if t <= observed),
    }


def row_table(b: Baseline) -> list[dict[str, Any]]:
    samples = [s.spec_rows for s in b.samples if s.spec_rows is not None]
    cap = b.key[4]
    table = []
    for j, x in enumerate(b.rows or ()):
        column = [s[j] for s in samples]
        table.append(
            {
                "prompt": j,
                "plain": x,
                "spec_at_cap": sum(v >= cap for v in column),
                "spec_median": statistics.median(column),
                "spec_mean": statistics.fmean(column),
                "plain_rank": plain_rank(x, column),
            }
        )
    return table


def shared_lengths(plain: Sequence[int], samples: Sequence[Sequence[int]], cap: int) -> dict:
    """Prompts where two samples stop at the very same length below the cap, per pair: plain
    against each speculative sample, and speculative samples among themselves (draws that share
    randomness would share stops more often than independent ones)."""

    def shared(a: Sequence[int], b: Sequence[int]) -> int:
        return sum(x == y and x < cap for x, y in zip(a, b))

    with_plain = [shared(plain, s) for s in samples]
    among = [shared(a, b) for i, a in enumerate(samples) for b in samples[i + 1 :]]
    return {
        "plain_spec_mean": statistics.fmean(with_plain) if with_plain else None,
        "spec_spec_mean": statistics.fmean(among) if among else None,
        "spec_spec_max": max(among) if among else None,
    }


def other_t1_files(root: pathlib.Path) -> list[dict[str, Any]]:
    """T = 1 comparisons in result files other than benchmark.json (not in the count)."""
    found = []
    for path in sorted(root.rglob("*.json")):
        if path.name == "benchmark.json":
            continue
        result = json.loads(path.read_text())
        if not isinstance(result, dict):
            continue
        name = str(path.relative_to(root.parent))
        for _, cell in t1_cells(result):
            if cell.get("points"):
                plain = cell["points"][0]["plain_tokens"]
                totals = [p["speculative_tokens"] for p in cell["points"]]
                cap = (result.get("num_examples") or 0) * (
                    (result.get("feature_lengths") or {}).get("targets") or 0
                )
                found.append(_other(name, plain, totals, cap))
            elif isinstance(cell.get("programs"), dict):
                programs = cell["programs"]
                plain = programs.get("ours plain", {}).get("tokens")
                totals = [
                    p["tokens"]
                    for n, p in programs.items()
                    if n.startswith("ours ") and n != "ours plain"
                ]
                cap = len(result.get("prompts") or []) * (result.get("max_new_tokens") or 0)
                if plain is not None:
                    found.append(_other(name, plain, totals, cap))
    return found


def _other(name: str, plain: int, totals: Sequence[int], cap: int) -> dict[str, Any]:
    return {
        "file": name,
        "plain": plain,
        "cap": cap,
        "comparisons": len(totals),
        "longer": sum(t > plain for t in totals),
        "shorter": sum(t < plain for t in totals),
        "plain_at_cap": plain == cap,
        "plain_rank": plain_rank(plain, totals),
    }


def analyse(root: pathlib.Path) -> dict[str, Any]:
    comparisons, lossy = read_comparisons(root)
    baselines = build_baselines(comparisons)
    by_name = {b.name: b for b in baselines}
    report: dict[str, Any] = {
        "comparisons": [dataclasses.asdict(c) for c in comparisons],
        "count": {
            "comparisons": len(comparisons),
            "longer": sum(c.spec > c.plain for c in comparisons),
            "shorter": sum(c.spec < c.plain for c in comparisons),
            "equal": sum(c.spec == c.plain for c in comparisons),
        },
        "baselines": [],
        "row_agreement": [],
        "lossy_left_out": lossy,
        "other_files": other_t1_files(root),
    }
    for b in baselines:
        totals = [s.spec for s in b.samples]
        entry: dict[str, Any] = {
            "name": b.name,
            "label": b.label,
            "plain": b.plain,
            "files": sorted({c.file for c in b.comparisons}),
            "comparisons": len(b.comparisons),
            "longer": sum(c.spec > c.plain for c in b.comparisons),
            "shorter": sum(c.spec < c.plain for c in b.comparisons),
            "distinct_samples": len(b.samples),
            "sample_totals": sorted(totals),
            "sample_mean": statistics.fmean(totals),
            "sample_sd": statistics.stdev(totals) if len(totals) > 1 else None,
            "plain_rank": plain_rank(b.plain, totals),
            "p_rank_at_most": plain_rank(b.plain, totals) / (len(totals) + 1),
            "prompts": b.key[3],
            "cap": b.key[4],
            "plain_rows": list(b.rows) if b.rows else None,
            "prefix_of": b.prefix_of,
        }
        if b.prefix_of:
            pairs = derived_samples(b, by_name[b.prefix_of])
            entry["samples_from_prefix_of"] = [
                f"{s.variant} g{s.gamma} {s.spec} = {t.file} {t.variant} g{t.gamma}"
                for s, t in pairs
            ]
        with_rows = [s.spec_rows for s in b.samples if s.spec_rows is not None]
        if b.rows and with_rows:
            entry["rows"] = row_table(b)
            entry["sample_totals_with_rows"] = [sum(r) for r in with_rows]
            entry["spec_prompts_at_cap"] = [sum(v >= b.key[4] for v in r) for r in with_rows]
            entry["rank_sum_test"] = rank_sum_test(b.rows, with_rows)
            entry["rank_sum_test"]["samples"] = len(with_rows)
            entry["shared_lengths"] = shared_lengths(b.rows, with_rows, b.key[4])
            gaps = sorted(entry["rows"], key=lambda row: row["plain"] - row["spec_mean"])
            entry["largest_gaps"] = [
                {"prompt": g["prompt"], "plain": g["plain"], "spec_mean": g["spec_mean"]}
                for g in gaps[:6]
            ]
        report["baselines"].append(entry)
    report["plain_draws"] = plain_draws(report["baselines"])
    rowed = [b for b in baselines if b.rows]
    for i, a in enumerate(rowed):
        for b in rowed[i + 1 :]:
            if a.key[1:3] == b.key[1:3]:
                n = min(len(a.rows), len(b.rows))
                same = sum(x == y for x, y in zip(a.rows[:n], b.rows[:n]))
                report["row_agreement"].append(
                    {"a": a.name, "b": b.name, "prompts": n, "equal": same}
                )
    return report


def plain_draws(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Baselines joined through prefix_of: each group is one plain draw, cut to fewer prompts or a
    lower cap; its speculative samples counted once (those that are prefixes of a larger
    baseline's samples left out)."""
    by_name = {e["name"]: e for e in entries}
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        root = e["name"]
        while by_name[root]["prefix_of"]:
            root = by_name[root]["prefix_of"]
        groups.setdefault(root, []).append(e)
    return [
        {
            "draw": root,
            "baselines": [e["name"] for e in members],
            "comparisons": sum(e["comparisons"] for e in members),
            "longer": sum(e["longer"] for e in members),
            "shorter": sum(e["shorter"] for e in members),
            "distinct_samples": sum(
                e["distinct_samples"] - len(e.get("samples_from_prefix_of", [])) for e in members
            ),
        }
        for root, members in groups.items()
    ]


def fmt_rank(r: float) -> str:
    return f"{r:g}"


def print_report(r: dict[str, Any], out: Any = sys.stdout) -> None:
    def p(line: str = "") -> None:
        print(line, file=out)

    names = {}
    for b in r["baselines"]:
        for f in b["files"]:
            names.setdefault((f, b["plain"]), b["name"])
    p("1. Exact T = 1 comparisons in benchmarks/**/benchmark.json (cells at temperature 1.0,")
    p("   points with lenience 1.0; tokens: generated tokens summed over the run's prompts)")
    p()
    p(f"{'file':48} {'cell':>4} {'variant':30} {'gamma':>5} {'plain':>6} {'spec':>6}  result  base")
    for c in r["comparisons"]:
        result = (
            "longer" if c["spec"] > c["plain"] else "shorter" if c["spec"] < c["plain"] else "equal"
        )
        variant = str(c["variant"])[:30]
        base = names[(c["file"], c["plain"])]
        p(
            f"{c['file']:48} {c['cell']:>4} {variant:30} {str(c['gamma']):>5} {c['plain']:>6} "
            f"{c['spec']:>6}  {result:7} {base}"
        )
    n = r["count"]
    p()
    p(
        f"speculative longer in {n['longer']} of {n['comparisons']}, shorter in {n['shorter']}, "
        f"equal in {n['equal']}"
    )
    p()
    p("2.-3. Plain baselines: comparisons sharing each, distinct speculative samples, plain's rank")
    p()
    for b in r["baselines"]:
        sd = "" if b["sample_sd"] is None else f", sd {b['sample_sd']:.0f}"
        p(f"{b['name']}: {b['label']}")
        p(f"   files: {', '.join(b['files'])}")
        p(
            f"   comparisons {b['comparisons']} (longer {b['longer']}, shorter {b['shorter']}); "
            f"distinct speculative samples {b['distinct_samples']}: {b['sample_totals']} "
            f"(mean {b['sample_mean']:.0f}{sd})"
        )
        p(
            f"   plain {b['plain']} ranks {fmt_rank(b['plain_rank'])} of "
            f"{b['distinct_samples'] + 1} (1 = shortest); P(rank <= that) = {b['p_rank_at_most']:.3f}"
        )
        if b["plain_rows"]:
            p(f"   plain per prompt: {b['plain_rows']}")
        if b["prefix_of"]:
            p(
                f"   plain = {b['prefix_of']}'s plain per-prompt lengths, first {b['prompts']} "
                f"prompts, each capped at {b['cap']}"
            )
            for s in b.get("samples_from_prefix_of", []):
                p(f"     speculative {s} (same prefix)")
    p()
    p("One plain draw each (baselines that are another's first prompts joined):")
    for d in r["plain_draws"]:
        p(
            f"   {d['draw']} ({' + '.join(d['baselines'])}): {d['comparisons']} comparisons, "
            f"longer {d['longer']}, shorter {d['shorter']}; distinct speculative samples "
            f"{d['distinct_samples']}"
        )
    p()
    for a in r["row_agreement"]:
        p(
            f"per-prompt plain lengths equal in {a['equal']} of {a['prompts']} prompts: "
            f"{a['a']} and {a['b']}"
        )
    p()
    p("4. Per prompt, where the files have per-prompt lengths")
    for b in r["baselines"]:
        if "rows" not in b:
            continue
        t = b["rank_sum_test"]
        p()
        p(f"{b['name']} ({b['label']}), {t['samples']} distinct speculative samples with rows")
        p(
            f"   {'prompt':>6} {'plain':>6} {'spec at cap':>11} {'spec median':>11} {'spec mean':>9} {'plain rank':>10}"
        )
        for row in b["rows"]:
            p(
                f"   {row['prompt']:>6} {row['plain']:>6} {row['spec_at_cap']:>11} "
                f"{row['spec_median']:>11g} {row['spec_mean']:>9.1f} {fmt_rank(row['plain_rank']):>10}"
            )
        at_cap = sum(x >= b["cap"] for x in b["plain_rows"])
        p(f"   plain prompts at the cap: {at_cap} of {len(b['plain_rows'])}")
        gap = statistics.fmean(b["sample_totals_with_rows"]) - b["plain"]
        largest = ", ".join(
            f"{g['prompt']} ({g['spec_mean'] - g['plain']:+.1f})" for g in b["largest_gaps"]
        )
        p(
            f"   mean speculative total with rows minus plain: {gap:+.1f}; largest per prompt: {largest}"
        )
        caps = b["spec_prompts_at_cap"]
        p(f"   speculative prompts at the cap: {caps} (mean {statistics.fmean(caps):.1f})")
        p(
            f"   rank sum {t['rank_sum']:g} against {t['expected']:g} expected; "
            f"P(rank sum <= {t['rank_sum']:g}) = {t['p_at_most']:.4f}"
        )
        sh = b["shared_lengths"]
        among = "n/a" if sh["spec_spec_mean"] is None else f"{sh['spec_spec_mean']:.2f}"
        p(
            f"   prompts stopping at the same length below the cap, per pair: plain-speculative "
            f"{sh['plain_spec_mean']:.2f}, speculative-speculative {among} (max {sh['spec_spec_max']})"
        )
    p()
    p("5. Not in the count")
    for x in r["lossy_left_out"]:
        p(
            f"   lossy point {x['file']} {x['variant']} (lenience {x['lenience']}): "
            f"plain {x['plain']}, speculative {x['spec']}"
        )
    for x in r["other_files"]:
        p(
            f"   {x['file']}: plain {x['plain']} (cap {x['cap']}), {x['comparisons']} comparisons: "
            f"longer {x['longer']}, shorter {x['shorter']}; plain ranks {fmt_rank(x['plain_rank'])} "
            f"of {x['comparisons'] + 1}" + (" (plain at the cap)" if x["plain_at_cap"] else "")
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=pathlib.Path, default=ROOT / "benchmarks")
    parser.add_argument(
        "--json", type=pathlib.Path, default=None, help="also write the report here"
    )
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        print(f"error: {args.root}: no such folder", file=sys.stderr)
        return 2
    report = analyse(args.root)
    print_report(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
