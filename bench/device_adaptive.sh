#!/usr/bin/env bash
# One device call that fits whichever card came: on an H200, the layouts fuzz campaign
# (bench/h200_layouts.sh PART=fuzz); on anything else, Nsight Compute of the zero-copy fast
# kernels (4096 x 128 and 1 x 128, bf16 and e4m3fn caches) for the bandwidth work. Results in OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${ROPEKV_BIN:-$ROOT/build-gpubin/ropekv}
OUT=${OUT:-./adaptive-out}; mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "device: $gpu"
if [[ "$gpu" == *H200* ]]; then
  PART=fuzz OUT=$OUT/fuzz bash "$ROOT/bench/h200_layouts.sh"
  exit
fi
export LD_LIBRARY_PATH=$(dirname "$BIN"):${LD_LIBRARY_PATH:-}
for c in deepseek-v3:4096 deepseek-v3:1; do
  for cache in bf16 fp8_e4m3fn; do
    set=(--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats
         --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SchedulerStats)
    [ "$c:$cache" = deepseek-v3:4096:bf16 ] && set=(--set full)
    f="$OUT/ncu-zc-${c/:/-}-$cache.txt"
    timeout 200 ncu --clock-control none --kernel-name regex:rk_fast4 --launch-skip 2 --launch-count 1 "${set[@]}" \
      "$BIN" bench --backend hip --case "$c" --cache "$cache" --mode zero_copy --budget 0.01 \
      --calls-per-graph 1 --copy-mb 64 > "$f" 2>&1
    echo "== ncu zero_copy $c $cache"
    grep -E "rk_fast4|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|Issued Ipc|Eligible Warps|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Block Size|Grid Size|Waves Per SM" "$f" | head -24
  done
done
