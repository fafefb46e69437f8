"""Which T5 training checkpoints stay on disk: the best by validation loss, never deleted, plus
the newest `keep` (for resuming); OUTPUT_DIR/best_checkpoint.json names the best.

Order of a save (`after_save`), so that a stop anywhere loses nothing: the checkpoint is renamed
into place (`t5x_write.save_t5x`), then best_checkpoint.json is replaced atomically, then older
checkpoints are pruned (each renamed away before it is removed, so a half-removed one is never
read). The truth is metrics.jsonl (its validation loss at a step is logged before that step's
checkpoint is written) and the checkpoints on disk; `reconcile` rebuilds best_checkpoint.json from
them when a run starts, so a stop between a save and the update of best_checkpoint.json neither
loses nor mislabels the best.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil
from collections.abc import Iterable
from typing import Any

from speculative.checkpoints import t5x_write
from speculative.checkpoints.best import BEST
from speculative.outputs import job_io

log = logging.getLogger(__name__)

_REMOVING = ".removing_checkpoint_"


def best_of(records: Iterable[dict], on_disk: Iterable[int]) -> dict[str, Any] | None:
    """{"step", "validation_loss"} of the lowest validation loss among the records whose step has
    a checkpoint on disk (the earliest on a tie); None without one."""
    present, best = set(on_disk), None
    for record in records:
        loss, step = record.get("validation_loss"), record.get("step")
        if step in present and isinstance(loss, int | float):
            if best is None or loss < best["validation_loss"]:
                best = {"step": step, "validation_loss": loss}
    return best


def read_best(out: pathlib.Path) -> dict[str, Any] | None:
    """best_checkpoint.json's record, or None when there is none (or it is unreadable)."""
    try:
        record = json.loads((out / BEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_best(out: pathlib.Path, best: dict[str, Any] | None) -> None:
    if best is None:
        (out / BEST).unlink(missing_ok=True)
    elif read_best(out) != best:
        job_io.write_text_atomic(out / BEST, json.dumps(best, indent=1))


def reconcile(out: pathlib.Path, records: list[dict]) -> dict[str, Any] | None:
    """The best checkpoint as the kept metrics records and the checkpoints on disk say, written
    to best_checkpoint.json when that file says otherwise (a run stopped before updating it)."""
    best = best_of(records, t5x_write.checkpoint_steps(out))
    if read_best(out) != best:
        log.info(f"{out / BEST}: the best checkpoint is {best} (rebuilt from metrics.jsonl)")
    write_best(out, best)
    return best


def after_save(
    out: pathlib.Path, record: dict, best: dict[str, Any] | None, keep: int | None
) -> dict[str, Any] | None:
    """After checkpoint record["step"] was written: records it as the best when its validation
    loss is lower, then prunes (`prune`). Returns the best."""
    loss = record.get("validation_loss")
    if loss is not None and (best is None or loss < best["validation_loss"]):
        best = {"step": record["step"], "validation_loss": loss}
        write_best(out, best)
    prune(out, record["step"], None if best is None else best["step"], keep)
    return best


def prune(out: pathlib.Path, up_to: int, best_step: int | None, keep: int | None) -> None:
    """Removes the checkpoints at or before `up_to` other than the newest `keep` and the best
    (keep None: every checkpoint stays). Later ones (a run cut back) are left alone."""
    for leftover in out.glob(_REMOVING + "*"):
        shutil.rmtree(leftover, ignore_errors=True)
    if keep is None:
        return
    steps = [s for s in t5x_write.checkpoint_steps(out) if s <= up_to]
    kept = set(steps[-keep:]) | {best_step}
    for step in steps:
        if step not in kept:
            doomed = out / f"{_REMOVING}{step}"
            os.replace(out / f"checkpoint_{step}", doomed)
            shutil.rmtree(doomed, ignore_errors=True)
