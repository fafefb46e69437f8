"""Runs tests/test_seqio_task.py in its own interpreter: seqio imports TensorFlow, and TensorFlow
and JAX in one process can crash it (both carry XLA and LLVM), so no test worker ever imports it
(tests/conftest.py checks that after every test)."""

import importlib.util
import os
import sys

import pytest

from speculative.errors import JobError
from speculative.jobs.config import seqio_tasks_module
from tests import helpers


@pytest.mark.skipif(
    importlib.util.find_spec("seqio") is None,
    reason="seqio extra not installed (pip install .[seqio])",
)
def test_seqio_tests_in_a_tensorflow_process(tmp_path):
    env = {**os.environ, helpers.TENSORFLOW_PROCESS: "1"}
    helpers.run_pytest_in_subprocess(
        ["tests/test_seqio_task.py"], tmp_path / "seqio.xml", 3, env, "in a TensorFlow process"
    )


def test_task_name_without_seqio_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "seqio", None)  # makes `import seqio` fail, as when absent
    monkeypatch.delitem(sys.modules, "speculative.data.seqio_tasks", raising=False)
    with pytest.raises(JobError, match=r"needs the seqio extra.*pip install"):
        seqio_tasks_module()
