"""Resumable outputs of the jobs (their inputs are read by `speculative.data.inputs`).

`predictions.jsonl`, one JSON object per example, identified by its input `index`.
Rows are appended a finished batch at a time, flushed and fsynced. A job killed at any moment
leaves whole rows plus at most one torn last line; `ResultStore` truncates that line on restart and
reports the indices already done, so a restarted job neither loses nor duplicates rows.
`job.json` holds a fingerprint of the job; a restart with a different job in the same directory is
refused instead of mixing results (`check_fingerprint`, the one check: the trainers' train_job.json
and head_job.json go through it too). `.lock` (`store_lock`: one lock file for the directory however
it is named, a path, '~', 'file://' or a symlink; its owner's host, pid, token and heartbeat) keeps
a second job out of a directory in use; a killed job's lock is taken over once it is provably
gone (its process dead and its heartbeat a few seconds old), so it does not block a resume.

That is the local directory. On an object store (OUTPUT_DIR = 'gs://...', any fsspec URL) the
same guarantees come from `chunk_store.ChunkStore` (committed chunk files) and the same `store_lock`
(an object there); `open_result_store` and `hold_output_dir` choose. Other files go through
`storage.OutputDir.write_text` (temp file + rename locally, one put on a store).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pathlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from speculative.data.inputs import Example
from speculative.errors import JobError, is_remote
from speculative.outputs import store_lock
from speculative.outputs.chunk_store import ChunkStore
from speculative.outputs.storage import OutputDir, write_local_atomic

log = logging.getLogger(__name__)

PREDICTIONS = "predictions.jsonl"
JOB = "job.json"
LOCK = store_lock.LOCK


def examples_digest(examples: Iterable[Example]) -> str:
    """SHA-256 of the inputs in order: part of a job's fingerprint."""
    digest = hashlib.sha256()
    for ex in examples:
        digest.update(json.dumps([ex.index, ex.inputs, ex.ids]).encode())
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------
# Resumable output.


def prepare_output_dir(output_dir: str) -> pathlib.Path:
    """Creates output_dir and proves it writable (a probe file), else raises JobError."""
    if not output_dir or not isinstance(output_dir, str):
        raise JobError(f"output directory must be a non-empty string, got {output_dir!r}")
    if is_remote(output_dir):  # a store has no append, rename or flock: see open_result_store
        raise JobError(f"output directory {output_dir!r}: expected a local directory here")
    path = pathlib.Path(output_dir).expanduser()  # '~/runs/x' as a shell would read it
    probe = path / f".write_probe.{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise JobError(f"output directory {output_dir!r} is not writable: {e}") from e
    return path


@contextlib.contextmanager
def lock_output_dir(output_dir: str | os.PathLike) -> Iterator[pathlib.Path]:
    """Holds an exclusive lock on output_dir (created if missing) while the block runs.

    Raises JobError naming the holder (host, pid, heartbeat) when another job holds it. The lock
    is `store_lock.hold`'s OUTPUT_DIR/.lock, the same file however the directory is named (a
    path, '~', 'file://', a symlink), whether the other job writes here or through a URL.
    """
    path = prepare_output_dir(os.fspath(output_dir))
    with store_lock.hold(OutputDir(path)):
        yield path


