#!/usr/bin/env bash
# Sets up .venv with the dev extras and runs the test suite.
#   scripts/test.sh            default suite (no downloads), on 2 pytest-xdist workers: a test
#                              mostly compiles on one core, and each worker is its own process
#   scripts/test.sh --slow     real-weight checks only (downloads ~1.7 GB of GGUF weights once)
#   scripts/test.sh ARGS...    extra pytest arguments
# Compiles cold: JAX's persistent compilation cache is off unless JAX_COMPILATION_CACHE_DIR names a
# directory (tests/conftest.py says why), e.g. JAX_COMPILATION_CACHE_DIR=.venv/jax_test_cache.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh dev,seqio  # seqio: the offline seqio Task tests (tests/test_seqio_task.py, in their own process)
if [[ "${1:-}" == "--slow" ]]; then
  shift
  exec .venv/bin/python -m pytest -m slow "$@"
fi
# A worker that crashes is replaced and the test it was running runs once more (--reruns 1
# --only-rerun crashed: a crashed worker's report says "crashed"; any other failure is not rerun).
# jaxlib 0.10.2's XLA:CPU segfaulted now and then inside a compile or a compilation-cache write,
# in a different test each time, in about one full run in three. pytest-rerunfailures reruns a
# crashed test under --dist worksteal or load, not loadfile (whose scheduler could also wait
# forever for the work of a replaced worker: pytest-xdist issue 784); worksteal keeps a module's
# tests mostly on one worker (module fixtures built once), 11 min 16 s here against load's 12.
exec .venv/bin/python -m pytest -n 2 --dist worksteal --max-worker-restart=4 --reruns 1 \
  --only-rerun crashed "$@"
