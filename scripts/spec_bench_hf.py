#!/usr/bin/env python
"""Spec-Bench with Hugging Face's programs beside ours, in one run (issue 54, item 4).

The Spec-Bench job's questions, template, models and protocol (`speculative.spec_bench`, its gin
config), with transformers' `generate` asked the same conversations: plain, assisted generation
with the same draft (transformers' default dynamic schedule and constant ones) and prompt-lookup
decoding, each in every dtype of --hf_dtypes, its weights dequantised at load (dense, as a
transformers user runs them: scripts/hf_generate.py). Ours: the job's plain and speculative
programs, and prompt lookup alone at each --lookup_gammas. Needs the `[compare]` extra.

    bash scripts/setup_env.sh compare
    .venv/bin/python scripts/spec_bench_hf.py --gin_file=configs/spec_bench/qwen_coder.gin \
        --gin.QUESTIONS="'question.jsonl'" --gin.OUTPUT_DIR="'benchmarks/spec_bench_hf'" \
        --gin.PER_TASK=1 --gin.PER_MT_BENCH_CATEGORY=1

Every program answers a question (all its turns, each next user turn after the program's own
answer) before the next question starts: interleaved, so a drifting machine hits all alike. Each
program sees the same prompt ids (the template rendered here; the first turns are checked equal
to transformers' `apply_chat_template` before anything is timed). Our compile and first runs,
and one untimed first call of each transformers program, are apart. Scores are Spec-Bench's
(`measure/spec_bench.py`): over our plain decoding (`scores`), over transformers' plain decoding
of the same dtype (`scores_over_hf_plain`), and per task the best of each side (`best`).

Writes predictions.jsonl (a row per question, as the job's rows), summary.json and summary.md
under OUTPUT_DIR (not resumable: a script's run, rerun whole).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib
import sys
import time
import types
from collections.abc import Mapping, Sequence
from typing import Any

import gin
import jax.numpy as jnp
import numpy as np
from hf_generate import HuggingFace  # scripts/hf_generate.py

from speculative.config import gin_flags
from speculative.decoding.sampling import SamplingConfig
from speculative.drafts.prompt_lookup import PromptLookupDrafter
from speculative.errors import JobError
from speculative.jobs import pairs
from speculative.jobs.spec_bench import run as job
from speculative.jobs.spec_bench.config import SpecBenchConfig
from speculative.loading import fetch
from speculative.measure import conversation, runner
from speculative.measure import spec_bench as scoring
from speculative.outputs import provenance
from speculative.vocab import chat

OURS_PLAIN = "plain"


def hf_name(dtype: str, mode: Any) -> str:
    """'hf plain' / 'hf assisted default' / 'hf assisted N' / 'hf prompt lookup N', with the
    dtype ('[float32]')."""
    if mode is None:
        what = "plain"
    elif isinstance(mode, tuple):
        what = f"prompt lookup {mode[1]}"
    else:
        what = f"assisted {mode}"
    return f"hf {what} [{dtype}]"


def is_hf(name: str) -> bool:
    return name.startswith("hf ")


def hf_modes(peers: argparse.Namespace) -> list[Any]:
    """transformers' programs (`HuggingFace.run`'s assistant_tokens): plain, assisted with each
    schedule, prompt lookup with each count."""
    assisted = [m if m == "default" else int(m) for m in peers.hf_assistant_tokens]
    return [None, *assisted, *(("lookup", n) for n in peers.hf_prompt_lookup_tokens)]


def check_rendering(prepared: job.Prepared, tokenizer: Any, given: str | None) -> None:
    """Every question's first turn, rendered and tokenized here, equals transformers'
    `apply_chat_template` ids (the model's own template as transformers finds it, or the one
    `given`); SystemExit otherwise."""
    extra = {} if given is None else {"chat_template": prepared.template.text}
    for q in prepared.questions:
        messages = [{"role": "user", "content": q.turns[0]}]
        ours = chat.encode_rendered(prepared.vocabulary, prepared.template.render(messages))
        theirs = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, **extra
        )
        theirs = list(theirs["input_ids"] if isinstance(theirs, Mapping) else theirs)
        if ours != theirs:
            raise SystemExit(f"question {q.question_id}: our rendering and transformers' differ")


def gguf_path(path: str) -> pathlib.Path:
    """A model's GGUF file: a registry name's (fetched once), else the path as given."""
    return fetch.ensure_model(path) if path in fetch.MODELS else pathlib.Path(path)


def hf_decoder(hf: HuggingFace, mode: Any, sampling: SamplingConfig, stops, seed: int):
    """converse's decode for one transformers program: (output with tokens [1, N], lengths [1]
    and target_calls [1], seconds); the program's first call ever is preceded by an untimed one."""
    warm: list[bool] = [False]

    def decode(ids: Sequence[int], turn: int, text: str) -> tuple[Any, float]:
        del text
        tokens, seconds, stats = hf.run(
            mode, list(ids), sampling, list(stops), seed + turn, warm[0]
        )
        warm[0] = True
        out = types.SimpleNamespace(
            tokens=np.asarray([tokens], np.int32),
            lengths=np.asarray([len(tokens)]),
            stats={"target_calls": np.asarray([stats["target_calls"]])},
        )
        return out, seconds

    return decode


