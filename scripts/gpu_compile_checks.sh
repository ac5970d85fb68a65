#!/usr/bin/env bash
# Compile checks of the GPU backend, each in its own build folder; exits non-zero on
# the first failure. No GPU needed.
#   1. nvidia: nvcc, sm_90a only (CI time), targets ropekv_hip and plugin_gpu (examples/plugin_gpu)
#   2. amd:    Debian's hipcc (clang-15), gfx90a, target ropekv_hip
#   3. gfx942: clang-19 device-only compile to ISA with the shim (backends/hip/gfx942_shim.h)
# Usage: scripts/gpu_compile_checks.sh [build-root]   (default: <repo>/build-gpucheck)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
root="${1:-$repo/build-gpucheck}"
jobs="${ROPEKV_JOBS:-2}"
common=(-DCMAKE_BUILD_TYPE=Release -DROPEKV_BUILD_TESTS=OFF)

step() { echo "== gpu_compile_checks: $* (at ${SECONDS}s)"; }

step "nvidia sm_90a (nvcc)"
command -v nvcc >/dev/null || { echo "nvcc not found on PATH" >&2; exit 1; }
cmake -S "$repo" -B "$root/nvidia" "${common[@]}" -DROPEKV_GPU=nvidia -DROPEKV_CUDA_ARCHS=90a >/dev/null
cmake --build "$root/nvidia" -j"$jobs" --target ropekv_hip plugin_gpu

step "amd gfx90a (hipcc)"
cmake -S "$repo" -B "$root/amd" "${common[@]}" -DROPEKV_GPU=amd -DROPEKV_AMD_ARCHS=gfx90a >/dev/null
cmake --build "$root/amd" -j"$jobs" --target ropekv_hip

step "amd gfx942 (clang-19 compile check)"
command -v clang++-19 >/dev/null || { echo "clang++-19 not found" >&2; exit 1; }
cmake --build "$root/amd" -j"$jobs" --target ropekv_hip_gfx942_check
test -s "$root/amd/backends/hip/kernel_gfx942.s"

step "all passed"
