"""The one exception type of the job layer (a leaf module: it imports nothing of the package)."""

from __future__ import annotations

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
