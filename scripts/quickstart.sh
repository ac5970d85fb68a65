#!/usr/bin/env bash
# README command (1): install, build (the CLI, and the Python package into build/venv), and run
# the reference once on the deepseek-v3 preset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/python_env.sh
exec ./build/ropekv run --preset deepseek-v3 "$@"
