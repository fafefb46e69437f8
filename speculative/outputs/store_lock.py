"""OUTPUT_DIR's lock: one lock file, `.lock`, for a directory however it is named.

`lock_dir` gives a directory one identity before it is locked: a local path, '~', 'file://' (any
fsspec filesystem over local files) and symlinks all resolve to the directory's real local path,
so `file:///runs/x`, `/runs/x` and a link to it lock one file; on an object store the lock is an
object at the URL. Local or not, one implementation and one format, a JSON object:

  owner      a token unique to the holding job
  host       its host name
  machine    its boot id and pid namespace (pids compare only where these are equal)
  pid        its process
  heartbeat  when it last beat (seconds since the epoch)
  stale_s    its promise: it beats more often than that

Taken by a create-only write (locally a written temporary file hard-linked into place, so never
seen empty; on a store a conditional put where it has one: GCS, S3; elsewhere fsspec checks,
then writes), then read back: the job holds the lock only if the file names its owner token.
Best-effort on a store without conditional writes, where two jobs starting within the same
moment may both win the check. A thread rewrites the heartbeat while the job runs: every
LOCAL_HEARTBEAT_S locally (stale_s LOCAL_STALE_S), every HEARTBEAT_S on a store (a put each;
stale_s STALE_S).

Nothing drops the lock of a killed job. It is taken over only when its job is provably gone, and
never while its heartbeat is fresh:
- on this machine (host name, boot id and pid namespace equal, so its pid names its process):
  when its process is gone and its heartbeat is older than its stale_s. A gone process whose
  heartbeat is still fresh is waited for (at most WAIT_S: a resume right after a kill waits a few
  seconds); a live process with a stale heartbeat (hung, or its pid reused) is refused.
- from elsewhere, a machine that only shares the host name (containers) included, where its pid
  says nothing: when it has not beaten for max(STALE_S, its stale_s) (clock skew stays inside).
A lock file that cannot be read (torn by another tool, or an older version's) is taken over only
once its mtime is STALE_S old; a fresher one is refused, naming the file.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import pathlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from speculative.errors import JobError
from speculative.outputs.storage import OutputDir

LOCK = ".lock"
HEARTBEAT_S, STALE_S = 30.0, 120.0  # on a store, where each beat is a put
LOCAL_HEARTBEAT_S, LOCAL_STALE_S = 1.0, 4.0  # a local file: a beat is a rename
WAIT_S = 10.0  # the longest wait for a gone process's heartbeat to turn stale


@functools.cache
def machine() -> str:
    """This machine's boot id and pid namespace ('' where /proc does not say: the host name
    alone then decides whether a lock's pid is judged here)."""
    try:
        boot = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def lock_dir(out: OutputDir) -> OutputDir:
    """Where `out`'s lock lives: its one local name (`OutputDir.local_path`), else out itself."""
    path = out.local_path()
    return out if path is None else OutputDir(path)


def windows(lock: OutputDir) -> tuple[float, float]:
    """(beat every, stale after) seconds for a lock in the directory `lock`."""
    return (HEARTBEAT_S, STALE_S) if lock.remote else (LOCAL_HEARTBEAT_S, LOCAL_STALE_S)


def record(owner: str, stale_s: float = STALE_S, now: float | None = None) -> bytes:
    """The lock file's contents for this process."""
    now = time.time() if now is None else now
    fields = {
        "owner": owner, "host": socket.gethostname(), "machine": machine(), "pid": os.getpid(),
        "heartbeat": now, "stale_s": stale_s,
    }  # fmt: skip
    return json.dumps(fields).encode()


def _read(out: OutputDir) -> dict[str, Any] | None:
    """The lock file's fields; None when it cannot be read. FileNotFoundError when it is gone."""
    try:
        fields = json.loads(out.read_bytes(LOCK))
    except (UnicodeDecodeError, ValueError):
        return None
    return fields if isinstance(fields, dict) else None


