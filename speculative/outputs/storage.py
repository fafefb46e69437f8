"""OUTPUT_DIR as a local directory or a directory on an object store (gs://, s3://, ... via fsspec).

Every whole file a job writes (job.json, plan.json, summary.json, config.gin, benchmark.json, the
plots, the infer job's chunks on a store) goes through `OutputDir.write_bytes` / `write_text`:
locally a fsynced temporary file renamed into place, on a store one whole-object put (an object
store shows an object whole or not at all). Nothing here appends: a store has no append.

A store's fsspec implementation (gcsfs for gs://, s3fs for s3://, adlfs for az://, ...) is an
optional install; a missing one is a one-line JobError naming the package to pip install.
"""

from __future__ import annotations

import os
import pathlib
import uuid
from typing import Any

from speculative.errors import JobError, is_remote


def _package_hint(protocol: str) -> str:
    """What to install for a protocol fsspec knows but cannot import ("pip install gcsfs")."""
    from fsspec.registry import known_implementations

    known = known_implementations.get(protocol, {})
    module = str(known.get("class", "")).split(".")[0]
    if module and module != "fsspec":
        return f"pip install {module}"
    return known.get("err") or "install its fsspec implementation"


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) for a URL, or a one-line JobError when its protocol is
    unknown or its implementation is not installed."""
    import fsspec

    protocol = url.split("://", 1)[0]
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError:
        raise JobError(
            f"output directory {url!r}: the {protocol}:// filesystem is not installed "
            f"({_package_hint(protocol)})"
        ) from None
    except ValueError as e:
        raise JobError(f"output directory {url!r}: {e} (no fsspec filesystem for it)") from None


def write_local_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Writes `data` to a local path through a fsynced temporary file renamed into place (the
    directory fsynced too): a kill leaves the old file or the new one, never a torn one."""
    path = pathlib.Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_local(path: str | os.PathLike, data: bytes) -> bool:
    """Creates a local file holding `data` unless the path exists (False then). The data goes to a
    temporary file first, hard-linked into place: no reader ever sees the file empty or half
    written. On a filesystem without hard links: an exclusive create, then the write."""
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.new"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # no hard links here (some FUSE and SMB mounts)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True
    finally:
        os.remove(tmp)


class OutputDir:
    """A job's output directory, local or on a store; files are named relative to it ("a/b.json").

    Constructing one touches nothing; `prepare` creates it and proves it writable.
    """

    def __init__(self, url: str | os.PathLike):
        self.url = os.fspath(url)
        self.remote = is_remote(self.url)
        if not self.remote:
            self.url = os.path.expanduser(self.url)  # '~/runs/x' as a shell would read it
        if self.remote:
            self.fs, root = filesystem(self.url)
            self.root = root.rstrip("/")
        else:
            self.fs, self.root = None, self.url

    def __str__(self) -> str:
        return self.url

    def where(self, name: str) -> str:
        """The file's full name, for messages (a URL on a store)."""
        return f"{self.url.rstrip('/')}/{name}" if self.remote else os.path.join(self.url, name)

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}" if self.remote else os.path.join(self.root, name)

    def prepare(self) -> OutputDir:
        """Creates the directory and writes and deletes a probe file, else raises JobError."""
        probe = f".write_probe.{os.getpid()}"
        try:
            if self.remote:
                self.fs.makedirs(self.root, exist_ok=True)
            else:
                pathlib.Path(self.root).mkdir(parents=True, exist_ok=True)
            self.write_bytes(probe, b"ok")
            self.delete(probe)
        except Exception as e:  # noqa: BLE001  any backend's failure (OSError, auth, HTTP) is one
            raise JobError(f"output directory {self.url!r} is not writable: {e}") from e
        return self

    def makedirs(self, sub: str) -> None:
        """Creates subdirectory `sub` (nothing on a store without directories; needed on the
        ones with real directories: local files, HDFS, SFTP)."""
        if self.remote:
            self.fs.makedirs(self._path(sub), exist_ok=True)
        else:
            os.makedirs(self._path(sub), exist_ok=True)

    def exists(self, name: str) -> bool:
        return self.fs.exists(self._path(name)) if self.remote else os.path.exists(self._path(name))

    def read_bytes(self, name: str) -> bytes:
        if self.remote:
            return self.fs.cat_file(self._path(name))
        return pathlib.Path(self._path(name)).read_bytes()

    def read_text(self, name: str) -> str:
        return self.read_bytes(name).decode("utf-8")

    def write_bytes(self, name: str, data: bytes) -> None:
        """The whole file at once: temp file + rename locally, one put on a store."""
        if self.remote:
            self.fs.pipe_file(self._path(name), data)
        else:
            write_local_atomic(self._path(name), data)

    def write_text(self, name: str, text: str) -> None:
        self.write_bytes(name, text.encode("utf-8"))

    def create(self, name: str, data: bytes) -> bool:
        """Writes the file only if it does not exist; False when it does. Locally atomic, content
        included (`create_local`); on a store atomic where it has conditional writes (fsspec's
        mode='create': GCS, S3), elsewhere fsspec checks then writes, so two racing writers may
        both see True (callers read back)."""
        if not self.remote:
            return create_local(self._path(name), data)
        path = self._path(name)
        try:
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        except TypeError:  # an implementation older than fsspec's mode="create": check, write
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, data)
        return True

    def mtime(self, name: str) -> float | None:
        """When the file was last written (seconds since the epoch); None where the store does not
        say. FileNotFoundError when it is gone."""
        if not self.remote:
            return os.path.getmtime(self._path(name))
        try:
            return self.fs.modified(self._path(name)).timestamp()
        except (NotImplementedError, AttributeError, TypeError, ValueError):
            return None

    def local_path(self) -> str | None:
        """The directory's one local name, whatever the spelling (a path, '~', 'file://', any
        fsspec filesystem over local files): absolute, symlinks resolved. None on a store."""
        if self.remote:
            from fsspec.implementations.local import LocalFileSystem

            if not isinstance(self.fs, LocalFileSystem):
                return None
        return os.path.realpath(self.root or "/")

    def delete(self, name: str) -> None:
        """Removes the file; nothing when it is already gone."""
        try:
            if self.remote:
                self.fs.rm_file(self._path(name))
            else:
                os.remove(self._path(name))
        except FileNotFoundError:
            pass

    def listdir(self, sub: str) -> list[str]:
        """The names of the files in subdirectory `sub` ([] when it does not exist)."""
        if not self.remote:
            folder = pathlib.Path(self._path(sub))
            return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        try:
            entries = self.fs.ls(self._path(sub), detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return sorted(str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries)
