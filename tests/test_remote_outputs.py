"""OUTPUT_DIR on an object store, with fsspec's in-memory filesystem (memory://) standing in for
gs:// or s3:// (no append, no rename, no flock): the infer job's outputs equal a local run's, a
kill between a chunk and its commit resumes with every row once, a second job is refused by the
lock object, a stale lock is taken over, and a missing fsspec implementation or a trainer given a
store URL is a one-line error that leaves no local 'gs:' folder behind."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem
from fsspec.registry import known_implementations

from speculative import infer, train, train_head
from speculative.config import gin_flags
from speculative.errors import JobError
from speculative.jobs import spmd as job_spmd
from speculative.measure import plots
from speculative.outputs import chunk_store, job_io, store_lock
from speculative.outputs.storage import OutputDir
from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROMPTS = ["Hi", "Ein", "x = 1", "abc", "Hey"]  # 3 batches of 2, one prompt width: one program
# The job's own compilation cache off, so that a memory:// run writes nothing under ~.
SAME = ["--gin.BATCH_SIZE=2", "--gin.GAMMA=3", "--gin.COMPILATION_CACHE_DIR=None"]


class Killed(BaseException):
    """A kill at a chosen write (BaseException: no handler of the job catches it)."""


@pytest.fixture(autouse=True)
def _cwd_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # gin paths in the flags are relative to the repository


@pytest.fixture
def store(tmp_path):
    """A fresh memory:// directory, removed afterwards (the filesystem is process-wide)."""
    url = f"memory://{tmp_path.name}/out"
    yield url
    memory = fsspec.filesystem("memory")
    if memory.exists(f"/{tmp_path.name}"):
        memory.rm(f"/{tmp_path.name}", recursive=True)


def _flags(inputs: pathlib.Path, out: str, *extra: str) -> list[str]:
    return [
        *helpers.TINY_INFER, *helpers.QUIET_INFER, *SAME,
        f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_DIR='{out}'", *extra,
    ]  # fmt: skip


class NoAppendFileSystem(LocalFileSystem):
    """teststore://PATH: local files behind a store's interface, without append (as a bucket):
    shared by processes, so a job on it can be killed with SIGKILL."""

    protocol = ("teststore",)

    def _open(self, path, mode="rb", **kwargs):
        if "a" in mode:
            raise OSError("teststore: no append on an object store")
        return super()._open(path, mode, **kwargs)


# The infer command with teststore:// registered (as gcsfs registers gs://).
_RUN_ON_TESTSTORE = """
import sys, fsspec
from tests.test_remote_outputs import NoAppendFileSystem
fsspec.register_implementation("teststore", NoAppendFileSystem, clobber=True)
from speculative import infer
from speculative.config import gin_flags
sys.exit(gin_flags.run_job(infer.main, sys.argv[1:]))
"""


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _lock(**fields) -> bytes:
    """A lock file as this process would write it, with `fields` changed."""
    return json.dumps(
        {**json.loads(store_lock.record("x", store_lock.LOCAL_STALE_S)), **fields}
    ).encode()


def test_infer_on_a_store_resumes_after_a_kill_and_equals_the_local_run(tmp_path, store):
    inputs = helpers.write_jsonl(tmp_path / "in.jsonl", PROMPTS)
    local = infer.main(_flags(inputs, str(tmp_path / "local")))
    out = OutputDir(store)
    real_write = OutputDir.write_bytes

    def write_then_die(self, name, data):  # killed after chunk 1's put, before its commit
        if name == chunk_store.chunk_name(1, "commit"):
            raise Killed
        real_write(self, name, data)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(OutputDir, "write_bytes", write_then_die)
        with pytest.raises(Killed):
            infer.main(_flags(inputs, store))
    assert out.listdir("predictions") == [
        "chunk-00000.commit",
        "chunk-00000.jsonl",
        "chunk-00001.jsonl",
    ]
    assert not out.exists("predictions.jsonl")
    # A SIGKILL leaves the lock object behind; its process is gone and its heartbeat stale, so it
    # is taken over.
    out.write_bytes(store_lock.LOCK, _lock(pid=_dead_pid(), heartbeat=time.time() - 300))
    resumed = infer.main(_flags(inputs, store))
    assert resumed["this_run"]["decoded_examples"] == 3  # chunk 1's rows again, and chunk 2's
    assert out.listdir("predictions") == [
        "chunk-00000.commit", "chunk-00000.jsonl", "chunk-00002.commit", "chunk-00002.jsonl",
        "chunk-00003.commit", "chunk-00003.jsonl",
    ]  # fmt: skip
    local_dir = tmp_path / "local"
    assert out.read_bytes("predictions.jsonl") == (local_dir / "predictions.jsonl").read_bytes()
    summary = json.loads(out.read_text("summary.json"))
    mine = json.loads((local_dir / "summary.json").read_text())
    # provenance's gin config names each OUTPUT_DIR; environment has each run's time
    apart = ("this_run", "provenance", "environment")
    assert {k: v for k, v in summary.items() if k not in apart} == {
        k: v for k, v in mine.items() if k not in apart
    }
    assert summary["provenance"]["gin_config"] == out.read_text("config.gin")
    assert summary["tokens"] == local["tokens"]
    config = out.read_text("config.gin").replace(store, str(local_dir))

    def unwrapped(text: str) -> str:  # gin wraps a long OUTPUT_DIR line; the paths differ in length
        return re.sub(r"\\\n\s+", "", text)

    assert unwrapped(config) == unwrapped((local_dir / "config.gin").read_text())
    assert not out.exists(store_lock.LOCK)  # released
    # Another job's settings in the same store directory: refused, rows kept.
    before = out.read_bytes("predictions.jsonl")
    with pytest.raises(JobError, match="different job.*gamma"):
        infer.main(_flags(inputs, store, "--gin.GAMMA=5"))
    assert out.read_bytes("predictions.jsonl") == before


