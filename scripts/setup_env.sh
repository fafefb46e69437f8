#!/usr/bin/env bash
# Creates (or reuses) .venv and installs this package. Usage: scripts/setup_env.sh [extras]
#   scripts/setup_env.sh          runtime dependencies only
#   scripts/setup_env.sh dev      + pytest, ruff and the torch/transformers test oracles
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python3 -m venv .venv 2>/dev/null || python3 -m venv --without-pip .venv
py=.venv/bin/python
"$py" -m pip --version >/dev/null 2>&1 || "$py" -m ensurepip --upgrade >/dev/null
say() { echo "setup_env: $*" >&2; }
say "installing speculative${extras:+[$extras]} into .venv (runtime: jax, flax, optax, gin-config," \
  "tensorstore, tokenizers, sentencepiece, gguf, matplotlib; ~0.9 GB; quiet when already there)"
if [[ ",$extras," == *,dev,* ]]; then
  say "dev: pytest, ruff and the test oracles torch (CPU build) and transformers (~1.5 GB more)"
fi
if [[ ",$extras," == *,seqio,* ]]; then
  say "seqio: seqio and TensorFlow, which it needs (~1.9 GB more)"
fi
if [[ -n "$extras" ]]; then
  if [[ ",$extras," == *,dev,* || ",$extras," == *,compare,* ]]; then
    # torch is a test oracle only. Pin the CPU build explicitly: a bare range would pull a
    # multi-GB CUDA build on a fresh machine.
    "$py" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
  fi
  "$py" -m pip install --quiet --disable-pip-version-check -e ".[$extras]"
else
  "$py" -m pip install --quiet --disable-pip-version-check -e .
fi
