"""Runs the 8-device SPMD tests (tests/test_sharded_decoding.py, tests/test_sharded_gemma.py, and
tests/test_orbax_t5x_shards.py when orbax-checkpoint is installed) in subprocesses.

XLA's host device count is fixed when JAX starts, and the rest of the suite runs on one device in
this process; so the sharded tests get their own interpreter with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (`helpers.run_pytest_on_host_devices`), and this
test fails unless all of them pass (none skipped). Two interpreters, one per model family, keep each
test here under a minute on a busy 2-core machine.
"""

import importlib.util

import pytest

from tests import helpers

MODULES = ["tests/test_sharded_decoding.py", "tests/test_sharded_gemma.py"]
# -k expression -> how many tests it selects at least (15 in all, 19 with orbax; the 1x8 and 8x1
# meshes are slow-marked repeats of 2x4; Gemma's tree case is in the "not t5" half, its chains
# are slow).
HALVES = {"t5": 4, "not t5": 11}
# Orbax-format T5X checkpoints restored per shard; the module's name puts it in the "t5" half.
if importlib.util.find_spec("orbax") is not None:
    MODULES.append("tests/test_orbax_t5x_shards.py")
    HALVES["t5"] += 4


@pytest.mark.parametrize("selection", sorted(HALVES))
def test_sharded_suite_on_8_host_devices(selection, tmp_path):
    helpers.run_pytest_on_host_devices(
        [*MODULES, "-k", selection], tmp_path / "spmd.xml", min_tests=HALVES[selection]
    )
