"""OUTPUT_DIR's lock on an object store, which has no locks: a lock object (`.lock`).

Taken by a create-only write (a conditional put on stores that have one: GCS, S3; elsewhere
fsspec checks, then writes), then read back: the job holds the lock only if the object names its
owner token. Best-effort on a store without conditional writes, where two jobs starting within
the same moment may both win the check.

The object holds {"owner", "host", "pid", "heartbeat"}; a thread rewrites the heartbeat every
HEARTBEAT_S while the job runs. Nothing drops the lock of a killed job, so a lock counts as stale,
and is taken over, when its job's process is gone (same host) or its heartbeat is older than
STALE_S (another host): a killed job's lock blocks a resume for at most STALE_S.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from speculative.errors import JobError
from speculative.storage import OutputDir

LOCK = ".lock"
HEARTBEAT_S = 30.0
STALE_S = 120.0


def record(owner: str, now: float | None = None) -> bytes:
    """The lock object's contents for this process."""
    now = time.time() if now is None else now
    fields = {"owner": owner, "host": socket.gethostname(), "pid": os.getpid(), "heartbeat": now}
    return json.dumps(fields).encode()


def read_record(out: OutputDir) -> dict[str, Any] | None:
    """The lock object's fields; None when it is gone or unreadable (a torn write)."""
    try:
        fields = json.loads(out.read_bytes(LOCK))
    except (FileNotFoundError, ValueError):
        return None
    return fields if isinstance(fields, dict) else None


def _process_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True  # someone else's process, or a pid we cannot judge: assume alive
    return True


def is_stale(fields: dict[str, Any], stale_s: float = STALE_S, now: float | None = None) -> bool:
    """Whether a lock's job is gone: its process (on this host) or its heartbeat (elsewhere)."""
    if fields.get("host") == socket.gethostname():
        return not _process_alive(fields.get("pid"))
    now = time.time() if now is None else now
    heartbeat = fields.get("heartbeat")
    return not isinstance(heartbeat, (int, float)) or now - heartbeat > stale_s


def acquire(out: OutputDir, owner: str, stale_s: float = STALE_S) -> None:
    """Takes the lock for `owner`, taking over a stale one; JobError when a live job holds it."""
    for _ in range(3):
        if out.create(LOCK, record(owner)):
            held = read_record(out)
            if held is not None and held.get("owner") == owner:
                return
        held = read_record(out)
        if held is not None and held.get("owner") != owner and not is_stale(held, stale_s):
            beat = held.get("heartbeat")
            age = f"{time.time() - beat:.0f}s ago" if isinstance(beat, (int, float)) else "none"
            raise JobError(
                f"output directory {out.url!r} is in use by another job (host "
                f"{held.get('host')}, pid {held.get('pid')}, heartbeat {age}, lock "
                f"object {out.where(LOCK)}); wait for it to finish or use another output "
                f"directory (a lock without a heartbeat for {stale_s:.0f}s is taken over)"
            )
        out.delete(LOCK)  # stale or unreadable: taken over
    raise JobError(f"output directory {out.url!r}: could not take its lock {out.where(LOCK)}")


class Heartbeat:
    """Rewrites the lock's heartbeat every `every_s` seconds on a daemon thread, while it is still
    the owner's (`lost` turns True when another job took the lock over)."""

    def __init__(self, out: OutputDir, owner: str, every_s: float = HEARTBEAT_S):
        self.out, self.owner, self.every_s = out, owner, every_s
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="lock-heartbeat")

    def beat(self) -> None:
        held = read_record(self.out)
        if held is None or held.get("owner") != self.owner:
            self.lost = True
            print(f"warning: lost the lock {self.out.where(LOCK)} to another job")
            return
        self.out.write_bytes(LOCK, record(self.owner))

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
def hold(out: OutputDir, every_s: float = HEARTBEAT_S) -> Iterator[OutputDir]:
    """OUTPUT_DIR's lock on a store while the block runs; deleted on exit if still ours."""
    owner = uuid.uuid4().hex
    acquire(out, owner)
    heartbeat = Heartbeat(out, owner, every_s)
    heartbeat.start()
    try:
        yield out
    finally:
        heartbeat.stop()
        held = read_record(out)
        if held is not None and held.get("owner") == owner:
            out.delete(LOCK)
