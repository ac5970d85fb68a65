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
  run_with_progress "setup: configuring" "$build_dir.configure.log" \
    cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release ||
    { cat "$build_dir.configure.log"; exit 1; }
  rm -f "$build_dir.configure.log"
fi
# a line every few seconds while it builds (minutes the first time): the time and the last [k/n] step
run_with_progress "setup: building" "$build_dir.build.log" cmake --build "$build_dir" -j "$jobs" ||
  { tail -n 60 "$build_dir.build.log"; echo "setup: build failed (full log: $build_dir.build.log)" >&2; exit 1; }
rm -f "$build_dir.build.log"
