"""`python -m speculative.train`: a gin-configured optax trainer for our T5 models (T5X style).

The command: gin flags in, `speculative.TrainConfig` resolved, `train` run. The trainer itself
(batching, losses, checkpoints, resumption, what OUTPUT_DIR holds) is `speculative.jobs.train.run`.

    python -m speculative.train --gin_file=configs/train/ende_tiny.gin --gin.OUTPUT_DIR="'/tmp/t'"
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from speculative.config import configurables, gin_flags  # noqa: F401  (gin names)
from speculative.jobs.train.run import TrainConfig, train


def main(argv: Sequence[str]) -> dict[str, Any] | None:
    return gin_flags.configure_and_run(
        argv, __doc__.split("\n\n")[0], TrainConfig, train, "configs/train/ende_base.gin"
    )


if __name__ == "__main__":
    sys.exit(gin_flags.run_job(main))
