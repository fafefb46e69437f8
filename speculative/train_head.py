"""`python -m speculative.train_head`: trains a feature-level draft head (EAGLE-style) on a
decoder-only target's own hidden states, configured in gin.

    python -m speculative.train_head --gin_file=configs/train/qwen_coder_head.gin \
        --gin.OUTPUT_DIR="'~/.cache/speculative/qwen_coder_head'"

The target reads windows of this interpreter's standard library (never a benchmark's prompts;
every tenth file held out) once; its hidden states are kept in OUTPUT_DIR/features and reused by
a resumed or extended run. The head (models/feature_head.py) trains with optax on them.

Output, in OUTPUT_DIR:
  head.json, checkpoint_<step>/  the head's shape and T5X checkpoints (the head's parameters, the
                                 ids it scores, the optimizer state): a killed run resumes from
                                 the newest; `speculative.DraftSpec(kind='feature_head',
                                 checkpoint=OUTPUT_DIR)` drafts with it.
  metrics.jsonl                  loss terms every 10 steps; held-out alpha and greedy agreement
                                 per draft position at every checkpoint.
  summary.json                   data sizes, time, the last held-out evaluation, provenance
                                 (git commit, dirty flag, version, operative gin config).
  tensorboard/                   loss terms, learning rate, seconds per step; held-out alpha
                                 per draft position at every checkpoint.
  head_job.json, .lock           the settings the checkpoints belong to (another run with other
                                 settings is refused) and the lock a second process is refused by.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from speculative.config import (
    configurables,  # noqa: F401  (gin names)
    gin_flags,  # noqa: F401  (gin names)
)
from speculative.jobs.train_head.run import HeadTrainConfig, run

__all__ = ["HeadTrainConfig", "main", "run"]


def main(argv: Sequence[str]) -> dict[str, Any] | None:
    return gin_flags.configure_and_run(
        argv, __doc__.split("\n\n")[0], HeadTrainConfig, run, "configs/train/qwen_coder_head.gin"
    )


if __name__ == "__main__":
    sys.exit(gin_flags.run_job(main))
