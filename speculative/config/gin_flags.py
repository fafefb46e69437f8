"""T5X-style command-line flags turned into gin (as T5X's `gin_utils`); used by the gin jobs.

    python -m speculative.infer --gin_file=configs/runs/infer.gin --gin_file=my_models.gin \
        --gin.TARGET_CHECKPOINT="'/ckpt'" --gin_bindings="speculative.InferConfig.batch_size = 4" \
        --gin_search_paths=/path/to/configs

- `--gin_file` and `--gin_bindings` are repeatable and applied in order (later ones win).
- `--gin.NAME=VALUE` is rewritten to `--gin_bindings=NAME = VALUE` (as T5X's `gin_utils.run`).
  VALUE is gin syntax: strings need quotes (`--gin.OUTPUT_DIR="'/tmp/out'"`).
- `--gin_search_paths` (repeatable, or comma-separated) are searched for gin files and `include`s;
  the current directory, this repository's root and the installed package (configs/ ships as
  package data, `speculative/configs`) are always searched, so `--gin_file=configs/runs/infer.gin`
  and `include 'configs/models/t5_1_1/xxl.gin'` work from anywhere, checkout or installed.
- `--help` lists the macros of the job's defaults file with their defaults (`macro_help`).
- Every macro still bound to `%gin.REQUIRED` after parsing is an error naming the macros.
- A problem the user can fix prints one line, `error: <role> <path>: <what is wrong>`, and exits
  with status 2; `--debug` prints the full traceback instead.
- The job logs to stderr with timestamps and levels (`speculative.outputs.logs`); `--log_level=WARNING`
  keeps only warnings and errors.

This module knows no job and registers no configurable: a job imports the modules whose
configurables its gin files bind (e.g. `speculative.jobs.config`) before parsing. No absl: plain
argparse, so the jobs also run where absl is not installed.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import gin

from speculative.errors import JobError
from speculative.outputs import logs

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
# Where `configs/...` resolves: a source checkout's root, or an installed package's directory.
CONFIG_ROOTS = (REPO_ROOT, PACKAGE_DIR)
_MACRO = re.compile(r"^([A-Z][A-Z0-9_]*)\s*=\s*(.*?)\s*(?:#\s*(.*))?$")
_LISTED = re.compile(r"^- ([A-Z][A-Z0-9_]*(?:, [A-Z][A-Z0-9_]*)*): (.*)$")
_REQUIRED_MACRO = re.compile(r"^([A-Za-z_][\w.]*)\s*=\s*%gin\.REQUIRED\s*$", re.MULTILINE)


def rewrite_gin_args(argv: Sequence[str]) -> list[str]:
    """Rewrites `--gin.NAME=VALUE` into `--gin_bindings=NAME = VALUE`; other args are unchanged."""
    out = []
    for arg in argv:
        if arg.startswith("--gin."):
            if "=" not in arg:
                raise JobError(f"gin flags must look like --gin.NAME=VALUE, got {arg!r}")
            name, value = arg[len("--gin.") :].split("=", 1)
            arg = f"--gin_bindings={name} = {value}"
        out.append(arg)
    return out


def find_config(name: str) -> pathlib.Path | None:
    """The file a `configs/...` name refers to: as given, or under a checkout or the package."""
    for root in (pathlib.Path("."), *CONFIG_ROOTS):
        if (root / name).is_file():
            return root / name
    return None


def _listed_notes(gin_text: str) -> dict[str, str]:
    """{NAME: text} of a header's `# - NAME, OTHER: text` items (continuation lines joined)."""
    notes, names, text = {}, [], []
    for line in [*gin_text.splitlines(), ""]:
        body = line.lstrip("#").strip() if line.startswith("#") else ""
        item = _LISTED.match(body)
        if names and (item or not body or not line.startswith("#   ")):
            notes.update(dict.fromkeys(names, " ".join(text)))
            names, text = [], []
        if item:
            names, text = [n.strip() for n in item[1].split(",")], [item[2]]
        elif names:
            text.append(body)
    return notes


def macros(gin_text: str) -> list[tuple[str, str, str]]:
    """(name, default, note) of every top-level `NAME = VALUE` line of a gin file; the note is
    the line's own comment, else the first sentence of the comment block just above it, else
    the header's `# - NAME: ...` item."""
    listed, found, block = _listed_notes(gin_text), [], []
    for line in gin_text.splitlines():
        if line.startswith("#"):
            block.append(line.lstrip("# ").rstrip())
            continue
        match = _MACRO.match(line)
        if match:
            name, value, comment = match.groups()
            note = comment or " ".join(block).split(". ")[0] or listed.get(name, "")
            found.append((name, value, note.strip()))
        block = []
    return found


