"""Inference job: speculative (or plain) decoding of a dataset, configured in gin like T5X's infer.py.

    python -m speculative.infer --gin_file=configs/demo/qwen_coder_infer.gin \
        --gin.OUTPUT_DIR="'/tmp/qwen'" [--gin.SPECULATIVE=False] [--gin.GAMMA=5]

Everything is bound in gin (configs/runs/infer.gin lists the macros, `%gin.REQUIRED` ones first):
target and draft `speculative.ModelSpec`s, vocabularies, sampling, gamma, batch size, feature
lengths, the input (JSONL / TSV file, "humaneval", or a seqio Task/Mixture name) and OUTPUT_DIR.

Output, in OUTPUT_DIR:
  predictions.jsonl  one row per example: index, inputs, targets (if any), output, output_ids,
                     length, target_calls, tau; an input longer than the inputs feature length
                     adds truncated_from (its token count) and inputs_used (the text decoded
                     from); speculative rows add alpha, accepted, drafted,
                     verified, accepted_at / verified_at per draft position. Written a batch at a
                     time, fsynced; a killed job restarted with the same OUTPUT_DIR resumes
                     (speculative/outputs/job_io.py). Row results do not depend on where a run stopped:
                     batches are fixed (indices [k*B, (k+1)*B)) and batch k uses rng fold_in(seed, k).
  summary.json       totals, pooled alpha, tau, measured c and the Theorem 3.8 speedup estimate;
                     this_run times this run's decoding, each program compiled once per prompt
                     width, ahead of time and apart; provenance: git_commit, git_dirty, version
                     and gin_config (speculative/outputs/provenance.py).
  config.gin         the operative gin config.
  plan.json          with GAMMA = 'auto': the planner's choice (gamma, or null for plain decoding)
                     and what it measured; a resumed run reuses it instead of planning again.
                     With TREE = 'auto' too: chains and token trees are scored, and the plan has
                     the chosen tree (its parents, or null), every tree's prediction and the
                     measured acceptance by depth and sibling rank.
  With PARTITIONER (a ('data', 'model') mesh) the weights are placed on their shards, T5X
  checkpoints read shard by shard, and each batch's rows split over 'data'; with DISTRIBUTED
  every host of a pod slice runs the job, feeds its rows, and process 0 alone writes the files.
  COMPILATION_CACHE_DIR ('auto': ~/.cache/speculative/jax_cache) keeps compiled programs
  across runs; summary.json's compilation_cache says whether this run found them (warm).
  .lock              held while a job runs (host, pid, heartbeat): a second job on OUTPUT_DIR,
                     however it is named (a path, ~, file://, a symlink), is refused.
OUTPUT_DIR may be on an object store (gs://, s3://: any fsspec URL, its implementation installed):
the rows then go to predictions/chunk-NNNNN.jsonl, each committed by a .commit object, and
predictions.jsonl is written whole at the end; .lock is an object (speculative/outputs/store_lock.py).
With SPECULATIVE = False the target is decoded plainly with everything else equal (the draft is
not loaded, GAMMA = 'auto' is ignored); greedy outputs are then identical to the speculative ones.
GAMMA_POLICY (a decoding.GammaPolicy) sets how many of the GAMMA slots each row drafts per round.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from speculative.config import gin_flags
from speculative.jobs.config import InferConfig
from speculative.jobs.infer.plan import PLAN
from speculative.jobs.infer.rows import pool_rows, summarize_rows
from speculative.jobs.infer.run import make_config, run

# What scripts and tests reach through this module; the job lives in speculative/jobs/infer/.
__all__ = ["InferConfig", "PLAN", "main", "pool_rows", "run", "summarize_rows"]


def main(argv: Sequence[str]) -> dict[str, Any] | None:
    return gin_flags.configure_and_run(
        argv, __doc__.split("\n\n")[0], make_config, run, "configs/runs/infer.gin"
    )


if __name__ == "__main__":
    sys.exit(gin_flags.run_job(main))
