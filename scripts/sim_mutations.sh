#!/usr/bin/env bash
# Planted-bug check of the sim tests: builds the sim with each kernel mutation
# (ROPEKV_MUTATION=1 off-by-one entry offset, 2 wrong neox rope partner, 3 dropped vector tail)
# and runs tests/cpp/test_sim.cpp against each; every one must FAIL (ctest WILL_FAIL), so this
# script exits 0 only when all three mutations are caught.
# Usage: scripts/sim_mutations.sh [build-dir]   (default: <repo>/build-mutations)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$repo/build-mutations}"
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DROPEKV_SIM_MUTATIONS=ON >/dev/null
cmake --build "$build" -j"${ROPEKV_JOBS:-2}" --target ropekv_sim_mutation_1 ropekv_sim_mutation_2 ropekv_sim_mutation_3
cd "$build" && ctest --output-on-failure -R '^sim_mutation_'
