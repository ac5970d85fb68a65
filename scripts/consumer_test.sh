#!/usr/bin/env bash
# Installs an already-built ropekv tree into a temporary prefix, builds examples/consumer (an
# outside CMake project: find_package(ropekv CONFIG REQUIRED)) against it and runs it; also checks
# the pkg-config file. Usage: scripts/consumer_test.sh [BUILD_DIR] (default: build).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$here/build}" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
cmake -S "$here/examples/consumer" -B "$tmp/consumer" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/configure.log" || { cat "$tmp/configure.log"; exit 1; }
grep "ropekv " "$tmp/configure.log" || true
cmake --build "$tmp/consumer" -j2 > "$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
"$tmp/consumer/consumer"

if command -v pkg-config > /dev/null; then
  pc_dir="$(dirname "$(find "$tmp/prefix" -name ropekv.pc | head -1)")"
  PKG_CONFIG_PATH="$pc_dir" pkg-config --modversion ropekv
  PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags ropekv | grep -q -- "-I$tmp/prefix/[a-z./]*include/ropekv" \
    || { echo "ropekv.pc: expected -I<prefix>/include/ropekv in --cflags, got: $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags ropekv)"; exit 1; }
  # the same consumer, built with the .pc file's flags alone
  # shellcheck disable=SC2046
  c++ -std=c++17 -O1 "$here/examples/consumer/main.cpp" -o "$tmp/consumer_pc" \
      $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs ropekv)
  "$tmp/consumer_pc" > /dev/null
  echo "pkg-config build: ok"
fi
echo "consumer test: ok"