def test_second_job_on_a_store_is_refused_and_a_stale_lock_is_taken_over(tmp_path, store):
    inputs = helpers.write_jsonl(tmp_path / "in.jsonl", PROMPTS[:1])
    out = OutputDir(store).prepare()
    with store_lock.hold(out):
        held = store_lock.read_record(out)
        with pytest.raises(JobError, match=r"in use by another job \(host .*, pid \d+"):
            infer.main(_flags(inputs, store))
        assert store_lock.read_record(out) == held and out.listdir("predictions") == []
    assert not out.exists(store_lock.LOCK)
    # Another host's lock: live while its heartbeat is fresh, stale after STALE_S.
    other = {"owner": "x", "host": "elsewhere", "pid": 1, "heartbeat": time.time()}
    out.write_bytes(store_lock.LOCK, json.dumps(other).encode())
    with pytest.raises(JobError, match="host elsewhere, pid 1, heartbeat 0s ago"):
        store_lock.acquire(out, "me")
    other["heartbeat"] -= store_lock.STALE_S + 1
    out.write_bytes(store_lock.LOCK, json.dumps(other).encode())
    store_lock.acquire(out, "me")
    assert store_lock.read_record(out)["owner"] == "me"
    beat = store_lock.Heartbeat(out, "me")
    beat.beat()
    assert not beat.lost and time.time() - store_lock.read_record(out)["heartbeat"] < 60
    out.write_bytes(store_lock.LOCK, json.dumps(other).encode())  # taken over by someone
    beat.beat()
    assert beat.lost and store_lock.read_record(out)["owner"] == "x"  # not overwritten


def test_a_fresh_heartbeat_is_never_taken_over_and_a_dead_job_with_a_stale_one_is(tmp_path):
    """Issue 40: a lock is taken over only when its job is provably gone."""
    out, host, dead = OutputDir(tmp_path).prepare(), socket.gethostname(), _dead_pid()
    path = tmp_path / store_lock.LOCK

    def taken(wait_s: float = 0.0) -> bool:
        try:
            store_lock.acquire(out, "me", wait_s=wait_s)
        except JobError:
            return False
        return store_lock.read_record(out)["owner"] == "me"

    # The host name only (containers): its pid, dead here or alive, says nothing; fresh wins.
    for pid in (dead, os.getpid()):
        path.write_bytes(_lock(machine="another container", pid=pid))
        with pytest.raises(JobError, match=rf"\(host {host}, pid {pid}, heartbeat 0s ago"):
            store_lock.acquire(out, "me")
    assert store_lock.read_record(out)["owner"] == "x"
    # This machine, its process gone, its heartbeat fresh: refused, or waited out within WAIT_S.
    path.write_bytes(_lock(pid=dead, stale_s=store_lock.STALE_S))
    with pytest.raises(JobError, match="process is gone; its lock is taken over once its heart"):
        store_lock.acquire(out, "me")
    beat = time.time() - 1
    path.write_bytes(_lock(pid=dead, heartbeat=beat))
    assert not taken() and store_lock.read_record(out)["owner"] == "x"
    assert taken(wait_s=store_lock.WAIT_S) and time.time() > beat + store_lock.LOCAL_STALE_S
    # Dead and stale: taken over at once. Alive here and stale (hung): refused.
    path.write_bytes(_lock(pid=dead, heartbeat=time.time() - 10))
    assert taken()
    path.write_bytes(_lock(pid=os.getpid(), heartbeat=time.time() - 10))
    with pytest.raises(JobError, match=rf"pid {os.getpid()} if it is hung"):
        store_lock.acquire(out, "me")
    # Elsewhere, silent for STALE_S: taken over, whatever its pid.
    path.write_bytes(_lock(machine="elsewhere", heartbeat=time.time() - store_lock.STALE_S - 1))
    assert taken()
    # Unreadable (torn): refused, kept and named while fresh; taken over once old.
    path.write_bytes(b'{"owner": "x", "ho')
    with pytest.raises(JobError, match=rf"lock file {re.escape(str(path))} cannot be read \(wr"):
        store_lock.acquire(out, "me")
    assert path.read_bytes() == b'{"owner": "x", "ho'
    old = time.time() - store_lock.STALE_S - 1
    os.utime(path, (old, old))
    assert taken()


