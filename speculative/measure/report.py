"""Reporting of the benchmark job's result (benchmark.json): the markdown table and the printed
summary (the plots: measure/plots.py). Everything here reads the JSON form only, so a committed
benchmark.json can be rendered again without running anything (read with `read_benchmark`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from speculative.errors import JobError, read_result_json
from speculative.measure import metrics


def read_benchmark(path: str | os.PathLike, allow_partial: bool = False) -> dict[str, Any]:
    """A benchmark.json, or a JobError naming it: missing, torn, without a list of "cells", or
    not marked complete (`partial_reason`) unless `allow_partial` (the report must say so)."""
    result = read_result_json(path, required=("cells",))
    if not isinstance(result["cells"], list):
        raise JobError("'cells' is not a list: not a benchmark.json", path=path)
    if partial_reason(result) and not allow_partial:
        what = "rerun the sweep to its end, or pass --allow_partial for a report labelled partial"
        raise JobError(f"{partial_reason(result)}; refused: {what}", path=path)
    return result


def partial_reason(result: Mapping[str, Any]) -> str | None:
    """Why a benchmark.json is not a finished sweep, or None when it is marked "complete": true."""
    if result.get("complete") is True:
        return None
    if result.get("complete") is None:
        return 'is not marked "complete" (from before benchmark.json recorded it?)'
    return 'is marked "complete": false (a sweep still running, or cut short)'


def ci_text(point: Mapping[str, Any]) -> str:
    """A point's bootstrap mean and 95% interval, "1.04x [0.98, 1.10]"; "1.04x [n/a]" when the run
    had too few batches x repeats for an interval; "" for a benchmark.json from before either."""
    interval = point.get("speedup_ci95")
    if interval is None:
        mean = point.get("speedup_mean")
        return "" if mean is None else f"{mean:.2f}x [n/a]"
    return f"{point['speedup_mean']:.2f}x [{interval[0]:.2f}, {interval[1]:.2f}]"


def variant_points(cell: Mapping[str, Any], variant: str) -> dict[int, Mapping[str, Any]]:
    """{gamma: point} of one variant in a benchmark.json cell."""
    return {p["gamma"]: p for p in cell["points"] if p.get("variant") == variant}


def best_mean_gamma(points: Mapping[int, Mapping[str, Any]]) -> int:
    """The gamma of the best bootstrap-mean speedup among {gamma: point} (the measured speedup
    for a benchmark.json from before the bootstrap); the smaller gamma on a tie."""
    return max(sorted(points), key=lambda g: points[g].get("speedup_mean", points[g]["speedup"]))


def cell_at(result: Mapping[str, Any], temperature: float) -> Mapping[str, Any]:
    """The first cell of a benchmark.json at `temperature` (an empty one when none is)."""
    cells = [c for c in result["cells"] if c["temperature"] == temperature]
    return cells[0] if cells else {"points": [], "temperature": temperature}


def chosen_rows(
    result: Mapping[str, Any], validation: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One row per (cell, variant) of a benchmark.json swept with VARIANTS, at one gamma each.

    With `validation` (the same variants' sweep on other inputs, e.g. a validation split) the
    gamma is the variant's best bootstrap-mean speedup there ("gamma_from": "validation"; the
    row's "validation" holds that point's mean and interval): picking the best of a sweep on the
    inputs it is reported on would bias its speedup upward. Without, it is Theorem 3.8's best
    for the measured alpha and c, the nearest swept ("Thm 3.8"), beside the sweep's best.
    Raises ValueError when the validation run lacks a variant or chose a gamma `result` lacks."""
    rows = []
    for cell in result["cells"]:
        for name, v in cell.get("variants", {}).items():
            points = variant_points(cell, name)
            if not points:
                continue
            if validation is None:
                row = _theorem_choice(v, points)
            else:
                swept = variant_points(cell_at(validation, cell["temperature"]), name)
                row = _validation_choice(name, v, points, swept)
            p = points[row["gamma"]]
            rows.append(
                {
                    "draft": name,
                    "temperature": cell["temperature"],
                    "alpha": v["alpha"],
                    "c": v["c"],
                    **row,
                    "predicted_speedup": metrics.predicted_speedup(v["alpha"], p["gamma"], v["c"]),
                    "speedup": p["speedup"],
                    "speedup_mean": p.get("speedup_mean"),  # None: a run from before the bootstrap
                    "speedup_ci95": p.get("speedup_ci95"),
                    "decode_speedup": p.get("decode_speedup"),
                    "cost_model_speedup": p.get("cost_model_speedup"),
                    "verify_steps": _verify_steps(cell, p["gamma"]),
                    "mean_output_tokens": p.get("speculative_mean_output_tokens"),
                    "plain_mean_output_tokens": cell.get("plain_mean_output_tokens"),
                    "greedy_identical": p.get("greedy_identical_to_plain"),
                    "plain_ms_per_token": 1e3 * cell["plain_s_per_token"],
                    "target_step_ms": 1e3 * cell["target_step_s"],
                    "examples": result.get("num_examples"),
                }
            )
    return rows


