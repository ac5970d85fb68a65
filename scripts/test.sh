#!/usr/bin/env bash
# README command (2): the whole test suite. Installs and builds what is missing, makes the
# Python venv (numpy, ml_dtypes, safetensors, pytest) in build/venv, runs ctest (C++ doctest +
# pytest), then the GPU compile checks (nvcc sm_90a, hipcc gfx90a, clang-19 gfx942).
#   ROPEKV_SKIP_GPU_BUILDS=1   skip the GPU compile checks
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build_dir="${ROPEKV_BUILD_DIR:-build}"

venv="$build_dir/venv"
stamp="$venv/.ropekv-requirements"
if [ ! -f "$stamp" ] || ! cmp -s tests/python/requirements.txt "$stamp"; then
  echo "test: preparing $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt
  cp tests/python/requirements.txt "$stamp"
fi

status=0
(cd "$build_dir" && ctest --output-on-failure) || status=1

if [ "${ROPEKV_SKIP_GPU_BUILDS:-0}" != "1" ] && [ -f scripts/gpu_compile_checks.sh ]; then
  bash scripts/gpu_compile_checks.sh || status=1
fi
exit $status
