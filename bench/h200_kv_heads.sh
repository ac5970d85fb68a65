#!/usr/bin/env bash
# Several kv heads and the fp8_ds_mla tile amax, on one NVIDIA H200:
#  - fuzz: kh=2 (and kh=4 under aligned16) ref vs hip, kh=2 sim vs hip bit for bit; fp8_ds_mla
#    ref vs hip and sim vs hip bit for bit under aligned16 (its fast body's tile amax); every
#    golden case on hip;
#  - bench: fp8_ds_mla beside the joint caches, three runs, and the kh=1 host-scale fast path
#    before / after (the two binaries alternated, three runs each).
#   ROPEKV_BIN         the nvcc build under test (default build-gpubin/ropekv)
#   ROPEKV_BIN_BEFORE  the nvcc build of the commit before several kv heads (bench; skipped if unset)
#   PART               fuzz, bench, or all (default)
# Keeps at most 8 files under OUT (the device returns no more).
set -uo pipefail
BEFORE=${ROPEKV_BIN_BEFORE:-}
NAME_DEFAULT_OUT=kv-heads-out
source "$(dirname "$0")/h200_lib.sh"
PART=${PART:-all}
[ -n "$BEFORE" ] && say "before $("$BEFORE" info | head -1)"
if [ "$PART" != bench ]; then
  campaign ref-hip-kh2 ref,hip 5000 --seed 20261241 --pin kh=2
  campaign sim-hip-kh2-bitwise sim,hip 2000 --seed 20261242 --pin kh=2 --bitwise
  campaign ref-hip-kh4-aligned16 ref,hip 2000 --seed 20261243 --pin kh=4 --profile aligned16
  campaign ref-hip-dsmla-aligned16 ref,hip 3000 --seed 20261244 --pin layout=fp8_ds_mla --profile aligned16
  campaign sim-hip-dsmla-aligned16-bitwise sim,hip 2000 --seed 20261245 --pin layout=fp8_ds_mla --profile aligned16 --bitwise
  golden_on_hip
  mv "$OUT"/ref-hip-kh4-aligned16.json "$W"/ 2>/dev/null
fi
if [ "$PART" != fuzz ]; then
  cases=(--case deepseek-v3:1 --case deepseek-v3:32 --case deepseek-v3:4096 --case deepseek-v3-tp8:8192)
  bench_runs dsmla --layout joint,fp8_ds_mla --cache bf16,fp8_e4m3fn --mode copy "${cases[@]}"
  bench_before_after --layout joint --cache bf16,fp8_e4m3fn --mode copy "${cases[@]}"
fi
rm -rf "$W"
