"""speculative.outputs.provenance: the commit and dirty flag of the checkout holding the code, null (never
an error) outside one; speculative.outputs.logs: one handler however often a job sets it up."""

from __future__ import annotations

import logging
import shutil
import subprocess

import pytest

import speculative
from speculative.outputs import logs, provenance
from tests import helpers

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(path, *args):
    subprocess.run(
        ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def test_outside_a_checkout_the_commit_is_null_and_nothing_fails(tmp_path):
    assert provenance.git_state(tmp_path) == {"git_commit": None, "git_dirty": None}
    assert provenance.git_state(tmp_path / "missing") == {"git_commit": None, "git_dirty": None}
    made = provenance.record("X = 1\n", tmp_path)
    assert made == {
        "git_commit": None,
        "git_dirty": None,
        "version": speculative.__version__,
        "gin_config": "X = 1\n",
    }


@needs_git
def test_a_checkout_gives_its_commit_and_whether_it_is_dirty(tmp_path):
    repo, code = tmp_path / "repo", tmp_path / "repo" / "pkg"
    code.mkdir(parents=True)
    (code / "mod.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "pkg/mod.py")
    _git(repo, "commit", "-q", "-m", "first")
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert provenance.git_state(code) == {"git_commit": head, "git_dirty": False}
    (code / "mod.py").write_text("x = 2\n")
    assert provenance.git_state(code) == {"git_commit": head, "git_dirty": True}
    # code installed in a folder the checkout does not track is not that checkout's code
    (repo / "venv").mkdir()
    (repo / "venv" / "other.py").write_text("")
    assert provenance.git_state(repo / "venv") == {"git_commit": None, "git_dirty": None}


def test_logging_is_set_up_once_with_timestamps_and_levels():
    logger = logs.setup("WARNING")
    logs.setup("INFO")
    handlers = [h for h in logger.handlers if isinstance(h, logs.StderrHandler)]
    assert len(handlers) == 1 and logger.level == logging.INFO
    record = logging.LogRecord("speculative.x", logging.INFO, __file__, 1, "hi", None, None)
    line = handlers[0].format(record)
    assert helpers.LOG_LINE.match(line) and line.endswith(" INFO speculative.x: hi"), line
    with pytest.raises(ValueError, match="log level must be one of"):
        logs.setup("LOUD")
