"""Benchmark job: plain vs speculative decoding of the same target, prompts and sampling, one run.

    python -m speculative.benchmark --gin_file=configs/runs/benchmark.gin \
        --gin_file=configs/demo/qwen_coder_benchmark.gin --gin.OUTPUT_DIR="'benchmarks/qwen'"

For every batch size B (skipped, and recorded as such, when its estimated memory does not fit or
the run fails for lack of memory) and temperature T (with the configured top-k / top-p):
  - the inputs are cut into ceil(N / B) batches (cycling the N inputs to fill the last one), each
    padded to its own power-of-two width; plain decoding and each gamma compile once per width
    (ahead of time, timed apart);
  - after one warm-up run each, batch j is run by plain decoding and then by every gamma before
    batch j+1 (interleaved, so drifting machine load hits all of them alike), `repeats` times;
    a batch's time is its median; tokens/s is total tokens over the sum of medians. Decoding stops
    at the vocabulary's stop ids (EOS and end-of-text tokens) or the target length. Plain and
    speculative use the same rng per batch;
  - both prefills are timed alone on every batch too: "decode speedup" subtracts them (the
    draft's prefill is charged to speculative decoding) and compares the decode loops alone;
  - c = draft step / target step, both timed single-token steps at batch B; the target's extend
    by gamma+1 tokens (one verify call) is timed too, and "cost model" is Thm 3.8's accounting
    with that measured verify cost in place of one step: tau * step / (gamma * draft + verify);
  - the target's weight bytes over the measured memory read bandwidth give the weight-streaming
    floor of one plain step, printed beside the measured plain time per step.
Speedup = speculative tokens/s / plain tokens/s. Theorem 3.8 predicts it from the measured alpha
(pooled over the gammas of a (B, T) cell) and c; the optimal gamma maximises that prediction.
Writes OUTPUT_DIR/benchmark.json, speedup_vs_gamma.png, speedup_vs_batch.png and
acceptance_by_position.png.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any

import gin
import jax
import numpy as np

from speculative import (
    benchmark_report,
    decoding,
    gin_flags,
    inputs,
    job_spmd,
    memory,
    metrics,
    runner,
    timing,
    vocab,
)
from speculative import model_loading as ml
from speculative.drafts.base import Drafter
from speculative.errors import JobError
from speculative.job_config import BenchmarkConfig, check_lenience, check_num_examples
from speculative.job_io import lock_output_dir
from speculative.sampling import SamplingConfig

# ------------------------------------------------------------------------------------------------
# Configuration, inputs, models.


def validate(cfg: BenchmarkConfig) -> None:
    """Raises JobError for a config the job cannot run (before any weight or input is read)."""
    for name in ("target", "draft", "vocabulary", "output_dir"):
        if getattr(cfg, name) is gin.REQUIRED:
            raise JobError(f"speculative.BenchmarkConfig.{name} is required")
    ml.validate_model_spec(cfg.target, "target")
    ml.validate_model_spec(cfg.draft, "draft")
    ml.validate_vocab_spec(cfg.vocabulary, "vocabulary")
    check_lenience(cfg.lenience)
    for name in ("gammas", "batch_sizes"):
        values = list(getattr(cfg, name))
        if not values or any(not isinstance(v, int) or v < 1 for v in values):
            raise JobError(f"{name} must be a non-empty list of integers >= 1, got {values}")
    if not list(cfg.temperatures) or any(t < 0 for t in cfg.temperatures):
        raise JobError(
            f"temperatures must be a non-empty list of values >= 0, got {cfg.temperatures}"
        )
    if not isinstance(cfg.repeats, int) or cfg.repeats < 1:
        raise JobError(f"repeats must be an integer >= 1, got {cfg.repeats!r}")
    check_num_examples(cfg.num_examples)


@dataclasses.dataclass(frozen=True)
class Setup:
    """The loaded models and tokenized inputs every cell of the sweep shares.

    ids: token ids per input; width: the bucket of the longest (what memory is planned for).
    truncated: inputs cut to the inputs feature length; vocab_padding: the padding ids masked out
    of both models ({} when none, see `model_loading.fit_vocabulary`).
    """

    target: ml.Loaded
    draft: ml.Loaded
    stop_ids: tuple[int, ...]
    num_examples: int
    ids: list[list[int]]
    width: int
    truncated: int = 0
    vocab_padding: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def encoder_decoder(self) -> bool:
        return self.target.model.is_encoder_decoder

    @property
    def draft_model(self) -> Any:
        """The draft as a model, or None for a `Drafter` that is not a separate model (no
        prefill, weights or cache of its own to account for)."""
        return None if isinstance(self.draft.model, Drafter) else self.draft.model


def load(cfg: BenchmarkConfig) -> Setup:
    examples = inputs.read_examples(
        cfg.input_file, input_field=cfg.input_field, limit=cfg.num_examples
    )
    vocabulary = ml.load_vocabulary(cfg.vocabulary, "vocabulary")
    specs = [("target", cfg.target)]
    if not isinstance(cfg.draft, ml.DraftSpec):
        specs.append(("draft", cfg.draft))
    mesh = {} if cfg.partitioner is None else {"partitioner": cfg.partitioner}
    loaded = {role: (ml.load_model(spec, role, **mesh), ml.where(spec)) for role, spec in specs}
    ml.check_draft_vocabulary(cfg.draft_vocabulary, vocabulary)
    fitted, padding = ml.fit_vocabulary(vocabulary, ml.where(cfg.vocabulary), loaded)
    if isinstance(cfg.draft, ml.DraftSpec):  # built for the fitted target's width
        fitted["draft"] = ml.build_draft(cfg.draft, fitted["target"])
    target, draft = fitted["target"], fitted["draft"]
    cap = cfg.feature_lengths["inputs"]
    encoded = inputs.encode(examples, vocabulary, target.model.is_encoder_decoder, cap)
    truncated = sum(e.truncated for e in encoded)
    if truncated:
        print(f"{truncated} input(s) longer than {cap} tokens are truncated to their last {cap}")
    ids = [e.ids for e in encoded]
    draft = ml.with_shortlist(draft, cfg.draft, vocabulary, ids)
    width = inputs.bucket(max(len(x) for x in ids), cap)
    stop_ids = vocab.stop_ids(vocabulary)
    return Setup(target, draft, stop_ids, len(examples), ids, width, truncated, padding)


def batches_of(setup: Setup, cfg: BenchmarkConfig, batch_size: int) -> list[dict[str, jax.Array]]:
    """ceil(N / B) batches cycling the N inputs, each padded to its own bucket (as the infer job
    does): padding every prompt to the longest would bill short prompts for a long prefill."""
    batches = []
    for rows in inputs.cycled_rows(len(setup.ids), batch_size):
        ids = [setup.ids[i] for i in rows]
        width = inputs.bucket(max(len(x) for x in ids), cfg.feature_lengths["inputs"])
        batches.append(inputs.make_batch(ids, setup.encoder_decoder, width))
    return batches


def available_bytes() -> int:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def memory_shortfall(setup: Setup, cfg: BenchmarkConfig, batch_size: int) -> str | None:
    """Why `batch_size` cannot fit in this host's free memory, or None when it may.

    The weights are loaded already, so what must still fit is the decode state of both models and
    XLA's workspace at the largest gamma, as `speculative.memory` estimates them; the check skips
    batch sizes that clearly cannot fit, no more.
    """
    available = available_bytes()
    plan = memory.plan(
        setup.target.model,
        setup.draft_model or setup.target.model,
        memory.Device("this host", available, 1),
        batch_size=batch_size,
        input_len=setup.width,
        max_decode_len=cfg.feature_lengths["targets"],
        gamma=max(cfg.gammas),
        param_dtype=_param_dtype(setup.target),
        mesh_shape={"data": 1, "model": 1},
        usable_fraction=0.8,
    )
    draft_cache = plan.draft_cache if setup.draft_model is not None else 0
    need = plan.target_cache + draft_cache + plan.workspace
    if need <= plan.usable:
        return None
    return f"estimated {need / 2**30:.1f} GiB > 80% of available {available / 2**30:.1f} GiB"


def _param_dtype(loaded: ml.Loaded) -> Any:
    return jax.tree.leaves(loaded.params)[0].dtype


# ------------------------------------------------------------------------------------------------
# Timing: every program on batch j before batch j + 1.


@dataclasses.dataclass
class Timed:
    """One program over all batches: seconds (sum of per-batch medians), batch_seconds, compile_s;
    tokens and outputs only for programs that return a DecodeOutput."""

    seconds: float = 0.0
    batch_seconds: list[float] = dataclasses.field(default_factory=list)
    compile_s: float = 0.0
    tokens: int = 0
    outputs: list[decoding.DecodeOutput] = dataclasses.field(default_factory=list)

    def add(self, output: Any, seconds: float, compile_s: float) -> None:
        self.seconds += seconds
        self.batch_seconds.append(seconds)
        self.compile_s += compile_s
        if isinstance(output, decoding.DecodeOutput):
            self.tokens += int(np.sum(output.lengths))
            self.outputs.append(output)


def interleaved_timings(
    programs: Mapping[Hashable, runner.Program],
    batches: Sequence[dict[str, jax.Array]],
    rngs: Sequence[jax.Array],
    repeats: int,
) -> dict[Hashable, Timed]:
    """Times every program on every batch, all programs on batch j before batch j+1.

    A program is compiled once per batch shape (prompt width), on first use, and warmed up once
    (not timed); a batch's time is the median of `repeats` runs. Interleaving puts the plain
    baseline and each gamma under the same machine conditions (a drift in load or clock affects
    all of them alike).
    """
    timed = {name: Timed() for name in programs}
    runs = runner.run_batches(programs, zip(batches, rngs), repeats=repeats, warmup=True)
    for j, (batch, result) in enumerate(zip(batches, runs)):
        for name in programs:
            timed[name].add(
                result.outputs[name], result.seconds[name], result.compile_s.get(name, 0.0)
            )
        shape = tuple(inputs.input_tokens(batch).shape)
        seconds = ", ".join(f"{_label(n)} {result.seconds[n]:.1f}s" for n in programs)
        print(f"    batch {j + 1}/{len(batches)} {shape}: {seconds}", flush=True)
    return timed


def _label(name: Hashable) -> str:
    return name if isinstance(name, str) else f"gamma {name}"


# ------------------------------------------------------------------------------------------------
# One cell: a batch size and a sampling setting, every gamma against one plain baseline.


@dataclasses.dataclass(frozen=True)
class Point:
    """One gamma of a cell against the cell's plain baseline (benchmark.json's points).

    *_s: seconds summed over the batches; *_batch_s: per batch (median of the repeats).
    decode_speedup: both prefills subtracted (the draft's too), the decode loops alone, as Thm 3.8
    models them. cost_model_speedup: Thm 3.8 with the measured verify cost.
    round_s: measured seconds per speculative round (decode time without the prefills / rounds,
    a batch's rounds being its slowest row's target calls); round_parts_s: what its parts cost
    alone, gamma draft steps + one verify call + the round's sampling work.
    greedy_identical_to_plain: None unless greedy.
    """

    gamma: int
    alpha: float
    tau: float
    acceptance_by_position: list[float]
    plain_tokens: int
    plain_s: float
    plain_batch_s: list[float]
    plain_tok_s: float
    plain_compile_s: float
    target_prefill_s: float
    draft_prefill_s: float
    speculative_tokens: int
    speculative_s: float
    speculative_batch_s: list[float]
    speculative_tok_s: float
    speculative_compile_s: float
    speedup: float
    decode_speedup: float
    predicted_speedup: float
    cost_model_speedup: float
    round_s: float
    round_parts_s: float
    greedy_identical_to_plain: bool | None


def make_point(
    gamma: int,
    plain: Timed,
    spec: Timed,
    prefill_s: tuple[float, float],
    costs: Mapping[str, Any],
    greedy: bool,
) -> Point:
    """A gamma's point from its timings, the plain baseline's and the (target, draft) prefills'."""
    target_prefill_s, draft_prefill_s = prefill_s
    stats = metrics.concat_rows([o.stats for o in spec.outputs])
    lengths = np.concatenate([np.asarray(o.lengths) for o in spec.outputs])
    summary = metrics.summarize(stats, lengths)
    plain_tok_s, spec_tok_s = plain.tokens / plain.seconds, spec.tokens / spec.seconds
    plain_decode_s = plain.seconds - target_prefill_s
    spec_decode_s = spec.seconds - target_prefill_s - draft_prefill_s
    rounds = sum(int(np.max(np.asarray(o.stats.target_calls))) for o in spec.outputs)
    same = None
    if greedy:
        same = all(
            np.array_equal(np.asarray(p.tokens), np.asarray(s.tokens))
            for p, s in zip(plain.outputs, spec.outputs)
        )
    return Point(
        gamma=gamma,
        alpha=summary["alpha"],
        tau=summary["tau"],
        acceptance_by_position=summary["acceptance_by_position"],
        plain_tokens=plain.tokens,
        plain_s=plain.seconds,
        plain_batch_s=plain.batch_seconds,
        plain_tok_s=plain_tok_s,
        plain_compile_s=plain.compile_s,
        target_prefill_s=target_prefill_s,
        draft_prefill_s=draft_prefill_s,
        speculative_tokens=spec.tokens,
        speculative_s=spec.seconds,
        speculative_batch_s=spec.batch_seconds,
        speculative_tok_s=spec_tok_s,
        speculative_compile_s=spec.compile_s,
        speedup=spec_tok_s / plain_tok_s,
        decode_speedup=(plain_decode_s / plain.tokens) / (spec_decode_s / spec.tokens),
        predicted_speedup=metrics.predicted_speedup(summary["alpha"], gamma, costs["c"]),
        cost_model_speedup=metrics.cost_model_speedup(
            summary["tau"],
            gamma,
            costs["target_step_s"],
            costs["draft_step_s"],
            costs["target_extend_s"][gamma + 1],
        ),
        round_s=spec_decode_s / max(rounds, 1),
        round_parts_s=gamma * costs["draft_step_s"]
        + costs["target_extend_s"][gamma + 1]
        + costs.get("sampling_round_s", {}).get(gamma, 0.0),
        greedy_identical_to_plain=same,
    )


def cell_programs(
    setup: Setup, cfg: BenchmarkConfig, sampling: SamplingConfig
) -> dict[Hashable, runner.Program]:
    """The two prefills, plain decoding and speculative decoding at every gamma."""
    target, draft = setup.target, setup.draft
    plain = decoding.DecodeConfig(cfg.feature_lengths["targets"], setup.stop_ids, sampling)
    programs: dict[Hashable, runner.Program] = {
        "target prefill": runner.Prefill(target.model, target.params, plain),
        "plain": runner.Decoder(target.model, target.params, plain, partitioner=cfg.partitioner),
    }
    if setup.draft_model is not None:
        programs["draft prefill"] = runner.Prefill(draft.model, draft.params, plain)
    for gamma in cfg.gammas:
        config = dataclasses.replace(plain, gamma=gamma, lenience=float(cfg.lenience))
        programs[gamma] = runner.Decoder(
            target.model, target.params, config, draft.model, draft.params, cfg.partitioner
        )
    return programs


def time_cell(
    setup: Setup,
    batches: Sequence[dict[str, jax.Array]],
    cfg: BenchmarkConfig,
    sampling: SamplingConfig,
) -> dict[Hashable, Timed]:
    """Every program of a cell (`cell_programs`) timed on every batch.

    Each program is compiled once per prompt width (ahead of time, timed apart) and rerun on every
    batch of that width; batch j uses the same rng for plain and speculative decoding. The two
    prefills are timed alone too, so that decode-only speedups can be reported beside end-to-end.
    """
    rngs = [jax.random.fold_in(jax.random.PRNGKey(cfg.seed), j) for j in range(len(batches))]
    timed = interleaved_timings(cell_programs(setup, cfg, sampling), batches, rngs, cfg.repeats)
    compile_s = ", ".join(f"{_label(n)} {t.compile_s:.1f}s" for n, t in timed.items())
    print(f"  compile: {compile_s}", flush=True)
    return timed


def cell_points(
    timed: Mapping[Hashable, Timed], gammas: Sequence[int], costs: Mapping[str, Any], greedy: bool
) -> list[Point]:
    """One point per gamma against the cell's plain baseline."""
    draft_prefill = timed.get("draft prefill")  # none for a draft that is not a model
    prefill_s = (timed["target prefill"].seconds, draft_prefill.seconds if draft_prefill else 0.0)
    points = []
    for gamma in gammas:
        p = make_point(gamma, timed["plain"], timed[gamma], prefill_s, costs, greedy)
        print(
            f"  gamma {gamma}: alpha {p.alpha:.3f} tau {p.tau:.2f} speedup {p.speedup:.2f}x "
            f"(decode only {p.decode_speedup:.2f}x, Thm 3.8 {p.predicted_speedup:.2f}x), "
            f"plain {p.plain_tok_s:.2f} tok/s, speculative {p.speculative_tok_s:.2f} tok/s",
            flush=True,
        )
        points.append(p)
    return points


def pooled_alpha(points: Sequence[Point]) -> float:
    """alpha over a cell's gammas weighted by tokens (alpha does not depend on gamma)."""
    weights = [p.speculative_tokens for p in points]
    return float(np.average([p.alpha for p in points], weights=weights))


def measure_cell(
    setup: Setup,
    batches: Sequence[dict[str, jax.Array]],
    cfg: BenchmarkConfig,
    temperature: float,
    costs: Mapping[str, Any],
) -> dict[str, Any]:
    """benchmark.json's cell for one batch size and temperature (with the configured filters)."""
    sampling = SamplingConfig(float(temperature), cfg.top_k, cfg.top_p)
    extend_ms = ", ".join(f"{n}: {1e3 * t:.0f}" for n, t in costs["target_extend_s"].items())
    print(
        f"batch {len(inputs.input_tokens(batches[0]))}, {sampling}, c {costs['c']:.3f} (target "
        f"step {1e3 * costs['target_step_s']:.0f} ms, draft step "
        f"{1e3 * costs['draft_step_s']:.0f} ms; target extend by n tokens, ms: {extend_ms}):",
        flush=True,
    )
    timed = time_cell(setup, batches, cfg, sampling)
    points = cell_points(timed, cfg.gammas, costs, sampling.greedy)
    alpha = pooled_alpha(points)
    return {
        "batch_size": len(inputs.input_tokens(batches[0])),
        "temperature": float(temperature),
        "exact": float(cfg.lenience) == 1.0,
        "lenience": float(cfg.lenience),
        "top_k": cfg.top_k,
        "top_p": cfg.top_p,
        "input_widths": [int(inputs.input_tokens(b).shape[1]) for b in batches],
        **costs,
        # Prefill included, so at batch 1 an upper bound on one plain step.
        "plain_s_per_token": points[0].plain_s / points[0].plain_tokens,
        "alpha": alpha,
        "optimal_gamma": metrics.optimal_gamma(alpha, costs["c"]),
        "points": [dataclasses.asdict(p) for p in points],
    }


# ------------------------------------------------------------------------------------------------
# The job.


def header(cfg: BenchmarkConfig, setup: Setup) -> dict[str, Any]:
    """benchmark.json's fields about the run itself (models, inputs, machine), cells empty."""
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(setup.target.params))
    bandwidth = timing.read_bandwidth()
    print(
        f"target weights {weight_bytes / 1e9:.2f} GB, measured read bandwidth "
        f"{bandwidth / 1e9:.1f} GB/s -> weight-streaming floor "
        f"{1e3 * weight_bytes / bandwidth:.0f} ms per plain step"
    )
    return {
        "target": setup.target.description,
        "draft": setup.draft.description,
        "inputs": cfg.input_file,
        "num_examples": setup.num_examples,
        "feature_lengths": dict(cfg.feature_lengths),
        "truncated_inputs": setup.truncated,
        "vocab_padding": dict(setup.vocab_padding),
        "padded_input_width": setup.width,
        "repeats": cfg.repeats,
        "stop_ids": list(setup.stop_ids),
        "target_weight_bytes": weight_bytes,
        "read_bandwidth_bytes_s": bandwidth,
        "stream_floor_s_per_step": weight_bytes / bandwidth,
        "jax": jax.__version__,
        "device": str(jax.devices()[0]),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),  # they can change kernels, hence timings
        **({"partitioner": job_spmd.describe(cfg.partitioner)} if cfg.partitioner else {}),
        "cells": [],
        "skipped": [],
    }


