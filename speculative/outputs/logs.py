"""The jobs' log: stdlib `logging`, one handler on the "speculative" logger, set up once by each
job's entry point (`gin_flags.configure_and_run`, and the main() of the argparse jobs).

    2026-12-03 16:21:21,123 INFO speculative.loading.specs: target: T5 ... (random weights)

Records go to stderr, through `tqdm.write`, so a progress bar on stderr is redrawn below a log
line instead of being cut by it; stdout keeps what a job returns to its user (the benchmark's
table, the infer summary, the demo's completions, --print_config). Modules log through
`logging.getLogger(__name__)`; records still propagate to the root logger, so whoever runs a job
inside a program of its own (and pytest's caplog) sees them too.

Plain `logging` rather than absl's: gin_flags avoids absl (argparse, so the jobs run where absl is
not installed) and absl's handler expects absl's flags parsed; absl's and JAX's records are stdlib
records anyway.
"""

from __future__ import annotations

import logging
import sys

LOGGER = "speculative"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class StderrHandler(logging.Handler):
    """Writes each record to the sys.stderr of the moment it is emitted (a test's capture, a
    redirect made after setup), through tqdm so that active bars are redrawn after it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001  logging must never fail the job
            self.handleError(record)


def setup(level: str | int = "INFO") -> logging.Logger:
    """Sets the "speculative" logger to `level` with one StderrHandler (a second call changes the
    level only, so a job that runs another job's main() logs each line once); returns it."""
    logger = logging.getLogger(LOGGER)
    if isinstance(level, str):
        if level.upper() not in LEVELS:
            raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
        level = getattr(logging, level.upper())
    logger.setLevel(level)
    if not any(isinstance(h, StderrHandler) for h in logger.handlers):
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter(FORMAT))
        logger.addHandler(handler)
    return logger
