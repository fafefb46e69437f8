"""A training run's directory as a checkpoint: the checkpoint its best_checkpoint.json names.

The T5 trainer keeps the checkpoint with the lowest validation loss and names it in
OUTPUT_DIR/best_checkpoint.json ({"step": N, "validation_loss": x}); decoding configs can then
point at the run directory instead of hard-coding a step (docs/design.md §7). A path that is a
checkpoint itself, or names no such file, is used as it is.
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
from typing import Any

from speculative.checkpoints import t5x_write

log = logging.getLogger(__name__)

BEST = "best_checkpoint.json"


def read_record(run_dir: str | pathlib.Path) -> dict[str, Any]:
    """The validated {"step", "validation_loss"} of run_dir/best_checkpoint.json.

    Raises:
      ValueError (one line naming the file) when it is unreadable, not such a record, or names a
      checkpoint that is not complete on disk.
    """
    path = pathlib.Path(run_dir) / BEST
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable best-checkpoint record ({e})") from e
    step = record.get("step") if isinstance(record, dict) else None
    loss = record.get("validation_loss") if isinstance(record, dict) else None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f'{path}: "step" must be a non-negative integer, got {record!r}')
    if isinstance(loss, bool) or not isinstance(loss, int | float) or not math.isfinite(loss):
        raise ValueError(f'{path}: "validation_loss" must be a finite number, got {record!r}')
    if step not in t5x_write.checkpoint_steps(run_dir):
        raise ValueError(f"{path}: names checkpoint_{step}, which is not complete in {run_dir}")
    return {"step": step, "validation_loss": float(loss)}


def is_run_dir(path: str) -> bool:
    """Whether path is a local training run directory with a best-checkpoint record (and is not
    a checkpoint itself)."""
    root = pathlib.Path(path)
    return "://" not in path and (root / BEST).is_file() and not (root / "checkpoint").exists()


def resolve(path: str) -> str:
    """The checkpoint to read for `path`: run_dir/checkpoint_N when path is a training run
    directory (`is_run_dir`), else path unchanged. Raises ValueError as `read_record` does."""
    if not is_run_dir(path):
        return path
    record = read_record(path)
    return str(pathlib.Path(path) / f"checkpoint_{record['step']}")