def read_record(out: OutputDir) -> dict[str, Any] | None:
    """The lock file's fields; None when it is gone or cannot be read."""
    try:
        return _read(out)
    except FileNotFoundError:
        return None


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def window(fields: dict[str, Any]) -> float:
    """The holder's stale_s (at most STALE_S; STALE_S when it does not say)."""
    stale_s = _number(fields.get("stale_s"))
    return STALE_S if stale_s is None or stale_s <= 0 else min(stale_s, STALE_S)


def age(fields: dict[str, Any], now: float | None = None) -> float:
    """Seconds since the holder's last heartbeat (infinite without one)."""
    beat = _number(fields.get("heartbeat"))
    return math.inf if beat is None else (time.time() if now is None else now) - beat


def same_machine(fields: dict[str, Any]) -> bool:
    """Whether the lock's pid names a process here: host name, boot id, pid namespace equal."""
    return fields.get("host") == socket.gethostname() and fields.get("machine") == machine()


def _process_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return True  # not a pid we can judge (0 or -1 would signal a group): assume alive
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process, or a pid out of range: assume alive
    return True


def state(fields: dict[str, Any], stale_s: float = STALE_S, now: float | None = None) -> str:
    """'stale' (its job provably gone: take it over), 'live', 'gone' (its process gone on this
    machine, its heartbeat still fresh: wait) or 'hung' (its process alive here, no heartbeat)."""
    if not same_machine(fields):
        return "stale" if age(fields, now) > max(stale_s, window(fields)) else "live"
    fresh = age(fields, now) <= window(fields)
    if _process_alive(fields.get("pid")):
        return "live" if fresh else "hung"
    return "gone" if fresh else "stale"


def is_stale(fields: dict[str, Any], stale_s: float = STALE_S, now: float | None = None) -> bool:
    """Whether a lock's job is provably gone (see the module docstring)."""
    return state(fields, stale_s, now) == "stale"


def acquire(
    out: OutputDir,
    owner: str,
    stale_s: float = STALE_S,
    wait_s: float = WAIT_S,
    url: str | None = None,
) -> None:
    """Takes the lock in `out` (a `lock_dir`) for `owner`, taking over a provably gone job's;
    JobError when a job holds it (`url`: the directory as the user named it, for messages)."""
    url = out.url if url is None else url
    deadline = time.time() + wait_s
    for _ in range(10):
        if out.create(LOCK, record(owner, windows(out)[1])) and _owns(out, owner):
            return
        try:
            held = _read(out)
        except FileNotFoundError:
            continue  # released meanwhile
        if held is None:
            _take_over_unreadable(out, stale_s, url)
            continue
        verdict = state(held, stale_s)
        if verdict == "stale":
            _take_over(out, held)
            continue
        pause = window(held) - age(held) + 0.05
        if verdict == "gone" and time.time() + pause <= deadline:
            print(
                f"{out.where(LOCK)}: its job (pid {held.get('pid')}) is gone; waiting {pause:.1f}s"
            )
            time.sleep(pause)  # for its heartbeat to turn stale
            continue
        raise JobError(_in_use(out, held, verdict, url))
    raise JobError(f"output directory {url!r}: could not take its lock {out.where(LOCK)}")


def _owns(out: OutputDir, owner: str) -> bool:
    held = read_record(out)
    return held is not None and held.get("owner") == owner


def _take_over(out: OutputDir, held: dict[str, Any]) -> None:
    """Deletes the stale lock `held`, unless another job replaced it since it was read."""
    if read_record(out) == held:
        out.delete(LOCK)


