#!/usr/bin/env bash
# Layout shuffled (AITER's 16-token tiles) on one NVIDIA H200 (< 6 minutes): ref vs hip over the
# default stream and the aligned16 profile (the fast paths), sim vs hip bit for bit, every
# golden case on hip, and bench rows of the joint and shuffled layouts side by side (one run,
# one copy ceiling), with and without the L2 keep hint on the cache stores. Summary last.
#   ROPEKV_BIN   the nvcc build of ropekv (default build-gpubin/ropekv)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${ROPEKV_BIN:-$ROOT/build-gpubin/ropekv}
OUT=${OUT:-./shuffled-out}
W=$OUT/work; mkdir -p "$W"
summary=$OUT/summary.txt; : > "$summary"
say() { echo "$*" | tee -a "$summary"; }
say "commit $("$BIN" info | head -1)"
say "device $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
campaign() {  # campaign NAME BACKENDS CASES FUZZ-ARGS...: 4 shards, merged
  local name=$1 backends=$2 cases=$3; shift 3
  local t0=$SECONDS pids=()
  for k in 0 1 2 3; do
    OMP_NUM_THREADS=4 "$BIN" fuzz --backends "$backends" --cases "$cases" --max-tokens 64 "$@" \
      --shard "$k/4" --json "$W/$name-$k.json" > "$W/$name-$k.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  "$BIN" report merge "$W/$name"-*.json --json "$OUT/$name.json" > "$W/$name-merge.log" 2>&1
  say "$name ($*): $(tail -1 "$W/$name-merge.log") ($((SECONDS - t0)) s)"
}
campaign ref-hip-shuffled ref,hip 5000 --seed 20261202 --pin layout=shuffled
campaign ref-hip-shuffled-aligned16 ref,hip 5000 --seed 20261203 --pin layout=shuffled --profile aligned16
campaign sim-hip-shuffled-bitwise sim,hip 2000 --seed 20261204 --pin layout=shuffled --bitwise
campaign sim-hip-shuffled-aligned16-bitwise sim,hip 2000 --seed 20261205 --pin layout=shuffled --profile aligned16 --bitwise
n=0; bad=0
for f in "$ROOT"/data/golden/*.safetensors; do
  n=$((n + 1)); log="$W/golden-$(basename "$f" .safetensors).log"
  "$BIN" golden check "$f" --backend hip > "$log" 2>&1 || bad=$((bad + 1))
done
say "golden on hip: $((n - bad)) passed, $bad failed of $n"
"$BIN" bench --backend hip --layout joint,shuffled --cache bf16,fp8_e4m3fn --mode copy \
  --variant auto,l2keep=0,l2keep=1 \
  --case deepseek-v3:1 --case deepseek-v3:32 --case deepseek-v3:4096 --case deepseek-v3-tp8:8192 \
  --json "$OUT/bench-shuffled.json" > "$W/bench.log" 2>&1
say "bench (joint vs shuffled, copy mode; auto = the L2 keep hint on shuffled cache stores only):"
cat "$W/bench.log" | tee -a "$summary"
