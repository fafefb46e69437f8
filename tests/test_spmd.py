"""Runs the 8-device SPMD tests (tests/test_sharded_decoding.py) in a subprocess.

XLA's host device count is fixed when JAX starts, and the rest of the suite runs on one device in
this process; so the sharded tests get their own interpreter with
XLA_FLAGS=--xla_force_host_platform_device_count=8, and this test fails unless all of them pass
(none skipped).
"""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = "tests/test_sharded_decoding.py"


def test_sharded_suite_on_8_host_devices(tmp_path):
    report = tmp_path / "spmd.xml"
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    env = {**os.environ, "XLA_FLAGS": flags.strip(), "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
    proc = subprocess.run(
        cmd + [MODULE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    log = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"sharded tests failed:\n{log}"
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["tests"] >= 15 and counts["failures"] == counts["errors"] == 0, log
    assert counts["skipped"] == 0, f"sharded tests were skipped (not 8 devices?):\n{log}"
