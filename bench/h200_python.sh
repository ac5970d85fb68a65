#!/usr/bin/env bash
# The Python package on one NVIDIA GPU, in one device call: bench/h200_python.py with the
# package from .devpy (python/ropekv + the _ropekv extension built with -DROPEKV_GPU=nvidia
# -DROPEKV_PYTHON_MODULE=ON against Python 3.12, see docs/python.md). Log and JSON go to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD/.devpy${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c 'import ropekv, torch; print("ropekv", ropekv.__version__, ropekv._c.commit, "torch", torch.__version__)'
python3 bench/h200_python.py 2>&1 | tee "$out/python.log" | grep -v '^progress:'
