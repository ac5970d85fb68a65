#!/usr/bin/env bash
# Numerics identification of the hip kernels on one NVIDIA H200 (< 3 minutes): ref vs hip with
# --identify over the default stream and the aligned16 profile (the fast paths), 4 shards each,
# merged; every golden case on hip (golden check identifies every rope region). Summary last.
#   ROPEKV_BIN   the nvcc build of ropekv (default build-gpubin/ropekv)
set -uo pipefail
NAME_DEFAULT_OUT=numerics-out
source "$(dirname "$0")/h200_lib.sh"
identify() {  # identify NAME CASES FUZZ-ARGS...: a ref,hip campaign with --identify, then its tally
  local name=$1 cases=$2; shift 2
  campaign "$name" ref,hip "$cases" --identify "$@"
  python3 -c "import json,sys; [print('  %s x%d' % kv) for kv in sorted(json.load(open(sys.argv[1]))['numerics'].items())]" \
    "$OUT/$name.json" | tee -a "$summary"
}
identify identify-any 4000 --seed 20261201
identify identify-aligned16 4000 --seed 20261202 --profile aligned16
golden_on_hip each
