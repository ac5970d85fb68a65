#!/usr/bin/env bash
# README command (2): the whole test suite.
#   1. installs and builds what is missing (scripts/setup.sh), makes the Python venv build/venv
#      from the lock tests/python/requirements.txt (exact pins) and installs the ropekv Python
#      package from this tree into it (scripts/python_env.sh);
#   2. ctest: C++ unit tests (doctest), Python tests (pytest: ml_dtypes cross-checks, numpy
#      oracle vs reference, CLI, the Python package and its PyTorch op, examples/), 2000 random
#      cases of ref vs sim;
#   3. slurm: the Slurm array recipe of docs/fuzz.md on a one-node cluster on localhost (slurmctld,
#      slurmd, munge from Debian): 4 shards merged = the unsharded run, and merge fails after a shard
#      is cancelled mid-run (scripts/slurm_test.sh);
#   4. the C++ unit tests and the CLI catalog (tests/python/test_cli_catalog.py) again under
#      AddressSanitizer + UndefinedBehaviorSanitizer, float-cast-overflow included;
#   5. libFuzzer targets, 40 s each (scripts/fuzz.sh);
#   6. GPU compile checks: nvcc sm_90a, hipcc gfx90a, clang-19 gfx942 (scripts/gpu_compile_checks.sh).
# Skips: ROPEKV_SKIP_SLURM=1, ROPEKV_SKIP_SANITIZE=1, ROPEKV_SKIP_FUZZ=1, ROPEKV_SKIP_GPU_BUILDS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
# Wall time of each stage, printed at the end (CI budget: keep the whole run under 60 minutes).
times=()
t0=$SECONDS
lap() { times+=("$1 $((SECONDS - t0))s"); t0=$SECONDS; }
bash scripts/setup.sh
lap build
build_dir="${ROPEKV_BUILD_DIR:-build}"
jobs="${ROPEKV_JOBS:-$(nproc)}"
bash scripts/python_env.sh
lap python-package

failed=()
echo "== ctest"
(cd "$build_dir" && ctest --output-on-failure) || failed+=(ctest)
lap ctest

if [ "${ROPEKV_SKIP_SLURM:-0}" != "1" ]; then
  echo "== Slurm array (docs/fuzz.md) on a one-node cluster"
  bash scripts/slurm_test.sh "$build_dir/ropekv" || failed+=(slurm)
  lap slurm
fi

if [ "${ROPEKV_SKIP_SANITIZE:-0}" != "1" ]; then
  echo "== C++ unit tests and the CLI catalog under ASan + UBSan"
  asan=build-asan
  if [ ! -f $asan/CMakeCache.txt ]; then
    # -O1 -g1: the checks and line numbers of a stack trace, at about half the compile time of -O2 -g
    cmake -S . -B $asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
      -DROPEKV_SANITIZE=ON >/dev/null
  fi
  if cmake --build $asan -j "$jobs" --target ropekv_tests ropekv >$asan/build.log 2>&1; then
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      ./$asan/ropekv_tests --minimal || failed+=(sanitizers)
    # A sanitizer finding ends the CLI with exit 86 and its report on stderr: the catalog's rows
    # expect exit 2 and one error line, or exit 0, so either way the row fails.
    ASAN_OPTIONS=detect_leaks=1:exitcode=86 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=86 \
      ROPEKV_BIN="$PWD/$asan/ropekv" "$build_dir/venv/bin/python" -m pytest -q \
      tests/python/test_cli_catalog.py || failed+=(sanitizers-cli)
  else
    tail -n 40 $asan/build.log; failed+=(sanitizer-build)
  fi
  lap sanitizers
fi

if [ "${ROPEKV_SKIP_FUZZ:-0}" != "1" ]; then
  echo "== libFuzzer targets"
  bash scripts/fuzz.sh || failed+=(libfuzzer)
  lap libfuzzer
fi

if [ "${ROPEKV_SKIP_GPU_BUILDS:-0}" != "1" ] && ! command -v nvcc >/dev/null; then
  echo "== GPU compile checks: SKIPPED (nvcc not on PATH: install the CUDA toolkit, or set ROPEKV_SKIP_GPU_BUILDS=1)"
elif [ "${ROPEKV_SKIP_GPU_BUILDS:-0}" != "1" ]; then
  echo "== GPU compile checks"
  install_missing test hipcc rocm-device-libs libamdhip64-dev clang-19
  bash scripts/gpu_compile_checks.sh >build-gpucheck.log 2>&1 &&
    { grep "^== gpu_compile_checks" build-gpucheck.log; echo "gpu compile checks: all passed"; } ||
    { tail -n 40 build-gpucheck.log; failed+=(gpu-builds); }
  lap gpu-builds
fi

echo "test: stage times: ${times[*]} (total ${SECONDS}s)"

if [ ${#failed[@]} -gt 0 ]; then
  echo "test: FAILED: ${failed[*]}"
  exit 1
fi
echo "test: all passed"
