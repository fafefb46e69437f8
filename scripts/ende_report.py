"""The EnDe reproduction's tables (docs/reproduction.md) from what scripts/reproduce_ende.sh left
in runs/ende: the trained models, Table 3 (alpha per draft), Table 2 (interleaved speedups on
the test split at the gamma chosen on the validation split, with bootstrap intervals), the Table 2
rows over the whole test split, distillation before / after, and BLEU (sacrebleu) of plain vs
speculative decoding.

    python scripts/ende_report.py --runs runs/ende --out benchmarks/ende_repro

Writes OUT/report.json (every number below) and OUT/report.md (the tables), and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import sys
from collections.abc import Mapping
from typing import Any

from speculative import benchmark_report, provenance

TARGETS = ("target", "target_regularised")  # the dictionary's run, the larger corpus's
MODELS = (*TARGETS, "draft_small", "draft_base", "draft_large", "draft_small_distilled")
DRAFTS = ("small", "base", "large", "small_distilled", "unigram", "bigram")
TEMPERATURES = (0, 1)
# Leviathan et al. (ICML 2023), Table 2, EnDe, T5-XXL target: (draft, T) -> (gamma, alpha, speedup).
PAPER = {
    ("small", 0): (7, 0.75, 3.4),
    ("base", 0): (7, 0.80, 2.8),
    ("large", 0): (7, 0.82, 1.7),
    ("small", 1): (7, 0.62, 2.6),
    ("base", 1): (5, 0.68, 2.4),
    ("large", 1): (3, 0.71, 1.4),
}

# Table 3's n-gram drafts, alpha only (the paper times no n-gram draft): (draft, T) -> alpha.
PAPER_NGRAM_ALPHA = {
    ("unigram", 0): 0.08,
    ("unigram", 1): 0.07,
    ("bigram", 0): 0.20,
    ("bigram", 1): 0.19,
}


def paper_alpha(draft: str, temperature: float) -> float | None:
    """The paper's Table 3 alpha for this draft and temperature (EnDe, T5-XXL), or None."""
    key = (draft, int(temperature))
    return PAPER[key][1] if key in PAPER else PAPER_NGRAM_ALPHA.get(key)


def run_commits(runs: pathlib.Path) -> dict[str, Any]:
    """The code every run ran: {"commits": {commit: [runs]}, "dirty": [runs from a modified tree],
    "unknown": [runs without a commit]}, from each summary.json / benchmark.json's provenance (the
    report's own git_commit is only the code that wrote it)."""
    commits: dict[str, list[str]] = {}
    dirty, unknown = [], []
    for path in sorted([*runs.rglob("summary.json"), *runs.rglob("benchmark.json")]):
        data = _json(path)
        source = data.get("provenance") if isinstance(data, Mapping) else None
        run = str(path.parent.relative_to(runs))
        commit = source.get("git_commit") if isinstance(source, Mapping) else None
        if commit is None:
            unknown.append(run)
            continue
        commits.setdefault(commit, []).append(run)
        if source.get("git_dirty"):
            dirty.append(run)
    return {"commits": commits, "dirty": dirty, "unknown": unknown}


