#!/usr/bin/env python
"""Which draft each Spec-Bench task wants, read off a greedy run's own answers (issue 54).

Greedy acceptance is a function of the text alone: a drafted token is kept exactly when it is the
target's next token, and a greedy draft's i-th proposal in a round, while the i - 1 before it
were kept, is its argmax after the committed text, the same as teacher-forced over the target's
answer. So one teacher-forced pass of the draft over each answer of a greedy Spec-Bench run
(`predictions.jsonl`, plain decoding's tokens) gives every round of any chain gamma, of prompt
lookup (read off the text) and of a mix that takes lookup's proposals when its n-gram match is
long enough and the draft's otherwise, without decoding again. Priced by the cost probe
(`scripts/spec_bench_costs.py`: target step, verify call by width, draft step, both prefills by
prompt width), each becomes a predicted speed per task beside plain's, with the prefill in it as
Spec-Bench's timing has it. The run's own plain seconds check the cost model.

    python scripts/spec_bench_replay.py --run benchmarks/spec_bench_qwen_cpu \
        --costs benchmarks/spec_bench_costs/costs.json \
        --questions ../shared/data/spec_bench/question.jsonl --out benchmarks/spec_bench_replay

Writes replay.json (per turn: tokens, rounds and draft steps of each strategy; per task: predicted
speedups) and prints the table. Sampled decoding (T > 0) is not replayable this way: its
acceptance is random; measure it with the job.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative.data import inputs, spec_bench
from speculative.decoding.state import teacher_forced_logits
from speculative.decoding.tree import TreeShape
from speculative.drafts.prompt_lookup import _lookup_tree, continuation, latest_match
from speculative.jobs import pairs
from speculative.loading import specs as ml
from speculative.outputs import provenance
from speculative.vocab import chat

GAMMAS = (1, 2, 3, 4, 5, 6, 7)
# By prompt length: a long prompt's draft prefill is skipped, lookup alone proposing.
ROUTES = {
    f"lookup g7 from {n} prompt tokens, else {short}": (n, "lookup g7", short)
    for n in (256, 512)
    for short in ("chain g3", "mix g3, lookup g7 at n>=2")
}
CEILING = "prefill alone (every decode step free)"
TEXT_WIDTH = 2048  # replayed texts are padded to this for the lookup's compiled search


def draft_argmax(loaded: ml.Loaded, prompt: Sequence[int], answer: Sequence[int]) -> np.ndarray:
    """[len(answer)] the draft's greedy token before each answer token, teacher-forced."""
    batch = inputs.decoder_batch([list(prompt)], pad_to=-(-len(prompt) // 128) * 128)
    width = -(-len(answer) // 64) * 64
    tokens = jnp.asarray([list(answer) + [0] * (width - len(answer))], jnp.int32)
    argmax = _teacher_forced_argmax(loaded.model, loaded.params, batch, tokens)
    return np.asarray(argmax)[0, : len(answer)]


@functools.partial(jax.jit, static_argnums=0)  # one compile per model and shape
def _teacher_forced_argmax(model, params, batch, tokens):
    return jnp.argmax(teacher_forced_logits(model, params, batch, tokens), -1)


@jax.jit
def _lookup(ids: jax.Array, length: jax.Array, last: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(the lookup's 8 proposals [8], the n of its match: 3, 2, 1 or 0) for one text."""
    ids, length, last = ids[None], length[None], last[None]
    n = jnp.zeros((1,), jnp.int32)
    for size in (1, 2, 3):
        n = jnp.where(latest_match(ids, length, size) >= 0, size, n)
    return continuation(ids, length, last, 8, 3, 1)[0], n[0]


def lookup_rounds(prompt: Sequence[int], answer: Sequence[int]) -> list[tuple[np.ndarray, int]]:
    """For each committed count i of answer tokens: (lookup's proposals after prompt +
    answer[:i], its match length)."""
    text = np.zeros(TEXT_WIDTH, np.int32)
    full = list(prompt) + list(answer)
    text[: len(full)] = full
    text = jnp.asarray(text)
    out = []
    for i in range(len(answer)):
        length = len(prompt) + i
        tokens, n = _lookup(text, jnp.int32(length), jnp.int32(full[length - 1]))
        out.append((np.asarray(tokens), int(n)))
    return out


# Lookup alone, other n-gram ranges and trees (several matches' continuations as siblings): name
# -> (max_ngram, min_ngram, tree widths or None for a chain of 7). At most 8 nodes: a verify call
# of up to 8 tokens costs about one target step on the AVX2 CPU (costs.json).
LOOKUP_VARIANTS = {
    "lookup g7 ngram 5..1": (5, 1, None),
    "lookup g7 ngram 3..2": (3, 2, None),
    "lookup tree (2,2,1,1,1)": (3, 1, (2, 2, 1, 1, 1)),
    "lookup tree (3,2,1,1,1)": (3, 1, (3, 2, 1, 1, 1)),
    "lookup tree (2,1,1,1,1,1)": (3, 1, (2, 1, 1, 1, 1, 1)),
}


def lookup_variant_rounds(
    prompt: Sequence[int], answer: np.ndarray, max_ngram: int, min_ngram: int, widths
) -> tuple[int, list[int]]:
    """(rounds, verify widths) of lookup alone with these n-grams, as a chain of 7 or a tree of
    first children (greedy: a depth's token is kept when any sibling is the target's; the path
    goes on below the first child only)."""
    text = np.zeros(TEXT_WIDTH, np.int32)
    full = list(prompt) + list(answer)
    text[: len(full)] = full
    text = jnp.asarray(text)
    tree = TreeShape.from_widths(widths) if widths else None
    propose = _variant(max_ngram, min_ngram, tree)
    i, rounds, verify = 0, 0, []
    while i < len(answer):
        length = len(prompt) + i
        tokens = np.asarray(propose(text, jnp.int32(length), jnp.int32(full[length - 1])))
        kept = 0
        if tree is None:
            while kept < 7 and i + kept < len(answer) and tokens[kept] == answer[i + kept]:
                kept += 1
        else:
            depths, ranks = np.asarray(tree.depths[1:]), np.asarray(tree.ranks[1:])
            for depth in range(1, tree.depth + 1):
                if i + kept >= len(answer):
                    break
                here = tokens[depths == depth]
                hit = np.flatnonzero(here == answer[i + kept])
                if not hit.size:
                    break
                kept += 1
                if ranks[depths == depth][hit[0]] != 0:
                    break
        i += kept + 1
        rounds += 1
        verify.append(7 + 1 if tree is None else tree.size + 1)
    return rounds, verify


@functools.cache  # one compiled proposer per variant
def _variant(max_ngram: int, min_ngram: int, tree: TreeShape | None):
    def propose(ids, length, last):
        ids, length, last = ids[None], length[None], last[None]
        if tree is None:
            return continuation(ids, length, last, 7, max_ngram, min_ngram)[0]
        return _lookup_tree(ids, length, last, tree, max_ngram, min_ngram)[0]

    return jax.jit(propose)


def replay(
    answer: np.ndarray,
    draft: np.ndarray | None,
    lookup,
    gamma: int,
    lookup_gamma: int,
    trust: int | None,
) -> tuple[int, int, list[int]]:
    """(rounds, draft steps, verify widths) of one turn under a strategy: a chain of `gamma`
    draft tokens (`draft` the teacher-forced argmax); lookup alone (`draft` None,
    `lookup_gamma` tokens a round); or a mix: lookup's `lookup_gamma` tokens when its match is at
    least `trust` tokens long, else the draft's `gamma`. A mix's lookup round still feeds the
    draft what the last round committed (one draft call, counted as a step). trust "plain" with
    lookup alone: a plain step (width 1) where the lookup matches nothing, instead of a round
    proposing the last token again."""
    i, rounds, steps, widths = 0, 0, 0, []
    n = len(answer)
    while i < n:
        if draft is None and trust == "plain" and lookup[i][1] == 0:
            i, rounds = i + 1, rounds + 1
            widths.append(1)
            continue
        use_lookup = draft is None or (trust is not None and lookup[i][1] >= trust)
        if use_lookup:
            proposal = lookup[i][0][:lookup_gamma]
            steps += draft is not None
        else:
            proposal = draft[i : i + gamma]
            steps += gamma
        kept = 0
        while kept < len(proposal) and i + kept < n and proposal[kept] == answer[i + kept]:
            kept += 1
        i += kept + 1
        rounds += 1
        widths.append((lookup_gamma if use_lookup else gamma) + 1)  # the call is this wide
    return rounds, steps, widths


def interpolate(table: dict[str, float], width: int) -> float:
    """Seconds at `width` from a {width: seconds} table, linear between its points."""
    xs = sorted(int(k) for k in table)
    return float(np.interp(width, xs, [table[str(x)] for x in xs]))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a greedy Spec-Bench run's directory")
    parser.add_argument("--costs", required=True, help="scripts/spec_bench_costs.py's costs.json")
    parser.add_argument("--questions", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--draft_form", default="draft, full head")
    parser.add_argument(
        "--rounds",
        help="scripts/loop_round_costs.py's JSON: a round of width w costs what a lookup round of "
        "gamma w - 1 cost inside the loop (the verify call, the rule, the bookkeeping), in plain "
        "steps, instead of the bare verify call's `extend` time",
    )
    args = parser.parse_args(argv)
    costs = json.loads(pathlib.Path(args.costs).read_text())
    step = costs["target"]["target_step_s"]
    verify = {int(k): v for k, v in costs["target"]["extend_in_steps"].items()}
    if args.rounds:  # measured in the loop: k proposals make a (k + 1)-token verify call
        rounds = json.loads(pathlib.Path(args.rounds).read_text())["rounds"]
        measured = {int(g) + 1: r["in_steps"] for g, r in rounds.items()}
        widths = sorted(measured)  # a width between two measured ones: linear between them
        verify |= {
            w: float(np.interp(w, widths, [measured[x] for x in widths]))
            for w in range(widths[0], widths[-1] + 1)
        }
    c = costs["drafts"][args.draft_form]["c"]
    prefill_t = costs["prefill_s"]["target"]
    prefill_d = next(iter(v for k, v in costs["prefill_s"].items() if k != "target"))
    questions = {q.question_id: q for q in spec_bench.read_questions(args.questions)}
    rows = [json.loads(line) for line in open(pathlib.Path(args.run) / "predictions.jsonl")]
    target = pairs.model_spec("qwen2.5-coder-1.5b")
    vocabulary = ml.load_vocabulary(pairs.vocab_spec(target))
    template = chat.find_template(vocabulary)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache_path = out / "teacher_forced.npz"  # the draft's argmax and lookup's proposals per turn
    cache = dict(np.load(cache_path)) if cache_path.exists() else {}
    loaded: list[ml.Loaded] = []

    def draft() -> ml.Loaded:
        if not loaded:
            loaded.append(pairs.load(pairs.model_spec(args.draft)).target)
        return loaded[0]

    strategies = {"plain": None}
    strategies |= {f"chain g{g}": (g, 0, None) for g in GAMMAS}
    strategies |= {f"lookup g{g}": (0, g, "lookup") for g in range(1, 9)}
    strategies |= {f"lookup g{g}, plain where unmatched": (0, g, "plain") for g in range(1, 9)}
    strategies |= {
        f"mix g{g}, lookup g{k} at n>={t}": (g, k, t)
        for g in (3, 5)
        for k in (3, 7)
        for t in (1, 2, 3)
    }
    turns = []
    for row in rows:
        question = questions[row["question_id"]]
        messages = []
        for index, turn in enumerate(row["programs"]["plain"]["turns"]):
            messages.append({"role": "user", "content": question.turns[index]})
            prompt = chat.encode_rendered(vocabulary, template.render(messages))
            messages.append({"role": "assistant", "content": turn["text"]})
            answer = np.asarray(turn["tokens"])
            key = f"{row['question_id']}_{index}"
            if f"{key}_argmax" not in cache:
                cache[f"{key}_argmax"] = draft_argmax(draft(), prompt, answer)
                found = lookup_rounds(prompt, answer)
                cache[f"{key}_lookup"] = np.stack([t for t, _ in found])
                cache[f"{key}_n"] = np.asarray([n for _, n in found])
            argmax = cache[f"{key}_argmax"]
            lookup = list(zip(cache[f"{key}_lookup"], cache[f"{key}_n"], strict=True))
            width = -(-len(prompt) // 128) * 128
            record = {"task": row["task"], "question_id": row["question_id"], "turn": index}
            record |= {"prompt": len(prompt), "tokens": len(answer), "plain_s": turn["wall_time"]}
            record["draft_agrees"] = float(np.mean(argmax == answer))
            record["prefill_target_s"] = interpolate(prefill_t, width)
            record["prefill_draft_s"] = interpolate(prefill_d, width)
            for name, spec in strategies.items():
                if spec is None:
                    seconds = record["prefill_target_s"] + len(answer) * step
                    record[name] = {"rounds": len(answer), "predicted_s": seconds}
                    continue
                gamma, lookup_gamma, how = spec
                uses_draft = how not in ("lookup", "plain")
                rounds, steps, widths = replay(
                    answer, argmax if uses_draft else None, lookup, gamma, lookup_gamma,
                    None if how in (None, "lookup") else how,
                )  # fmt: skip
                # width 1: a plain step, one step by definition
                seconds = record["prefill_target_s"] + step * (
                    sum(verify[w] if w > 1 else 1.0 for w in widths) + c * steps
                )
                seconds += record["prefill_draft_s"] if uses_draft else 0.0
                record[name] = {"rounds": rounds, "draft_steps": steps, "predicted_s": seconds}
            for name, (max_ngram, min_ngram, widths) in LOOKUP_VARIANTS.items():
                rounds, widths_ = lookup_variant_rounds(
                    prompt, answer, max_ngram, min_ngram, widths
                )
                seconds = record["prefill_target_s"] + step * sum(verify[w] for w in widths_)
                record[name] = {"rounds": rounds, "draft_steps": 0, "predicted_s": seconds}
            # every decode step free: the bound of any method that keeps the target's prefill
            record[CEILING] = {"predicted_s": record["prefill_target_s"]}
            for name, (length, long, short) in ROUTES.items():
                record[name] = record[long] if len(prompt) >= length else record[short]
            turns.append(record)
            print(f"q{row['question_id']} turn {index + 1}: {len(answer)} tokens", flush=True)
    np.savez(cache_path, **cache)
    summary = summarize(turns, [*strategies, *LOOKUP_VARIANTS, *ROUTES, CEILING])
    report = {"turns": turns, "summary": summary, "costs": args.costs, "run": args.run}
    report["rounds"] = args.rounds
    report["verify_in_steps"] = {str(k): v for k, v in sorted(verify.items())}
    report["tau"] = taus(turns, [*strategies, *LOOKUP_VARIANTS])
    report["environment"] = provenance.environment()
    report["provenance"] = provenance.git_state()
    (out / "replay.json").write_text(json.dumps(report, indent=1) + "\n")
    print(table(summary, [*strategies, *LOOKUP_VARIANTS, *ROUTES, CEILING]))


def summarize(turns: list[dict], names: list[str]) -> dict[str, dict[str, float]]:
    """Per task and overall: each strategy's predicted Spec-Bench speedup (mean over questions of
    tokens per second, over plain's), and the plain model's error against the run's seconds."""
    out = {}
    for task in [*spec_bench.TASKS, "overall"]:
        chosen = [t for t in turns if task in ("overall", t["task"])]
        if not chosen:
            continue
        by_question: dict[int, list[dict]] = {}
        for t in chosen:
            by_question.setdefault(t["question_id"], []).append(t)

        def speed(name: str, question: list[dict]) -> float:
            return sum(t["tokens"] for t in question) / sum(
                t[name]["predicted_s"] for t in question
            )

        plain = np.mean([speed("plain", q) for q in by_question.values()])
        out[task] = {n: float(np.mean([speed(n, q) for q in by_question.values()]) / plain)
                     for n in names}  # fmt: skip
        measured = sum(t["plain_s"] for t in chosen)
        out[task]["plain model / measured"] = (
            sum(t["plain"]["predicted_s"] for t in chosen) / measured
        )
    return out


def taus(turns: list[dict], names: list[str]) -> dict[str, dict[str, float]]:
    """Per task and overall: tokens per target call (tau) of each strategy, pooled over turns."""
    out = {}
    for task in [*spec_bench.TASKS, "overall"]:
        chosen = [t for t in turns if task in ("overall", t["task"])]
        if chosen:
            tokens = sum(t["tokens"] for t in chosen)
            out[task] = {n: tokens / sum(t[n]["rounds"] for t in chosen) for n in names}
    return out


# The rows docs/spec_bench.md shows (replay.json holds every strategy).
DOC_ROWS = [
    "chain g3", "chain g5", "lookup g3", "lookup g7", "lookup tree (2,1,1,1,1,1)",
    "mix g3, lookup g7 at n>=2", "lookup g7 from 256 prompt tokens, else chain g3",
    "lookup g3, plain where unmatched", "lookup g7, plain where unmatched", CEILING,
]  # fmt: skip


def table(summary: dict, names: list[str]) -> str:
    """Markdown: a row per strategy, a column per task, the predicted Spec-Bench speedups, and
    the cost model's plain seconds over the run's measured ones."""
    head = "| strategy | " + " | ".join(summary) + " |"
    lines = [head, "|---" * (len(summary) + 1) + "|"]
    for name in [*(n for n in names if n != "plain"), "plain model / measured"]:
        lines.append(f"| {name} | " + " | ".join(f"{v[name]:.2f}" for v in summary.values()) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
