"""Runs the 8-device SPMD tests (tests/test_sharded_decoding.py) in a subprocess.

XLA's host device count is fixed when JAX starts, and the rest of the suite runs on one device in
this process; so the sharded tests get their own interpreter with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (`helpers.run_pytest_on_host_devices`), and this
test fails unless all of them pass (none skipped).
"""

from tests import helpers


def test_sharded_suite_on_8_host_devices(tmp_path):
    helpers.run_pytest_on_host_devices(
        ["tests/test_sharded_decoding.py"], tmp_path / "spmd.xml", min_tests=15
    )
