"""The one exception type of the job layer and the checks that raise it for a file (a leaf module:
it imports nothing of the package, so loaders and drafts alike can use it)."""

from __future__ import annotations

import os
from typing import Any

import gin

# Roles a user-fixable error names first (`error: <role> <path>: <what is wrong>`).
ROLES = ("target", "draft", "vocabulary", "draft vocabulary", "input")


class JobError(Exception):
    """A configuration or input problem the user can fix; jobs print it without a traceback.

    With a role ('target', 'draft', 'vocabulary', 'input') the message reads
    `<role> <path>: <what>`, so that the one line a job prints says which file is at fault.
    """

    def __init__(self, what: str, *, role: str | None = None, path: object = None):
        self.role, self.path, self.what = role, path, what
        named = " ".join(str(x) for x in (role, path) if x is not None and x != "")
        super().__init__(f"{named}: {what}" if named else what)


def strip_path(message: str, path: object) -> str:
    """message without a leading "<path>: " or "<path> " (loaders name their file; the job names
    it first, so it is not said twice)."""
    prefix = str(path)
    if not prefix or not message.startswith(prefix):
        return message
    return message[len(prefix) :].lstrip(": ") or message


# What a loader raises for a file it cannot read: a ValueError or an OSError by contract; the
# others are the contract broken by a malformed file (a config.json of the wrong shape, say).
LOADER_ERRORS = (ValueError, OSError)
MALFORMED_ERRORS = (KeyError, TypeError, AttributeError, IndexError, RuntimeError)


def loader_error(error: Exception, role: str, path: str) -> JobError:
    """A loader's exception as a one-line JobError naming the role and the file."""
    if isinstance(error, LOADER_ERRORS):
        what = strip_path(str(error), path) or type(error).__name__
    else:
        what = f"cannot be read ({type(error).__name__}: {error})"
    return JobError(what, role=role, path=path)


def is_remote(path: str) -> bool:
    return "://" in path


def expand(path: Any) -> Any:
    """A local path with `~` expanded (configs name tables under ~/.cache); others unchanged."""
    return os.path.expanduser(path) if isinstance(path, str) else path


def check_path(role: str, what: str, path: Any) -> str:
    """path as a string, or a JobError when none is bound or a local one does not exist."""
    if path is None or path is gin.REQUIRED or path == "":
        raise JobError(f"{what} needs a checkpoint path; none is bound", role=role)
    path = os.fspath(path)
    if not is_remote(path) and not os.path.exists(path):
        raise JobError("path does not exist", role=role, path=path)
    return path