def macro_help(defaults_file: str | None) -> str:
    """The `--help` epilog: the macros of a job's defaults gin file, with defaults and notes."""
    shorthand = "--gin.NAME=VALUE is shorthand for --gin_bindings='NAME = VALUE'."
    path = find_config(defaults_file) if defaults_file else None
    if path is None:
        return shorthand
    lines = [f"macros of {defaults_file} (set with --gin.NAME=VALUE; VALUE in gin syntax):"]
    for name, value, note in macros(path.read_text()):
        value = "(required)" if value == "%gin.REQUIRED" else value
        lines.append(f"  {name} = {value}" + (f"\n      {note}" if note else ""))
    return "\n".join(lines + ["", shorthand])


def build_parser(description: str, defaults_file: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=description,
        epilog=macro_help(defaults_file),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable)")
    parser.add_argument(
        "--gin_bindings", action="append", default=[], help="gin binding (repeatable)"
    )
    parser.add_argument(
        "--gin_search_paths",
        action="append",
        default=[],
        help="directories searched for gin files and includes (repeatable or comma-separated)",
    )
    parser.add_argument(
        "--print_config", action="store_true", help="print the parsed gin config and exit"
    )
    parser.add_argument(
        "--debug", action="store_true", help="print the full traceback of an error, not one line"
    )
    parser.add_argument(
        "--log_level", default="INFO", choices=logs.LEVELS, help="the least level logged (stderr)"
    )
    return parser


def parse_args(
    argv: Sequence[str], description: str, defaults_file: str | None = None
) -> argparse.Namespace:
    """Parses job flags after the `--gin.NAME=VALUE` rewriting; `--help` lists the macros of
    `defaults_file` (the job's configs/... defaults)."""
    args = build_parser(description, defaults_file).parse_args(rewrite_gin_args(argv))
    args.gin_search_paths = [p for item in args.gin_search_paths for p in item.split(",") if p]
    if not args.gin_file:
        raise JobError("give at least one --gin_file (e.g. --gin_file=configs/runs/infer.gin)")
    return args


def missing_required_macros() -> list[str]:
    """Names of the macros still bound to %gin.REQUIRED in the parsed config."""
    return _REQUIRED_MACRO.findall(gin.config_str())


def parse_gin(
    gin_files: Sequence[str], bindings: Sequence[str] = (), search_paths: Sequence[str] = ()
) -> None:
    """Clears gin, then parses files then bindings.

    Only configurables already registered can be bound: a job imports the modules that register
    what its configs use (e.g. `speculative.jobs.config`, `speculative.config.configurables`) before this.

    Raises:
      JobError: unknown configurable or parameter, unreadable file, syntax error, or a macro left
        at %gin.REQUIRED (all named in the message).
    """
    gin.clear_config()
    for path in ["."] + list(search_paths) + [str(root) for root in CONFIG_ROOTS]:
        gin.add_config_file_search_path(path)
    try:
        gin.parse_config_files_and_bindings(list(gin_files), list(bindings), finalize_config=False)
    except (ValueError, OSError, SyntaxError, TypeError) as e:
        raise JobError(f"gin config: {e}") from e
    missing = missing_required_macros()
    if missing:
        flags = " ".join(f"--gin.{name}=..." for name in missing)
        raise JobError(
            f"required gin macro(s) not set: {', '.join(missing)}. Bind them in a gin file or on "
            f"the command line, e.g. {flags}"
        )
    try:
        gin.finalize()
    except (ValueError, TypeError) as e:
        raise JobError(f"gin config: {e}") from e


def configure_and_run(
    argv: Sequence[str],
    description: str,
    make_config: Callable[[], Any],
    run: Callable[[Any], Any],
    defaults_file: str | None = None,
) -> Any:
    """The body of a job's main(): flags -> gin -> config object -> run(config).

    defaults_file: the job's defaults gin file (`configs/...`), whose macros `--help` lists.
    Returns None after --print_config; gin errors building the config become a JobError.
    """
    args = parse_args(argv, description, defaults_file)
    logs.setup(args.log_level)
    parse_gin(args.gin_file, args.gin_bindings, args.gin_search_paths)
    try:
        if args.print_config:
            print(gin.config_str())
            return None
        try:
            cfg = make_config()
        except (TypeError, ValueError, RuntimeError) as e:
            raise JobError(f"gin config: {e}") from e
        return run(cfg)
    finally:
        # The config was read into `cfg` once; a finalized (locked) gin would refuse the
        # configurables of any module imported later in this process (a notebook, or another job).
        gin.clear_config()


def run_job(main: Callable[[Sequence[str]], object], argv: Sequence[str] | None = None) -> int:
    """Runs main(argv); a JobError is printed as one line on stderr with exit status 2 (with
    `--debug` in argv, as its full traceback)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        main(argv)
    except JobError as e:
        if "--debug" in argv:
            traceback.print_exc()
        else:
            one_line = " ".join(str(e).split("\n"))  # a wrapped loader message stays one line
            print(f"error: {one_line}", file=sys.stderr)
        return 2
    return 0
