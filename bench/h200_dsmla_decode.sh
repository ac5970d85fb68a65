#!/usr/bin/env bash
# Layout fp8_ds_mla and the decode outputs on the fast kernel, on one NVIDIA H200:
#  - fuzz: fp8_ds_mla ref vs hip and sim vs hip bit for bit; decode outputs on the fast paths'
#    domain (aligned16) ref vs hip and sim vs hip bit for bit; an unpinned aligned16 campaign;
#    every golden case on hip;
#  - bench: joint bf16 / fp8 caches with and without the decode outputs, fp8_ds_mla beside
#    joint, and the plain fast path before / after (the two binaries alternated, 3 runs each).
#   ROPEKV_BIN         the nvcc build under test (default build-gpubin/ropekv)
#   ROPEKV_BIN_BEFORE  the nvcc build of the commit before (bench comparison; skipped if unset)
#   PART               fuzz, bench, or all (default)
set -uo pipefail
BEFORE=${ROPEKV_BIN_BEFORE:-}
NAME_DEFAULT_OUT=dsmla-decode-out
source "$(dirname "$0")/h200_lib.sh"
PART=${PART:-all}
[ -n "$BEFORE" ] && say "before $("$BEFORE" info | head -1)"
if [ "$PART" != bench ]; then
  campaign ref-hip-dsmla ref,hip 5000 --seed 20261221 --pin layout=fp8_ds_mla
  campaign sim-hip-dsmla-bitwise sim,hip 2000 --seed 20261222 --pin layout=fp8_ds_mla --bitwise
  campaign ref-hip-decode-aligned16 ref,hip 5000 --seed 20261223 --pin dec_out=qzk --profile aligned16
  campaign sim-hip-decode-aligned16-bitwise sim,hip 2000 --seed 20261224 --pin dec_out=qzk --profile aligned16 --bitwise
  campaign ref-hip-aligned16 ref,hip 5000 --seed 20261225 --profile aligned16
  golden_on_hip
fi
[ "$PART" = fuzz ] && exit 0
cases=(--case deepseek-v3:1 --case deepseek-v3:32 --case deepseek-v3:4096 --case deepseek-v3-tp8:8192)
bench_before_after --layout joint --cache bf16,fp8_e4m3fn --mode copy "${cases[@]}"
"$BIN" bench --backend hip --layout joint --cache bf16,fp8_e4m3fn --mode copy,zero_copy --decode 32 \
  "${cases[@]}" --json "$OUT/bench-decode.json" > "$W/bench-decode.log" 2>&1
say "bench, decode outputs (N = min(32, Tq)), joint:"
tee -a "$summary" < "$W/bench-decode.log"
"$BIN" bench --backend hip --layout joint,fp8_ds_mla --cache bf16,fp8_e4m3fn --mode copy \
  "${cases[@]}" --json "$OUT/bench-dsmla.json" > "$W/bench-dsmla.log" 2>&1
say "bench, fp8_ds_mla beside joint:"
tee -a "$summary" < "$W/bench-dsmla.log"
