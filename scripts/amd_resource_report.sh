#!/usr/bin/env bash
# Registers, spills, scratch and occupancy of the GPU kernels on AMD, without AMD hardware: the
# compiler's per-kernel resource-usage remarks (the values it writes into each kernel's code
# object metadata), tabulated by scripts/amd_resource_report.py:
#   gfx90a  Debian's hipcc (clang-15): every kernel of backends/hip/hip_backend.hip (device side
#           only, as the amd build compiles it)
#   gfx942  clang-19 with the gfx942 shim: the kernels of backends/hip/kernel_check.hip (the
#           general body, fast_v4 generic and one specialised instantiation; docs/gpu.md)
# Writes OUT/gfx90a.md and OUT/gfx942.md (and the raw remarks, *.log). Not part of CI (the
# gfx90a compile of every instantiation takes minutes); docs/gpu.md quotes its tables.
# Usage: scripts/amd_resource_report.sh [out-dir]   (default: <repo>/build-amdreport)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$repo/build-amdreport}"
mkdir -p "$out"
command -v hipcc >/dev/null || { echo "hipcc not found (apt-get install hipcc rocm-device-libs)" >&2; exit 1; }
command -v clang++-19 >/dev/null || { echo "clang++-19 not found (apt-get install clang-19)" >&2; exit 1; }
remarks=(-Rpass-analysis=kernel-resource-usage)
hipcc -x hip -std=c++17 -O3 -ffp-contract=off --offload-arch=gfx90a --cuda-device-only -c -I"$repo" \
  "${remarks[@]}" "$repo/backends/hip/hip_backend.hip" -o "$out/hip_backend_gfx90a.o" 2> "$out/gfx90a.log"
clang++-19 -x hip -std=c++17 -O3 -ffp-contract=off --offload-arch=gfx942 -nogpulib --cuda-device-only -S \
  -include "$repo/backends/hip/gfx942_shim.h" -I"$repo" "${remarks[@]}" \
  "$repo/backends/hip/kernel_check.hip" -o "$out/kernel_check_gfx942.s" 2> "$out/gfx942.log"
python3 "$repo/scripts/amd_resource_report.py" "$out/gfx90a.log" > "$out/gfx90a.md"
python3 "$repo/scripts/amd_resource_report.py" "$out/gfx942.log" > "$out/gfx942.md"
echo "gfx90a: $(($(wc -l < "$out/gfx90a.md") - 2)) kernels -> $out/gfx90a.md"
echo "gfx942: $(($(wc -l < "$out/gfx942.md") - 2)) kernels -> $out/gfx942.md"
