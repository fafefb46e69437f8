"""The infer job's outputs: a JSON row per example (predictions.jsonl), the rows pooled (by
`metrics.summarize`), what this run decoded, and summary.json with its printed digest."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from speculative import decoding, vocab
from speculative.data import inputs
from speculative.data.inputs import Example
from speculative.jobs.infer.settings import Settings, describe, policy_fields
from speculative.measure import metrics


def output_rows(
    examples: Sequence[Example],
    out: decoding.DecodeOutput,
    vocabulary: vocab.Vocabulary,
    speculative: bool,
    encoded: Sequence[inputs.Encoded] | None = None,
) -> list[dict[str, Any]]:
    """One JSON-able row per example from the first len(examples) rows of `out`; a truncated
    input (per `encoded`) records its token count and the text decoded from."""
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    stats = jax.tree.map(np.asarray, out.stats)
    alpha, tau = np.asarray(stats.alpha), np.asarray(stats.tokens_per_call)
    rows = []
    for i, ex in enumerate(examples):
        ids = [int(t) for t in tokens[i, : int(lengths[i])]]
        text_ids = ids[:-1] if ids and ids[-1] == vocabulary.eos_id else ids
        row: dict[str, Any] = {"index": ex.index, **dict(ex.extra), "inputs": ex.inputs}
        if ex.targets is not None:
            row["targets"] = ex.targets
        if encoded is not None and encoded[i].truncated:
            row["truncated_from"] = encoded[i].full_length
            row["inputs_used"] = vocabulary.decode(encoded[i].ids)
        row.update(
            output=vocabulary.decode(text_ids),
            output_ids=ids,
            length=len(ids),
            target_calls=int(stats.target_calls[i]),
            tau=float(tau[i]),
            exact=bool(out.exact),
            lenience=float(out.lenience),
        )
        if speculative:
            row.update(
                alpha=float(alpha[i]),
                accepted=int(stats.accepted[i]),
                drafted=int(stats.drafted[i]),
                draft_calls=int(stats.draft_calls[i]),
                verified=int(stats.verified_at[i].sum()),
                accepted_at=[int(x) for x in stats.accepted_at[i]],
                verified_at=[int(x) for x in stats.verified_at[i]],
            )
        if speculative and stats.outside_mass is not None:  # a cross-vocabulary draft
            drafted = max(int(stats.drafted[i]), 1)
            outside = float(stats.outside_mass[i])
            row.update(outside_mass=outside, draft_mass_outside=outside / drafted)
        if speculative and stats.lookup_proposed is not None:  # a staged draft's lookup
            row.update(
                lookup_proposed=int(stats.lookup_proposed[i]),
                lookup_accepted=int(stats.lookup_accepted[i]),
            )
        rows.append(row)
    return rows


_SPECULATIVE_COLUMNS = ("alpha", "accepted", "drafted", "draft_calls", "accepted_at", "verified_at")
_LOOKUP_COLUMNS = ("lookup_proposed", "lookup_accepted")


def summarize_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals over output rows, pooled by `metrics.summarize`: examples, tokens, target calls,
    tau, and (speculative rows) alpha, accepted, drafted, acceptance per draft position."""
    names = ("target_calls",)
    if rows and "alpha" in rows[0]:  # rows on disk: plain ones have no speculative fields
        names += _SPECULATIVE_COLUMNS
    if rows and "outside_mass" in rows[0]:  # a cross-vocabulary draft's
        names += ("outside_mass",)
    if rows and "lookup_proposed" in rows[0]:  # a staged draft's
        names += _LOOKUP_COLUMNS
    columns = {name: np.asarray([r[name] for r in rows]) for name in names}
    lengths = np.asarray([r["length"] for r in rows], np.int64)
    return {"examples": len(rows), **metrics.summarize(columns, lengths)}


def pool_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Speculative output rows pooled into one row of the same form (counts summed, alpha by
    `summarize_rows`). Pooling is associative: the pool of [pool_rows(a)] + b is the pool of a + b,
    which lets a running total take O(batch) work per batch."""
    s = summarize_rows(rows)
    return {
        "length": s["tokens"],
        **{k: s[k] for k in ("target_calls", "alpha", "accepted", "drafted", "draft_calls")},
        "accepted_at": np.sum([r["accepted_at"] for r in rows], axis=0),
        "verified_at": np.sum([r["verified_at"] for r in rows], axis=0),
        **(
            {"outside_mass": sum(r["outside_mass"] for r in rows)}
            if "outside_mass" in rows[0]
            else {}
        ),
        **({k: s[k] for k in _LOOKUP_COLUMNS} if "lookup_proposed" in rows[0] else {}),
    }


@dataclasses.dataclass
class RunStats:
    """What this run decoded (summary.json's "this_run"); seconds exclude compilation."""

    decoded_examples: int = 0
    decoded_tokens: int = 0
    decode_s: float = 0.0
    compile_batches: int = 0  # batches that compiled a program first (one per prompt width)
    compile_s: float = 0.0  # seconds compiling them (low when the compilation cache is warm)

    @property
    def tokens_per_s(self) -> float | None:
        return self.decoded_tokens / self.decode_s if self.decode_s else None

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "tokens_per_s": self.tokens_per_s}


