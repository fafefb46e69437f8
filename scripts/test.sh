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
# --dist loadfile: a module's tests share one worker (module-scoped fixtures are built once).
# --max-worker-restart=0: a crashed worker fails the run at once; pytest-xdist 3.8's loadfile
# scheduler can wait forever for the work of a worker it replaced (pytest-xdist issue 784).
exec .venv/bin/python -m pytest -n 2 --dist loadfile --max-worker-restart=0 "$@"
