"""What produced a result file: the code's git commit, whether its checkout was dirty, the package
version and the job's operative gin config. Every job that writes a result file (infer's
summary.json, benchmark.json, the trainers' summary.json, demo.json) records `record(...)` under
"provenance"; scripts/ende_report.py records `git_state()`.

The commit is the one of the checkout holding this package's own files (`git rev-parse HEAD`),
"dirty" whether `git status --porcelain` lists anything there (edits or untracked files). Outside a
git checkout, without git, or when git refuses the directory, both are null: recording never
fails a job.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
from typing import Any

from speculative.version import __version__

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent


def _git(path: pathlib.Path, *args: str) -> str | None:
    """git's stdout in `path`, or None when git is missing, fails or hangs."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # status must not take the index lock
    try:
        done = subprocess.run(
            ["git", "-C", str(path), *args],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
            env=env,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(path: str | os.PathLike = PACKAGE_DIR) -> dict[str, Any]:
    """{"git_commit": HEAD's hash or None, "git_dirty": bool or None} of the checkout that tracks
    the files under `path` (a package installed inside some other repository's untracked
    directory is not that repository's code: null)."""
    path = pathlib.Path(path)
    unknown = {"git_commit": None, "git_dirty": None}
    if not path.is_dir() or _git(path, "ls-files", "--error-unmatch", "--", ".") is None:
        return unknown
    commit = _git(path, "rev-parse", "HEAD")
    if commit is None:
        return unknown
    status = _git(path, "status", "--porcelain")
    return {"git_commit": commit.strip(), "git_dirty": None if status is None else bool(status)}


def record(gin_config: str | None, path: str | os.PathLike = PACKAGE_DIR) -> dict[str, Any]:
    """A result file's "provenance": git_commit, git_dirty, version (`speculative.__version__`, what
    identifies the code outside a checkout) and gin_config (the operative gin config text; None for
    a job without gin)."""
    return {**git_state(path), "version": __version__, "gin_config": gin_config}


_CPU_FLAGS = ("amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_vnni", "avx512f", "avx2")


def environment() -> dict[str, Any]:
    """Where a result was measured: the time (UTC), the command line, jax / jaxlib versions, the
    devices, the CPU model and its matrix-unit flags (Linux's /proc/cpuinfo; null elsewhere)."""
    import datetime
    import platform
    import sys

    import jax
    import jaxlib

    cpu, flags = None, []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and cpu is None:
                    cpu = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = [x for x in _CPU_FLAGS if x in value.split()]
    except OSError:
        pass
    return {
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": list(sys.argv),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "devices": sorted({d.device_kind for d in jax.devices()}),
        "cpu": cpu,
        "cpu_flags": flags,
        "cores": os.cpu_count(),
    }
