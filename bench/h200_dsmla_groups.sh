#!/usr/bin/env bash
# Layout fp8_ds_mla with a cache entry's nope part over 1, 2 or 4 groups of the fast kernel
# (`--variant kvs=N`; kernel_fast.h rk_v4_ds_mla_row), on one NVIDIA GPU:
#  - fuzz (PART=fuzz): for kvs=2 and kvs=4, ref vs hip (2000 cases, and 2000 under the aligned16
#    profile, where every case takes the fast kernel) and sim vs hip bit for bit (1000), pinned
#    to layout=fp8_ds_mla;
#  - bench (PART=bench): joint and fp8_ds_mla, kvs 1 / 2 / 4, at the decode and large cases, three
#    runs (each measures its own copy ceiling); with ROPEKV_BIN_BEFORE, the plain rows of the
#    build before alternated with this one's.
#   ROPEKV_BIN         the nvcc build under test (default build-gpubin/ropekv)
#   ROPEKV_BIN_BEFORE  the nvcc build before (optional)
#   PART               fuzz, bench, or all (default)
set -uo pipefail
BEFORE=${ROPEKV_BIN_BEFORE:-}
NAME_DEFAULT_OUT=dsmla-groups-out
source "$(dirname "$0")/h200_lib.sh"
PART=${PART:-all}
[ -n "$BEFORE" ] && say "before $("$BEFORE" info | head -1)"
if [ "$PART" != bench ]; then
  seed=20261208
  for n in 2 4; do
    campaign "ref-hip-kvs$n" ref,hip 2000 --seed $((seed++)) --pin layout=fp8_ds_mla --variant "kvs=$n"
    campaign "ref-hip-kvs$n-aligned16" ref,hip 2000 --seed $((seed++)) --pin layout=fp8_ds_mla --profile aligned16 --variant "kvs=$n"
    campaign "sim-hip-kvs$n-bitwise" sim,hip 1000 --seed $((seed++)) --pin layout=fp8_ds_mla --variant "kvs=$n" --bitwise
    rm -f "$OUT"/*-kvs"$n"*.json  # the summary keeps their closing lines (at most 8 files come back)
  done
fi
[ "$PART" = fuzz ] && { rm -rf "$W"; exit 0; }
small=(--case deepseek-v3:1 --case deepseek-v3:32)
bench_before_after --layout joint,fp8_ds_mla --cache bf16 --mode copy "${small[@]}"
bench_runs groups --layout joint,fp8_ds_mla --cache bf16 --mode copy --variant auto,kvs=2,kvs=4 "${small[@]}" \
  --case deepseek-v3:128 --case deepseek-v3:512 --case deepseek-v3:4096 --case deepseek-v3-tp8:8192
rm -rf "$W"
