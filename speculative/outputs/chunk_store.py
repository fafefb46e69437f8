"""The infer job's resumable predictions on an object store (no append, no rename, no fsync).

Each `append` (a decoded batch's rows) is one chunk, `predictions/chunk-NNNNN.jsonl`, written in
one put, then committed by a second put, `predictions/chunk-NNNNN.commit`, holding the chunk's row
count and SHA-256. A job killed at any moment leaves committed chunks and at most one chunk
without its commit; on restart the committed chunks are the rows done (their digests checked),
the uncommitted one is deleted and its rows decoded again, so every input row is written exactly
once. Chunk numbers only grow (past every name seen), so no object is ever overwritten.
`finish` writes the rows of every committed chunk, in index order, to `predictions.jsonl` (one
put): the same file, byte for byte, as a local run's. Local OUTPUT_DIRs keep
`job_io.ResultStore` (an append-only, fsynced predictions.jsonl).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from speculative.errors import JobError
from speculative.outputs import store_lock
from speculative.outputs.storage import OutputDir

CHUNKS = "predictions"
PREDICTIONS = "predictions.jsonl"
_NAME = re.compile(r"chunk-(\d+)\.(jsonl|commit)")


def chunk_name(number: int, kind: str) -> str:
    """ "predictions/chunk-00012.jsonl" (kind "jsonl") or its commit (kind "commit")."""
    return f"{CHUNKS}/chunk-{number:05d}.{kind}"


def encode_rows(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """Rows as JSON lines, as `job_io.ResultStore` appends them."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


class ChunkStore:
    """predictions.jsonl's rows as committed chunks (see the module docstring); the interface of
    `job_io.ResultStore`: done {index: row}, append, rows, plus finish.

    Construction lists the chunks only; `recover` reads them (after the fingerprint check, so
    another job's chunks are refused before anything is deleted).
    """

    def __init__(self, out: OutputDir):
        self.out = out
        self.path = out.where(PREDICTIONS)
        names = [_NAME.fullmatch(n) for n in out.listdir(CHUNKS)]
        found = [(int(m[1]), m[2]) for m in names if m]
        self.committed = sorted(k for k, kind in found if kind == "commit")
        self.strays = sorted({k for k, kind in found if kind == "jsonl"} - set(self.committed))
        self.next = 1 + max((k for k, _ in found), default=-1)
        self.done: dict[int, dict[str, Any]] = {}

    def recover(self) -> None:
        """Reads the committed chunks into `done`; deletes the chunks without a commit."""
        self.out.makedirs(CHUNKS)
        for number in self.committed:
            for row in self._read_chunk(number):
                index = int(row["index"])
                if index in self.done:
                    raise JobError(
                        f"{self.out.where(chunk_name(number, 'jsonl'))}: duplicate row for index "
                        f"{index}"
                    )
                self.done[index] = row
        for number in self.strays:
            print(f"{self.out.where(chunk_name(number, 'jsonl'))}: not committed, decoded again")
            self.out.delete(chunk_name(number, "jsonl"))
        self.strays = []

    def _read_chunk(self, number: int) -> list[dict[str, Any]]:
        name = chunk_name(number, "jsonl")
        where = self.out.where(name)
        try:
            commit = json.loads(self.out.read_bytes(chunk_name(number, "commit")))
            data = self.out.read_bytes(name)
            if hashlib.sha256(data).hexdigest() != commit["sha256"]:
                raise ValueError("its SHA-256 differs from its commit's")
            rows = [json.loads(line) for line in data.decode("utf-8").splitlines()]
            if len(rows) != commit["rows"] or any("index" not in r for r in rows):
                raise ValueError(f"{len(rows)} rows, its commit says {commit['rows']}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise JobError(
                f"{where}: corrupt committed chunk ({e}); not resuming over it. Delete it and its "
                ".commit to decode its rows again"
            ) from e
        return rows

    def append(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Writes the rows not done yet as the next chunk, then its commit: after return they
        survive a kill."""
        fresh = [dict(r) for r in rows if int(r["index"]) not in self.done]
        if not fresh:
            return
        store_lock.check_held(self.out)
        data = encode_rows(fresh)
        commit = {"rows": len(fresh), "sha256": hashlib.sha256(data).hexdigest()}
        self.out.write_bytes(chunk_name(self.next, "jsonl"), data)
        self.out.write_bytes(chunk_name(self.next, "commit"), json.dumps(commit).encode())
        self.committed.append(self.next)
        self.next += 1
        for r in fresh:
            self.done[int(r["index"])] = r

    def rows(self) -> list[dict[str, Any]]:
        """Every row written so far, in index order."""
        return [self.done[i] for i in sorted(self.done)]

    def finish(self) -> None:
        """predictions.jsonl: every row in index order, in one put."""
        self.out.write_bytes(PREDICTIONS, encode_rows(self.rows()))