def _take_over_unreadable(out: OutputDir, stale_s: float, url: str) -> None:
    """Deletes an unreadable lock file once its mtime is stale_s old; JobError before."""
    where = out.where(LOCK)
    try:
        written = out.mtime(LOCK)
    except FileNotFoundError:
        return
    since = None if written is None else time.time() - written
    if since is None or since <= stale_s:
        when = "at a time the store does not say" if since is None else f"{since:.0f}s ago"
        raise JobError(
            f"output directory {url!r}: its lock file {where} cannot be read (written {when}: "
            f"a job taking the lock right now, an older version's lock or a damaged file); not "
            f"taken over until it is {stale_s:.0f}s old. Delete it if no job is using the directory"
        )
    if read_record(out) is None:  # still unreadable, not replaced meanwhile
        print(f"warning: taking over the unreadable lock file {where} ({since:.0f}s old)")
        out.delete(LOCK)


def _in_use(out: OutputDir, held: dict[str, Any], verdict: str, url: str) -> str:
    """The refusal: who holds the lock and when the user may expect it back."""
    pid, since, window_s = held.get("pid"), age(held), window(held)
    ago = "none" if since == math.inf else f"{since:.0f}s ago"
    who = f"host {held.get('host')}, pid {pid}, heartbeat {ago}, lock file {out.where(LOCK)}"
    if verdict == "hung":
        why = (
            f"its process is alive but its heartbeat stopped (stale after {window_s:.0f}s): "
            f"stop pid {pid} if it is hung, or delete the lock file if that pid is not a job"
        )
    elif verdict == "gone":
        why = (
            f"its process is gone; its lock is taken over once its heartbeat is "
            f"{window_s:.0f}s old, in {window_s - since:.0f}s: rerun then"
        )
    else:
        why = (
            "wait for it to finish or use another output directory (a lock is taken over once "
            f"its process is gone on its machine, or it has no heartbeat for {STALE_S:.0f}s)"
        )
    return f"output directory {url!r} is in use by another job ({who}); {why}"


# The lock files (`OutputDir.where(LOCK)`) whose heartbeat, in this process, found the lock taken
# over by another job; the writers ask `check_held` before each write.
_LOST: set[str] = set()


def check_held(out: OutputDir) -> None:
    """Raises JobError when this process's lock on `out` was taken over by another job (its
    heartbeat stalled past the takeover window): writing on would put rows beside the new
    holder's, so the job stops before its next write. Nothing for a directory it never lost."""
    where = lock_dir(out).where(LOCK)
    if where in _LOST:
        raise JobError(
            f"output directory {out.url!r}: another job took over its lock ({where}) while this "
            "one ran; stopped before writing more. Rerun (alone) to resume"
        )


class Heartbeat:
    """Rewrites the lock's heartbeat every `every_s` seconds on a daemon thread, while it is still
    the owner's (`lost` turns True when another job took the lock over)."""

    def __init__(
        self, out: OutputDir, owner: str, every_s: float = HEARTBEAT_S, stale_s: float = STALE_S
    ):
        self.out, self.owner, self.every_s, self.stale_s = out, owner, every_s, stale_s
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="lock-heartbeat")

    def beat(self) -> None:
        if not _owns(self.out, self.owner):
            self.lost = True
            _LOST.add(self.out.where(LOCK))
            print(f"warning: lost the lock {self.out.where(LOCK)} to another job")
            return
        self.out.write_bytes(LOCK, record(self.owner, self.stale_s))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s) and not self.lost:
            try:
                self.beat()
            except Exception as e:  # noqa: BLE001  a failed beat is retried at the next one
                print(f"warning: lock heartbeat failed: {e}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@contextlib.contextmanager
def hold(out: OutputDir) -> Iterator[OutputDir]:
    """The lock of the directory `out` (created beforehand) while the block runs, wherever its
    name points (`lock_dir`); deleted on exit if still ours."""
    lock, owner = lock_dir(out), uuid.uuid4().hex
    every_s, stale_s = windows(lock)
    acquire(lock, owner, url=out.url)
    _LOST.discard(lock.where(LOCK))
    heartbeat = Heartbeat(lock, owner, every_s, stale_s)
    heartbeat.start()
    try:
        yield out
    finally:
        heartbeat.stop()
        if _owns(lock, owner):
            lock.delete(LOCK)
