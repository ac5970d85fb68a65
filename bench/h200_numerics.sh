#!/usr/bin/env bash
# Numerics identification of the hip kernels on one NVIDIA H200 (< 3 minutes): ref vs hip with
# --identify over the default stream and the aligned16 profile (the fast paths), 4 shards each,
# merged; every golden case on hip (golden check identifies every rope region). Summary last.
#   ROPEKV_BIN   the nvcc build of ropekv (default build-gpubin/ropekv)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${ROPEKV_BIN:-$ROOT/build-gpubin/ropekv}
OUT=${OUT:-./numerics-out}
W=$OUT/work; mkdir -p "$W"
summary=$OUT/summary.txt; : > "$summary"
say() { echo "$*" | tee -a "$summary"; }
say "commit $("$BIN" info | head -1)"
say "device $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
identify() {  # identify NAME CASES FUZZ-ARGS...
  local name=$1 cases=$2; shift 2
  local t0=$SECONDS pids=()
  for k in 0 1 2 3; do
    OMP_NUM_THREADS=4 "$BIN" fuzz --backends ref,hip --identify --cases "$cases" --max-tokens 64 "$@" \
      --shard "$k/4" --json "$W/$name-$k.json" > "$W/$name-$k.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  "$BIN" report merge "$W/$name"-*.json --json "$OUT/$name.json" > "$W/$name-merge.log" 2>&1
  say "$name: $(tail -1 "$W/$name-merge.log") ($((SECONDS - t0)) s)"
  python3 -c "import json,sys; [print('  %s x%d' % kv) for kv in sorted(json.load(open(sys.argv[1]))['numerics'].items())]" \
    "$OUT/$name.json" | tee -a "$summary"
}
identify identify-any 4000 --seed 20261201
identify identify-aligned16 4000 --seed 20261202 --profile aligned16
n=0; bad=0
for f in "$ROOT"/data/golden/*.safetensors; do
  n=$((n + 1)); log="$W/golden-$(basename "$f" .safetensors).log"
  "$BIN" golden check "$f" --backend hip > "$log" 2>&1 || bad=$((bad + 1))
  say "golden $(basename "$f" .safetensors): $(tail -1 "$log"); $(awk '/\[rope/ {r=$1} /numerics:/ {sub(/^ *numerics: /, ""); printf "%s: %s  ", r, $0}' "$log")"
done
say "golden on hip: $((n - bad)) passed, $bad failed"