def print_memory(setup: Setup, cfg: BenchmarkConfig) -> None:
    gamma = max(cfg.gammas)
    for batch_size in cfg.batch_sizes:
        report = memory.job_report(
            setup.target.model,
            setup.draft_model,
            batch_size=batch_size,
            input_len=setup.width,
            max_decode_len=cfg.feature_lengths["targets"],
            gamma=gamma,
            param_dtype=_param_dtype(setup.target),
            mesh_shape=None if cfg.partitioner is None else cfg.partitioner.mesh_shape,
        )
        print(f"batch {batch_size}, gamma {gamma}: {report}")


def measure_batch_size(
    setup: Setup, cfg: BenchmarkConfig, batch_size: int
) -> Iterator[dict[str, Any]]:
    """Every temperature's cell at one batch size, one at a time; c and the verify costs are
    measured once for them all."""
    batches = batches_of(setup, cfg, batch_size)
    target, draft = setup.target, setup.draft
    cache_len = target.model.cache_length(
        setup.width, cfg.feature_lengths["targets"], max(cfg.gammas) + 1
    )
    costs = timing.measure_c(
        target.model,
        target.params,
        draft.model,
        draft.params,
        batches[0],
        cache_len,
        [g + 1 for g in cfg.gammas],
        draft_config=decoding.DecodeConfig(
            cfg.feature_lengths["targets"], setup.stop_ids, gamma=max(cfg.gammas)
        ),
    )
    for temperature in cfg.temperatures:
        sampling = SamplingConfig(float(temperature), cfg.top_k, cfg.top_p)
        rows = inputs.input_tokens(batches[0]).shape[0]
        costs["sampling_round_s"] = {
            g: timing.sampling_round_time(rows, target.model.vocab_size, g, sampling)
            for g in cfg.gammas
        }
        yield measure_cell(setup, batches, cfg, temperature, dict(costs))


