"""The one exception type of the job layer (a leaf module: it imports nothing of the package)."""

from __future__ import annotations


class JobError(Exception):
    """A configuration or input problem the user can fix; jobs print it without a traceback."""
