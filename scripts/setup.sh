#!/usr/bin/env bash
# Installs what ropekv needs from Debian 12 packages (only what is missing), then configures and
# builds into build/ (Release). Idempotent and quiet when everything is already there.
#   ROPEKV_BUILD_DIR   build folder (default: build)
#   ROPEKV_JOBS        parallel build jobs (default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

packages=(g++ make cmake git python3 python3-venv
          libeigen3-dev doctest-dev libcli11-dev nlohmann-json3-dev libfmt-dev)

install_missing setup "${packages[@]}"

build_dir="${ROPEKV_BUILD_DIR:-build}"
jobs="${ROPEKV_JOBS:-$(nproc)}"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release >"$build_dir.configure.log" 2>&1 ||
    { cat "$build_dir.configure.log"; exit 1; }
  rm -f "$build_dir.configure.log"
fi
cmake --build "$build_dir" -j "$jobs" >"$build_dir.build.log" 2>&1 ||
  { tail -n 60 "$build_dir.build.log"; echo "setup: build failed (full log: $build_dir.build.log)" >&2; exit 1; }
rm -f "$build_dir.build.log"