def job_summary(
    s: Settings,
    rows: Sequence[Mapping[str, Any]],
    stats: RunStats,
    costs: Mapping[str, Any],
) -> dict[str, Any]:
    """summary.json: the job, its rows pooled, this run, and (with costs) Thm 3.8's estimates."""
    summary = {
        **describe(s),
        "gamma_policy": policy_fields(s),
        "exact": s.exact,
        "lenience": s.lenience,
        "batch_size": s.run.batch_size,
        "sampling": dataclasses.asdict(s.run.sampling),
        "feature_lengths": dict(s.inputs.feature_lengths),
        **summarize_rows(rows),
        "truncated_inputs": sum("truncated_from" in r for r in rows),
        "this_run": stats.to_json(),
    }
    if costs and "alpha" in summary and s.tree is not None:
        # Thm 3.8's accounting with the tree's measured tokens per call (no closed form in alpha)
        tau = summary["tau"]
        summary.update(costs, predicted_speedup=metrics.speedup_from_tau(tau, s.gamma, costs["c"]))
    elif costs and "alpha" in summary:
        alpha = summary["alpha"]
        summary.update(
            costs,
            predicted_speedup=metrics.predicted_speedup(alpha, s.gamma, costs["c"]),
            optimal_gamma=metrics.optimal_gamma(alpha, costs["c"]),
        )
    return summary


def print_summary(s: Mapping[str, Any], out_dir) -> None:
    mode = f"speculative, gamma {s['gamma']}" if s["speculative"] else "plain decoding"
    policy = s.get("gamma_policy") or {}
    if policy.get("kind", "fixed") != "fixed":
        mode += f" (at most; {policy['kind']} gamma policy)"
    if s.get("tree"):
        mode += f", token tree {s['tree']} (parents)"
    if s.get("planner"):
        p = s["planner"]
        mode += f", planned (alpha {p['alpha']:.3f}, predicted {p['predicted_speedup']:.2f}x)"
    print(f"\n{s['target']}\n  {mode}, batch {s['batch_size']}, {s['sampling']}")
    if s["speculative"]:
        print(f"  draft: {s['draft']}")
    if not s["exact"]:
        print(f"  LOSSY: lenient acceptance, lenience {s['lenience']} (exact: false)")
    print(
        f"  {s['examples']} examples, {s['tokens']} tokens, {s['target_calls']} target calls, "
        f"tau {s['tau']:.2f}"
    )
    if "alpha" in s:
        print(f"  alpha {s['alpha']:.3f}, accepted {s['accepted']} / drafted {s['drafted']}")
    if "draft_mass_outside" in s:  # a draft with its own vocabulary
        print(f"  draft mass outside the shared tokens {s['draft_mass_outside']:.3f}")
    if s["truncated_inputs"]:
        print(f"  {s['truncated_inputs']} input(s) truncated (rows with truncated_from)")
    r = s["this_run"]
    if r["tokens_per_s"]:
        print(
            f"  this run: {r['decoded_tokens']} tokens, {r['tokens_per_s']:.1f} tok/s "
            "(compilation excluded)"
        )
    if r["compile_batches"]:
        cache = s.get("compilation_cache")
        state = ""
        if cache:
            warmth = "warm" if cache["warm"] else "cold" if not cache["hits"] else "partly warm"
            state = f", cache {warmth} ({cache['hits']} hits, {cache['misses']} misses)"
        print(f"  compiled {r['compile_batches']} program(s) in {r['compile_s']:.1f}s{state}")
    if "c" in s:
        # a tree's estimate comes from its measured tau: there is no optimal chain gamma to name
        best = f" (optimal gamma {s['optimal_gamma']})" if "optimal_gamma" in s else ""
        print(
            f"  c {s['c']:.3f} -> Theorem 3.8 speedup estimate {s['predicted_speedup']:.2f}x{best}"
        )
    print(f"  wrote {out_dir}/predictions.jsonl, summary.json, config.gin")
