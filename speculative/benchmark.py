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

import json
import math
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gin
import jax
import numpy as np

from speculative import decoding, infer, inputs, memory, metrics, timing, vocab
from speculative import model_loading as ml
from speculative.gin_flags import JobError
from speculative.job_config import BenchmarkConfig
from speculative.job_io import prepare_output_dir, read_examples
from speculative.sampling import SamplingConfig


def validate(cfg: BenchmarkConfig) -> None:
    for name in ("target", "draft", "vocabulary", "output_dir"):
        if getattr(cfg, name) is gin.REQUIRED:
            raise JobError(f"speculative.BenchmarkConfig.{name} is required")
    ml.validate_model_spec(cfg.target, "target")
    ml.validate_model_spec(cfg.draft, "draft")
    ml.validate_vocab_spec(cfg.vocabulary, "vocabulary")
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


def cycled_batches(ids: Sequence[Sequence[int]], batch_size: int) -> list[list[Sequence[int]]]:
    """ceil(N / B) batches of B rows; row i of batch j is input (j * B + i) mod N."""
    n = len(ids)
    return [
        [ids[(j * batch_size + i) % n] for i in range(batch_size)]
        for j in range(math.ceil(n / batch_size))
    ]


def estimated_bytes(models: Sequence[Any], batch_size: int, cache_len: int, block: int) -> int:
    """Rough working memory of decoding beyond the weights: KV caches of every model plus ~8
    float32 copies of the [B, block, V] logits (probabilities, residuals). An estimate, used only
    to skip batch sizes that clearly cannot fit."""
    total = 0
    for model in models:
        cfg = model.config
        layers = getattr(cfg, "num_layers", None) or cfg.num_decoder_layers
        kv_heads = getattr(cfg, "num_kv_heads", None) or cfg.num_heads
        total += 2 * layers * batch_size * cache_len * kv_heads * cfg.head_dim * 4
    return total + 8 * batch_size * block * models[0].vocab_size * 4


def available_bytes() -> int:
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


Compiler = Callable[[dict, jax.Array], tuple[Callable[..., Any], float]]


def interleaved_timings(
    compilers: Mapping[Any, Compiler],
    batches: Sequence[dict],
    rngs: Sequence[jax.Array],
    repeats: int,
) -> dict[Any, dict[str, Any]]:
    """Times every program on every batch, all programs on batch j before batch j+1.

    compilers: name -> compile(batch, rng) -> (run(batch, rng), compile seconds). A program is
    compiled once per batch shape (prompt width), on first use, and warmed up once (not timed).
    Interleaving puts the plain baseline and each gamma under the same machine conditions (a
    drift in load or clock affects all of them alike).
    Returns per program {seconds (sum of per-batch medians), batch_seconds, compile_s, tokens,
    outputs}; tokens and outputs only for programs that return a DecodeOutput.
    """
    result = {
        name: {"seconds": 0.0, "batch_seconds": [], "compile_s": 0.0, "tokens": 0, "outputs": []}
        for name in compilers
    }
    compiled: dict[tuple[Any, tuple[int, ...]], Callable[..., Any]] = {}
    for j, (batch, rng) in enumerate(zip(batches, rngs)):
        shape = tuple(inputs.input_tokens(batch).shape)
        for name, compile_fn in compilers.items():
            if (name, shape) not in compiled:
                run, seconds = compile_fn(batch, rng)
                result[name]["compile_s"] += seconds
                timing.block(run(batch, rng))  # warm-up, not timed
                compiled[name, shape] = run
            run = compiled[name, shape]
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                out = timing.block(run(batch, rng))
                times.append(time.perf_counter() - start)
            r = result[name]
            r["seconds"] += statistics.median(times)
            r["batch_seconds"].append(statistics.median(times))
            if isinstance(out, decoding.DecodeOutput):
                r["tokens"] += int(np.sum(out.lengths))
                r["outputs"].append(out)
        print(
            f"    batch {j + 1}/{len(batches)} {shape}: "
            + ", ".join(f"{_label(n)} {result[n]['batch_seconds'][-1]:.1f}s" for n in compilers),
            flush=True,
        )
    return result


