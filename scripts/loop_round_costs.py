#!/usr/bin/env python
"""What a speculative round costs inside the decode loop, in plain steps, by verify width (issue
54): the target decodes one Spec-Bench-sized chat prompt plainly and with prompt lookup at each
gamma, every program compiled and warmed apart, the programs interleaved for `--repeats` rounds
of timing; a round's seconds are (decode seconds - prefill seconds) / target calls, a plain
step's (plain seconds - prefill seconds) / tokens. Unlike `scripts/spec_bench_costs.py`'s
`extend` timings, this is everything a round does: the verify call, the rule over V = 152k
logits, the lookup, the loop's bookkeeping. Writes JSON; `scripts/spec_bench_replay.py --rounds`
prices its replays by it.

    python scripts/loop_round_costs.py --out benchmarks/loop_round_costs/round_costs.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import jax

from speculative.decoding import DecodeConfig
from speculative.decoding.sampling import SamplingConfig
from speculative.drafts.prompt_lookup import PromptLookupDrafter
from speculative.jobs import pairs
from speculative.measure import runner, timing
from speculative.outputs import provenance
from speculative.vocab import chat

QUESTION = (
    "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural "
    "experiences and must-see attractions."
)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/loop_round_costs/round_costs.json")
    parser.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 7, 8])
    parser.add_argument("--max_new_tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    code = provenance.record(None)
    pair = pairs.load(pairs.model_spec("qwen2.5-coder-1.5b"))
    model, params = pair.target.model, pair.target.params
    template = chat.find_template(pair.vocabulary)
    ids = chat.encode_rendered(
        pair.vocabulary, template.render([{"role": "user", "content": QUESTION}])
    )
    batch = pair.batch([ids])
    lookup = PromptLookupDrafter(model.vocab_size)

    def config(gamma: int | None, steps: int) -> DecodeConfig:
        # no stop id: every program decodes all `steps` tokens, as many rounds as its text allows
        return DecodeConfig(steps, (-1,), SamplingConfig(), gamma=gamma)

    programs = {"prefill": runner.Prefill(model, params, config(None, args.max_new_tokens))}
    programs["plain"] = runner.Decoder(model, params, config(None, args.max_new_tokens))
    for g in args.gammas:
        programs[f"lookup {g}"] = runner.Decoder(
            model, params, config(g, args.max_new_tokens), lookup, ()
        )
    rng = jax.random.PRNGKey(0)
    calls, compile_s, seconds, outputs = {}, {}, {n: [] for n in programs}, {}
    for name, program in programs.items():
        run, compile_s[name] = program.compile(batch, rng)
        calls[name] = run
        outputs[name] = jax.block_until_ready(run(batch, rng))  # the untimed first run
        print(f"compiled {name} {compile_s[name]:.1f}s", flush=True)
    for _ in range(args.repeats):  # interleaved: a drifting machine hits every program alike
        for name, run in calls.items():
            seconds[name].append(timing.time_call(lambda run=run: run(batch, rng), repeats=1)[1])
    median = {n: statistics.median(s) for n, s in seconds.items()}
    prefill = median["prefill"]
    plain_tokens = int(outputs["plain"].lengths[0])
    step = (median["plain"] - prefill) / plain_tokens
    report = {"prompt_tokens": len(ids), "max_new_tokens": args.max_new_tokens, "step_s": step}
    report["prefill_s"] = prefill
    report["rounds"] = {}
    for g in args.gammas:
        out = outputs[f"lookup {g}"]
        rounds = int(out.stats.target_calls[0])
        round_s = (median[f"lookup {g}"] - prefill) / rounds
        report["rounds"][str(g)] = {
            "round_s": round_s, "in_steps": round_s / step, "rounds": rounds,
            "tokens": int(out.lengths[0]),
        }  # fmt: skip
        print(f"gamma {g}: a round {round_s * 1e3:.0f} ms = {round_s / step:.2f} steps", flush=True)
    # the bare verify call beside it, same process, same minutes: what the loop adds to a round
    cache = config(None, args.max_new_tokens).cache_length(model, batch)
    bare = timing.target_costs(model, params, batch, cache, [g + 1 for g in args.gammas])
    report["bare_extend_in_steps"] = {
        str(n): s / bare["target_step_s"] for n, s in bare["target_extend_s"].items()
    }
    report["bare"] = bare
    print(f"bare extend in steps: {report['bare_extend_in_steps']}", flush=True)
    report |= {"seconds": seconds, "compile_s": compile_s}
    report["environment"] = provenance.environment()
    report["provenance"] = code
    out_path = pathlib.Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"plain step {step * 1e3:.0f} ms, prefill {prefill:.2f} s; wrote {out_path}")


if __name__ == "__main__":
    main(sys.argv[1:])
