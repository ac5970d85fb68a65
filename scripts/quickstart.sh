#!/usr/bin/env bash
# README command (1): install, build, and run the reference once on the deepseek-v3 preset.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec ./build/ropekv run --preset deepseek-v3 "$@"
