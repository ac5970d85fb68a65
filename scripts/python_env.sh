#!/usr/bin/env bash
# The Python side of the set-up, run by both README commands: the venv $ROPEKV_BUILD_DIR/venv
# (default build/venv) with exactly the lock tests/python/requirements.txt (remade only when the
# lock changed), and the ropekv Python package built from this tree into it (pip install ., in
# setup.sh's build folder: only the module is compiled there). Needs scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
build_dir="${ROPEKV_BUILD_DIR:-build}"
mkdir -p "$build_dir"
venv="$build_dir/venv"
stamp="$venv/.ropekv-requirements"
if [ ! -f "$stamp" ] || ! cmp -s tests/python/requirements.txt "$stamp"; then
  echo "python_env: preparing $venv"
  python3 -m venv "$venv"
  # The lock pins every package, dependencies included: --no-deps installs exactly it, and
  # pip check fails if a pinned package needs something the lock lacks.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r tests/python/requirements.txt
  "$venv/bin/python" -m pip check --disable-pip-version-check
  cp tests/python/requirements.txt "$stamp"
fi

# The Python package, built from this tree into the venv. Where scripts/setup.sh has configured
# $build_dir, pip builds in it with the options it holds (generator, tests, examples): the
# libraries are already compiled there with the same flags, so only the module itself is.
# Otherwise pip builds in its own folder, build/py (incremental too).
echo "python_env: installing the ropekv Python package into $venv"
pip_args=(-q --disable-pip-version-check --no-build-isolation --no-deps)
if [ -f "$build_dir/CMakeCache.txt" ]; then
  cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build_dir/CMakeCache.txt" | head -n 1; }
  export CMAKE_GENERATOR="$(cache_value CMAKE_GENERATOR)"
  export CMAKE_BUILD_PARALLEL_LEVEL="${ROPEKV_JOBS:-$(nproc)}"
  pip_args+=(-C "build-dir=$build_dir"
             -C "cmake.define.ROPEKV_BUILD_TESTS=$(cache_value ROPEKV_BUILD_TESTS)"
             -C "cmake.define.ROPEKV_BUILD_EXAMPLES=$(cache_value ROPEKV_BUILD_EXAMPLES)")
fi
run_with_progress "python_env: building the package" "$build_dir/pip-install.log" \
  "$venv/bin/python" -m pip install "${pip_args[@]}" . || { tail -n 40 "$build_dir/pip-install.log"; exit 1; }

echo "python_env: ropekv package -> $venv (use $venv/bin/python; import ropekv)"
