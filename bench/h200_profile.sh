#!/usr/bin/env bash
# Nsight Compute on the H200 for the fast_v4 kernel: one launch at 4096 x 128 (bandwidth case)
# and one at 1 x 128 (latency case), plus local-memory instructions in its SASS. Results in $OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${ROPEKV_BIN:-$ROOT/build-gpubin/ropekv}
OUT=${OUT:-./profile-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$(dirname "$BIN"):${LD_LIBRARY_PATH:-}
sections=(--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats
          --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SourceCounters)
for c in deepseek-v3:4096 deepseek-v3:1; do
  timeout 120 ncu --clock-control none --kernel-name regex:rk_fast4 --launch-count 1 "${sections[@]}" \
    "$BIN" bench --backend hip --case "$c" --cache bf16 --mode copy --variant auto --budget 0.01 \
    --calls-per-graph 1 --copy-mb 64 > "$OUT/ncu-v4-${c/:/-}.txt" 2>&1
  echo "== ncu $c"; grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Local Memory|Stack|Warp Cycles Per Issued|Issue Slots Busy|Block Size|Grid Size" "$OUT/ncu-v4-${c/:/-}.txt" | head -16
done
if command -v cuobjdump > /dev/null; then
  cuobjdump --dump-sass "$BIN" > "$OUT/sass.txt" 2>/dev/null
  awk '/Function : .*rk_fast4/{f=1} /Function : /{if ($0 !~ /rk_fast4/) f=0} f' "$OUT/sass.txt" > "$OUT/sass-fast4.txt"
  echo "fast4 SASS: $(wc -l < "$OUT/sass-fast4.txt") lines, LDL/STL: $(grep -cE 'LDL|STL' "$OUT/sass-fast4.txt"), 128-bit LDG/STG: $(grep -cE '(LDG|STG)\.E\.128' "$OUT/sass-fast4.txt")"
  rm -f "$OUT/sass.txt"
fi
