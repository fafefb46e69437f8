"""Fixtures shared by the test modules (plain functions live in tests/helpers.py).

Models, params and batches are immutable, so they are built once per process (session scope) and
shared across modules: a jitted loop called with the same static arguments (the same model config,
DecodeConfig, shapes) is then a hit in JAX's in-process compilation cache.

- the greedy setup (`helpers.GREEDY_VOCAB` ids, decodes of `helpers.GREEDY_MAX_LEN` tokens):
  `target`, `draft`, `batch`, `greedy_free` (the target's free-running greedy decode) and
  `greedy_reference` (an EOS some rows emit mid-sequence, the plain greedy decode stopping at it,
  bigram tables fitted on the target's own outputs);
- the sampled setup (`helpers.SV` ids, `helpers.SEQ_LEN` tokens after `helpers.PROMPT`):
  `small_pair` (a target and an unrelated draft) and `small_target_probs` (the target's exact
  sequence probabilities under a SamplingConfig, computed once per config).
"""

from __future__ import annotations

import os
import pathlib
import sys

# The suite compiles hundreds of tiny programs whose run time is negligible next to their compile
# time: XLA:CPU's lowest backend optimisation level compiles them about a quarter faster, and its
# older elemental emitters for fusions (instead of the MLIR fusion emitters) halve what remains of
# a decode loop's backend compile (2.8 -> 1.5 s for the tiny pair's two loops; the full suite
# 819 -> 742 s on 2 cores). Set before jax makes its backend (subprocesses the tests start inherit it); tests check behaviour, never
# speed. XLA_FLAGS that already choose an optimisation level are left alone.
_FAST_COMPILE = (
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    " --xla_cpu_use_fusion_emitters=false"
)
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_COMPILE}".strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from speculative import decoding  # noqa: E402
from speculative.drafts import ngram  # noqa: E402
from tests import helpers  # noqa: E402

