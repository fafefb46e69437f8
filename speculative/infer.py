"""Inference job: speculative (or plain) decoding of a dataset, configured in gin like T5X's infer.py.

    python -m speculative.infer --gin_file=configs/demo/qwen_coder_infer.gin \
        --gin.OUTPUT_DIR="'/tmp/qwen'" [--gin.SPECULATIVE=False] [--gin.GAMMA=5]

Everything is bound in gin (configs/runs/infer.gin lists the macros, `%gin.REQUIRED` ones first):
target and draft `speculative.ModelSpec`s, vocabularies, sampling, gamma, batch size, feature
lengths, the input (JSONL / TSV file, "humaneval", or a seqio Task/Mixture name) and OUTPUT_DIR.

Output, in OUTPUT_DIR:
  predictions.jsonl  one row per example: index, inputs, targets (if any), output, output_ids,
                     length, target_calls, tau; speculative rows add alpha, accepted, drafted,
                     verified, accepted_at / verified_at per draft position. Written a batch at a
                     time, fsynced; a killed job restarted with the same OUTPUT_DIR resumes
                     (speculative/job_io.py). Row results do not depend on where a run stopped:
                     batches are fixed (indices [k*B, (k+1)*B)) and batch k uses rng fold_in(seed, k).
  summary.json       totals, pooled alpha, tau, measured c and the Theorem 3.8 speedup estimate.
  config.gin         the operative gin config.
With SPECULATIVE = False the target is decoded plainly with everything else equal (the draft is
not loaded); greedy outputs are then identical to the speculative ones.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import gin
import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from speculative import decoding, memory, metrics, timing, vocab
from speculative import model_loading as ml
from speculative.gin_flags import JobError
from speculative.job_config import InferConfig, seqio_tasks_module
from speculative.job_io import Example, ResultStore, examples_digest, read_examples

# ------------------------------------------------------------------------------------------------
# Validation and inputs.


def validate(cfg: InferConfig) -> None:
    """Raises JobError for a config the job cannot run (before any weight or input is read)."""
    for name in ("target", "vocabulary", "output_dir"):
        if getattr(cfg, name) is gin.REQUIRED:
            raise JobError(f"speculative.InferConfig.{name} is required")
    ml.validate_model_spec(cfg.target, "target")
    ml.validate_vocab_spec(cfg.vocabulary, "vocabulary")
    if cfg.speculative:
        if cfg.draft is None:
            raise JobError(
                "SPECULATIVE is on but no draft model is bound (speculative.InferConfig.draft)"
            )
        ml.validate_model_spec(cfg.draft, "draft")
        if cfg.draft_vocabulary is not None:
            ml.validate_vocab_spec(cfg.draft_vocabulary, "draft vocabulary")
    if not isinstance(cfg.gamma, int) or cfg.gamma < 1:
        raise JobError(f"gamma must be an integer >= 1, got {cfg.gamma!r}")
    if not isinstance(cfg.batch_size, int) or cfg.batch_size < 1:
        raise JobError(f"batch_size must be an integer >= 1, got {cfg.batch_size!r}")
    lengths = dict(cfg.feature_lengths)
    if set(lengths) != {"inputs", "targets"} or min(lengths.values()) < 1:
        raise JobError(
            f"feature_lengths must be {{'inputs': n, 'targets': m}} (>= 1), got {lengths}"
        )
    if (cfg.input_file is None) == (cfg.mixture_or_task_name is None):
        raise JobError("bind exactly one of INPUT_FILE and MIXTURE_OR_TASK_NAME")


def load_examples(cfg: InferConfig) -> list[Example]:
    if cfg.input_file is not None:
        return read_examples(
            cfg.input_file,
            input_field=cfg.input_field,
            target_field=cfg.target_field,
            limit=cfg.num_examples,
        )
    module = seqio_tasks_module()
    if cfg.task_module:
        importlib.import_module(cfg.task_module)
    if cfg.task_setup is not None:
        cfg.task_setup()
    examples = module.task_examples(
        cfg.mixture_or_task_name, cfg.task_split, dict(cfg.feature_lengths), cfg.num_examples
    )
    if not examples:
        raise JobError(f"seqio task {cfg.mixture_or_task_name!r} split {cfg.task_split!r} is empty")
    return examples


def tokenize(
    examples: Sequence[Example], vocabulary: vocab.Vocabulary, encoder_decoder: bool, max_len: int
) -> list[list[int]]:
    """Token ids per example, truncated to max_len (encoder inputs end with EOS, as in T5)."""
    out = []
    for ex in examples:
        if ex.ids is not None:  # seqio: already trimmed, ends with EOS (kept for encoders only)
            ids = list(ex.ids)[:max_len]
            if not encoder_decoder and ids and ids[-1] == vocabulary.eos_id:
                ids = ids[:-1]
        elif encoder_decoder:
            ids = vocabulary.encode(ex.inputs)[: max_len - 1] + [vocabulary.eos_id]
        else:
            ids = vocabulary.encode(ex.inputs)[-max_len:]
        if not ids:
            raise JobError(f"input {ex.index} is empty after tokenization; a prompt needs a token")
        out.append(ids)
    return out


def bucket(length: int, cap: int) -> int:
    """Padded width for a batch: the next power of two >= length (>= 8), at most cap.

    Few distinct widths means few compilations; a batch's width depends only on its own inputs.
    """
    return min(max(8, 1 << math.ceil(math.log2(max(length, 1)))), max(cap, length))


def make_batch(ids: Sequence[Sequence[int]], width: int, encoder_decoder: bool) -> dict:
    """[B, width] right-padded with 0; decoder-only batches add prompt_lengths [B]."""
    tokens = np.zeros((len(ids), width), np.int32)
    for row, seq in enumerate(ids):
        tokens[row, : len(seq)] = seq
    if encoder_decoder:
        return {"encoder_input_tokens": jnp.asarray(tokens)}
    lengths = np.asarray([len(s) for s in ids], np.int32)
    return {"prompt": jnp.asarray(tokens), "prompt_lengths": jnp.asarray(lengths)}


# ------------------------------------------------------------------------------------------------
# Rows and summaries.


def output_rows(
    examples: Sequence[Example],
    out: decoding.DecodeOutput,
    vocabulary: vocab.Vocabulary,
    speculative: bool,
) -> list[dict[str, Any]]:
    """One JSON-able row per example from the first len(examples) rows of `out`."""
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    stats = {k: np.asarray(v) for k, v in out.stats.items()}
    rows = []
    for i, ex in enumerate(examples):
        ids = [int(t) for t in tokens[i, : int(lengths[i])]]
        text_ids = ids[:-1] if ids and ids[-1] == vocabulary.eos_id else ids
        row: dict[str, Any] = {"index": ex.index, **dict(ex.extra), "inputs": ex.inputs}
        if ex.targets is not None:
            row["targets"] = ex.targets
        row.update(
            output=vocabulary.decode(text_ids),
            output_ids=ids,
            length=len(ids),
            target_calls=int(stats["target_calls"][i]),
            tau=float(stats["tokens_per_call"][i]),
        )
        if speculative:
            row.update(
                alpha=float(stats["alpha"][i]),
                accepted=int(stats["accepted"][i]),
                drafted=int(stats["drafted"][i]),
                draft_calls=int(stats["draft_calls"][i]),
                verified=int(stats["verified_at"][i].sum()),
                accepted_at=[int(x) for x in stats["accepted_at"][i]],
                verified_at=[int(x) for x in stats["verified_at"][i]],
            )
        rows.append(row)
    return rows


def pooled(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals over output rows: tokens, target calls, tau, and (speculative) alpha pooled over
    verified positions, accepted / drafted, acceptance per draft position."""
    tokens = sum(r["length"] for r in rows)
    calls = sum(r["target_calls"] for r in rows)
    out: dict[str, Any] = {
        "examples": len(rows),
        "tokens": tokens,
        "target_calls": calls,
        "tau": tokens / max(calls, 1),
    }
    if rows and "alpha" in rows[0]:
        verified = sum(r["verified"] for r in rows)
        out["alpha"] = sum(r["alpha"] * r["verified"] for r in rows) / max(verified, 1)
        out["accepted"] = sum(r["accepted"] for r in rows)
        out["drafted"] = sum(r["drafted"] for r in rows)
        out["draft_calls"] = sum(r["draft_calls"] for r in rows)
        acc = np.sum([r["accepted_at"] for r in rows], axis=0)
        ver = np.sum([r["verified_at"] for r in rows], axis=0)
        out["acceptance_by_position"] = [float(x) for x in acc / np.maximum(ver, 1)]
    return out


