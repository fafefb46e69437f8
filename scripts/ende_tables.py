"""The EnDe report's tables as markdown (report.md), from report.json alone (scripts/ende_report.py
builds it), beside the paper's numbers they are compared with: Leviathan et al. (ICML 2023),
Tables 2 and 3, EnDe, T5-XXL target.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from speculative.measure import report as benchmark_report

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
    lines = [f"**{partial_line(report['partial'])}**", ""] if report.get("partial") else []
    lines += [
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


def partial_line(read: list[str]) -> str:
    """The label of a report built with --allow_partial from `Partial.read`."""
    return f"PARTIAL REPORT (--allow_partial): built from {'; '.join(read)}."
