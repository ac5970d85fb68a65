#!/usr/bin/env bash
# Compile checks of the GPU backend, each in its own build folder; exits non-zero if any fails.
# No GPU needed.
#   1. nvidia: nvcc, sm_90a only (CI time), targets ropekv_hip and plugin_gpu (examples/plugin_gpu)
#   2. amd:    Debian's hipcc (clang-15), gfx90a, target ropekv_hip
#   3. gfx942: clang-19 device-only compile to ISA with the shim (backends/hip/gfx942_shim.h)
# Only the GPU sources compile: the targets build with their "/fast" rules (Unix Makefiles), which
# skip the host libraries they link (the main build compiles and tests those). The nvidia and amd
# checks run side by side, one compile job each (most of their time is one large translation unit).
# Usage: scripts/gpu_compile_checks.sh [build-root]   (default: <repo>/build-gpucheck)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
root="${1:-$repo/build-gpucheck}"
common=(-G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release -DROPEKV_BUILD_TESTS=OFF -DROPEKV_BUILD_EXAMPLES=ON)

step() { echo "== gpu_compile_checks: $* (at ${SECONDS}s)"; }

command -v nvcc >/dev/null || { echo "nvcc not found on PATH" >&2; exit 1; }
command -v clang++-19 >/dev/null || { echo "clang++-19 not found" >&2; exit 1; }
mkdir -p "$root"

nvidia() {
  cmake -S "$repo" -B "$root/nvidia" "${common[@]}" -DROPEKV_GPU=nvidia -DROPEKV_CUDA_ARCHS=90a >/dev/null &&
    cmake --build "$root/nvidia" -j1 --target ropekv_hip/fast plugin_gpu/fast
}
amd() {
  cmake -S "$repo" -B "$root/amd" "${common[@]}" -DROPEKV_GPU=amd -DROPEKV_AMD_ARCHS=gfx90a >/dev/null &&
    cmake --build "$root/amd" -j1 --target ropekv_hip/fast &&
    cmake --build "$root/amd" -j1 --target ropekv_hip_gfx942_check/fast &&
    test -s "$root/amd/backends/hip/kernel_gfx942.s"
}

step "nvidia sm_90a (nvcc) and amd gfx90a (hipcc) + gfx942 (clang-19), side by side"
nvidia >"$root/nvidia.log" 2>&1 & nvidia_pid=$!
amd >"$root/amd.log" 2>&1 & amd_pid=$!
status=0
if wait $nvidia_pid; then step "nvidia sm_90a passed"; else
  step "nvidia sm_90a FAILED"; tail -n 40 "$root/nvidia.log"; status=1; fi
if wait $amd_pid; then step "amd gfx90a and gfx942 passed"; else
  step "amd FAILED"; tail -n 40 "$root/amd.log"; status=1; fi
[ $status -eq 0 ] && step "all passed"
exit $status