def prefill_compiler(model: Any, params: Any, max_decode_len: int, block: int) -> Compiler:
    """compile(batch, rng) for the prefill alone: what every decode of `batch` pays first."""

    def compile_fn(batch, rng):
        cache_len = decoding._cache_len(model, batch, max_decode_len, block)
        fn = jax.jit(lambda p, b: decoding._prefill(model, p, b, cache_len))
        start = time.perf_counter()
        executable = fn.lower(params, batch).compile()
        seconds = time.perf_counter() - start
        return (lambda b, _rng: executable(params, b)), seconds

    return compile_fn


def _label(name: Any) -> str:
    return name if isinstance(name, str) else f"gamma {name}"


def _stats(outputs: Sequence[decoding.DecodeOutput]) -> dict[str, Any]:
    stats = {k: np.concatenate([np.asarray(o.stats[k]) for o in outputs]) for k in outputs[0].stats}
    return metrics.summarize(stats, np.concatenate([np.asarray(o.lengths) for o in outputs]))


def sweep_cell(
    target: ml.Loaded,
    draft: ml.Loaded,
    batches: Sequence[dict],
    cfg: BenchmarkConfig,
    sampling: SamplingConfig,
    stop_ids: Sequence[int],
    costs: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """All gammas at one (batch size, sampling): one plain baseline, one point per gamma.

    Each program is compiled once per prompt width (ahead of time, timed apart) and rerun on every
    batch of that width; batch j uses the same rng for plain and speculative decoding. The two
    prefills are timed alone too, so that decode-only speedups can be reported beside end-to-end.
    """
    max_len = cfg.feature_lengths["targets"]
    common = dict(max_decode_len=max_len, sampling=sampling, eos_id=stop_ids)
    rngs = [jax.random.fold_in(jax.random.PRNGKey(cfg.seed), j) for j in range(len(batches))]

    def spec_compiler(gamma):
        def compile_fn(batch, rng):
            return decoding.compile_speculative(
                target.model,
                target.params,
                draft.model,
                draft.params,
                batch,
                gamma=gamma,
                rng=rng,
                **common,
            )

        return compile_fn

    compilers: dict[Any, Compiler] = {
        "target prefill": prefill_compiler(target.model, target.params, max_len, 1),
        "draft prefill": prefill_compiler(draft.model, draft.params, max_len, 1),
        "plain": lambda batch, rng: decoding.compile_autoregressive(
            target.model, target.params, batch, rng=rng, **common
        ),
        **{gamma: spec_compiler(gamma) for gamma in cfg.gammas},
    }
    timed = interleaved_timings(compilers, batches, rngs, cfg.repeats)
    print(
        "  compile: " + ", ".join(f"{_label(n)} {r['compile_s']:.1f}s" for n, r in timed.items()),
        flush=True,
    )
    plain = timed["plain"]
    target_prefill_s = timed["target prefill"]["seconds"]
    draft_prefill_s = timed["draft prefill"]["seconds"]
    plain_tok_s = plain["tokens"] / plain["seconds"]
    plain_decode_s = plain["seconds"] - target_prefill_s
    points = []
    for gamma in cfg.gammas:
        spec = timed[gamma]
        summary = _stats(spec["outputs"])
        same = None
        if sampling.greedy:
            same = all(
                np.array_equal(np.asarray(p.tokens), np.asarray(s.tokens))
                for p, s in zip(plain["outputs"], spec["outputs"])
            )
        spec_tok_s = spec["tokens"] / spec["seconds"]
        spec_decode_s = spec["seconds"] - target_prefill_s - draft_prefill_s
        points.append(
            {
                "gamma": gamma,
                "alpha": summary["alpha"],
                "tau": summary["tau"],
                "acceptance_by_position": summary["acceptance_by_position"],
                "plain_tokens": plain["tokens"],
                "plain_s": plain["seconds"],
                "plain_batch_s": plain["batch_seconds"],
                "plain_tok_s": plain_tok_s,
                "plain_compile_s": plain["compile_s"],
                "target_prefill_s": target_prefill_s,
                "draft_prefill_s": draft_prefill_s,
                "speculative_tokens": spec["tokens"],
                "speculative_s": spec["seconds"],
                "speculative_batch_s": spec["batch_seconds"],
                "speculative_tok_s": spec_tok_s,
                "speculative_compile_s": spec["compile_s"],
                "speedup": spec_tok_s / plain_tok_s,
                # Prefills subtracted (the draft's too): the decode loops alone, as Thm 3.8 models.
                "decode_speedup": (plain_decode_s / plain["tokens"])
                / (spec_decode_s / spec["tokens"]),
                "predicted_speedup": metrics.predicted_speedup(summary["alpha"], gamma, costs["c"]),
                "cost_model_speedup": metrics.cost_model_speedup(
                    summary["tau"],
                    gamma,
                    costs["target_step_s"],
                    costs["draft_step_s"],
                    costs["target_extend_s"][gamma + 1],
                ),
                "greedy_identical_to_plain": same,
            }
        )
        print(
            f"  gamma {gamma}: alpha {summary['alpha']:.3f} tau {summary['tau']:.2f} "
            f"speedup {points[-1]['speedup']:.2f}x (decode only {points[-1]['decode_speedup']:.2f}x, "
            f"Thm 3.8 {points[-1]['predicted_speedup']:.2f}x), "
            f"plain {plain_tok_s:.2f} tok/s, speculative {spec_tok_s:.2f} tok/s",
            flush=True,
        )
    return points


def pooled_alpha(points: Sequence[Mapping[str, Any]]) -> float:
    """alpha over a cell's gammas weighted by tokens (alpha does not depend on gamma)."""
    weights = [p["speculative_tokens"] for p in points]
    return float(np.average([p["alpha"] for p in points], weights=weights))


def run(cfg: BenchmarkConfig) -> dict[str, Any]:
    validate(cfg)
    out_dir = prepare_output_dir(cfg.output_dir)
    examples = read_examples(cfg.input_file, input_field=cfg.input_field, limit=cfg.num_examples)
    vocabulary = ml.load_vocabulary(cfg.vocabulary, "vocabulary")
    target = ml.load_model(cfg.target, "target")
    draft = ml.load_model(cfg.draft, "draft")
    ml.check_draft_vocabulary(cfg.draft_vocabulary, vocabulary)
    encdec = target.model.is_encoder_decoder
    ids = infer.tokenize(examples, vocabulary, encdec, cfg.feature_lengths["inputs"])
    width = infer.bucket(max(len(x) for x in ids), cfg.feature_lengths["inputs"])
    max_gamma = max(cfg.gammas)
    cache_len = (0 if encdec else width) + cfg.feature_lengths["targets"] + max_gamma + 1
    for batch_size in cfg.batch_sizes:
        print(
            f"batch {batch_size}, gamma {max_gamma}: "
            + memory.job_report(
                target.model,
                draft.model,
                batch_size=batch_size,
                input_len=width,
                max_decode_len=cfg.feature_lengths["targets"],
                gamma=max_gamma,
                param_dtype=jax.tree_util.tree_leaves(target.params)[0].dtype,
            )
        )
    stop_ids = vocab.stop_ids(vocabulary)
    weight_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(target.params))
    bandwidth = timing.read_bandwidth()
    print(
        f"target weights {weight_bytes / 1e9:.2f} GB, measured read bandwidth {bandwidth / 1e9:.1f} GB/s "
        f"-> weight-streaming floor {1e3 * weight_bytes / bandwidth:.0f} ms per plain step"
    )
    result: dict[str, Any] = {
        "target": target.description,
        "draft": draft.description,
        "inputs": cfg.input_file,
        "num_examples": len(examples),
        "feature_lengths": dict(cfg.feature_lengths),
        "padded_input_width": width,
        "repeats": cfg.repeats,
        "stop_ids": list(stop_ids),
        "target_weight_bytes": weight_bytes,
        "read_bandwidth_bytes_s": bandwidth,
        "stream_floor_s_per_step": weight_bytes / bandwidth,
        "jax": jax.__version__,
        "device": str(jax.devices()[0]),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),  # they can change kernels, hence timings
        "cells": [],
        "skipped": [],
    }
    for B in cfg.batch_sizes:
        need = estimated_bytes([target.model, draft.model], B, cache_len, max_gamma + 1)
        if need > 0.8 * available_bytes():
            reason = f"estimated {need / 2**30:.1f} GiB > 80% of available {available_bytes() / 2**30:.1f} GiB"
            print(f"batch {B}: skipped ({reason})")
            result["skipped"].append({"batch_size": B, "reason": reason})
            continue
        # Each batch padded to its own bucket (as the infer job does): padding every prompt to the
        # longest would bill short prompts for a long prefill.
        cap = cfg.feature_lengths["inputs"]
        batches = [
            infer.make_batch(b, infer.bucket(max(len(x) for x in b), cap), encdec)
            for b in cycled_batches(ids, B)
        ]
        try:
            timing_c = timing.measure_c(
                target, draft, batches[0], cache_len, [g + 1 for g in cfg.gammas]
            )
            for T in cfg.temperatures:
                sampling = SamplingConfig(float(T), cfg.top_k, cfg.top_p)
                extend_ms = ", ".join(
                    f"{n}: {1e3 * t:.0f}" for n, t in timing_c["target_extend_s"].items()
                )
                print(
                    f"batch {B}, {sampling}, c {timing_c['c']:.3f} (target step "
                    f"{1e3 * timing_c['target_step_s']:.0f} ms, draft step "
                    f"{1e3 * timing_c['draft_step_s']:.0f} ms; target extend by n tokens, ms: "
                    f"{extend_ms}):",
                    flush=True,
                )
                points = sweep_cell(target, draft, batches, cfg, sampling, stop_ids, timing_c)
                alpha = pooled_alpha(points)
                plain = points[0]
                result["cells"].append(
                    {
                        "batch_size": B,
                        "temperature": float(T),
                        "top_k": cfg.top_k,
                        "top_p": cfg.top_p,
                        "input_widths": [int(inputs.input_tokens(b).shape[1]) for b in batches],
                        **timing_c,
                        # Prefill included, so at batch 1 an upper bound on one plain step.
                        "plain_s_per_token": plain["plain_s"] / plain["plain_tokens"],
                        "alpha": alpha,
                        "optimal_gamma": metrics.optimal_gamma(alpha, timing_c["c"]),
                        "points": points,
                    }
                )
                (out_dir / "benchmark.json").write_text(json.dumps(result, indent=2))
        except Exception as e:  # noqa: BLE001  only out-of-memory is expected; others re-raise
            if "RESOURCE_EXHAUSTED" not in str(e) and not isinstance(e, MemoryError):
                raise
            print(f"batch {B}: skipped (out of memory: {str(e)[:200]})")
            result["skipped"].append({"batch_size": B, "reason": f"out of memory: {str(e)[:500]}"})
    if not result["cells"]:
        raise JobError("no batch size fitted in memory; nothing was measured")
    (out_dir / "benchmark.json").write_text(json.dumps(result, indent=2))
    plot(result, out_dir)
    print_table(result)
    print(f"wrote {out_dir}/benchmark.json and plots")
    return result


