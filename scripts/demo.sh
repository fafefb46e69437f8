#!/usr/bin/env bash
# Sets up .venv, fetches the default weights (once) and runs the main job: plain vs speculative
# decoding on real prompts, printing completions and alpha / tau / speedup.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m speculative.demo "$@"