def lookup_programs(
    programs: conversation.Programs, prepared: job.Prepared, gammas: Sequence[int]
) -> None:
    """Adds ours 'lookup gamma G' (prompt lookup alone, proposing to the target) for each G."""
    plain = programs.programs[OURS_PLAIN]
    base = prepared.speculative  # its sampling, stops and length
    for gamma in gammas:
        config = dataclasses.replace(base, gamma=gamma, tree=None)
        drafter = PromptLookupDrafter(plain.target.vocab_size, 3, 1)
        programs.programs[f"lookup gamma {gamma}"] = runner.Decoder(
            plain.target, plain.target_params, config, drafter, ()
        )


def fastest(programs: Mapping[str, Any], names: Sequence[str]) -> str:
    """The name of the program of `names` with the highest Spec-Bench mean tokens per second."""
    return max(names, key=lambda name: programs[name]["mean_tokens_per_s"])


def best_by_task(scores: Mapping[str, Any]) -> dict[str, Any]:
    """Per task: the fastest of ours and of transformers' speculative programs (Spec-Bench's mean
    tokens per second over the task's questions) and their ratio, and each side's plain."""
    best = {}
    for group, programs in scores.items():
        ours = [n for n in programs if not is_hf(n) and n != OURS_PLAIN]
        hf_plain = [n for n in programs if n.startswith("hf plain")]
        hf = [n for n in programs if is_hf(n) and n not in hf_plain]
        entry: dict[str, Any] = {"ours_plain_tok_s": programs[OURS_PLAIN]["mean_tokens_per_s"]}
        if hf_plain:
            entry["fastest_hf_plain"] = fastest(programs, hf_plain)
        if ours and hf:
            o, h = fastest(programs, ours), fastest(programs, hf)
            tok_s = {n: programs[n]["mean_tokens_per_s"] for n in (o, h)}
            entry.update(best_ours=o, best_hf=h, tok_s=tok_s, ours_over_best_hf=tok_s[o] / tok_s[h])
        best[group] = entry
    return best


