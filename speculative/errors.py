"""The one exception type of the job layer and the checks that raise it for a file (a leaf module:
it imports nothing of the package, so loaders and drafts alike can use it).

The report tools (scripts/ende_report.py, `benchmark_report.read_benchmark`, the scripts that read
a job's summary.json or predictions.jsonl) read every result file through `read_result_json` /
`read_result_jsonl`, and refuse to replace an output with `check_new_outputs`: a missing, torn or
foreign file is one line naming it (`gin_flags.run_job` prints it and exits 2), not a traceback.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
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
    rest = message[len(prefix) :]
    # "DIR/model.safetensors: ..." names a file in DIR, not DIR: kept whole, never "/model..."
    if not prefix or not message.startswith(prefix) or rest[:1] not in ("", ":", " "):
        return message
    return rest.lstrip(": ") or message


# What a loader raises for a file it cannot read: a ValueError or an OSError by contract; the
# others are the contract broken by a malformed file (a config.json of the wrong shape, say).
LOADER_ERRORS = (ValueError, OSError)
MALFORMED_ERRORS = (KeyError, TypeError, AttributeError, IndexError, RuntimeError)


def loader_error(error: Exception, role: str | None, path: str | os.PathLike) -> JobError:
    """A loader's exception as a one-line JobError naming the role (if any) and the file."""
    if isinstance(error, LOADER_ERRORS):
        what = strip_path(str(error), path) or type(error).__name__
    else:
        what = f"cannot be read ({type(error).__name__}: {error})"
    return JobError(what, role=role, path=path)


def is_remote(path: str) -> bool:
    return "://" in path


LOCAL_SCHEMES = ("file://", "local://")


def output_location(path: Any) -> Any:
    """OUTPUT_DIR as the jobs use it: a URL naming local files (file://, local://) becomes its
    plain path, '~' expanded, so one directory is one storage layout and one lock whatever its
    spelling (docs/design.md §7); store URLs and non-strings are unchanged."""
    if not isinstance(path, str):
        return path
    for scheme in LOCAL_SCHEMES:
        if path.startswith(scheme):
            return os.path.expanduser(path[len(scheme) :] or "/")
    return path if is_remote(path) else os.path.expanduser(path)


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


def read_result_json(path: str | os.PathLike, required: Sequence[str] = ()) -> dict[str, Any]:
    """A result file's JSON object (summary.json, benchmark.json, ...), or a JobError naming the
    file: missing or unreadable, not UTF-8, empty, torn or otherwise not JSON, not an object, or
    without one of the `required` top-level keys."""
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise JobError(_json_problem(text, e), path=path) from e
    if not isinstance(data, dict):
        raise JobError(f"holds a JSON {type(data).__name__}, not an object", path=path)
    _check_keys(data, required, path, "")
    return data


def read_result_jsonl(
    path: str | os.PathLike, required: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """A result file's JSON lines (predictions.jsonl: one object per line, blank lines skipped),
    or a JobError naming the file and the line: torn (a run killed mid-write), not an object, or
    without one of the `required` keys."""
    rows = []
    lines = _read_text(path).splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            cut = " (the last line, cut short: a run killed while writing it?)"
            what = f"line {number} is not valid JSON: {e.msg} (column {e.colno})"
            raise JobError(what + (cut if number == len(lines) else ""), path=path) from e
        if not isinstance(row, dict):
            raise JobError(
                f"line {number} holds a JSON {type(row).__name__}, not an object", path=path
            )
        _check_keys(row, required, path, f"line {number} ")
        rows.append(row)
    return rows


def check_new_outputs(paths: Iterable[str | os.PathLike], overwrite: bool) -> None:
    """A JobError naming the first of `paths` that already exists, unless `overwrite`: no report
    tool replaces a result (a committed one, say) unless asked to."""
    for path in paths:
        if not overwrite and os.path.lexists(path):
            raise JobError(
                "already exists: pass --overwrite to replace it, or another --out", path=path
            )


def _read_text(path: str | os.PathLike) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise JobError("does not exist", path=path) from None
    except IsADirectoryError:
        raise JobError("is a directory, not a result file", path=path) from None
    except UnicodeDecodeError as e:
        raise JobError(f"is not UTF-8 text (byte {e.start}): not a result file", path=path) from e
    except OSError as e:
        raise JobError(f"cannot be read ({e.strerror or e})", path=path) from e


def _json_problem(text: str, error: json.JSONDecodeError) -> str:
    if not text.strip():
        return "is empty (the run that writes it was cut short?)"
    where = f"{error.msg} (line {error.lineno}, column {error.colno})"
    return f"is not valid JSON: {where} (torn: a run killed while writing it?)"


def _check_keys(data: dict, required: Sequence[str], path: object, where: str) -> None:
    missing = [key for key in required if key not in data]
    if missing:
        keys = ", ".join(repr(k) for k in missing)
        raise JobError(f"{where}has no {keys}: not the result file expected here", path=path)


def _type_name(kind: type, described: Mapping[type, str]) -> str:
    """A type's name, module-qualified where it would pass for one of `described` (fetch's
    registry ModelSpec is not speculative.ModelSpec)."""
    if kind not in described and kind.__name__ in {t.__name__ for t in described}:
        return f"{kind.__module__}.{kind.__qualname__}"
    return kind.__name__


def check_slot(
    value: Any, slot: str, noun: str, takes: Sequence[type], described: Mapping[type, str]
) -> None:
    """Raises a one-line JobError naming `slot` (e.g. 'speculative.InferConfig.target') unless
    value is one of `takes`: a spec bound where another kind belongs is refused here, before it
    fails deep in loading with an AttributeError. described: {type: what it is}, for the message:
    `<slot>: got a DraftSpec (<what>); the <noun> slot takes a ModelSpec (<what>)`."""
    if isinstance(value, tuple(takes)):
        return
    got = "None" if value is None else f"a {_type_name(type(value), described)}"
    if type(value) in described:
        got += f" ({described[type(value)]})"
    wanted = " or ".join(f"a {t.__name__} ({described[t]})" for t in takes)
    raise JobError(f"{slot}: got {got}; the {noun} slot takes {wanted}")