def test_tilde_symlink_and_file_url_name_one_lock(tmp_path, monkeypatch):
    """Issue 40: however a directory is named, its jobs take one lock file."""
    monkeypatch.setenv("HOME", str(tmp_path))
    real = tmp_path / "runs" / "x"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    names = [
        "~/runs/x", str(real), f"{tmp_path}/runs/../runs/x/", str(tmp_path / "link"),
        f"file://{real}", f"file://{tmp_path}/link/", "file://~/runs/x",
    ]  # fmt: skip
    lock = os.path.realpath(real)
    assert {store_lock.lock_dir(OutputDir(name)).url for name in names} == {lock}
    for first in names:
        with job_io.hold_output_dir(first):
            for second in names:
                with pytest.raises(JobError, match=f"file {re.escape(lock)}/.lock"):
                    with job_io.hold_output_dir(second):
                        pass
        with job_io.hold_output_dir(names[-1 - names.index(first)]):
            pass  # released
    assert sorted(os.listdir(real)) == []  # no lock, no probe, no temporary file left


@pytest.fixture(params=["memory", "teststore"])
def any_store(request, store, tmp_path):
    """memory:// (no directories) and teststore:// (real directories, no append)."""
    if request.param == "memory":
        return store
    fsspec.register_implementation("teststore", NoAppendFileSystem, clobber=True)
    return f"teststore://{tmp_path}/out"


def test_chunk_store_refuses_a_corrupt_committed_chunk_and_drops_uncommitted_ones(any_store):
    out = OutputDir(any_store).prepare()
    first = chunk_store.ChunkStore(out)
    first.recover()
    first.append([{"index": 0, "x": "a"}, {"index": 1, "x": "b"}])
    first.append([{"index": 1, "x": "b"}, {"index": 2, "x": "c"}])  # 1 is not written twice
    out.write_bytes(chunk_store.chunk_name(2, "jsonl"), b'{"index": 3, "x": "tor')  # no commit
    again = chunk_store.ChunkStore(out)
    again.recover()
    assert sorted(again.done) == [0, 1, 2] and again.next == 3
    assert not out.exists(chunk_store.chunk_name(2, "jsonl"))
    out.write_bytes(chunk_store.chunk_name(1, "jsonl"), b'{"index": 2, "x": "C"}\n')
    with pytest.raises(JobError, match=r"chunk-00001\.jsonl: corrupt committed chunk \(its SHA"):
        chunk_store.ChunkStore(out).recover()


def test_missing_filesystem_and_trainers_given_a_store_are_one_line_errors(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(
        known_implementations, "nostore", {"class": "no_such_fs_package.NoFS", "err": "missing"}
    )
    inputs = helpers.write_jsonl(tmp_path / "in.jsonl", PROMPTS[:1])
    flags = _flags(inputs, "nostore://bucket/out")
    assert gin_flags.run_job(infer.main, flags) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: output directory 'nostore://bucket/out': the nostore:// filesystem is not "
        "installed (pip install no_such_fs_package)\n"
    )
    with pytest.raises(JobError, match=r"'zzz://b/o': Protocol not known: zzz"):
        infer.main(_flags(inputs, "zzz://b/o"))
    # 'auto' puts the compilation cache in the user's cache, never on a store.
    assert job_spmd.cache_dir("auto").endswith(
        "speculative/jax_cache"
    )  # local, whatever OUTPUT_DIR
    train_flags = [
        "--gin_file=configs/train/ende_tiny.gin", "--gin.OUTPUT_DIR='gs://bucket/t5'",
        "--gin.TRAIN_FILE='tests/data/en_de_pairs.tsv'",
    ]  # fmt: skip
    with pytest.raises(JobError, match="'gs://bucket/t5': the T5 trainer writes to a local"):
        train.main(train_flags)
    head = ["--gin_file=configs/train/tiny_head.gin", "--gin.OUTPUT_DIR='s3://bucket/head'"]
    with pytest.raises(JobError, match="'s3://bucket/head': the head trainer writes to a local"):
        train_head.main(head)
    assert not any((ROOT / name).exists() for name in ("gs:", "s3:", "nostore:", "zzz:"))


