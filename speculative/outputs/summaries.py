"""TensorBoard summaries of the jobs, in OUTPUT_DIR/tensorboard/ (`tensorboard --logdir` it).

Written with tensorboardX's event writer (protobuf only, no TensorFlow), imported when a job
opens its writer. Scalars only:
  train / train_head   train/loss (and the head's loss terms), train/validation_loss,
                       train/learning_rate, train/step_time_s at every logged step; the head's
                       heldout/alpha/<depth> at every checkpoint.
  benchmark            speedup/, alpha/, tau/ b<B>_t<T>/<variant>, step = gamma (a curve of gamma
                       per cell and variant).
A trainer opens its writer with `purge_step` = the first step it can log (its checkpoint's step +
1, or 1 afresh): the new event file starts with a SessionLog.START at that step, and TensorBoard
hides every earlier event at that step or later (what a killed run logged past its last
checkpoint), so a step the resumed run logs again is drawn once. `read_scalars` reads the files
back the same way.
"""

from __future__ import annotations

import logging
import os
import pathlib
import struct
import time
from collections.abc import Mapping
from typing import Any

from speculative.errors import JobError

TENSORBOARD = "tensorboard"


class Scalars:
    """A TensorBoard writer of scalars under OUTPUT_DIR/tensorboard (a context manager).

    purge_step: where this run starts (see the module docstring); None writes no purge event.
    enabled False (an OUTPUT_DIR on an object store, which tensorboardX's writer cannot reach
    through fsspec): no events, and one log line saying so."""

    def __init__(
        self, output_dir: str | os.PathLike, purge_step: int | None = None, enabled: bool = True
    ):
        # a string join keeps a URL's "//" (pathlib would fold it)
        self.dir = os.path.join(os.fspath(output_dir), TENSORBOARD)
        self._writer = None
        if not enabled:
            logging.getLogger(__name__).info(f"no TensorBoard summaries for {output_dir} (a store)")
            return
        from tensorboardX import SummaryWriter

        # The nanosecond suffix orders and separates two runs started within the same second.
        self._writer = SummaryWriter(
            self.dir, purge_step=purge_step, filename_suffix=f".{time.time_ns()}"
        )

    def write(self, step: int, values: Mapping[str, Any]) -> None:
        """One scalar per tag at `step`; None values are left out."""
        for tag, value in values.items():
            if value is not None and self._writer is not None:
                self._writer.add_scalar(tag, float(value), int(step))

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    def __enter__(self) -> Scalars:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class StepTimer:
    """Seconds per step between two logged steps (the first interval includes compilation)."""

    def __init__(self, step: int):
        self.step, self.time = step, time.perf_counter()

    def per_step(self, step: int) -> float:
        now = time.perf_counter()
        seconds = (now - self.time) / max(step - self.step, 1)
        self.step, self.time = step, now
        return seconds


def _records(path: pathlib.Path) -> list[bytes]:
    """The TFRecord payloads of an event file: [length u64][crc u32][data][crc u32] each; a torn
    last record (a writer killed mid-write) ends the file."""
    data, out, at = path.read_bytes(), [], 0
    while at + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        end = at + 12 + length + 4
        if end > len(data):
            break
        out.append(data[at + 12 : at + 12 + length])
        at = end
    return out


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of every event file in logdir, in file then write order, with
    the events a later SessionLog.START purges left out (as TensorBoard shows them)."""
    from tensorboardX.proto.event_pb2 import Event, SessionLog

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(pathlib.Path(logdir).glob("events.out.tfevents.*")):
        for payload in _records(path):
            event = Event()
            try:
                event.ParseFromString(payload)
            except Exception as e:  # noqa: BLE001  protobuf's DecodeError
                raise JobError(f"not an event record: {e}", role="tensorboard", path=path) from e
            if event.session_log.status == SessionLog.START:
                for tag, points in scalars.items():
                    scalars[tag] = [(s, v) for s, v in points if s < event.step]
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars
