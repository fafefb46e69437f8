#!/usr/bin/env python
"""docs/spec_bench.md's tables from the files a Spec-Bench run and the cost probe wrote: per task,
Spec-Bench's speedup, our end-to-end ratio, tokens per second, tau, alpha, acceptance by draft
position, mean prompt and answer lengths, and the share of plain decoding's time the target's
prefill takes (the prefill seconds of `scripts/spec_bench_costs.py`, interpolated at each turn's
padded prompt width, over the turn's measured seconds).

    python scripts/spec_bench_report.py benchmarks/spec_bench_qwen_cpu \
        [--costs benchmarks/spec_bench_costs/costs.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

from speculative.data.spec_bench import TASKS


def prefill_estimate(costs: dict, width: int) -> float:
    """The target's prefill seconds at `width` prompt tokens, linear between measured widths."""
    measured = sorted((int(w), s) for w, s in costs["prefill_s"]["target"].items())
    return float(np.interp(width, [w for w, _ in measured], [s for _, s in measured]))


def prefill_share(rows: list[dict], costs: dict, multiple: int = 128) -> float:
    """Estimated share of plain decoding's seconds spent in the target's prefill."""
    turns = [t for r in rows for t in r["programs"]["plain"]["turns"]]
    prefill = sum(
        prefill_estimate(costs, -(-t["prompt_tokens"] // multiple) * multiple) for t in turns
    )
    return prefill / sum(t["wall_time"] for t in turns)


def table(run: pathlib.Path, costs: dict | None) -> str:
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(x) for x in (run / "predictions.jsonl").read_text().splitlines()]
    lines = [
        "| task | questions | turns | prompt / answer tokens | plain tok/s | speculative tok/s | "
        "Spec-Bench speedup | end to end | τ | α | acceptance by position | identical | "
        "prefill share (plain) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for group in [*TASKS, "overall"]:
        if group not in summary["scores"]:
            continue
        plain, spec = summary["scores"][group]["plain"], summary["scores"][group]["speculative"]
        chosen = [r for r in rows if group == "overall" or r["task"] == group]
        turns = [t for r in chosen for t in r["programs"]["plain"]["turns"]]
        prompt = np.mean([t["prompt_tokens"] for t in turns])
        answer = np.mean([t["new_tokens"] for t in turns])
        by_position = " / ".join(f"{x:.2f}" for x in spec["acceptance_by_position"])
        share = f"{prefill_share(chosen, costs):.0%}" if costs else "-"
        lines.append(
            f"| {group} | {spec['questions']} | {len(turns)} | {prompt:.0f} / {answer:.0f} | "
            f"{plain['mean_tokens_per_s']:.2f} | {spec['mean_tokens_per_s']:.2f} | "
            f"**{spec['speedup']:.2f}x** | {spec['end_to_end']:.2f}x | {spec['tau']:.2f} | "
            f"{spec['alpha']:.3f} | {by_position} | {spec['identical']}/{spec['questions']} | "
            f"{share} |"
        )
    return "\n".join(lines)


def ceiling_table(costs: dict, alphas: tuple[float, ...] = (0.8, 0.9, 1.0)) -> str:
    """Decode-only speedup the measured costs allow a chain of gamma drafts: tau(alpha, gamma)
    target steps' worth of tokens per round of gamma draft steps and one (gamma + 1)-token verify
    call, tau = (1 - alpha^(gamma+1)) / (1 - alpha) (Eq. 1). alpha = 1 is the ceiling."""
    steps = costs["target"]["extend_in_steps"]
    drafts = costs["drafts"]
    header = " | ".join(
        f"{name} (c {d['c']:.3f}), α {a:g}" for name, d in drafts.items() for a in alphas
    )
    lines = [
        f"| γ | verify call (target steps) | {header} |",
        "|---|---|" + "---|" * (len(drafts) * len(alphas)),
    ]
    for gamma in range(1, 12):
        if str(gamma + 1) not in steps:
            continue
        verify = steps[str(gamma + 1)]
        cells = []
        for d in drafts.values():
            for a in alphas:
                tau = gamma + 1 if a == 1 else (1 - a ** (gamma + 1)) / (1 - a)
                cells.append(f"{tau / (gamma * d['c'] + verify):.2f}x")
        lines.append(f"| {gamma} | {verify:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=pathlib.Path, help="a Spec-Bench job's OUTPUT_DIR")
    parser.add_argument("--costs", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    costs = json.loads(args.costs.read_text()) if args.costs else None
    print(table(args.run, costs))
    if costs:
        print()
        print(ceiling_table(costs))


if __name__ == "__main__":
    main(sys.argv[1:])
