"""The EnDe reproduction's tables (docs/reproduction.md) from what scripts/reproduce_ende.sh left
in runs/ende: the trained models, Table 3 (alpha per draft), Table 2 (interleaved speedups on
the test split at the gamma chosen on the validation split, with bootstrap intervals), the Table 2
rows over the whole test split, distillation before / after, and BLEU (sacrebleu) of plain vs
speculative decoding.

    python scripts/ende_report.py --runs runs/ende --out benchmarks/ende_repro --overwrite

Writes OUT/report.json (every number below) and OUT/report.md (the tables), and prints the tables.
OUT defaults to RUNS/report, beside the runs and never a committed folder; a report already there
is refused unless --overwrite. Every result file is read through the one boundary
(`errors.read_result_json`, `benchmark_report.read_benchmark`): a missing key, a torn or empty file
is one line `error: <file>: <what is wrong>` and exit status 2. A benchmark.json not marked
"complete" (a sweep running or cut short) is refused unless --allow_partial, and the report then
says it is partial (printed, in report.json's "partial" and report.md's first line).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
from collections.abc import Mapping
from typing import Any

from speculative import errors
from speculative.config import gin_flags
from speculative.errors import MALFORMED_ERRORS, JobError
from speculative.measure import report as benchmark_report
from speculative.outputs import provenance

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # when imported by a test
from ende_tables import (  # noqa: E402  (beside this file; the report's markdown and the paper's)
    PAPER,
    PAPER_NGRAM_ALPHA,
    code_line,  # noqa: F401  (the report's API, with the functions below)
    markdown,
    paper_alpha,  # noqa: F401
    partial_line,
    table2_markdown,  # noqa: F401
)

TARGETS = ("target", "target_regularised")  # the dictionary's run, the larger corpus's
MODELS = (*TARGETS, "draft_small", "draft_base", "draft_large", "draft_small_distilled")
DRAFTS = ("small", "base", "large", "small_distilled", "unigram", "bigram")
TEMPERATURES = (0, 1)


class Partial:
    """Whether a benchmark.json not marked complete may be read (--allow_partial), and which were
    ("<run>/benchmark.json <why>", for the report's label)."""

    def __init__(self, allowed: bool = False):
        self.allowed, self.read = allowed, []


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


def _json(path: pathlib.Path, *required: str) -> dict[str, Any] | None:
    """A run's result file through the boundary, or None where that run is missing."""
    return errors.read_result_json(path, required) if path.exists() else None


def _rows(run: pathlib.Path, *required: str, must: bool = False) -> list[dict] | None:
    """A run's predictions.jsonl, sorted, each row with the keys BLEU needs and `required`; None
    where it is missing (`must`: an error)."""
    path = run / "predictions.jsonl"
    if not must and not path.exists():
        return None
    rows = errors.read_result_jsonl(path, ("index", "output", "targets", *required))
    return sorted(rows, key=lambda r: r["index"])


def _times(runs: pathlib.Path) -> dict[str, int]:
    path = runs / "times.tsv"
    if not path.exists():
        return {}
    out: dict[str, int] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        name, _, seconds = line.partition("\t")
        if not seconds.strip().isdigit():
            raise JobError(f"line {number} is not '<step>\\t<seconds>'", path=path)
        out[name] = out.get(name, 0) + int(seconds)  # a resumed step adds up
    return out


def models_table(runs: pathlib.Path, times: Mapping[str, int]) -> list[dict]:
    rows = []
    for name in MODELS:
        summary = _json(runs / name / "summary.json", "parameters", "steps")
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
    rows = _rows(run, "length") if _json(run / "summary.json") is not None else None
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
            run = runs / "alpha" / f"t{t}_{draft}"
            s = _json(run / "summary.json", "alpha", "tokens", "examples", "tau", "gamma")
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
            forced = _json(runs / "alpha_tf" / f"t{t}_{draft}.json", "alpha", "tokens")
            if forced is not None:
                rows[-1].update(alpha_all_positions=forced["alpha"], forced_tokens=forced["tokens"])
    return rows


def _benchmark(runs: pathlib.Path, name: str, partial: Partial | None) -> Mapping[str, Any] | None:
    """runs/<name>/benchmark.json (`benchmark_report.read_benchmark`: refused when not marked
    complete, unless partial.allowed: then listed in partial.read), or None where it is missing."""
    path = runs / name / "benchmark.json"
    if not path.exists():
        return None
    partial = Partial() if partial is None else partial
    result = benchmark_report.read_benchmark(path, allow_partial=partial.allowed)
    reason = benchmark_report.partial_reason(result)
    if reason is not None:
        partial.read.append(f"{name}/benchmark.json {reason}")
    return result


def benchmark_table(runs: pathlib.Path, partial: Partial | None = None) -> list[dict]:
    """Table 2 (interleaved, one plain baseline per temperature): per draft, the alpha and c the
    benchmark measured, Theorem 3.8's prediction, and the speedup measured (with its bootstrap
    mean and 95% interval) at the row's gamma (`benchmark_report.chosen_rows`).

    The gamma: with benchmark_validation_t{T} and benchmark_test_t{T}, the one of the best
    bootstrap-mean speedup on the validation sweep, measured on the test split (choosing the
    best of a sweep on the inputs it is reported on would bias it upward); otherwise (runs from
    before that split, benchmark_t{T}) Theorem 3.8's best, with the best speedup of the sweep."""
    rows = []
    for t in TEMPERATURES:
        names = [f"benchmark_test_t{t}", f"benchmark_validation_t{t}"]
        if not all((runs / name / "benchmark.json").exists() for name in names):
            names = [f"benchmark_t{t}"]  # a run from before the validation split
        read = [_benchmark(runs, name, partial) for name in names]
        test, validation = read[0], (read[1] if len(read) > 1 else None)
        try:
            rows += [] if test is None else benchmark_report.chosen_rows(test, validation)
        except (ValueError, *MALFORMED_ERRORS) as e:  # a benchmark.json of the wrong shape
            raise errors.loader_error(e, None, runs / names[0] / "benchmark.json") from e
    return rows


def validation_gamma(
    runs: pathlib.Path, draft: str, temperature: float, partial: Partial | None = None
) -> int | None:
    """The gamma of `draft`'s best bootstrap-mean speedup in the validation sweep at T, or None."""
    name = f"benchmark_validation_t{int(temperature)}"
    validation = _benchmark(runs, name, partial)
    try:
        cell = benchmark_report.cell_at(validation or {"cells": []}, temperature)
        points = benchmark_report.variant_points(cell, draft)
        return benchmark_report.best_mean_gamma(points) if points else None
    except (ValueError, *MALFORMED_ERRORS) as e:
        raise errors.loader_error(e, None, runs / name / "benchmark.json") from e


def table2_gamma(
    runs: pathlib.Path, draft: str, temperature: float, partial: Partial | None = None
) -> int | None:
    """The gamma of `draft`'s Table 2 row at T (`benchmark_table`), or None."""
    rows = benchmark_table(runs, partial)
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
        plain = _json(plain_dir / "summary.json", "this_run")
        if plain is None:
            continue
        plain_rows = _rows(plain_dir, "output_ids", must=True)
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
            s = _json(run / "summary.json", "this_run", "gamma", "alpha", "tau")
            if s is None:
                continue
            rows = _rows(run, "output_ids", must=True)
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


def build_report(runs: pathlib.Path, partial: Partial) -> dict[str, Any]:
    """Every table of the report (report.json); "partial" lists what --allow_partial let in."""
    times = _times(runs)
    return {
        **provenance.git_state(),  # git_commit, git_dirty: the code that wrote the report
        "runs_code": run_commits(runs),  # and the code each run ran
        "times_s": times,
        "models": models_table(runs, times),
        "alpha": alpha_table(runs),
        "benchmark": benchmark_table(runs, partial),
        "rows": rows_table(runs),
        "seed_bleu": seed_bleu(runs),
        "paper": {f"{d}_t{t}": v for (d, t), v in PAPER.items()},
        "paper_ngram_alpha": {f"{d}_t{t}": a for (d, t), a in PAPER_NGRAM_ALPHA.items()},
        "partial": partial.read,  # filled by benchmark_table: [] for a report of finished runs
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=pathlib.Path, default=pathlib.Path("runs/ende"))
    parser.add_argument("--out", type=pathlib.Path, help="default: RUNS/report")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT's report")
    parser.add_argument(
        "--allow_partial",
        action="store_true",
        help='read a benchmark.json not marked "complete" (the report is labelled partial)',
    )
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
    parser.add_argument("--debug", action="store_true", help="a traceback instead of one line")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command: 0, or 2 after one line `error: <file>: <what is wrong>` (--debug: the
    traceback)."""
    return gin_flags.run_job(_main, argv)


def _main(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    partial = Partial(allowed=args.allow_partial)
    if args.validation_gamma or args.gamma_for:
        _print_gamma(args, partial)
        return
    out = args.runs / "report" if args.out is None else args.out
    errors.check_new_outputs([out / "report.json", out / "report.md"], args.overwrite)
    report = build_report(args.runs, partial)
    if not any(report[part] for part in ("models", "alpha", "benchmark", "rows")):
        # a report of nothing would overwrite the one the docs cite (with --overwrite)
        raise JobError(f"nothing to report in {args.runs}: run scripts/reproduce_ende.sh first")
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    (out / "report.md").write_text(text)
    print(text)
    _warn_partial(partial)


def _print_gamma(args: argparse.Namespace, partial: Partial) -> None:
    draft, t = args.validation_gamma or args.gamma_for
    pick, where = (validation_gamma, "validation ") if args.validation_gamma else (table2_gamma, "")
    try:
        temperature = float(t)
    except ValueError:
        raise JobError(f"T must be a temperature (a number), not {t!r}") from None
    gamma = pick(args.runs, draft, temperature, partial)
    if gamma is None:
        raise JobError(f"no {where}benchmark point for draft {draft} at T = {t}", path=args.runs)
    _warn_partial(partial)
    print(gamma)


def _warn_partial(partial: Partial) -> None:
    if partial.read:
        print(f"warning: {partial_line(partial.read)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