def _theorem_choice(v: Mapping[str, Any], points: Mapping[int, Any]) -> dict[str, Any]:
    theorem = metrics.optimal_gamma(v["alpha"], v["c"], max_gamma=max(points))
    best = max(points.values(), key=lambda p: p["speedup"])
    return {
        "gamma": min(points, key=lambda g: (abs(g - theorem), g)),
        "gamma_from": "Thm 3.8",
        "theorem_gamma": theorem,
        "best_gamma": best["gamma"],
        "best_speedup": best["speedup"],
    }


def _validation_choice(
    name: str, v: Mapping[str, Any], points: Mapping[int, Any], swept: Mapping[int, Any]
) -> dict[str, Any]:
    if not swept:
        raise ValueError(f"the validation run has no point of variant {name!r}")
    gamma = best_mean_gamma(swept)
    if gamma not in points:
        raise ValueError(f"variant {name!r} did not run gamma {gamma}, chosen on validation")
    chosen = swept[gamma]
    return {
        "gamma": gamma,
        "gamma_from": "validation",
        "theorem_gamma": metrics.optimal_gamma(v["alpha"], v["c"], max_gamma=max(swept)),
        "validation": {
            "gamma": gamma,
            "speedup": chosen["speedup"],
            "speedup_mean": chosen.get("speedup_mean"),
            "speedup_ci95": chosen.get("speedup_ci95"),
        },
    }


def _verify_steps(cell: Mapping[str, Any], gamma: int) -> float | None:
    """The verify call (the target's extend by gamma + 1 tokens) in one-token steps."""
    extend = cell.get("target_extend_s", {}).get(str(gamma + 1))
    return None if extend is None else extend / cell["target_step_s"]


def table_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Flat rows: batch, temperature, gamma, alpha, tau, c, measured / predicted speedup (with
    its bootstrap mean and 95% interval, "ci"), tok/s."""
    rows = []
    for cell in result["cells"]:
        for p in cell["points"]:
            rows.append(
                {
                    "batch": cell["batch_size"],
                    "T": _sampling_label(cell),
                    "gamma": p["gamma"],
                    "alpha": p["alpha"],
                    "tau": p["tau"],
                    "c": p.get("c", cell["c"]),  # a variant's draft's (older JSON: the cell's)
                    "speedup": p["speedup"],
                    "ci": ci_text(p),
                    "decode_speedup": p.get("decode_speedup", float("nan")),
                    "predicted": p["predicted_speedup"],
                    "cost_model": p.get("cost_model_speedup", float("nan")),
                    "plain_tok_s": p["plain_tok_s"],
                    "spec_tok_s": p["speculative_tok_s"],
                    "round_ms": 1e3 * p.get("round_s", float("nan")),
                    "parts_ms": 1e3 * p.get("round_parts_s", float("nan")),
                }
            )
    return rows


def batch_curve(result: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per sampling setting: each batch size's best measured gamma and its speedups, by batch.

    Returns {sampling label: [{"batch", "gamma", "speedup", "decode_speedup", "alpha"}, ...]}.
    """
    curves: dict[str, list[dict[str, Any]]] = {}
    for cell in sorted(result["cells"], key=lambda c: c["batch_size"]):
        best = max(cell["points"], key=lambda p: p["speedup"])
        curves.setdefault(_sampling_label(cell), []).append(
            {
                "batch": cell["batch_size"],
                "gamma": best["gamma"],
                "speedup": best["speedup"],
                "decode_speedup": best.get("decode_speedup", float("nan")),
                "alpha": best["alpha"],
            }
        )
    return curves