# ------------------------------------------------------------------------------------------------
# Reporting.


def table_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Flat rows: batch, temperature, gamma, alpha, tau, c, measured / predicted speedup, tok/s."""
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
                    "c": cell["c"],
                    "speedup": p["speedup"],
                    "decode_speedup": p.get("decode_speedup", float("nan")),
                    "predicted": p["predicted_speedup"],
                    "cost_model": p.get("cost_model_speedup", float("nan")),
                    "plain_tok_s": p["plain_tok_s"],
                    "spec_tok_s": p["speculative_tok_s"],
                }
            )
    return rows


def _sampling_label(cell: Mapping[str, Any]) -> str:
    """ "0" (greedy), "1", or "1, top-p 0.95" / "1, top-k 40" when those filters were on."""
    label = f"{cell['temperature']:g}"
    if cell["temperature"] > 0 and cell.get("top_k", 0):
        label += f", top-k {cell['top_k']}"
    if cell["temperature"] > 0 and cell.get("top_p", 1.0) < 1.0:
        label += f", top-p {cell['top_p']:g}"
    return label


def markdown_table(result: Mapping[str, Any]) -> str:
    head = "| batch | T | γ | α | τ | c | speedup | decode-only speedup | Thm 3.8 | cost model | plain tok/s | spec tok/s |\n"
    head += (
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    )
    lines = [
        f"| {r['batch']} | {r['T']} | {r['gamma']} | {r['alpha']:.3f} | {r['tau']:.2f} | {r['c']:.3f} "
        f"| {r['speedup']:.2f}x | {r['decode_speedup']:.2f}x | {r['predicted']:.2f}x | {r['cost_model']:.2f}x | {r['plain_tok_s']:.1f} | {r['spec_tok_s']:.1f} |"
        for r in table_rows(result)
    ]
    return head + "\n".join(lines)


def print_table(result: Mapping[str, Any]) -> None:
    print(f"\n{result['target']}\n  draft {result['draft']}\n")
    print(markdown_table(result))
    for cell in result["cells"]:
        print(
            f"batch {cell['batch_size']}, T {_sampling_label(cell)}: alpha {cell['alpha']:.3f}, "
            f"c {cell['c']:.3f} -> optimal gamma (Thm 3.8) {cell['optimal_gamma']}"
        )
    floor = result.get("stream_floor_s_per_step")
    for cell in result["cells"]:
        if cell["batch_size"] == 1 and floor:
            print(
                f"batch 1, T {_sampling_label(cell)}: plain {1e3 * cell['plain_s_per_token']:.0f} ms "
                f"per token (prefill included) vs weight-streaming floor {1e3 * floor:.0f} ms"
            )
    for s in result["skipped"]:
        print(f"batch {s['batch_size']} skipped: {s['reason']}")


def plot(result: Mapping[str, Any], out_dir: pathlib.Path) -> list[pathlib.Path]:
    """The three PNGs of the module docstring; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    cells = result["cells"]
    temps = sorted({c["temperature"] for c in cells})
    paths = []

    fig, axes = plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 4), squeeze=False)
    for ax, T in zip(axes[0], temps):
        for i, cell in enumerate(c for c in cells if c["temperature"] == T):
            color = f"C{i}"
            gammas = [p["gamma"] for p in cell["points"]]
            ax.plot(
                gammas,
                [p["speedup"] for p in cell["points"]],
                "o",
                color=color,
                label=f"B={cell['batch_size']} measured",
            )
            grid = np.arange(1, max(gammas) + 1)
            ax.plot(
                grid,
                [metrics.predicted_speedup(cell["alpha"], int(g), cell["c"]) for g in grid],
                "--",
                color=color,
                label=f"B={cell['batch_size']} Thm 3.8 (α={cell['alpha']:.2f}, c={cell['c']:.2f})",
            )
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(xlabel="γ", ylabel="speedup over plain decoding", title=f"temperature {T:g}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    paths.append(_save(fig, out_dir / "speedup_vs_gamma.png"))

    fig, axes = plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 4), squeeze=False)
    for ax, T in zip(axes[0], temps):
        row = sorted((c for c in cells if c["temperature"] == T), key=lambda c: c["batch_size"])
        for gamma in sorted({p["gamma"] for c in row for p in c["points"]}):
            xs, ys = [], []
            for cell in row:
                for p in cell["points"]:
                    if p["gamma"] == gamma:
                        xs.append(cell["batch_size"])
                        ys.append(p["speedup"])
            ax.plot(xs, ys, "o-", label=f"γ={gamma}")
        ax.set_xscale("log", base=2)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set(xlabel="batch size", ylabel="measured speedup", title=f"temperature {T:g}")
        ax.legend(fontsize=7)
    paths.append(_save(fig, out_dir / "speedup_vs_batch.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, T in enumerate(temps):
        cell = min((c for c in cells if c["temperature"] == T), key=lambda c: c["batch_size"])
        point = max(cell["points"], key=lambda p: p["gamma"])
        positions = np.arange(1, point["gamma"] + 1)
        ax.plot(
            positions,
            point["acceptance_by_position"],
            "o-",
            color=f"C{i}",
            label=f"T={T:g}, γ={point['gamma']}, B={cell['batch_size']}",
        )
        ax.axhline(
            point["alpha"], color=f"C{i}", ls=":", lw=1, label=f"T={T:g} α={point['alpha']:.2f}"
        )
    ax.set(
        xlabel="draft position i", ylabel="P(accept x_i | x_1..x_{i-1} accepted)", ylim=(0, 1.05)
    )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7)
    paths.append(_save(fig, out_dir / "acceptance_by_position.png"))
    return paths


def _save(fig, path: pathlib.Path) -> pathlib.Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def main(argv: Sequence[str]) -> dict[str, Any] | None:
    from speculative import gin_flags

    return gin_flags.configure_and_run(argv, __doc__.split("\n\n")[0], BenchmarkConfig, run)


if __name__ == "__main__":
    from speculative.gin_flags import run_job

    sys.exit(run_job(main))
