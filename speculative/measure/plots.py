"""The benchmark job's three plots (PLOTS), drawn from benchmark.json's JSON form only, like the
tables of measure/report.py, so a committed result can be plotted again without running anything.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from speculative.measure import metrics
from speculative.measure.report import batch_curve, crossover_batch
from speculative.outputs.storage import OutputDir

PLOTS = ("speedup_vs_gamma.png", "speedup_vs_batch.png", "acceptance_by_position.png")


def plot(result: Mapping[str, Any], out_dir: OutputDir | str | os.PathLike) -> list[str]:
    """Writes the three PNGs of PLOTS into out_dir (a local path or an `OutputDir`, which may be
    on an object store); returns their paths."""
    out = out_dir if isinstance(out_dir, OutputDir) else OutputDir(out_dir)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [_first_variant(c) for c in result["cells"]]
    temps = sorted({c["temperature"] for c in cells})
    paths = []
    for name, draw in zip(PLOTS, (_speedup_vs_gamma, _speedup_vs_batch)):
        fig, axes = plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 4), squeeze=False)
        for ax, T in zip(axes[0], temps):
            draw(ax, [c for c in cells if c["temperature"] == T])
            ax.axhline(1.0, color="gray", lw=0.8)
            ax.set(title=f"temperature {T:g}")
            ax.legend(fontsize=7)
        paths.append(_save(fig, out, name))
    fig, ax = plt.subplots(figsize=(6, 4))
    _acceptance_by_position(ax, cells, temps)
    paths.append(_save(fig, out, PLOTS[2]))
    return paths


def _first_variant(cell: Mapping[str, Any]) -> Mapping[str, Any]:
    """The cell with only its first variant's points (the one its alpha and c are of), so the
    plots compare gammas of one draft; variant_table has them all."""
    name = cell["points"][0].get("variant")
    return {**cell, "points": [p for p in cell["points"] if p.get("variant") == name]}


def _speedup_vs_gamma(ax, cells: list[Mapping[str, Any]]) -> None:
    """Measured speedups (dots), their bootstrap 95% intervals (bars, where recorded) and the
    Thm 3.8 curve (dashed) of each batch size."""
    from matplotlib.ticker import MaxNLocator

    for i, cell in enumerate(cells):
        color, label = f"C{i}", f"B={cell['batch_size']}"
        gammas = [p["gamma"] for p in cell["points"]]
        speedups = [p["speedup"] for p in cell["points"]]
        ax.plot(gammas, speedups, "o", color=color, label=f"{label} measured")
        bars = [p for p in cell["points"] if _finite_interval(p)]
        if bars:  # the 95% interval (absent in older benchmark.json): a line from lo to hi,
            # not mean ± error: a skewed bootstrap's mean may lie outside its percentiles
            lo, hi = np.array([p["speedup_ci95"] for p in bars]).T
            xs = [p["gamma"] + 0.08 for p in bars]  # beside the measured dot, not over it
            ax.vlines(xs, lo, hi, colors=color, label=f"{label} 95% CI")
        grid = np.arange(1, max(gammas) + 1)
        predicted = [metrics.predicted_speedup(cell["alpha"], int(g), cell["c"]) for g in grid]
        theorem = f"{label} Thm 3.8 (α={cell['alpha']:.2f}, c={cell['c']:.2f})"
        ax.plot(grid, predicted, "--", color=color, label=theorem)
    ax.set(xlabel="γ", ylabel="speedup over plain decoding")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _finite_interval(point: Mapping[str, Any]) -> bool:
    interval = point.get("speedup_ci95")
    return interval is not None and bool(np.all(np.isfinite(interval)))


def _speedup_vs_batch(ax, cells: list[Mapping[str, Any]]) -> None:
    """Measured speedup against batch size, one line per gamma."""
    cells = sorted(cells, key=lambda c: c["batch_size"])
    for gamma in sorted({p["gamma"] for c in cells for p in c["points"]}):
        xs, ys = [], []
        for cell in cells:
            for p in cell["points"]:
                if p["gamma"] == gamma:
                    xs.append(cell["batch_size"])
                    ys.append(p["speedup"])
        ax.plot(xs, ys, "o-", label=f"γ={gamma}", alpha=0.6)
    for curve in batch_curve({"cells": cells}).values():
        xs = [r["batch"] for r in curve]
        ax.plot(xs, [r["speedup"] for r in curve], "k-", lw=2, label="best γ")
        batch = crossover_batch(curve)
        if batch is not None:
            ax.axvline(batch, color="k", ls=":", lw=1, label=f"crossover ≈ {batch:.1f}")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="batch size", ylabel="measured speedup")


def _acceptance_by_position(ax, cells: list[Mapping[str, Any]], temps: list[float]) -> None:
    """Per temperature: acceptance per draft position at the smallest batch and largest gamma."""
    from matplotlib.ticker import MaxNLocator

    for i, T in enumerate(temps):
        cell = min((c for c in cells if c["temperature"] == T), key=lambda c: c["batch_size"])
        point = max(cell["points"], key=lambda p: p["gamma"])
        positions = np.arange(1, point["gamma"] + 1)
        label = f"T={T:g}, γ={point['gamma']}, B={cell['batch_size']}"
        ax.plot(positions, point["acceptance_by_position"], "o-", color=f"C{i}", label=label)
        alpha = f"T={T:g} α={point['alpha']:.2f}"
        ax.axhline(point["alpha"], color=f"C{i}", ls=":", lw=1, label=alpha)
    ax.set(
        xlabel="draft position i", ylabel="P(accept x_i | x_1..x_{i-1} accepted)", ylim=(0, 1.05)
    )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7)


def _save(fig, out: OutputDir, name: str) -> str:
    """The figure as a PNG, written whole (`OutputDir.write_bytes`)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    out.write_bytes(name, png.getvalue())
    return out.where(name)
