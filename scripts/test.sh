#!/usr/bin/env bash
# Sets up .venv with the dev extras and runs the test suite.
#   scripts/test.sh            default suite (no downloads, ~10 min on 2 cores)
#   scripts/test.sh --slow     real-weight checks only (downloads ~1.7 GB of GGUF weights once)
#   scripts/test.sh ARGS...    extra pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh dev,seqio  # seqio: the offline seqio Task test (tests/test_seqio_task.py)
if [[ "${1:-}" == "--slow" ]]; then
  shift
  exec .venv/bin/python -m pytest -m slow "$@"
fi
exec .venv/bin/python -m pytest "$@"
