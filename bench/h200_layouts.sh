#!/usr/bin/env bash
# Every cache layout and option the peers ship, at one commit, on one NVIDIA GPU:
#  - fuzz (PART=fuzz): for fp8_ds_mla, the shuffled cache, two kv heads, the decode outputs and
#    scales as device tensors: ref vs hip (5000 cases) and sim vs hip bit for bit (2000), each
#    pinned to its layout / option; every golden case on hip;
#  - bench (PART=bench): joint, shuffled and fp8_ds_mla side by side at the decode and large
#    cases, copy mode, three runs (each run measures its own copy ceiling).
#   ROPEKV_BIN   the nvcc build under test (default build-gpubin/ropekv); bench/h200_lib.sh
#   PART         fuzz, bench, or all (default)
# Keeps at most 8 files under OUT (the device returns no more): the merged reports stay in OUT/work
# and only their closing lines reach the summary.
set -uo pipefail
NAME_DEFAULT_OUT=layouts-out
source "$(dirname "$0")/h200_lib.sh"
PART=${PART:-all}
if [ "$PART" != bench ]; then
  seed=20261206
  mkdir -p "$W/merged"
  for pin in layout=fp8_ds_mla layout=shuffled kh=2 dec_out=qzk scales=tensor; do
    tag=${pin//=/-}
    campaign "ref-hip-$tag" ref,hip 5000 --seed $((seed++)) --pin "$pin"
    campaign "sim-hip-$tag-bitwise" sim,hip 2000 --seed $((seed++)) --pin "$pin" --bitwise
    mv "$OUT/ref-hip-$tag.json" "$OUT/sim-hip-$tag-bitwise.json" "$W/merged/" 2>/dev/null
  done
  golden_on_hip
  # the merged reports only (a name filter on "-N.json" would also drop kh-2's)
  tar -czf "$OUT/fuzz-reports.tar.gz" -C "$W/merged" .
fi
if [ "$PART" != fuzz ]; then
  bench_runs layouts --layout joint,shuffled,fp8_ds_mla --cache bf16,fp8_e4m3fn --mode copy \
    --case deepseek-v3:1 --case deepseek-v3:32 --case deepseek-v3:4096 --case deepseek-v3-tp8:8192
fi
rm -rf "$W"