def table(summary: Mapping[str, Any]) -> str:
    """summary.md: Spec-Bench's table over our plain decoding, then the best of each side."""
    lines = [scoring.table(summary["scores"], OURS_PLAIN), "", "| task | best ours | tok/s | "
             "best transformers | tok/s | ours / transformers |", "|---|---|---|---|---|---|"]  # fmt: skip
    for group, b in summary["best"].items():
        if "best_ours" in b:
            o, h = b["best_ours"], b["best_hf"]
            lines.append(
                f"| {group} | {o} | {b['tok_s'][o]:.2f} | {h} | {b['tok_s'][h]:.2f} | "
                f"{b['ours_over_best_hf']:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def doc_table(summary: Mapping[str, Any]) -> str:
    """docs/spec_bench.md's table: per task, each program's Spec-Bench speedup over our plain
    decoding (plain decoding's tokens per second in the first column), then each side's best and
    their ratio."""
    scores, best = summary["scores"], summary["best"]
    names = [n for n in next(iter(scores.values())) if n != OURS_PLAIN]
    lines = [
        "| task | ours plain tok/s | " + " | ".join(names) + " | best ours / best HF |",
        "|---|---|" + "---|" * len(names) + "---|",
    ]
    for group, programs in scores.items():
        cells = [f"{programs[n]['speedup']:.2f}x" for n in names]
        b = best[group]
        ratio = f"{b['ours_over_best_hf']:.2f}x" if "ours_over_best_hf" in b else "-"
        lines.append(
            f"| {group} | {programs[OURS_PLAIN]['mean_tokens_per_s']:.2f} | "
            + " | ".join(cells) + f" | {ratio} |"
        )  # fmt: skip
    return "\n".join(lines)


def run(peers: argparse.Namespace, cfg: SpecBenchConfig) -> dict[str, Any]:
    code = provenance.git_state()  # before anything runs: a long run's tree may be edited
    prepared = job.prepare(cfg)
    target, draft = pairs.model_spec(cfg.target), pairs.model_spec(cfg.draft)
    paths = [gguf_path(s.path) for s in (target, draft)]
    hf_args = types.SimpleNamespace(max_new_tokens=cfg.max_new_tokens)
    hfs = {d: HuggingFace(*paths, hf_args, d) for d in peers.hf_dtypes}  # before ours: its peak
    check_rendering(prepared, next(iter(hfs.values())).tokenizer, cfg.chat_template)
    programs, context = job.load_programs(cfg, prepared)
    lookup_programs(programs, prepared, peers.lookup_gammas)
    sampling = SamplingConfig(cfg.temperature, cfg.top_k, cfg.top_p)
    out = pathlib.Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows, start = [], time.perf_counter()
    decoders = {
        hf_name(d, m): functools.partial(hf_decoder, h, m, sampling, prepared.stops)
        for d, h in hfs.items()
        for m in hf_modes(peers)
    }
    hf_programs = {name: make(cfg.seed) for name, make in decoders.items()}
    with open(out / "predictions.jsonl", "w") as rows_file:
        for index, question in enumerate(prepared.questions):
            row = job.ask(cfg, prepared, programs, context, index)  # ours, plain first
            for name, decode in hf_programs.items():
                row["programs"][name] = job.answer(cfg, prepared, question, decode, context)
            rows.append(row)
            rows_file.write(json.dumps(row) + "\n")
            rows_file.flush()
            print(f"question {question.question_id} ({question.task}): {index + 1}/"
                  f"{len(prepared.questions)}", flush=True)  # fmt: skip
    scores = scoring.summarize(rows, OURS_PLAIN)
    first_hf = hf_name(peers.hf_dtypes[0], None)
    summary = {
        "scores": scores,
        "scores_over_hf_plain": scoring.summarize(rows, first_hf),
        "best": best_by_task(scores),
        "this_run": {
            "questions": len(rows),
            "seconds": time.perf_counter() - start,
            "compile_s": {f"{n}@{w}": s for (n, w), s in programs.compile_s.items()},
            "warmup_s": {f"{n}@{w}": s for (n, w), s in programs.warmup_s.items()},
            "hf_load_s": {d: h.load_s for d, h in hfs.items()},
        },
        "settings": {**job.fingerprint(cfg, prepared)["settings"], "peers": vars(peers)},
        "hf_weights": {d: h.routes for d, h in hfs.items()},  # dense, not GGUF-packed
        "versions": next(iter(hfs.values())).versions,
        "provenance": {**provenance.record(gin.operative_config_str()), **code},
        "environment": provenance.environment(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(table(summary))
    print(table(summary))
    return summary


def parse_peers(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """This script's own flags; the rest are the Spec-Bench job's (gin)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--lookup_gammas", type=int, nargs="*", default=[7])
    parser.add_argument("--hf_assistant_tokens", nargs="*", default=["default", "3"])
    parser.add_argument("--hf_prompt_lookup_tokens", type=int, nargs="*", default=[10])
    parser.add_argument("--hf_dtypes", nargs="+", default=["float32"])
    peers, rest = parser.parse_known_args(argv)
    return peers, rest


def main(argv: Sequence[str]) -> Any:
    peers, rest = parse_peers(argv)
    if not peers.hf_dtypes:
        raise JobError("--hf_dtypes: at least one")
    jnp.zeros(())  # initialise JAX before torch starts its threads
    return gin_flags.configure_and_run(
        rest, __doc__.splitlines()[0], SpecBenchConfig, functools.partial(run, peers),
        "configs/runs/spec_bench.gin",
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(gin_flags.run_job(main))
