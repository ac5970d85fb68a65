#!/usr/bin/env bash
# Layout fp8_ds_mla on the fast kernel (fast_v4), on one NVIDIA H200:
#  - fuzz: ref vs hip and sim vs hip bit for bit, under both profiles (aligned16 puts nearly
#    every fp8_ds_mla case on fast_v4, the default profile mixes in the general body and the
#    narrow entry stores), an unpinned aligned16 campaign, every golden case on hip;
#  - bench: fp8_ds_mla beside the joint caches, three runs, and the plain fast path before /
#    after (the two binaries alternated).
#   ROPEKV_BIN         the nvcc build under test (default build-gpubin/ropekv)
#   ROPEKV_BIN_BEFORE  the nvcc build of the commit before (bench comparison; skipped if unset)
#   PART               fuzz, bench, or all (default)
# Keeps at most 8 files under OUT (the device returns no more): summary.txt and the JSON of
# the campaigns and the bench runs that matter; the work folder is removed at the end.
set -uo pipefail
BEFORE=${ROPEKV_BIN_BEFORE:-}
NAME_DEFAULT_OUT=dsmla-fast-out
source "$(dirname "$0")/h200_lib.sh"
PART=${PART:-all}
[ -n "$BEFORE" ] && say "before $("$BEFORE" info | head -1)"
if [ "$PART" != bench ]; then
  campaign ref-hip-dsmla-aligned16 ref,hip 5000 --seed 20261231 --pin layout=fp8_ds_mla --profile aligned16
  campaign sim-hip-dsmla-aligned16-bitwise sim,hip 2000 --seed 20261232 --pin layout=fp8_ds_mla --profile aligned16 --bitwise
  campaign ref-hip-dsmla ref,hip 5000 --seed 20261233 --pin layout=fp8_ds_mla
  campaign sim-hip-dsmla-bitwise sim,hip 2000 --seed 20261234 --pin layout=fp8_ds_mla --bitwise
  campaign ref-hip-aligned16 ref,hip 5000 --seed 20261235 --profile aligned16
  golden_on_hip
  mv "$OUT"/sim-hip-dsmla-bitwise.json "$OUT"/ref-hip-aligned16.json "$W"/ 2>/dev/null
fi
if [ "$PART" != fuzz ]; then
  cases=(--case deepseek-v3:1 --case deepseek-v3:32 --case deepseek-v3:4096 --case deepseek-v3-tp8:8192)
  bench_runs dsmla --layout joint,fp8_ds_mla --cache bf16,fp8_e4m3fn --mode copy "${cases[@]}"
  bench_before_after --layout joint --cache bf16,fp8_e4m3fn --mode copy "${cases[@]}"
fi
rm -rf "$W"