def fingerprint(cfg: InferConfig, examples: Sequence[Example]) -> dict[str, Any]:
    """What determines every row's result: a restart must match it to resume."""
    return {
        "target": ml.describe(cfg.target),
        "draft": ml.describe(cfg.draft) if cfg.speculative else None,
        "speculative": cfg.speculative,
        "gamma": cfg.gamma if cfg.speculative else None,
        "sampling": dataclasses.asdict(cfg.sampling),
        "batch_size": cfg.batch_size,
        "feature_lengths": dict(cfg.feature_lengths),
        "seed": cfg.seed,
        "examples": len(examples),
        "inputs_sha256": examples_digest(examples),
    }


# ------------------------------------------------------------------------------------------------
# The job.


def run(cfg: InferConfig) -> dict[str, Any]:
    """Runs (or resumes) the job; returns the summary also written to OUTPUT_DIR/summary.json."""
    validate(cfg)
    examples = load_examples(cfg)
    store = ResultStore(cfg.output_dir, fingerprint(cfg, examples))
    B, n = cfg.batch_size, len(examples)
    todo = [
        k
        for k in range(math.ceil(n / B))
        if any(i not in store.done for i in range(k * B, min(n, (k + 1) * B)))
    ]
    print(
        f"{n} examples, {len(store.done)} already in {store.path}, {len(todo)} batches of {B} to decode"
    )

    vocabulary = ml.load_vocabulary(cfg.vocabulary, "vocabulary")
    target = draft = None
    run_stats: dict[str, Any] = {
        "decoded_examples": 0,
        "decoded_tokens": 0,
        "decode_s": 0.0,
        "compile_batches": 0,
    }
    if todo or (cfg.speculative and cfg.measure_c):
        target = ml.load_model(cfg.target, "target")
        if cfg.speculative:
            draft = ml.load_model(cfg.draft, "draft")
            ml.check_draft_vocabulary(cfg.draft_vocabulary, vocabulary)
    encoder_decoder = bool(target and target.model.is_encoder_decoder)
    ids = (
        tokenize(examples, vocabulary, encoder_decoder, cfg.feature_lengths["inputs"])
        if target
        else []
    )
    if target is not None and not encoder_decoder:
        context = target.model.config.max_seq_len
        if cfg.speculative:
            context = min(context, draft.model.config.max_seq_len)
        need = max(len(x) for x in ids) + cfg.feature_lengths["targets"]
        if need > context:
            raise JobError(
                f"longest prompt + targets length = {need} tokens exceeds the model context {context}"
            )

    if target is not None:
        print(
            memory.job_report(
                target.model,
                draft.model if draft is not None else None,
                batch_size=B,
                input_len=max(len(x) for x in ids),
                max_decode_len=cfg.feature_lengths["targets"],
                gamma=cfg.gamma if cfg.speculative else 0,
                param_dtype=jax.tree_util.tree_leaves(target.params)[0].dtype,
            )
        )
    decode_s, decoded_tokens, seen_widths = 0.0, 0, set()
    # Running alpha for the progress bar, kept incrementally (re-pooling every row is O(N^2)).
    beta_sum = sum(r["alpha"] * r["verified"] for r in store.rows() if "alpha" in r)
    verified = sum(r["verified"] for r in store.rows() if "alpha" in r)
    bar = tqdm(
        total=n, initial=len(store.done), unit="ex", disable=not cfg.progress, file=sys.stderr
    )
    for k in todo:
        members = list(range(k * B, min(n, (k + 1) * B)))
        # Static batch size: a short last batch repeats its last row (the copies are dropped).
        padded = members + [members[-1]] * (B - len(members))
        width = bucket(max(len(ids[i]) for i in members), cfg.feature_lengths["inputs"])
        batch = make_batch([ids[i] for i in padded], width, encoder_decoder)
        common = dict(
            max_decode_len=cfg.feature_lengths["targets"],
            sampling=cfg.sampling,
            eos_id=vocab.stop_ids(vocabulary),
            rng=jax.random.fold_in(jax.random.PRNGKey(cfg.seed), k),
        )
        start = time.perf_counter()
        try:
            if cfg.speculative:
                out = decoding.speculative_decode(
                    target.model,
                    target.params,
                    draft.model,
                    draft.params,
                    batch,
                    gamma=cfg.gamma,
                    **common,
                )
            else:
                out = decoding.autoregressive_decode(target.model, target.params, batch, **common)
            out = timing.block(out)
        except ValueError as e:
            raise JobError(f"batch {k}: {e}") from e
        seconds = time.perf_counter() - start
        rows = output_rows([examples[i] for i in members], out, vocabulary, cfg.speculative)
        rows = [r for r in rows if r["index"] not in store.done]  # a torn batch's survivors stay
        store.append(rows)
        if width in seen_widths:  # the first batch of each width includes its compilation
            decode_s += seconds
            decoded_tokens += sum(r["length"] for r in rows)
        else:
            run_stats["compile_batches"] += 1
        seen_widths.add(width)
        run_stats["decoded_examples"] += len(rows)
        run_stats["decoded_tokens"] += sum(r["length"] for r in rows)
        postfix = {"tok/s": f"{decoded_tokens / decode_s:.1f}" if decode_s else "compiling"}
        if cfg.speculative:
            beta_sum += sum(r["alpha"] * r["verified"] for r in rows)
            verified += sum(r["verified"] for r in rows)
            postfix["alpha"] = f"{beta_sum / max(verified, 1):.3f}"
        bar.set_postfix(postfix)
        bar.update(len(rows))
    bar.close()
    run_stats["decode_s"] = decode_s
    run_stats["tokens_per_s"] = decoded_tokens / decode_s if decode_s else None

    summary = {
        "target": ml.describe(cfg.target),
        "draft": ml.describe(cfg.draft) if cfg.speculative else None,
        "speculative": cfg.speculative,
        "gamma": cfg.gamma if cfg.speculative else None,
        "batch_size": B,
        "sampling": dataclasses.asdict(cfg.sampling),
        "feature_lengths": dict(cfg.feature_lengths),
        **pooled(store.rows()),
        "this_run": run_stats,
    }
    if cfg.speculative and cfg.measure_c and target is not None:
        probe_ids = [ids[0]] * B
        width = bucket(len(ids[0]), cfg.feature_lengths["inputs"])
        cache_len = (
            (0 if encoder_decoder else width) + cfg.feature_lengths["targets"] + cfg.gamma + 1
        )
        timing_c = timing.measure_c(
            target, draft, make_batch(probe_ids, width, encoder_decoder), cache_len
        )
        alpha = summary["alpha"]
        summary.update(
            timing_c,
            predicted_speedup=metrics.predicted_speedup(alpha, cfg.gamma, timing_c["c"]),
            optimal_gamma=metrics.optimal_gamma(alpha, timing_c["c"]),
        )
    (store.dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (store.dir / "config.gin").write_text(gin.operative_config_str())
    print_summary(summary, store.dir)
    return summary


def print_summary(s: Mapping[str, Any], out_dir) -> None:
    mode = f"speculative, gamma {s['gamma']}" if s["speculative"] else "plain decoding"
    print(f"\n{s['target']}\n  {mode}, batch {s['batch_size']}, {s['sampling']}")
    if s["speculative"]:
        print(f"  draft: {s['draft']}")
    print(
        f"  {s['examples']} examples, {s['tokens']} tokens, {s['target_calls']} target calls, tau {s['tau']:.2f}"
    )
    if "alpha" in s:
        print(f"  alpha {s['alpha']:.3f}, accepted {s['accepted']} / drafted {s['drafted']}")
    r = s["this_run"]
    if r["tokens_per_s"]:
        print(
            f"  this run: {r['decoded_tokens']} tokens, {r['tokens_per_s']:.1f} tok/s (batches that compiled excluded)"
        )
    if "c" in s:
        print(
            f"  c {s['c']:.3f} -> Theorem 3.8 speedup estimate {s['predicted_speedup']:.2f}x "
            f"(optimal gamma {s['optimal_gamma']})"
        )
    print(f"  wrote {out_dir}/predictions.jsonl, summary.json, config.gin")


def main(argv: Sequence[str]) -> dict[str, Any] | None:
    from speculative import gin_flags

    return gin_flags.configure_and_run(argv, __doc__.split("\n\n")[0], InferConfig, run)


if __name__ == "__main__":
    from speculative.gin_flags import run_job

    sys.exit(run_job(main))
