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
Writes OUTPUT_DIR/benchmark.json (with "provenance": git commit, dirty flag, version, operative gin
config), speedup_vs_gamma.png, speedup_vs_batch.png, acceptance_by_position.png and tensorboard/
(speedup, alpha and tau per cell and variant over gamma; speculative/outputs/summaries.py).

VARIANTS (BenchmarkConfig.variants, `speculative.Variant`): several drafts / acceptance rules /
gamma policies, each at its own gammas and temperatures, all interleaved against the cell's one
plain baseline (configs/demo/qwen_coder_drafts.gin); points name their variant, and with
SCORE_OUTPUTS carry the target's mean log-probability per generated token of their outputs.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from speculative.config import gin_flags
from speculative.jobs.benchmark.harness import interleaved_timings
from speculative.jobs.benchmark.run import run
from speculative.jobs.benchmark.settings import distinct_drafts, runs_at, validate, variants_of
from speculative.jobs.benchmark.setup import Setup
from speculative.jobs.config import BenchmarkConfig

# What scripts and tests reach through this module; the job lives in speculative/jobs/benchmark/.
__all__ = [
    "BenchmarkConfig",
    "Setup",
    "distinct_drafts",
    "interleaved_timings",
    "main",
    "run",
    "runs_at",
    "validate",
    "variants_of",
]


def main(argv: Sequence[str]) -> dict[str, Any] | None:
    return gin_flags.configure_and_run(
        argv, __doc__.split("\n\n")[0], BenchmarkConfig, run, "configs/runs/benchmark.gin"
    )


if __name__ == "__main__":
    sys.exit(gin_flags.run_job(main))