def _json(path: pathlib.Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def _rows(run: pathlib.Path) -> list[dict] | None:
    path = run / "predictions.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return sorted(rows, key=lambda r: r["index"])


def _times(runs: pathlib.Path) -> dict[str, int]:
    path = runs / "times.tsv"
    if not path.exists():
        return {}
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        name, seconds = line.split("\t")
        out[name] = out.get(name, 0) + int(seconds)  # a resumed step adds up
    return out


def models_table(runs: pathlib.Path, times: Mapping[str, int]) -> list[dict]:
    rows = []
    for name in MODELS:
        summary = _json(runs / name / "summary.json")
        if summary is None:
            continue
        rows.append(
            {
                "model": name,
                "parameters": summary["parameters"],
                "steps": summary["steps"],
                # to this checkpoint (resumed runs summed); older runs logged no wall time
                "train_s": summary.get("train_s"),
                "train_loss": summary.get("loss"),
                "validation_loss": summary.get("validation_loss"),
                **alone_bleu(runs, name),
            }
        )
    return rows


def alone_bleu(runs: pathlib.Path, model: str) -> dict[str, Any]:
    """BLEU of the model's own greedy translations of the test split, and their mean length; {}
    where that run is missing. A draft's run is runs/alone/<model> (scripts/reproduce_ende.sh);
    the target's is Table 2's plain T = 0 row, the same greedy outputs at any batch size."""
    run = runs / "rows" / "t0_plain" if model in TARGETS else runs / "alone" / model
    rows = _rows(run) if _json(run / "summary.json") is not None else None
    if not rows:
        return {}
    return {
        "test_bleu": _bleu(rows),
        "test_examples": len(rows),
        "mean_output_tokens": statistics.mean(r["length"] for r in rows),
    }


def alpha_table(runs: pathlib.Path) -> list[dict]:
    """Table 3: alpha of each draft over the held-out splits (infer runs at gamma 4)."""
    rows = []
    for t in TEMPERATURES:
        for draft in DRAFTS:
            s = _json(runs / "alpha" / f"t{t}_{draft}" / "summary.json")
            if s is None:
                continue
            rows.append(
                {
                    "draft": draft,
                    "temperature": t,
                    "alpha": s["alpha"],
                    "tokens": s["tokens"],
                    "examples": s["examples"],
                    "tau": s["tau"],
                    "gamma": s["gamma"],
                }
            )
            forced = _json(runs / "alpha_tf" / f"t{t}_{draft}.json")
            if forced is not None:
                rows[-1].update(alpha_all_positions=forced["alpha"], forced_tokens=forced["tokens"])
    return rows


def _benchmark(runs: pathlib.Path, name: str) -> Mapping[str, Any] | None:
    return _json(runs / name / "benchmark.json")


def benchmark_table(runs: pathlib.Path) -> list[dict]:
    """Table 2 (interleaved, one plain baseline per temperature): per draft, the alpha and c the
    benchmark measured, Theorem 3.8's prediction, and the speedup measured (with its bootstrap
    mean and 95% interval) at the row's gamma (`benchmark_report.chosen_rows`).

    The gamma: with benchmark_validation_t{T} and benchmark_test_t{T}, the one of the best
    bootstrap-mean speedup on the validation sweep, measured on the test split (choosing the
    best of a sweep on the inputs it is reported on would bias it upward); otherwise (runs from
    before that split, benchmark_t{T}) Theorem 3.8's best, with the best speedup of the sweep."""
    rows = []
    for t in TEMPERATURES:
        validation = _benchmark(runs, f"benchmark_validation_t{t}")
        test = _benchmark(runs, f"benchmark_test_t{t}")
        if validation is None or test is None:
            test, validation = _benchmark(runs, f"benchmark_t{t}"), None
        try:
            rows += [] if test is None else benchmark_report.chosen_rows(test, validation)
        except ValueError as e:
            raise SystemExit(f"error: benchmark_test_t{t}/benchmark.json: {e}") from None
    return rows


def validation_gamma(runs: pathlib.Path, draft: str, temperature: float) -> int | None:
    """The gamma of `draft`'s best bootstrap-mean speedup in the validation sweep at T, or None."""
    validation = _benchmark(runs, f"benchmark_validation_t{int(temperature)}")
    cell = benchmark_report.cell_at(validation or {"cells": []}, temperature)
    points = benchmark_report.variant_points(cell, draft)
    return benchmark_report.best_mean_gamma(points) if points else None


def table2_gamma(runs: pathlib.Path, draft: str, temperature: float) -> int | None:
    """The gamma of `draft`'s Table 2 row at T (`benchmark_table`), or None."""
    rows = benchmark_table(runs)
    return next(
        (r["gamma"] for r in rows if (r["draft"], r["temperature"]) == (draft, temperature)), None
    )


def _bleu(rows: list[dict]) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu([r["output"] for r in rows], [[r["targets"] for r in rows]]).score


def rows_table(runs: pathlib.Path) -> list[dict]:
    """The Table 2 rows over the whole test split (separate infer runs, not interleaved): tokens
    per second against the plain run at the same temperature and seed, and BLEU."""
    out = []
    for t in TEMPERATURES:
        plain_dir = runs / "rows" / f"t{t}_plain"
        plain, plain_rows = _json(plain_dir / "summary.json"), _rows(plain_dir)
        if plain is None:
            continue
        plain_tok_s = plain["this_run"]["tokens_per_s"]
        out.append(
            {
                "draft": "plain",
                "temperature": t,
                "gamma": None,
                "alpha": None,
                "tok_s": plain_tok_s,
                "speedup": 1.0,
                "bleu": _bleu(plain_rows),
                "identical_to_plain": True,
            }
        )
        for draft in DRAFTS:
            run = runs / "rows" / f"t{t}_{draft}"
            s, rows = _json(run / "summary.json"), _rows(run)
            if s is None:
                continue
            same = [r["output_ids"] for r in rows] == [r["output_ids"] for r in plain_rows]
            out.append(
                {
                    "draft": draft,
                    "temperature": t,
                    "gamma": s["gamma"],
                    "alpha": s["alpha"],
                    "tau": s["tau"],
                    "tok_s": s["this_run"]["tokens_per_s"],
                    "speedup": s["this_run"]["tokens_per_s"] / plain_tok_s,
                    "predicted_speedup": s.get("predicted_speedup"),
                    "c": s.get("c"),
                    "bleu": _bleu(rows),
                    "identical_to_plain": same,
                }
            )
    return out


def seed_bleu(runs: pathlib.Path) -> dict[str, list[float]]:
    """T = 1 BLEU over seeds 0, 1, 2: plain and the small draft's speculative decoding."""
    out = {}
    for kind in ("plain", "small"):
        names = [f"t1_{kind}"] + [f"t1_{kind}_seed{s}" for s in (1, 2)]
        rows = [_rows(runs / "rows" / n) for n in names]
        out[kind] = [_bleu(r) for r in rows if r is not None]
    return out


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "" if x is None else format(x, spec)


def _gamma_choice(r: Mapping[str, Any]) -> str:
    if r["gamma_from"] == "validation":
        chosen = r["validation"]
        mean = benchmark_report.ci_text(chosen) or f"{chosen['speedup']:.2f}x"
        return f"validation: {mean}; Thm 3.8: {r['theorem_gamma']}"
    return f"Thm 3.8; best measured {r['best_speedup']:.2f}x ({r['best_gamma']})"


def table2_markdown(rows: list[Mapping[str, Any]]) -> list[str]:
    """Table 2's lines: what chose each gamma, then a row per draft and temperature."""
    lines = ["", "### Table 2: interleaved benchmark, batch 1", ""]
    if any(r["gamma_from"] == "validation" for r in rows):
        lines += [
            "γ chosen on validation: the best bootstrap-mean speedup of the validation split's "
            "sweep, then measured on the test split. Mean [95% CI]: bootstrap over inputs and "
            "repeats. Output tokens: mean per example, speculative / plain.",
            "",
        ]
    if any(r["gamma_from"] == "Thm 3.8" for r in rows):
        lines += ["γ = Thm 3.8's best (the nearest swept); best measured: the sweep's best.", ""]
    lines += [
        "| draft | T | γ | α | c | Thm 3.8 | verify (steps) | cost model | measured | mean [95% CI] "
        "| decode-only | output tokens | γ chosen by | paper γ / α / speedup |",
        "| --- " + "| ---: " * 11 + "| --- | ---: |",
    ]
    for r in rows:
        paper = PAPER.get((r["draft"], r["temperature"]))
        paper_text = "" if paper is None else f"{paper[0]} / {paper[1]} / {paper[2]}X"
        lengths = (r.get("mean_output_tokens"), r.get("plain_mean_output_tokens"))
        lines.append(
            f"| {r['draft']} | {r['temperature']} | {r['gamma']} | {r['alpha']:.3f} | {r['c']:.3f} "
            f"| {r['predicted_speedup']:.2f}x | {_fmt(r['verify_steps'], '.2f')} "
            f"| {_fmt(r['cost_model_speedup'], '.2f')}x | {r['speedup']:.2f}x "
            f"| {benchmark_report.ci_text(r)} "
            f"| {_fmt(r['decode_speedup'], '.2f')}x "
            f"| {'' if None in lengths else '{:.1f} / {:.1f}'.format(*lengths)} "
            f"| {_gamma_choice(r)} | {paper_text} |"
        )
    return lines


def markdown(report: Mapping[str, Any]) -> str:
    lines = [
        "### Models",
        "",
        "| model | parameters | steps | train wall | train loss | val loss (perplexity) "
        "| test BLEU, alone | mean output tokens |",
    ]
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in report["models"]:
        wall = "" if m["train_s"] is None else f"{m['train_s'] / 60:.1f} min"
        loss = m["validation_loss"]
        val = "" if loss is None else f"{loss:.3f} ({math.exp(loss):.1f})"
        lines.append(
            f"| {m['model']} | {m['parameters'] / 1e6:.2f}M | {m['steps']} | {wall} "
            f"| {_fmt(m['train_loss'])} | {val} | {_fmt(m.get('test_bleu'), '.2f')} "
            f"| {_fmt(m.get('mean_output_tokens'), '.1f')} |"
        )
    lines += [
        "",
        "### Table 3: α per draft (held-out inputs; target tokens: how many were scored)",
        "",
    ]
    lines += [
        "| draft | T | α (decode, γ 4) | α (every position) | target tokens | paper α (T5-XXL, EnDe) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in report["alpha"]:
        paper = paper_alpha(r["draft"], r["temperature"])
        lines.append(
            f"| {r['draft']} | {r['temperature']} | {r['alpha']:.3f} "
            f"| {_fmt(r.get('alpha_all_positions'))} | {r['tokens']} "
            f"| {'' if paper is None else paper} |"
        )
    lines += table2_markdown(report["benchmark"])
    lines += ["", "### Table 2 rows over the whole test split (infer job; BLEU)", ""]
    lines += [
        "| draft | T | γ | α | τ | tok/s | speedup | BLEU | tokens identical to plain |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in report["rows"]:
        same = "yes" if r["identical_to_plain"] else ("no (sampled)" if r["temperature"] else "NO")
        lines.append(
            f"| {r['draft']} | {r['temperature']} | {_fmt(r['gamma'], 'd')} | {_fmt(r['alpha'])} "
            f"| {_fmt(r.get('tau'), '.2f')} | {r['tok_s']:.0f} | {r['speedup']:.2f}x | {r['bleu']:.2f} | {same} |"
        )
    seeds = report["seed_bleu"]
    if seeds.get("plain"):
        lines += ["", "T = 1 BLEU over seeds 0, 1, 2:", ""]
        for kind, values in seeds.items():
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            listed = ", ".join(f"{v:.2f}" for v in values)
            lines.append(f"- {kind}: {listed} (mean {statistics.mean(values):.2f} ± {spread:.2f})")
    if "runs_code" in report:
        lines += ["", code_line(report["runs_code"])]
    return "\n".join(lines) + "\n"


def code_line(code: Mapping[str, Any]) -> str:
    """One line on the code the runs ran (`run_commits`): one clean commit, or what differs."""
    commits = sorted(code["commits"])
    text = f"Runs from commit{'s' if len(commits) > 1 else ''} " + (
        ", ".join(c[:12] for c in commits) or "(none recorded)"
    )
    if code["dirty"]:
        text += f"; from a modified tree: {', '.join(code['dirty'])}"
    if code["unknown"]:
        text += f"; without a recorded commit: {', '.join(code['unknown'])}"
    return text + ("." if len(commits) == 1 and not code["dirty"] else " (not one clean commit).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=pathlib.Path, default=pathlib.Path("runs/ende"))
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/ende_repro"))
    parser.add_argument(
        "--gamma_for",
        nargs=2,
        metavar=("DRAFT", "T"),
        help="print the Table 2 row's gamma (chosen on validation; without that run, Thm 3.8's "
        "best for the benchmark's alpha and c)",
    )
    parser.add_argument(
        "--validation_gamma",
        nargs=2,
        metavar=("DRAFT", "T"),
        help="print the gamma of DRAFT's best bootstrap-mean speedup in the validation sweep at T",
    )
    args = parser.parse_args(argv)
    if args.validation_gamma or args.gamma_for:
        draft, t = args.validation_gamma or args.gamma_for
        pick, where = (
            (validation_gamma, "validation ") if args.validation_gamma else (table2_gamma, "")
        )
        gamma = pick(args.runs, draft, float(t))
        if gamma is None:
            print(f"no {where}benchmark point for draft {draft} at T = {t}", file=sys.stderr)
            return 2
        print(gamma)
        return 0
    times = _times(args.runs)
    report = {
        **provenance.git_state(),  # git_commit, git_dirty: the code that wrote the report
        "runs_code": run_commits(args.runs),  # and the code each run ran
        "times_s": times,
        "models": models_table(args.runs, times),
        "alpha": alpha_table(args.runs),
        "benchmark": benchmark_table(args.runs),
        "rows": rows_table(args.runs),
        "seed_bleu": seed_bleu(args.runs),
        "paper": {f"{d}_t{t}": v for (d, t), v in PAPER.items()},
        "paper_ngram_alpha": {f"{d}_t{t}": a for (d, t), a in PAPER_NGRAM_ALPHA.items()},
    }
    if not any(report[part] for part in ("models", "alpha", "benchmark", "rows")):
        # a report of nothing would overwrite the one the docs cite
        print(
            f"nothing to report in {args.runs}: run scripts/reproduce_ende.sh first",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    (args.out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