def run(cfg: BenchmarkConfig) -> dict[str, Any]:
    """Runs the sweep; returns the result also written to OUTPUT_DIR/benchmark.json (rewritten
    after every cell, so a long sweep keeps what it measured)."""
    validate(cfg)
    cfg = dataclasses.replace(cfg, partitioner=job_spmd.make_partitioner(cfg.partitioner))
    for batch_size in cfg.batch_sizes:  # refused before any weight is read
        job_spmd.check_batch(cfg.partitioner, batch_size, "BATCH_SIZES entry")
    cache_dir = job_spmd.cache_dir(cfg.compilation_cache_dir, cfg.output_dir)
    with lock_output_dir(cfg.output_dir) as out, job_spmd.compilation_cache(cache_dir) as cache:
        return run_locked(cfg, out, cache)


def run_locked(
    cfg: BenchmarkConfig, out_dir: pathlib.Path, cache: job_spmd.CacheStats | None = None
) -> dict[str, Any]:
    """`run`'s sweep while it holds OUTPUT_DIR's lock. With the compilation cache on,
    benchmark.json's compilation_cache says whether the compile times are warm (cache hits)."""
    setup = load(cfg)
    print_memory(setup, cfg)
    result = header(cfg, setup)
    if cache is not None and cache.dir:
        result["compilation_cache"] = cache.to_json()
    for batch_size in cfg.batch_sizes:
        reason = memory_shortfall(setup, cfg, batch_size)
        if reason is not None:
            print(f"batch {batch_size}: skipped ({reason})")
            result["skipped"].append({"batch_size": batch_size, "reason": reason})
            continue
        try:
            for cell in measure_batch_size(setup, cfg, batch_size):
                result["cells"].append(cell)
                if "compilation_cache" in result:
                    result["compilation_cache"] = cache.to_json()
                (out_dir / "benchmark.json").write_text(json.dumps(result, indent=2))
        except FloatingPointError as e:  # NaN logits: `runner.Decoder` checks every output
            role = "draft" if getattr(e, "role", "target") == "draft" else "target"
            raise JobError(
                f"NaN logits at batch size {batch_size}: corrupt weights, or a dtype too narrow "
                f"for the model ({e})",
                role=role,
                path=ml.describe(cfg.draft) if role == "draft" else ml.where(cfg.target),
            ) from e
        except Exception as e:  # noqa: BLE001  only out-of-memory is expected; others re-raise
            if "RESOURCE_EXHAUSTED" not in str(e) and not isinstance(e, MemoryError):
                raise
            print(f"batch {batch_size}: skipped (out of memory: {str(e)[:200]})")
            reason = f"out of memory: {str(e)[:500]}"
            result["skipped"].append({"batch_size": batch_size, "reason": reason})
    if not result["cells"]:
        raise JobError("no batch size fitted in memory; nothing was measured")
    (out_dir / "benchmark.json").write_text(json.dumps(result, indent=2))
    benchmark_report.plot(result, out_dir)
    benchmark_report.print_table(result)
    print(f"wrote {out_dir}/benchmark.json and plots")
    return result


def main(argv: Sequence[str]) -> dict[str, Any] | None:
    return gin_flags.configure_and_run(argv, __doc__.split("\n\n")[0], BenchmarkConfig, run)


if __name__ == "__main__":
    sys.exit(gin_flags.run_job(main))
