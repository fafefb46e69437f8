"""Where a T5 training run resumes: the newest complete checkpoint at or before `steps`.

A checkpoint directory appears only by an atomic rename of a finished one
(`checkpoints.t5x_write.save_t5x`), so a run killed while writing leaves at most a
`.tmp_checkpoint_N` that is never read. A checkpoint damaged afterwards (a deleted or truncated
file) cannot be read back: the run falls back to the previous complete one and says so.
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any

from speculative.checkpoints import load_t5x, t5x_write
from speculative.errors import LOADER_ERRORS, MALFORMED_ERRORS, JobError

log = logging.getLogger(__name__)


def restore(out: pathlib.Path, steps: int, model_config: Any, params: Any, opt_state: Any) -> tuple:
    """(start step, params, optimizer state): the newest readable checkpoint at or before
    `steps`, or the fresh params and state at step 0. A run can be cut back to an earlier
    checkpoint (the one the validation loss preferred) by setting steps, since the schedule and
    the batches are functions of the step alone."""
    candidates = [s for s in t5x_write.checkpoint_steps(out) if s <= steps]
    for step in reversed(candidates):
        path = out / f"checkpoint_{step}"
        try:
            restored = load_t5x(str(path), model_config)
            start, state = t5x_write.load_train_state(path, opt_state)
        except JobError as e:
            _skip(path, e)
            continue
        except LOADER_ERRORS + MALFORMED_ERRORS as e:
            _skip(path, e)
            continue
        log.info(f"resuming from {path} (step {start})")
        return start, restored, state
    if candidates:
        log.warning(f"no checkpoint in {out} could be read; training starts afresh")
    return 0, params, opt_state


def _skip(path: pathlib.Path, error: BaseException) -> None:
    message = " ".join(str(error).split())
    log.warning(f"{path} cannot be read ({message[:300]}); falling back to the previous checkpoint")
