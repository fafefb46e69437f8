#!/usr/bin/env python
"""The peer anchor in one run: our plain and speculative decoding against Hugging Face's plain
`generate` and assisted generation, same GGUF pair, same prompts, same stop ids, batch 1.

Needs the `[compare]` extra (torch CPU and transformers; the package itself never imports them):

    bash scripts/setup_env.sh compare
    .venv/bin/python scripts/compare_hf.py --prompts 100:104 --out benchmarks/compare_hf

Every program decodes every prompt before the next prompt starts (interleaved), so drifts in the
machine's speed hit all of them alike. Load and compile times are reported apart. Greedy outputs of
every program are compared token for token with Hugging Face's plain greedy output. Hugging Face's
assisted generation runs with its defaults (a dynamic number of assistant tokens) and with a
constant `num_assistant_tokens` from --hf_assistant_tokens, and its prompt-lookup decoding runs
with `prompt_lookup_num_tokens` from --hf_prompt_lookup_tokens, each in every dtype of --hf_dtypes
(torch's bfloat16 uses the same matrix units as ours); the best of them all is the anchor ("HF
best"). Ours runs in --dtype ('auto': bfloat16 where the machine has bfloat16 matrix units), so
"ours plain" is our fastest plain decoding. Greedy identity is checked against each side's own
plain output of the same dtype (bfloat16 and float32 outputs may differ from each other).
With --cross_draft NAME (e.g. smollm2-135m) a draft of another tokenizer runs on both sides too:
ours through the token-level intersection, fed the prompt text in its own tokens, at each
--cross_gammas; Hugging Face's universal assisted generation (`assistant_model`, `tokenizer`,
`assistant_tokenizer`) with each assistant schedule (scripts/compare_hf_cross.py); each cell then
also reports the best of each side's cross-vocabulary programs.
A program that raises (transformers' universal assisted generation has raised RuntimeError
"cannot reshape tensor of 0 elements") is a failed cell: its name, exception type and message go
to the JSON ("failed" in its program entry and the cell's "failed" list) and the markdown table,
it is not run again in that cell, and the other programs go on.
Writes compare_hf.json and compare_hf.md under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import compare_hf_cross  # scripts/compare_hf_cross.py (the script's directory is on sys.path)
import jax
import jax.numpy as jnp
import numpy as np
from hf_generate import HuggingFace  # scripts/hf_generate.py

from speculative import checkpoints, decoding, vocab
from speculative.data import inputs
from speculative.decoding.sampling import SamplingConfig
from speculative.drafts import shortlist, staged
from speculative.loading import fetch
from speculative.measure import runner, timing
from speculative.models import decoder, int8, precision
from speculative.outputs import provenance

TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"


def _parse_range(text: str) -> range:
    start, _, stop = text.partition(":")
    return range(int(start), int(stop) if stop else int(start) + 1)


class Ours:
    """Our plain and speculative programs, compiled once for a fixed prompt width."""

    def __init__(self, target_path, draft_path, width, args, prompts):
        start = time.perf_counter()
        self.dtype = precision.resolve_dtype(args.dtype)
        t_cfg, self.t_params = checkpoints.load_gguf(target_path, dtype=jnp.dtype(self.dtype))
        d_cfg, d_params = checkpoints.load_gguf(draft_path, dtype=jnp.dtype(self.dtype))
        self.target = decoder.DecoderLM(t_cfg)
        self.vocab = vocab.from_gguf(target_path)
        vocab.check_compatible(vocab.from_gguf(draft_path), self.vocab)
        # draft shortlist size -> (draft model, params); 0 is the full head
        self.drafts = {}
        for size in args.draft_shortlists:
            if size:
                ids = shortlist.for_prompts(self.vocab, size, prompts, vocab_size=t_cfg.vocab_size)
                config, params = decoder.restrict_head(d_cfg, d_params, ids)
                self.drafts[size] = (decoder.DecoderLM(config), params)
            else:
                self.drafts[size] = (decoder.DecoderLM(d_cfg), d_params)
            if args.draft_quantize == "int8":  # after the shortlist: its head is int8 too
                model, params = self.drafts[size]
                self.drafts[size] = (model, int8.quantize_params(params))
        self.load_s = time.perf_counter() - start
        self.width, self.args = width, args
        self.compiled: dict[Any, Any] = {}
        self.compile_s: dict[str, float] = {}

    def batch(self, ids):
        return inputs.decoder_batch([ids], pad_to=self.width)

    def run(self, name, program, ids, sampling, seed):
        """program: None (plain) or (gamma, draft shortlist, tree widths or None, staged
        lookahead: 0 or the lookup tokens per draft call, drafts/staged.py)."""
        gamma, short, tree, staged_k = program if program is not None else (None, None, None, 0)
        config = decoding.DecodeConfig(
            self.args.max_new_tokens, vocab.stop_ids(self.vocab), sampling, gamma, tree=tree
        )

        def draft():
            if config.gamma is None:
                return None, None
            model, params = self.drafts[short]
            return (staged.StagedDrafter(model, staged_k), params) if staged_k else (model, params)

        return self.timed(name, config, self.batch(ids), seed, draft)

    def timed(self, name, config, batch, seed, draft):
        """(tokens, seconds, stats) of one timed decode of `batch` (one row); the program is
        compiled and warmed up once per (name, config), untimed. draft: () -> (drafter, params)."""
        rng = jax.random.PRNGKey(seed)
        key = (name, config)
        if key not in self.compiled:  # compile once per program, warm up once, both untimed
            program = runner.Decoder(self.target, self.t_params, config, *draft())
            self.compiled[key], seconds = program.compile(batch, rng)
            self.compile_s[name] = self.compile_s.get(name, 0.0) + seconds
            timing.block(self.compiled[key](batch, rng))
        start = time.perf_counter()
        out = timing.block(self.compiled[key](batch, rng))
        seconds = time.perf_counter() - start
        n = int(out.lengths[0])
        tokens = [int(t) for t in np.asarray(out.tokens[0, :n])]
        stats = {"target_calls": int(out.stats.target_calls[0])}
        if config.gamma is not None:
            stats["alpha"] = float(out.stats.alpha[0])
            stats["verified"] = int(out.stats.verified[0])
        return tokens, seconds, stats


def run(args) -> dict[str, Any]:
    code = provenance.record(None)  # before anything runs: a long run's tree may be edited
    target_path = fetch.ensure_model(TARGET)
    draft_path = fetch.ensure_model(DRAFT)
    problems = inputs.humaneval_prompts()
    chosen = list(_parse_range(args.prompts))
    hfs = {d: HuggingFace(target_path, draft_path, args, d) for d in args.hf_dtypes}
    hf = next(iter(hfs.values()))
    ours_vocab = vocab.from_gguf(target_path)
    prompts, texts = [], [problems[i]["prompt"] for i in chosen]
    for i in chosen:
        ids = ours_vocab.encode(problems[i]["prompt"])
        hf_ids = hf.tokenizer(problems[i]["prompt"], add_special_tokens=False)["input_ids"]
        if ids != hf_ids:
            raise SystemExit(f"HumanEval/{i}: our tokenizer and transformers' disagree")
        prompts.append(ids)
    width = inputs.bucket(max(len(p) for p in prompts), 4096)
    ours = Ours(target_path, draft_path, width, args, prompts)
    stop_ids = vocab.stop_ids(ours.vocab)
    cross = None
    if args.cross_draft:
        cross = compare_hf_cross.Cross(args.cross_draft, ours, hfs, texts, prompts)
        print(f"loaded the cross-vocabulary draft {cross.load_s:.0f}s: {cross.tables}", flush=True)
    print(
        f"loaded: ours ({ours.dtype}) {ours.load_s:.0f}s, transformers "
        f"{', '.join(f'{d} {h.load_s:.0f}s' for d, h in hfs.items())} (apart); "
        f"prompts HumanEval/{chosen[0]}..{chosen[-1]}, width {width}, stop ids {stop_ids}",
        flush=True,
    )

    programs: list[tuple[str, str, Any]] = [("ours plain", "ours", None)]
    int8_note = ", int8 draft" if args.draft_quantize == "int8" else ""
    programs += [
        (
            f"ours speculative gamma {g}" + (f", draft shortlist {s}" if s else "") + int8_note,
            "ours",
            (g, s, None, 0),
        )
        for s in args.draft_shortlists
        for g in args.gammas
    ]
    programs += [
        (
            f"ours staged gamma {g}, lookup {k}"
            + (f", draft shortlist {s}" if s else "")
            + int8_note,
            "ours",
            (g, s, None, k),
        )
        for s in args.draft_shortlists
        for g in args.gammas
        for k in args.staged
    ]
    programs += [
        (
            f"ours speculative tree {t}" + (f", draft shortlist {s}" if s else "") + int8_note,
            "ours",
            (None, s, t, 0),
        )
        for s in args.draft_shortlists
        for t in (tuple(int(w) for w in text.split(",")) for text in args.trees)
    ]
    for d in args.hf_dtypes:
        side = _hf_side(d)
        modes = [None, "default", *args.hf_assistant_tokens]
        modes += [("lookup", n) for n in args.hf_prompt_lookup_tokens]
        programs += [(_hf_name(d, mode), side, mode) for mode in modes]
    if cross is not None:
        programs += cross.programs(args.cross_gammas, args.hf_assistant_tokens)
    cells = []
    for temperature in args.temperatures:
        sampling = SamplingConfig(temperature=temperature)
        rows: dict[str, dict[str, Any]] = {
            name: {"seconds": [], "tokens": [], "target_calls": 0, "beta": 0.0, "verified": 0}
            for name, _, _ in programs
        }
        warm: set[str] = set()
        for j, ids in enumerate(prompts):
            for name, side, arg in programs:
                if "failed" in rows[name]:  # failed on an earlier prompt of this cell
                    continue

                def call(name=name, side=side, arg=arg, ids=ids, j=j, t=sampling, warm=warm):
                    if isinstance(arg, compare_hf_cross.CrossProgram):
                        result = cross.run(
                            name, side, arg, ids, t, stop_ids, args.seed + j, name in warm
                        )
                    elif side == "ours":
                        return ours.run(name, arg, ids, t, args.seed + j)
                    else:
                        # one untimed call before each program's first timed one (torch has no
                        # compile step, but allocates and picks kernels on first use)
                        result = hfs[side.removeprefix("hf ")].run(
                            arg, ids, t, stop_ids, args.seed + j, name in warm
                        )
                    warm.add(name)
                    return result

                record(rows[name], name, f"HumanEval/{chosen[j]}", call)
            print(
                f"  T={temperature} prompt {chosen[j]}: "
                + ", ".join(_progress(n, rows[n]) for n, _, _ in programs),
                flush=True,
            )
        cells.append(_summarize(temperature, programs, rows, args.hf_dtypes))
        if cross is not None:
            cells[-1]["cross"] = compare_hf_cross.summary(cells[-1], cross.tables)
        print(_markdown(cells[-1]), flush=True)
    return dict(
        prompts=[f"HumanEval/{i}" for i in chosen],
        max_new_tokens=args.max_new_tokens,
        batch_size=1,
        dtype=ours.dtype,
        dtype_route=precision.resolve(args.dtype).reason,
        hf_dtypes=list(args.hf_dtypes),
        stop_ids=list(stop_ids),
        load_s={"ours": ours.load_s, **{_hf_side(d): h.load_s for d, h in hfs.items()}},
        hf_weights={_hf_side(d): h.routes for d, h in hfs.items()},  # dense, not GGUF-packed
        compile_s=ours.compile_s,
        cells=cells,
        machine=dict(cpus=os.cpu_count(), platform=platform.platform()),
        versions=dict(jax=jax.__version__, **hf.versions),
        cpu=_cpu_model(),
        xla_flags=os.environ.get("XLA_FLAGS", ""),
        provenance=code,  # the commit and dirty state the run started from, the package version
        environment=provenance.environment(),  # time, command line, jax, devices, CPU and flags
    )


def record(row: dict[str, Any], name: str, prompt: str, call: Callable[[], Any]) -> None:
    """Runs one program on one prompt (`call`: its (tokens, seconds, stats)) and adds the result
    to its row; where it raises, the row records the failure instead ("failed": program, prompt,
    exception type and message) and the caller goes on with the other programs."""
    try:
        tokens, seconds, stats = call()
    except Exception as e:  # a peer's failure is a result of the run, not the end of it
        row["failed"] = dict(program=name, prompt=prompt, error=type(e).__name__, message=str(e))
        print(f"  {name} failed on {prompt}: {type(e).__name__}: {e}", flush=True)
        return
    row["seconds"].append(seconds)
    row["tokens"].append(tokens)
    row["target_calls"] += stats["target_calls"]
    row["beta"] += stats.get("alpha", 0.0) * stats.get("verified", 0)
    row["verified"] += stats.get("verified", 0)


def _progress(name: str, row: dict[str, Any]) -> str:
    if "failed" in row:
        return f"{name} failed"
    return f"{name} {row['seconds'][-1]:.1f}s"


def _hf_side(dtype: str) -> str:
    return f"hf {dtype}"


def _hf_name(dtype: str, mode: Any) -> str:
    """hf plain / hf assisted default / hf assisted N / hf prompt lookup N, with a dtype tag
    (float32 keeps the names of earlier runs)."""
    tag = "" if dtype == "float32" else f" [{dtype}]"
    if mode is None:
        return f"hf plain{tag}"
    if isinstance(mode, tuple):
        return f"hf prompt lookup {mode[1]}{tag}"
    return f"hf assisted {mode}{tag}"


def _cpu_model() -> str:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _summarize(temperature, programs, rows, hf_dtypes) -> dict[str, Any]:
    """A cell: every program's entry (a failed one: side and "failed" alone, left out of the bests
    and ratios, which are None where nothing is left to compare)."""
    table = {}
    for name, side, _ in programs:
        r = rows[name]
        if "failed" in r:
            table[name] = dict(side=side, failed=r["failed"])
            continue
        tokens = sum(len(t) for t in r["tokens"])
        seconds = sum(r["seconds"])
        table[name] = dict(
            side=side,
            tok_s=tokens / seconds,
            tokens=tokens,
            seconds=seconds,
            median_prompt_s=statistics.median(r["seconds"]),
            tokens_per_target_call=tokens / max(r["target_calls"], 1),
            alpha=r["beta"] / r["verified"] if r["verified"] else None,
        )
    own_plain = {"ours": "ours plain", **{_hf_side(d): _hf_name(d, None) for d in hf_dtypes}}
    hf_plains = [own_plain[_hf_side(d)] for d in hf_dtypes]
    ran = {n: e for n, e in table.items() if "failed" not in e}

    def fastest(names) -> str | None:
        return max((n for n in names if n in ran), key=lambda n: ran[n]["tok_s"], default=None)

    def ratio(a: str | None, b: str | None) -> float | None:
        return None if a not in ran or b not in ran else ran[a]["tok_s"] / ran[b]["tok_s"]

    fastest_hf_plain = fastest(hf_plains)
    for name, entry in ran.items():
        entry["speedup_over_own_plain"] = ratio(name, own_plain[entry["side"]])
        entry["speedup_over_hf_plain"] = ratio(name, fastest_hf_plain)
    # HF best: its assisted generation (default and fixed lengths) and its prompt lookup, any dtype
    # the headline pair is the same-tokenizer one; --cross_draft programs have their own summary
    same = {n: e for n, e in ran.items() if not compare_hf_cross.is_cross(n)}
    best_hf = fastest(n for n, e in same.items() if e["side"] != "ours" and n not in hf_plains)
    best_ours = fastest(n for n, e in same.items() if e["side"] == "ours" and n != "ours plain")
    identical = None
    if temperature == 0.0:  # against the side's own plain output of the same dtype
        identical = {
            name: rows[name]["tokens"] == rows[own_plain[side]]["tokens"]
            if name in ran and own_plain[side] in ran
            else None
            for name, side, _ in programs
        }
    return dict(
        temperature=temperature,
        programs=table,
        best_hf_assisted=best_hf,
        best_ours_speculative=best_ours,
        ours_over_best_hf_assisted=ratio(best_ours, best_hf),
        fastest_hf_plain=fastest_hf_plain,
        greedy_identical_to_own_plain=identical,
        failed=[e["failed"] for e in table.values() if "failed" in e],
    )


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _markdown(cell: dict[str, Any]) -> str:
    lines = [
        f"\nTemperature {cell['temperature']}, batch 1: best ours ({cell['best_ours_speculative']})"
        f" / best HF, assisted or prompt lookup ({cell['best_hf_assisted']}) = "
        f"{_times(cell['ours_over_best_hf_assisted'])}",
        "",
        f"| program | tok/s | over own plain | over {cell['fastest_hf_plain']} | tokens / target "
        "call | alpha | greedy identical to own plain |",
        "|---|---|---|---|---|---|---|",
    ]
    if "cross" in cell:
        lines.insert(1, compare_hf_cross.markdown(cell["cross"]))
    same = cell.get("greedy_identical_to_own_plain") or {}
    for name, e in cell["programs"].items():
        if "failed" in e:
            f = e["failed"]
            message = f"{f['error']}: {f['message']}".replace("|", "/").replace("\n", " ")
            lines.append(f"| {name} | failed on {f['prompt']}: {message} | | | | | |")
            continue
        alpha = "" if e["alpha"] is None else f"{e['alpha']:.3f}"
        lines.append(
            f"| {name} | {e['tok_s']:.2f} | {_times(e['speedup_over_own_plain'])} | "
            f"{_times(e['speedup_over_hf_plain'])} | {e['tokens_per_target_call']:.2f} | {alpha} | "
            f"{'' if same.get(name) is None else same[name]} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="100:104", help="HumanEval index range, e.g. 0:20")
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--gammas", type=int, nargs="+", default=[5])
    parser.add_argument(
        "--draft_shortlists",
        type=int,
        nargs="+",
        default=[0, 32768],
        help="our draft's head: 0 = all ids, N = a shortlist of N (drafts/shortlist.py)",
    )
    parser.add_argument("--hf_assistant_tokens", type=int, nargs="+", default=[3, 5, 8])
    parser.add_argument(
        "--trees",
        nargs="*",
        default=[],
        help="our token trees as widths per depth, e.g. 2,2,1,1,1 (one program each)",
    )
    parser.add_argument(
        "--staged",
        type=int,
        nargs="*",
        default=[],
        help="our staged drafting at each --gammas: prompt-lookup tokens per draft call",
    )
    parser.add_argument(
        "--hf_prompt_lookup_tokens",
        type=int,
        nargs="*",
        default=[10],
        help="prompt_lookup_num_tokens values of HF's prompt-lookup decoding (none: skip it)",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="ours: auto picks bfloat16 where the machine has bfloat16 matrix units",
    )
    parser.add_argument(
        "--draft_quantize",
        default="none",
        choices=["none", "int8"],
        help="ours: int8 draft weights (models/int8.py; exact), for every speculative program",
    )
    parser.add_argument(
        "--hf_dtypes",
        nargs="+",
        default=["float32", "bfloat16"],
        choices=["float32", "bfloat16"],
        help="torch dtypes Hugging Face's programs run in (each program in each)",
    )
    parser.add_argument(
        "--cross_draft",
        default=None,
        help="a draft of another tokenizer (registry name, e.g. smollm2-135m, or .gguf): ours "
        "through the token-level intersection, HF's universal assisted generation "
        "(scripts/compare_hf_cross.py)",
    )
    parser.add_argument(
        "--cross_gammas", type=int, nargs="+", default=[4, 6], help="ours, with --cross_draft"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/compare_hf")
    args = parser.parse_args()
    jnp.zeros(())  # initialise JAX before torch starts its threads
    result = run(args)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare_hf.json").write_text(json.dumps(result, indent=1))
    (out / "compare_hf.md").write_text("\n".join(_markdown(c) for c in result["cells"]) + "\n")
    print(f"wrote {out}/compare_hf.json and compare_hf.md")


if __name__ == "__main__":
    main()
