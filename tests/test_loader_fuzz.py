"""Property-based fuzzing of the checkpoint loaders with byte-level mutations (hypothesis).

Small GGUF, safetensors (HF T5) and T5X checkpoints are written by the test writers, then truncated,
bit-flipped, or have a header field set to a huge value. Every outcome must be one of:
  - a clean load with parameters identical to the original's;
  - a ValueError or OSError whose message names the file (or its checkpoint directory);
never another exception type, a hang (an alarm per example) or a memory blow-up (the address space
is capped per example, so an oversized allocation fails as a MemoryError, which fails the test).

GGUF and safetensors keep raw tensor bytes with no checksum, so a flipped bit inside tensor data
cannot be detected by any reader: there the property is relaxed to "error, or the same parameter
tree and shapes with finite values". Their headers, and every byte of a T5X checkpoint (zarr chunks
are gzip-compressed, with a CRC; the T5X writer here stores no parameter inline in the msgpack),
are held to the strict property.

The default suite runs 80 GGUF, 80 safetensors and 20 T5X examples (about 15 s of fuzzing, plus
the process's first JAX start); set SPECULATIVE_FUZZ_EXAMPLES=N to run N per format with random
seeds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import random
import resource
import shutil
import signal
import tempfile

import jax
import numpy as np
import pytest
from flax import serialization, traverse_util

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from speculative.checkpoints import load_gguf, load_hf_t5, load_t5x  # noqa: E402
from speculative.models import t5  # noqa: E402
from tests import test_gguf_loader as gguf_tests  # noqa: E402
from tests import test_t5_checkpoints as t5_tests  # noqa: E402

# gguf-py adds corrupt uint64 offsets with numpy scalars and dequantises corrupt scales, which
# warns before the loader refuses the file.
pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

_LONG = int(os.environ.get("SPECULATIVE_FUZZ_EXAMPLES", "0"))


def fuzz(examples: int):
    """Hypothesis settings: `examples` per test in the default suite (deterministic), or
    SPECULATIVE_FUZZ_EXAMPLES with random seeds."""
    return settings(
        max_examples=_LONG or examples,
        deadline=None,  # the per-example alarm below bounds time instead
        derandomize=not _LONG,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


SECONDS_PER_EXAMPLE = 20
MEMORY_HEADROOM = 4 << 30  # bytes of address space an example may add
HUGE = (2**31 - 1, 2**32 - 1, 2**40, 2**63 - 1, 2**64 - 1)
GGUF_HP = dict(emb=32, layers=1, heads=2, kv_heads=1, mlp=32, context=64, rope_theta=1e4, eps=1e-5)
GGUF_VOCAB = 16


# ---- harness -------------------------------------------------------------------------------------


class Hang(Exception):
    """Raised by the alarm when one load runs past SECONDS_PER_EXAMPLE."""


def _virtual_size() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def bounded():
    """Fails a load that hangs or that allocates more than MEMORY_HEADROOM of address space."""

    def on_alarm(signum, frame):
        raise Hang(f"load still running after {SECONDS_PER_EXAMPLE} s")

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _virtual_size() + MEMORY_HEADROOM
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    previous = signal.signal(signal.SIGALRM, on_alarm)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    signal.alarm(SECONDS_PER_EXAMPLE)
    try:
        yield
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, previous)


def _flat(params) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(params, sep="/").items()}


def check_outcome(load, names: str, reference: dict, strict: bool) -> None:
    """The property: an identical load, or a ValueError/OSError naming the file."""
    try:
        with bounded():
            params = load()
    except (ValueError, OSError) as e:
        assert names in str(e), f"error does not name {names}: {type(e).__name__}: {e}"
        event(f"refused ({type(e).__name__})")
        return
    event("loaded")
    got = _flat(params)
    assert set(got) == set(reference), "a load with another parameter tree"
    for key, want in reference.items():
        assert got[key].shape == want.shape, key
        if strict:
            np.testing.assert_array_equal(got[key], want, err_msg=f"silent change in {key}")
        else:
            assert np.all(np.isfinite(got[key].astype(np.float32))), key


@dataclasses.dataclass(frozen=True)
class Mutation:
    kind: str  # "truncate", "flip" or "huge"
    at: int
    bit: int = 0
    value: int = 0
    width: int = 0

    def apply(self, data: bytes) -> bytes:
        if self.kind == "truncate":
            return data[: self.at]
        out = bytearray(data)
        if self.kind == "flip":
            out[self.at] ^= 1 << self.bit
        else:
            out[self.at : self.at + self.width] = (self.value % 256**self.width).to_bytes(
                self.width, "little"
            )
        return bytes(out)


def _offset(lo: int, hi: int) -> st.SearchStrategy:
    """A byte offset in [lo, hi), uniform rather than hypothesis's bias to small integers (which
    would keep every flip near the start); hypothesis draws the seed, so it still replays."""
    seeds = st.integers(0, 2**32 - 1)
    return seeds.map(lambda seed: random.Random(seed).randrange(lo, max(hi, lo + 1)))


def mutations(size: int, header_end: int, fields: list[tuple[int, int]]) -> st.SearchStrategy:
    """Bit flips (3 in 5; half of them in the header), truncations and huge integer fields."""
    at = st.one_of(_offset(0, header_end), _offset(0, size))
    by_kind = {
        "flip": st.builds(Mutation, st.just("flip"), at, st.integers(0, 7)),
        "truncate": st.builds(Mutation, st.just("truncate"), _offset(0, size)),
        "huge": st.builds(
            lambda field, value: Mutation("huge", field[0], 0, value, field[1]),
            st.sampled_from(fields or [(0, 0)]),
            st.sampled_from(HUGE),
        ),
    }
    kinds = ["flip", "flip", "flip", "truncate"] + (["huge"] if fields else [])
    return st.sampled_from(kinds).flatmap(by_kind.get)


# ---- GGUF ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_originals(tmp_path_factory):
    """[(bytes, header end, integer fields (offset, width), reference params)] of a tiny llama
    file with F32 weights and one with Q8_0 weights (quantised blocks carry f16 scales)."""
    import gguf

    state = gguf_tests.random_hf_state(np.random.default_rng(0), GGUF_HP, GGUF_VOCAB, tied=True)
    directory = tmp_path_factory.mktemp("gguf")
    originals = []
    for qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.Q8_0):
        path = gguf_tests.write(
            directory, state, qtype=qtype, name=f"{qtype.name}.gguf", hp=GGUF_HP
        )
        reader = gguf.GGUFReader(str(path))
        fields = []
        for field in [*reader.fields.values(), *(t.field for t in reader.tensors)]:
            offset = field.offset
            for part in field.parts:
                if part.dtype.kind in "iu" and part.dtype.itemsize in (4, 8) and part.size == 1:
                    fields.append((offset, part.dtype.itemsize))
                offset += part.nbytes
        reference = _flat(load_gguf(path)[1])
        originals.append(
            (path.read_bytes(), int(reader.data_offset), sorted(set(fields)), reference)
        )
    return originals


@given(data=st.data())
@fuzz(80)
def test_fuzz_gguf(gguf_originals, data):
    original, header_end, fields, reference = data.draw(st.sampled_from(gguf_originals))
    mutation = data.draw(mutations(len(original), header_end, fields))
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "m.gguf"
        path.write_bytes(mutation.apply(original))
        strict = mutation.kind != "flip" or mutation.at < header_end
        check_outcome(lambda: load_gguf(path)[1], str(path), reference, strict)


# ---- safetensors (HF T5) -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_original(tmp_path_factory):
    """(directory, safetensors bytes, header end, reference params) of a tiny HF T5 checkpoint."""
    directory = tmp_path_factory.mktemp("hf")
    params = t5.T5(t5_tests.CONFIG).init_params(jax.random.PRNGKey(0))
    t5_tests.write_hf(directory, params)
    data = (directory / "model.safetensors").read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    return directory, data, header_end, _flat(load_hf_t5(str(directory))[1])


def header_field_edits(header: dict) -> st.SearchStrategy:
    """(tensor name, "shape" or "data_offsets", index, huge value) edits of a safetensors header."""
    names = sorted(k for k in header if k != "__metadata__")
    return st.tuples(
        st.sampled_from(names),
        st.sampled_from(["shape", "data_offsets"]),
        st.integers(0, 1),
        st.sampled_from(HUGE),
    )


@given(data=st.data())
@fuzz(80)
def test_fuzz_safetensors(hf_original, data):
    directory, original, header_end, reference = hf_original
    if data.draw(st.integers(0, 3), label="edit a header number") == 0:
        header = json.loads(original[8:header_end])
        name, key, index, value = data.draw(header_field_edits(header))
        field = header[name][key]
        field[min(index, len(field) - 1)] = value
        text = json.dumps(header).encode()
        mutated, strict = len(text).to_bytes(8, "little") + text + original[header_end:], True
    else:
        mutation = data.draw(mutations(len(original), header_end, [(0, 8)]))
        mutated = mutation.apply(original)
        strict = mutation.kind != "flip" or mutation.at < header_end
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(directory / "config.json", tmp)
        pathlib.Path(tmp, "model.safetensors").write_bytes(mutated)
        check_outcome(lambda: load_hf_t5(tmp)[1], tmp, reference, strict)


# ---- T5X -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def t5x_original(tmp_path_factory):
    """(directory, {relative file: bytes}, reference params) of a tiny T5X checkpoint, every
    parameter in TensorStore (inline msgpack arrays carry no checksum)."""
    directory = tmp_path_factory.mktemp("t5x")
    params = t5.T5(t5_tests.CONFIG).init_params(jax.random.PRNGKey(0))
    t5_tests.write_t5x_checkpoint(directory, params, inline=())
    files = {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }
    return directory, files, _flat(load_t5x(str(directory), t5_tests.CONFIG))


def _huge_spec_shape(raw: bytes, value: int, which: int) -> bytes:
    """The msgpack with one parameter's declared shape set to a huge value."""
    state = serialization.msgpack_restore(raw)
    flat = traverse_util.flatten_dict(state["optimizer"]["target"], sep="/")
    specs = sorted(k for k in flat if k.endswith("/metadata/shape"))
    key = specs[which % len(specs)]
    flat[key] = [value, *flat[key][1:]]
    state["optimizer"]["target"] = traverse_util.unflatten_dict(flat, sep="/")
    return serialization.msgpack_serialize(state)