# JAX's persistent compilation cache is off in the test processes unless JAX_COMPILATION_CACHE_DIR
# names one (e.g. `JAX_COMPILATION_CACHE_DIR=.venv/jax_test_cache scripts/test.sh` for faster
# reruns; one directory per xdist worker, PYTHONPATH-started subprocesses inherit it). On by
# default it wrote every compiled program, and jaxlib 0.10.2 segfaulted inside that write
# (`compilation_cache.put_executable_and_time`) in a full local run, killing a worker midway
# through an unrelated test (CI's last red run lost a worker the same way; its stack was cut);
# a clean clone compiles cold anyway. Jobs that set their own
# cache (COMPILATION_CACHE_DIR) restore this setting afterwards (job_spmd.compilation_cache).
_CACHE = os.environ.get("JAX_COMPILATION_CACHE_DIR", "")
if _CACHE:
    _CACHE = str(pathlib.Path(_CACHE) / os.environ.get("PYTEST_XDIST_WORKER", "main"))
    jax.config.update("jax_compilation_cache_dir", _CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@pytest.fixture(autouse=True)
def _no_tensorflow_in_the_worker():
    """TensorFlow and JAX in one process can crash it: a test that imports TensorFlow (seqio does)
    belongs in tests/test_seqio_task.py, which runs in its own interpreter."""
    yield
    if os.environ.get(helpers.TENSORFLOW_PROCESS) != "1":
        assert "tensorflow" not in sys.modules, "this test imported TensorFlow into a JAX worker"


@pytest.fixture(scope="session")
def target():
    """(model, params): 2 layers, GQA, random weights."""
    return helpers.tiny_decoder(helpers.GREEDY_VOCAB, emb=64, layers=2, heads=4, kv_heads=2, seed=0)


@pytest.fixture(scope="session")
def draft():
    """(model, params): an unrelated smaller model over the same ids."""
    return helpers.tiny_decoder(helpers.GREEDY_VOCAB, emb=32, layers=1, heads=2, kv_heads=1, seed=1)


@pytest.fixture(scope="session")
def batch():
    """9 right-padded prompts of lengths 1..7 (row 0 full, row 1 one token)."""
    return helpers.ragged_prompts(0, batch=9, width=7, vocab=helpers.GREEDY_VOCAB)


@pytest.fixture(scope="session")
def greedy_free(target, batch):
    """The target's free-running greedy decode of `batch` (its EOS id is never emitted)."""
    vocab, max_len = helpers.GREEDY_VOCAB, helpers.GREEDY_MAX_LEN
    return decoding.autoregressive_decode(*target, batch, max_decode_len=max_len, eos_id=vocab)


@pytest.fixture(scope="session")
def greedy_reference(target, batch, greedy_free):
    """(eos_id, reference DecodeOutput, bigram tables): an EOS id some rows emit mid-sequence (row
    0's 7th free-running token), the plain greedy decode stopping at it, and bigram tables fitted
    on the target's free-running outputs (so that n-gram drafts are right some of the time)."""
    vocab, max_len = helpers.GREEDY_VOCAB, helpers.GREEDY_MAX_LEN
    eos_id = int(greedy_free.tokens[0, 6])
    ref = decoding.autoregressive_decode(*target, batch, max_decode_len=max_len, eos_id=eos_id)
    assert np.asarray(ref.lengths).min() < max_len, "want a row that stops at the EOS"
    rows = helpers.rows_as_sequences(greedy_free.tokens, greedy_free.lengths)
    return eos_id, ref, ngram.fit(rows, vocab, top_k=4)


@pytest.fixture(scope="session")
def small_pair():
    """((target, params), (draft, params)) over `helpers.SV` ids, for the sampled checks."""
    return helpers.small_target(), helpers.small_draft()


@pytest.fixture(scope="session")
def small_target_probs(small_pair):
    """cfg -> the exact sequence probabilities of the small target after `helpers.PROMPT`."""
    (model, params), _ = small_pair
    cache: dict = {}

    def probs(cfg):
        if cfg not in cache:
            cache[cfg] = helpers.exact_sequence_probs(
                model, params, helpers.PROMPT, helpers.SEQ_LEN, helpers.SV, helpers.EOS, cfg
            )
        return cache[cfg]

    return probs


def pytest_unconfigure(config):
    """JAX runs a garbage-collection callback that calls into its extension module; at interpreter
    shutdown that module may already be torn down, and a green run ended with an ignored-exception
    traceback from `_xla_gc_callback`. Collect now, while JAX is whole, then take the callback off."""
    import gc

    gc.collect()
    gc.callbacks[:] = [c for c in gc.callbacks if getattr(c, "__name__", "") != "_xla_gc_callback"]


# The order the two xdist workers take the suite in (worksteal hands each worker half the list,
# in order, and a worker that runs dry steals the tail of the other's half). The tests that run
# a whole interpreter of their own (a minute each) go first, so no worker ends on one while the
# other idles; the mutation checks go last, because they clear JAX's caches (a mutant must not
# reuse programs traced with the real rule) and every test after them in that worker would
# compile again what it had compiled already.
FIRST = ("tests/test_spmd.py", "tests/test_job_spmd.py", "tests/test_seqio_process.py")
LAST = ("tests/test_mutations.py",)
# A renamed module would silently fall back to the default order (slower, never wrong): refuse.
_ORDERED_MISSING = [p for p in FIRST + LAST if not (helpers.ROOT / p).is_file()]
if _ORDERED_MISSING:
    raise pytest.UsageError(f"tests/conftest.py FIRST / LAST name no module: {_ORDERED_MISSING}")


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> tuple[int, int]:
        path = item.nodeid.split("::")[0]
        if path in FIRST:
            return 0, FIRST.index(path)
        return (2 if path in LAST else 1), 0

    items.sort(key=rank)  # stable: each module keeps its order, its fixtures built once
