#!/usr/bin/env bash
# Installs what ropekv needs from Debian 12 packages (only what is missing), then configures and
# builds into build/ (Release). Idempotent and quiet when everything is already there.
#   ROPEKV_BUILD_DIR   build folder (default: build)
#   ROPEKV_JOBS        parallel build jobs (default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ make cmake git python3 python3-venv
          libeigen3-dev doctest-dev libcli11-dev nlohmann-json3-dev libfmt-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then echo "setup: run as root (apt-get install needed)" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  local_log=$(mktemp)
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$local_log" 2>&1 ||
    { cat "$local_log"; rm -f "$local_log"; echo "apt-get failed" >&2; exit 1; }
  rm -f "$local_log"
fi

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