def _huge_zarray(raw: bytes, value: int, key: str) -> bytes:
    metadata = json.loads(raw)
    metadata[key][0] = value
    return json.dumps(metadata).encode()


@given(data=st.data())
@fuzz(20)
def test_fuzz_t5x(t5x_original, data):
    directory, files, reference = t5x_original
    # Half the examples hit the msgpack or a .zarray (the structure), half any file.
    structural = sorted(f for f in files if f == "checkpoint" or f.endswith(".zarray"))
    name = data.draw(st.sampled_from(structural) | st.sampled_from(sorted(files)), label="file")
    raw = files[name]
    value = data.draw(st.sampled_from(HUGE), label="huge")
    if name != "checkpoint" and name.endswith(".zarray") and data.draw(st.booleans()):
        mutated = _huge_zarray(raw, value, data.draw(st.sampled_from(["shape", "chunks"])))
    elif name == "checkpoint" and data.draw(st.booleans()):
        mutated = _huge_spec_shape(raw, value, data.draw(st.integers(0, 100)))
    else:
        mutated = data.draw(mutations(len(raw), len(raw), [])).apply(raw)
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp) / "checkpoint_1"
        shutil.copytree(directory, copy)
        (copy / name).write_bytes(mutated)
        check_outcome(lambda: load_t5x(str(copy), t5_tests.CONFIG), str(copy), reference, True)
