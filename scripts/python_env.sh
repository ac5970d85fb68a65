#!/usr/bin/env bash
# The Python side of the set-up, run by both README commands: the venv $ROPEKV_BUILD_DIR/venv
# (default build/venv) with exactly the lock tests/python/requirements.txt (remade only when the
# lock changed), and the ropekv Python package built from this tree into it (pip install .,
# incremental: build/py keeps its objects). Needs scripts/setup.sh's packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
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

# The Python package, built from this tree into the venv (incremental: build/py keeps its objects).
echo "python_env: installing the ropekv Python package into $venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps . \
  >"$build_dir/pip-install.log" 2>&1 || { tail -n 40 "$build_dir/pip-install.log"; exit 1; }

echo "python_env: ropekv package -> $venv (use $venv/bin/python; import ropekv)"
