#!/usr/bin/env bash
# Layout shuffled (AITER's 16-token tiles) on one NVIDIA H200 (< 6 minutes): ref vs hip over the
# default stream and the aligned16 profile (the fast paths), sim vs hip bit for bit, every
# golden case on hip, and bench rows of the joint and shuffled layouts side by side (one run,
# one copy ceiling), with and without the L2 keep hint on the cache stores. Summary last.
#   ROPEKV_BIN   the nvcc build of ropekv (default build-gpubin/ropekv); bench/h200_lib.sh
set -uo pipefail
NAME_DEFAULT_OUT=shuffled-out
source "$(dirname "$0")/h200_lib.sh"
campaign ref-hip-shuffled ref,hip 5000 --seed 20261202 --pin layout=shuffled
campaign ref-hip-shuffled-aligned16 ref,hip 5000 --seed 20261203 --pin layout=shuffled --profile aligned16
campaign sim-hip-shuffled-bitwise sim,hip 2000 --seed 20261204 --pin layout=shuffled --bitwise
campaign sim-hip-shuffled-aligned16-bitwise sim,hip 2000 --seed 20261205 --pin layout=shuffled --profile aligned16 --bitwise
golden_on_hip
"$BIN" bench --backend hip --layout joint,shuffled --cache bf16,fp8_e4m3fn --mode copy \
  --variant auto,l2keep=0,l2keep=1 \
  --case deepseek-v3:1 --case deepseek-v3:32 --case deepseek-v3:4096 --case deepseek-v3-tp8:8192 \
  --json "$OUT/bench-shuffled.json" > "$W/bench.log" 2>&1
say "bench (joint vs shuffled, copy mode; auto = the L2 keep hint on shuffled cache stores only):"
cat "$W/bench.log" | tee -a "$summary"