def crossover_batch(curve: list[Mapping[str, Any]]) -> float | None:
    """The batch size at which the best speedup falls to 1.0, interpolated in log2(batch).

    curve: one sampling setting of batch_curve, sorted by batch. None when speculation wins at
    every measured batch size; the smallest batch when it never wins.
    """
    if curve[0]["speedup"] <= 1.0:
        return float(curve[0]["batch"])
    for lo, hi in zip(curve, curve[1:]):
        if hi["speedup"] <= 1.0:
            x0, x1 = np.log2(lo["batch"]), np.log2(hi["batch"])
            y0, y1 = lo["speedup"] - 1.0, hi["speedup"] - 1.0
            return float(2 ** (x0 + (x1 - x0) * y0 / (y0 - y1)))
    return None


def batch_curve_table(result: Mapping[str, Any]) -> str:
    """Markdown: the best gamma per batch size with its speedup, and the crossover line."""
    lines = [
        "| T | batch | best γ | α | speedup | decode-only speedup |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for label, curve in batch_curve(result).items():
        for r in curve:
            lines.append(
                f"| {label} | {r['batch']} | {r['gamma']} | {r['alpha']:.3f} | {r['speedup']:.2f}x "
                f"| {r['decode_speedup']:.2f}x |"
            )
        notes.append(_crossover_sentence(label, curve))
    return "\n".join(lines + [""] + notes)


def _crossover_sentence(label: str, curve: list[Mapping[str, Any]]) -> str:
    batch = crossover_batch(curve)
    largest = curve[-1]["batch"]
    if batch is None:
        return f"T {label}: speculation wins at every measured batch size (up to {largest})."
    return f"T {label}: crossover (best speedup = 1.0) at batch ≈ {batch:.1f}."


def _sampling_label(cell: Mapping[str, Any]) -> str:
    """ "0" (greedy), "1", or "1, top-p 0.95" / "1, top-k 40" when those filters were on."""
    label = f"{cell['temperature']:g}"
    if cell["temperature"] > 0 and cell.get("top_k", 0):
        label += f", top-k {cell['top_k']}"
    if cell["temperature"] > 0 and cell.get("top_p", 1.0) < 1.0:
        label += f", top-p {cell['top_p']:g}"
    return label


def markdown_table(result: Mapping[str, Any]) -> str:
    head = "| batch | T | γ | α | τ | c | speedup | mean [95% CI] | decode-only speedup | Thm 3.8 | cost model | plain tok/s | spec tok/s | round ms | γ·draft + verify + sampling ms |\n"
    head += "| ---: " * 15 + "|\n"
    lines = [
        f"| {r['batch']} | {r['T']} | {r['gamma']} | {r['alpha']:.3f} | {r['tau']:.2f} | {r['c']:.3f} "
        f"| {r['speedup']:.2f}x | {r['ci']} | {r['decode_speedup']:.2f}x | {r['predicted']:.2f}x | {r['cost_model']:.2f}x | {r['plain_tok_s']:.1f} | {r['spec_tok_s']:.1f} | {r['round_ms']:.0f} | {r['parts_ms']:.0f} |"
        for r in table_rows(result)
    ]
    return head + "\n".join(lines)


def has_variants(result: Mapping[str, Any]) -> bool:
    """Whether the run swept BenchmarkConfig.variants (cells say which)."""
    return any("variants" in cell for cell in result["cells"])


def shape_label(point: Mapping[str, Any]) -> str:
    """ "5" for a chain at gamma 5, "tree 2-2-1-1-1" for a tree (its widths per depth)."""
    parents = point.get("tree")
    if not parents:
        return str(point["gamma"])
    depths = [0]
    for parent in parents:
        depths.append(depths[parent] + 1)
    widths = [depths.count(d) for d in range(1, max(depths) + 1)]
    return "tree " + "-".join(map(str, widths))


def variant_table(result: Mapping[str, Any]) -> str:
    """Markdown, one row per (cell, variant, gamma): the variants side by side against the shared
    plain baseline, with the target's mean log-prob of their outputs when it was scored."""
    head = (
        "| batch | variant | T | γ | α | τ | c | speedup | mean [95% CI] | decode-only | Thm 3.8 "
        "| greedy identical | exact | target mean logprob |\n" + "| ---: " * 14 + "|\n"
    )
    lines = []
    for cell in result["cells"]:
        plain = cell.get("plain_target_mean_logprob")
        if plain is not None:
            lines.append(
                f"| {cell['batch_size']} | plain | {_sampling_label(cell)} | | | | | 1.00x | | 1.00x "
                f"| | | yes | {plain:.3f} |"
            )
        for p in cell["points"]:
            logprob = p.get("target_mean_logprob")
            same = {True: "yes", False: "NO", None: ""}[p.get("greedy_identical_to_plain")]
            lines.append(
                f"| {cell['batch_size']} | {p.get('variant', '')} | {_sampling_label(cell)} "
                f"| {shape_label(p)} | {p['alpha']:.3f} | {p['tau']:.2f} "
                f"| {p.get('c', cell['c']):.3f} "
                f"| {p['speedup']:.2f}x | {ci_text(p)} | {p.get('decode_speedup', float('nan')):.2f}x "
                f"| {p['predicted_speedup']:.2f}x | {same} | {'yes' if p.get('exact', True) else 'NO'} "
                f"| {'' if logprob is None else f'{logprob:.3f}'} |"
            )
    return head + "\n".join(lines)


def _cost_model_choice(cell: Mapping[str, Any]) -> str:
    """The cost model's gamma beside the theorem's: it charges each swept verify call its
    measured cost, where the theorem charges one step (wrong for a batch of 8 on a CPU)."""
    if len(cell.get("target_extend_s", {})) == 0:  # a run from before verify calls were timed
        return ""
    gamma = metrics.cost_model_optimal_gamma(
        cell["alpha"], cell["target_step_s"], cell["draft_step_s"], cell["target_extend_s"]
    )
    return f"; with the measured verify calls (cost model) {gamma}"


def print_table(result: Mapping[str, Any]) -> None:
    print(f"\n{result['target']}\n  draft {result['draft']}\n")
    print(markdown_table(result))
    if has_variants(result):
        print("\n" + variant_table(result) + "\n")
    for cell in result["cells"]:
        print(
            f"batch {cell['batch_size']}, T {_sampling_label(cell)}: alpha {cell['alpha']:.3f}, "
            f"c {cell['c']:.3f} -> optimal gamma (Thm 3.8) {cell['optimal_gamma']}"
            + _cost_model_choice(cell)
        )
    floor = result.get("stream_floor_s_per_step")
    for cell in result["cells"]:
        if cell["batch_size"] == 1 and floor:
            print(
                f"batch 1, T {_sampling_label(cell)}: plain {1e3 * cell['plain_s_per_token']:.0f} ms "
                f"per token (prefill included) vs weight-streaming floor {1e3 * floor:.0f} ms"
            )
    if len({c["batch_size"] for c in result["cells"]}) > 1:
        print("\n" + batch_curve_table(result))
    for s in result["skipped"]:
        print(f"batch {s['batch_size']} skipped: {s['reason']}")
