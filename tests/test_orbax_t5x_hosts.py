"""Per-host reads of an Orbax T5X checkpoint on a 2-process pod of 8 XLA:CPU devices.

Two interpreters (tests/orbax_t5x_host.py, 4 host devices each, jax.distributed on localhost) write
and restore a tiny T5 on a data 2 x model 4 mesh where each host holds half of every 'model'-split
parameter: each host must read (TensorStore's file byte counters) its half of the split parameters
plus the replicated ones, about half of what a whole read of the checkpoint reads.
"""

import json
import socket
import subprocess
import sys
import time

import jax.numpy as jnp
import pytest

from speculative.checkpoints import load_t5x
from tests import helpers

pytest.importorskip("orbax.checkpoint", reason="orbax-checkpoint is not installed")
from tests import orbax_t5x_host  # noqa: E402  (imports orbax)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_hosts(directory: str, results: list[str], timeout: float = 240) -> None:
    """Runs the two host processes; fails with their logs unless both succeed."""
    port, env = free_port(), helpers.host_devices_env(4)
    cmd = [sys.executable, "-m", "tests.orbax_t5x_host"]
    procs = [
        subprocess.Popen(
            [*cmd, str(i), str(port), directory, results[i]],
            cwd=helpers.ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    deadline, logs = time.monotonic() + timeout, []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    finally:
        for proc in procs:  # one host failing leaves the other waiting at a barrier
            proc.kill()
    for proc, log in zip(procs, logs, strict=True):
        assert proc.returncode == 0, f"host process failed:\n{log[-6000:]}"


@pytest.mark.slow  # two processes; tests/test_orbax_t5x_shards.py checks every device's slice
def test_t5x_orbax_each_host_reads_its_shards(tmp_path):
    directory = str(tmp_path / "checkpoint")
    results = [str(tmp_path / f"host{i}.json") for i in range(2)]
    run_hosts(directory, results)
    before = orbax_t5x_host.bytes_read()
    load_t5x(directory, orbax_t5x_host.tiny_config(), dtype=jnp.bfloat16)
    whole = orbax_t5x_host.bytes_read() - before
    for path in results:
        with open(path) as f:
            host = json.load(f)
        mine = host["replicated_bytes"] + host["split_bytes"] / 2
        print(f"host read {host['bytes_read']} bytes, its shards {mine:.0f}, whole read {whole}")
        assert 0.8 * mine < host["bytes_read"] < 1.2 * mine
        assert host["bytes_read"] < 0.6 * whole