class ResultStore:
    """Append-only predictions file with resume (see the module docstring).

    done: {index: row} of the rows already written, by this or an earlier run.
    """

    def __init__(self, output_dir: str, fingerprint: Mapping[str, Any]):
        self.dir = prepare_output_dir(output_dir)
        self.out = OutputDir(self.dir)
        self.path = self.dir / PREDICTIONS
        holds_rows = self.path.exists() and self.path.stat().st_size > 0
        check_fingerprint(self.out, fingerprint, holds_results=holds_rows)
        self.done: dict[int, dict[str, Any]] = self._recover()

    def _recover(self) -> dict[int, dict[str, Any]]:
        """Reads the rows written so far; truncates a torn (unterminated) last line."""
        if not self.path.exists():
            return {}
        data = self.path.read_bytes()
        complete = data.rfind(b"\n") + 1  # bytes up to the end of the last whole line
        if complete < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(complete)
                os.fsync(f.fileno())
            log.warning(f"{self.path}: dropped a torn last line ({len(data) - complete} bytes)")
        done: dict[int, dict[str, Any]] = {}
        for line_no, line in enumerate(data[:complete].splitlines(), 1):
            try:
                row = json.loads(line)
                index = int(row["index"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise JobError(
                    f"{self.path}:{line_no}: corrupt row ({e}); not resuming over it. Move the file "
                    "away to start afresh"
                ) from e
            if index in done:
                raise JobError(f"{self.path}:{line_no}: duplicate row for index {index}")
            done[index] = row
        return done

    def append(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Appends rows as one write, then flush + fsync: after return they survive a kill."""
        fresh = [r for r in rows if int(r["index"]) not in self.done]
        if not fresh:
            return
        store_lock.check_held(self.out)
        payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in fresh)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        for r in fresh:
            self.done[int(r["index"])] = dict(r)

    def rows(self) -> list[dict[str, Any]]:
        """Every row written so far, in index order."""
        return [self.done[i] for i in sorted(self.done)]

    def finish(self) -> None:
        """Nothing: the rows are in predictions.jsonl as they are appended."""


def check_fingerprint(
    out: OutputDir | str | os.PathLike,
    fingerprint: Mapping[str, Any],
    *,
    name: str = JOB,
    holds_results: bool = True,
    what: str | None = None,
) -> None:
    """Records `fingerprint` (what the outputs in `out` are a function of) in out/name on the
    first run; refuses (JobError, naming the settings that differ) a later run with another one.

    The one check of every job: the infer and benchmark jobs' job.json (what=None: "holds results
    of a different job") and the trainers' train_job.json / head_job.json (what="a model", "a
    head": "holds a model trained with other settings"). holds_results=False (a job that stopped
    before its first row, after a bad checkpoint path, say): nothing of the earlier job is in
    `out`, so the new fingerprint takes the directory over, whatever the old file holds.

    Written: {"fingerprint": {...}}, values normalised through JSON (tuples -> lists, anything
    else by repr). Read: that, and a bare {...} object (what the trainers wrote before).
    """
    out = out if isinstance(out, OutputDir) else OutputDir(out)
    mine = json.loads(json.dumps(dict(fingerprint), default=repr))
    if out.exists(name):
        try:
            theirs = _read_fingerprint(out, name)
        except JobError:
            if holds_results:
                raise
            theirs = {}
        differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if not differ:
            return
        if holds_results:
            raise JobError(_refusal(out, what, ", ".join(differ)))
    out.write_text(name, json.dumps({"fingerprint": mine}, indent=2))


def _read_fingerprint(out: OutputDir, name: str) -> dict[str, Any]:
    """The settings recorded in out/name, in either format (see check_fingerprint)."""
    try:
        record = json.loads(out.read_text(name))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise JobError(
            f"unreadable job fingerprint ({e}); delete it", role="fingerprint", path=out.where(name)
        ) from None
    if isinstance(record, dict) and isinstance(record.get("fingerprint"), dict):
        record = record["fingerprint"]
    if not isinstance(record, dict):
        raise JobError(
            "not a job fingerprint (a JSON object); delete it",
            role="fingerprint",
            path=out.where(name),
        )
    return record


def _refusal(out: OutputDir, what: str | None, differ: str) -> str:
    if what is None:  # the rows of the infer and benchmark jobs
        return (
            f"output directory {out.url!r} holds results of a different job (differs in: "
            f"{differ}); use another output directory or delete it"
        )
    return (
        f"{out.url} holds {what} trained with other settings ({differ}); use another OUTPUT_DIR "
        "or the same settings"
    )


def open_result_store(output_dir: str, fingerprint: Mapping[str, Any]) -> ResultStore | ChunkStore:
    """The infer job's predictions: a `ResultStore` in a local directory, a `ChunkStore` on an
    object store; either after the fingerprint check, with the rows already written in done."""
    if not is_remote(output_dir):
        return ResultStore(output_dir, fingerprint)
    store = ChunkStore(OutputDir(output_dir).prepare())
    check_fingerprint(store.out, fingerprint, holds_results=bool(store.committed))
    store.recover()
    return store


@contextlib.contextmanager
def hold_output_dir(output_dir: str) -> Iterator[OutputDir]:
    """OUTPUT_DIR created and locked while the block runs: `lock_output_dir` locally, else
    `store_lock.hold` (the same lock: a local file when the URL names local files, as file://
    does; an object, best-effort, on a store)."""
    if not is_remote(output_dir):
        with lock_output_dir(output_dir) as path:
            yield OutputDir(path)
        return
    with store_lock.hold(OutputDir(output_dir).prepare()) as out:
        yield out


def require_local(output_dir: str, job: str) -> None:
    """A one-line JobError for a job that writes only to a local OUTPUT_DIR (appends, renamed
    checkpoint directories), given a store URL: before anything (a local 'gs:' folder) exists."""
    if isinstance(output_dir, str) and is_remote(output_dir):
        raise JobError(
            f"output directory {output_dir!r}: {job} writes to a local directory only (an "
            "object-store OUTPUT_DIR is supported by the infer and benchmark jobs); write "
            "locally and copy the directory to the store"
        )


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes `text` to path through a fsynced temporary file renamed into place."""
    write_local_atomic(path, text.encode("utf-8"))


def keep_records_up_to(path: str | os.PathLike, step: int) -> list[dict]:
    """Keeps (and returns) the JSON-lines records of steps <= `step` in a trainer's metrics log:
    a run killed after its last checkpoint logged steps the resumed run repeats, and may have
    left a torn last line. Rewritten atomically when anything is dropped; [] without a file."""
    path = pathlib.Path(path)
    if not path.exists():
        return []
    # A torn write can cut a multi-byte character: undecodable bytes make that line unreadable.
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        at = record.get("step") if isinstance(record, dict) else None
        if isinstance(at, int) and not isinstance(at, bool) and at <= step:
            kept.append(record)  # anything else (not a record, no integer step) is dropped
    if len(kept) < len(lines):
        write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
    return kept
