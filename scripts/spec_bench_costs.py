#!/usr/bin/env python
"""What a Spec-Bench turn costs on this machine, piece by piece (issue 54): the target's step, its
verify call (`extend`) over 1..17 tokens, the draft's step (with and without its shortlist head, in
float32 and int8), and both models' prefill over the prompt lengths Spec-Bench's tasks have
(MT-bench ~50-200 tokens, summarization ~400-800, retrieval ~700-1100). Writes JSON; the numbers
behind docs/spec_bench.md's "Where the limit is".

    python scripts/spec_bench_costs.py [--out benchmarks/spec_bench_costs/costs.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from speculative.data import inputs
from speculative.decoding import DecodeConfig
from speculative.decoding.sampling import SamplingConfig
from speculative.jobs import common, pairs
from speculative.loading import specs as ml
from speculative.measure import runner, timing
from speculative.outputs import provenance

VERIFY_TOKENS = [*range(1, 13), 16, 17]
PREFILL_WIDTHS = [128, 256, 512, 768, 1024]


def prefill_seconds(loaded: ml.Loaded, ids: list[int], width: int, stops) -> float:
    """Median of three prefills of `width` prompt tokens, compiled and warmed apart."""
    config = DecodeConfig(16, stops, SamplingConfig())
    batch = inputs.decoder_batch([ids[:width]])
    run, _ = runner.Prefill(loaded.model, loaded.params, config).compile(batch, None)
    return timing.time_call(lambda: run(batch, None), repeats=3)[1]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/spec_bench_costs/costs.json")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args(argv)
    target = ml.ModelSpec("gguf", "qwen2.5-coder-1.5b", None, args.dtype)
    draft = {"path": "qwen2.5-coder-0.5b", "dtype": args.dtype, "seed": 1}
    forms = {
        "draft, full head": ml.ModelSpec("gguf", **draft),
        "draft, 32768-id shortlist": ml.ModelSpec("gguf", **draft, shortlist=32768),
        "draft, shortlist, int8": ml.ModelSpec("gguf", **draft, shortlist=32768, quantize="int8"),
    }
    vocab_spec = pairs.vocab_spec(target)
    vocabulary = ml.load_vocabulary(vocab_spec)
    drafts = list(forms.items())
    loaded = common.load_models(target, drafts, vocabulary, vocab_spec, vocab_spec)
    text = "The quick brown fox jumps over the lazy dog, and then it rests. " * 200
    ids = vocabulary.encode(text)
    loaded = common.prepare_drafts(loaded, drafts, vocabulary, [ids[:256]])
    batch = inputs.decoder_batch([ids[:256]])
    cache = 256 + 300
    tgt = loaded.target
    report = {
        "target": timing.target_costs(tgt.model, tgt.params, batch, cache, VERIFY_TOKENS),
        "drafts": {},
        "prefill_s": {"target": {}, "draft, 32768-id shortlist": {}},
    }
    step = report["target"]["target_step_s"]
    report["target"]["extend_in_steps"] = {
        str(k): v / step for k, v in report["target"]["target_extend_s"].items()
    }
    for (name, _), d in zip(drafts, loaded.drafts, strict=True):
        seconds = timing.draft_step_time(d.model, d.params, batch, cache)
        report["drafts"][name] = {"draft_step_s": seconds, "c": seconds / step}
        print(f"{name}: {seconds * 1e3:.1f} ms a step, c {seconds / step:.3f}", flush=True)
    stops = vocabulary.stop_ids
    for width in PREFILL_WIDTHS:
        for name, model in (("target", tgt), ("draft, 32768-id shortlist", loaded.drafts[1])):
            seconds = prefill_seconds(model, ids, width, stops)
            report["prefill_s"][name][str(width)] = seconds
            print(f"prefill {name} {width}: {seconds:.2f} s", flush=True)
    print(json.dumps(report["target"]["extend_in_steps"], indent=1))
    report["environment"] = provenance.environment()
    report["provenance"] = provenance.record(None)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
