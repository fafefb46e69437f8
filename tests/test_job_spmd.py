"""The jobs on meshes, on several hosts and with the persistent compilation cache.

- tests/test_job_meshes.py (the infer job on 2x4 and 4x2 meshes) in a subprocess on 8 XLA:CPU
  host devices, as tests/test_spmd.py runs the sharded decoding tests;
- the compilation cache: a second run of the same job in a fresh process finds its programs;
- the multi-host logic as plain functions: hosts' rows tile a batch, only process 0 writes.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from speculative import infer
from speculative.jobs import spmd as job_spmd
from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = helpers.TINY_INFER
FAST = helpers.QUIET_INFER


def _write_inputs(path: pathlib.Path) -> pathlib.Path:
    return helpers.write_jsonl(path, ["Hi", "x = 1", "abc"])


def test_infer_job_on_meshes_of_8_host_devices(tmp_path):
    helpers.run_pytest_on_host_devices(
        ["tests/test_job_meshes.py"], tmp_path / "meshes.xml", min_tests=3
    )


# ------------------------------------------------------------------------------------------------
# Compilation cache.


@pytest.mark.slow  # two job processes (~11 s); cache_dir and restore are unit-tested below
def test_second_run_in_a_fresh_process_hits_the_compilation_cache(tmp_path):
    inputs, cache = _write_inputs(tmp_path / "in.jsonl"), tmp_path / "cache"
    summaries = []
    for run in ("cold", "warm"):
        out = tmp_path / run
        cmd = [sys.executable, "-m", "speculative.infer", *TINY, *FAST]
        cmd += [f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_DIR='{out}'"]
        cmd += ["--gin.SPECULATIVE=False", f"--gin.COMPILATION_CACHE_DIR='{cache}'"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summaries.append(json.loads((out / "summary.json").read_text()))
        if run == "cold":
            assert any(cache.iterdir()), "the first run wrote no cache entries"
    cold, warm = (s["compilation_cache"] for s in summaries)
    assert cold["dir"] == str(cache) and cold["hits"] == 0 and cold["misses"] > 0
    assert not cold["warm"] and warm["hits"] > 0 and warm["misses"] < cold["misses"]
    assert summaries[0]["this_run"]["compile_s"] > 0  # compile time reported apart, both runs
    assert (
        summaries[1]["this_run"]["compile_batches"] == summaries[0]["this_run"]["compile_batches"]
    )


def test_cache_dir_setting(tmp_path, monkeypatch):
    assert job_spmd.cache_dir(None) is None and job_spmd.cache_dir("") is None
    monkeypatch.setenv("SPECULATIVE_CACHE", str(tmp_path / "cache"))
    # the user's cache, shared by every run; never inside or beside OUTPUT_DIR
    assert job_spmd.cache_dir("auto") == str(tmp_path / "cache/jax_cache")
    assert job_spmd.cache_dir("~/c") == os.path.expanduser("~/c")


def test_compilation_cache_settings_are_restored(tmp_path):
    import jax

    before = jax.config.jax_compilation_cache_dir
    with job_spmd.compilation_cache(str(tmp_path / "c")) as stats:
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "c")
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    assert jax.config.jax_compilation_cache_dir == before and stats.dir == str(tmp_path / "c")


# ------------------------------------------------------------------------------------------------
# Multi-host logic, with the process index and the device -> process map injected.


def _fake_sharding(batch: int, data: int, hosts: int, devices_per_host: int):
    """{device: (rows,)} of a batch split over 'data' on hosts x devices_per_host devices, data
    rows laid out over the devices in order (model = devices / data); device -> host."""
    devices = [f"d{i}" for i in range(hosts * devices_per_host)]
    model = len(devices) // data
    rows = batch // data
    indices = {
        d: (slice(i // model * rows, (i // model + 1) * rows),) for i, d in enumerate(devices)
    }
    return indices, lambda d: int(d[1:]) // devices_per_host


@pytest.mark.parametrize("batch,data,hosts", [(8, 8, 4), (16, 4, 4), (6, 2, 2), (4, 4, 2)])
def test_hosts_rows_cover_every_row_exactly_once(batch, data, hosts):
    indices, host_of = _fake_sharding(batch, data, hosts, devices_per_host=4)
    spans = [job_spmd.rows_of_process(indices, host_of, h, batch) for h in range(hosts)]
    covered = [row for s in spans for row in range(s.start, s.stop)]
    assert sorted(covered) == list(range(batch))


def test_hosts_sharing_a_data_row_feed_the_same_rows():
    # data = 2 over 4 hosts: hosts 0 and 1 hold the devices of data row 0.
    indices, host_of = _fake_sharding(8, data=2, hosts=4, devices_per_host=2)
    spans = [job_spmd.rows_of_process(indices, host_of, h, 8) for h in range(4)]
    assert spans == [slice(0, 4), slice(0, 4), slice(4, 8), slice(4, 8)]


def test_rows_of_a_process_without_devices_or_with_gaps_are_refused():
    indices = {"a": (slice(0, 2),), "b": (slice(4, 6),), "c": (slice(2, 4),)}
    owner = {"a": 0, "b": 0, "c": 1}.get
    with pytest.raises(ValueError, match="not contiguous"):
        job_spmd.rows_of_process(indices, owner, 0, 6)
    with pytest.raises(ValueError, match="holds no device"):
        job_spmd.rows_of_process(indices, owner, 2, 6)


def test_only_process_0_writes():
    assert job_spmd.is_writer(0) and not job_spmd.is_writer(1) and not job_spmd.is_writer(3)
    assert job_spmd.is_writer()  # this test's single process
    assert job_spmd.agree_on_pending([2, 0], 4) == [2, 0]  # one process: as it is


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two real processes (~20 s); the 8-device mesh tests run in the default suite
def test_two_processes_on_cpu_resume_a_job_and_write_its_rows_once(tmp_path, monkeypatch):
    """A real two-host run on XLA:CPU (gloo collectives), 2 devices each, a 2x2 mesh, resuming a
    job whose first batch a single-process run wrote: host 0 reads what is done, both hosts
    decode the rest, and host 0 alone writes it."""
    monkeypatch.chdir(ROOT)
    inputs = _write_inputs(tmp_path / "in.jsonl")
    common = TINY + FAST + [f"--gin.INPUT_FILE='{inputs}'", "--gin.COMPILATION_CACHE_DIR=None"]
    common += ["--gin.BATCH_SIZE=2"]
    one, out = tmp_path / "one", tmp_path / "two"
    infer.main(common + [f"--gin.OUTPUT_DIR='{one}'"])
    expected = (one / "predictions.jsonl").read_text().splitlines()
    out.mkdir()
    (out / "job.json").write_text((one / "job.json").read_text())
    (out / "predictions.jsonl").write_text("\n".join(expected[:2]) + "\n")  # batch 0 of 2
    env = {**helpers.host_devices_env(2), "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo"}
    cmd = [sys.executable, "-m", "speculative.infer", *common, f"--gin.OUTPUT_DIR='{out}'"]
    cmd += [
        "--gin.PARTITIONER=@partitioning.create_partitioner()",
        "--gin.partitioning.create_partitioner.data=2",
        "--gin.partitioning.create_partitioner.model=2",
        "--gin.DISTRIBUTED=True",
        "--gin.distributed.initialize.num_processes=2",
        f"--gin.distributed.initialize.coordinator_address='localhost:{_free_port()}'",
    ]
    procs = [
        subprocess.Popen(
            cmd + [f"--gin.distributed.initialize.process_id={i}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n----\n".join(x[-3000:] for x in logs)
    assert "2 already in" in logs[0] and "1 batches of 2 to decode" in logs[1]  # host 0's plan
    assert "wrote" in logs[0] and "wrote" not in logs[1]  # process 0 alone writes
    assert (out / "predictions.jsonl").read_text().splitlines() == expected
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partitioner"] == {"mesh": {"data": 2, "model": 2}, "processes": 2}
    assert summary["examples"] == 3 and summary["this_run"]["decoded_examples"] == 1


def test_a_host_other_than_0_decodes_but_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(job_spmd, "is_writer", lambda process_index=None: False)
    inputs, out = _write_inputs(tmp_path / "in.jsonl"), tmp_path / "out"
    flags = [f"--gin.INPUT_FILE='{inputs}'", f"--gin.OUTPUT_DIR='{out}'"]
    # plain decoding of short features: which rows a host writes does not depend on the decoder,
    # and the plain loop compiles in a fraction of the speculative one's time
    flags += ["--gin.SPECULATIVE=False", "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 8}"]
    result = infer.main(TINY + FAST + flags + ["--gin.COMPILATION_CACHE_DIR=None"])
    assert result["this_run"]["compile_batches"] >= 1  # it decoded ...
    assert result["this_run"]["decoded_examples"] == 0  # ... but the rows are host 0's
    assert result["process_index"] == 0 and not out.exists()
