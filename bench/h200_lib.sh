# Shared by the bench/h200_*.sh campaign scripts (source it after setting NAME_DEFAULT_OUT):
# BIN, OUT, W (work folder), the summary file, say, campaign (sharded fuzz, merged), golden_on_hip.
#   ROPEKV_BIN   the nvcc build of ropekv (default build-gpubin/ropekv)
#   OUT          where results go (default ./$NAME_DEFAULT_OUT)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${ROPEKV_BIN:-$ROOT/build-gpubin/ropekv}
OUT=${OUT:-./$NAME_DEFAULT_OUT}
W=$OUT/work; mkdir -p "$W"
summary=$OUT/summary.txt; : > "$summary"
say() { echo "$*" | tee -a "$summary"; }
say "commit $("$BIN" info | head -1)"
say "device $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"

# campaign NAME BACKENDS CASES FUZZ-ARGS...: 4 shards of `fuzz`, merged into $OUT/NAME.json.
campaign() {
  local name=$1 backends=$2 cases=$3; shift 3
  local t0=$SECONDS pids=()
  for k in 0 1 2 3; do
    OMP_NUM_THREADS=4 "$BIN" fuzz --backends "$backends" --cases "$cases" --max-tokens 64 "$@" \
      --shard "$k/4" --json "$W/$name-$k.json" > "$W/$name-$k.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  "$BIN" report merge "$W/$name"-[0-3].json --json "$OUT/$name.json" > "$W/$name-merge.log" 2>&1
  say "$name ($backends $*): $(tail -1 "$W/$name-merge.log") ($((SECONDS - t0)) s)"
}

# golden_on_hip [EACH]: `golden check --backend hip` on every data/golden case; with EACH, a
# summary line per case (its rope regions' numerics) as well.
golden_on_hip() {
  local n=0 bad=0 f log
  for f in "$ROOT"/data/golden/*.safetensors; do
    n=$((n + 1)); log="$W/golden-$(basename "$f" .safetensors).log"
    "$BIN" golden check "$f" --backend hip > "$log" 2>&1 || bad=$((bad + 1))
    [ -n "${1:-}" ] && say "golden $(basename "$f" .safetensors): $(tail -1 "$log"); $(awk '/\[rope/ {r=$1} /numerics:/ {sub(/^ *numerics: /, ""); printf "%s: %s  ", r, $0}' "$log")"
  done
  say "golden on hip: $((n - bad)) passed, $bad failed of $n"
}

# bench_runs NAME BENCH-ARGS...: three `bench --backend hip` runs into the summary; the third
# run's JSON goes to $OUT/bench-NAME-3.json.
bench_runs() {
  local name=$1 run; shift
  for run in 1 2 3; do
    "$BIN" bench --backend hip "$@" --json "$W/bench-$name-$run.json" > "$W/bench-$name-$run.log" 2>&1
    say "--- bench $name ($*), run $run:"
    tee -a "$summary" < "$W/bench-$name-$run.log"
  done
  cp "$W/bench-$name-3.json" "$OUT/"
}

# bench_before_after BENCH-ARGS...: `bench --backend hip` with $BEFORE and $BIN (and $EXTRA, a
# third build, when set) alternated, $RUNS (default three) runs each, into the summary; the last
# runs' JSON go to $OUT. Nothing without $BEFORE.
bench_before_after() {
  [ -n "${BEFORE:-}" ] || return 0
  local run side b
  local runs=${RUNS:-3}
  local sides="before after"
  [ -n "${EXTRA:-}" ] && sides="before after extra" && say "extra $("$EXTRA" info | head -1) ($EXTRA)"
  say "bench ($*): $sides alternated, $runs runs each"
  for run in $(seq 1 "$runs"); do
    for side in $sides; do
      b=$BIN; [ "$side" = before ] && b=$BEFORE; [ "$side" = extra ] && b=$EXTRA
      "$b" bench --backend hip "$@" --json "$W/bench-$side-$run.json" > "$W/bench-$side-$run.log" 2>&1
      say "--- $side, run $run"
      tee -a "$summary" < "$W/bench-$side-$run.log"
    done
  done
  cp "$W/bench-before-$runs.json" "$W/bench-after-$runs.json" "$OUT/"
  [ -n "${EXTRA:-}" ] && cp "$W/bench-extra-$runs.json" "$OUT/"
  return 0
}