def test_benchmark_plots_go_to_a_store_whole(store):
    point = {"gamma": 2, "speedup": 1.3, "alpha": 0.8, "acceptance_by_position": [0.9, 0.7]}
    cell = {"batch_size": 1, "temperature": 0.0, "top_p": 1.0, "alpha": 0.8, "c": 0.2}
    out = OutputDir(store).prepare()
    paths = plots.plot({"cells": [{**cell, "points": [point]}]}, out)
    assert paths == [f"{store}/{name}" for name in plots.PLOTS]
    for name in plots.PLOTS:
        assert out.read_bytes(name).startswith(b"\x89PNG\r\n\x1a\n")
    assert out.listdir("") == sorted(plots.PLOTS)  # no temporary files


@pytest.mark.slow  # two subprocess runs of the job (about 30 s on 2 cores)
def test_sigkilled_job_on_a_filesystem_backed_store_resumes_with_every_row_once(tmp_path):
    inputs = helpers.write_jsonl(tmp_path / "in.jsonl", PROMPTS)
    infer.main(_flags(inputs, str(tmp_path / "local"), "--gin.TEMPERATURE=1.0", "--gin.SEED=7"))
    url = f"teststore://{tmp_path / 'store'}"
    cmd = [sys.executable, "-c", _RUN_ON_TESTSTORE]
    cmd += _flags(inputs, url, "--gin.TEMPERATURE=1.0", "--gin.SEED=7")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    chunks = tmp_path / "store" / "predictions"
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log)
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if chunks.is_dir() and any(p.suffix == ".commit" for p in chunks.iterdir()):
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL, (tmp_path / "first.log").read_text()[-3000:]
    assert json.loads((tmp_path / "store" / ".lock").read_text())["pid"] == proc.pid  # left
    assert not (tmp_path / "store" / "predictions.jsonl").exists()
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "5 examples, 0 already" not in again.stdout  # it resumed
    rows = (tmp_path / "store" / "predictions.jsonl").read_bytes()
    assert rows == (tmp_path / "local" / "predictions.jsonl").read_bytes()  # each row once
    assert not (tmp_path / "store" / ".lock").exists()


@pytest.mark.slow  # a benchmark sweep (about 10 s on 2 cores)
def test_benchmark_job_writes_its_outputs_to_a_store(tmp_path, store):
    from speculative import benchmark

    inputs = helpers.write_jsonl(tmp_path / "in.jsonl", ["abcabcabc", "Hello, Hello"])
    result = benchmark.main(
        [
            "--gin_file=configs/runs/benchmark.gin", "--gin_file=configs/demo/tiny_random_models.gin",
            f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_DIR='{store}'", "--gin.GAMMAS=[3]",
            "--gin.TEMPERATURES=[0.0]", "--gin.BATCH_SIZES=[2]", "--gin.REPEATS=1",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}",
            "--gin.COMPILATION_CACHE_DIR=None",
        ]
    )  # fmt: skip
    out = OutputDir(store)
    assert out.listdir("") == sorted(["benchmark.json", *plots.PLOTS])  # lock gone
    assert json.loads(out.read_text("benchmark.json"))["cells"] == json.loads(
        json.dumps(result["cells"])
    )


@pytest.mark.parametrize("remote", [False, True], ids=["local", "store"])
def test_a_job_whose_lock_was_taken_over_stops_before_its_next_write(tmp_path, monkeypatch, remote):
    """A lock is taken over only once its heartbeat is stale; if a live job's heartbeat stalled
    that long (a hung store, a paused VM), the job must not write on beside the new holder."""
    monkeypatch.setattr(store_lock, "HEARTBEAT_S", 0.2)  # a store's beat, sped up
    url = f"memory://taken-{os.getpid()}" if remote else str(tmp_path)
    out = OutputDir(url).prepare()
    store = job_io.open_result_store(url, {"job": "a"})
    with store_lock.hold(out):
        store.append([{"index": 0}])
        lock = store_lock.lock_dir(out)
        lock.write_bytes(store_lock.LOCK, store_lock.record("another-job"))  # taken over
        deadline = time.time() + 10
        while time.time() < deadline:  # the holder's next beat finds the other job's record
            try:
                store_lock.check_held(out)
            except JobError:
                break
            time.sleep(0.05)
        with pytest.raises(JobError, match="another job took over its lock"):
            store.append([{"index": 1}])
    assert sorted(store.done) == [0]
