#!/usr/bin/env bash
# The performance check on one NVIDIA H200, in one call (< 5 minutes): a short device fuzz of the fast path,
# then the bench cases hot (fast_v4 = auto, and without PDL; auto twice more for the spread), two
# cases cold, a small fast_v4 block-size / row-pair sweep at decode sizes, and the nvcc resource report. Writes everything under $OUT (default
# ./bench-out) and prints a short table against the performance targets last.
#
# Needs the nvcc build (see docs/perf.md "Build"):
#   cmake -S . -B build-perf3-nv -DCMAKE_BUILD_TYPE=Release -DROPEKV_GPU=nvidia -DROPEKV_CUDA_ARCHS=90a
#   cmake --build build-perf3-nv -j2 --target ropekv
# Override the binary with ROPEKV_BIN=path.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${ROPEKV_BIN:-$ROOT/build-gpubin/ropekv}
OUT=${OUT:-./bench-out}
mkdir -p "$OUT"
LOG="$OUT/h200.log"
: > "$LOG"
status=0
step() {  # step NAME TIMEOUT_S CMD...: runs with a time limit, logs, records failures
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  echo "   rc=$rc, $((SECONDS - t0)) s" | tee -a "$LOG"
  if [ $rc -ne 0 ]; then status=1; tail -5 "$OUT/$name.txt" | tee -a "$LOG"; fi
}

[ -x "$BIN" ] || { echo "h200.sh: no binary at $BIN (build it first, see the header)"; exit 2; }
(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; nvidia-smi) \
  > "$OUT/nvidia-smi.txt" 2>&1 || true
step info 30 "$BIN" info
command -v cuobjdump > /dev/null && cuobjdump --dump-resource-usage "$BIN" > "$OUT/resource-usage.txt" 2>&1
command -v cuobjdump > /dev/null && cuobjdump --dump-sass "$BIN" 2> /dev/null \
  | grep -cE "(LDG|STG)\.E\.128" > "$OUT/sass-128bit-count.txt"

# 1. Correctness on the device: the kernel (fast and general paths as the plan picks them)
#    against the reference, on the 2000-case stream.
step fuzz 150 "$BIN" fuzz --backends ref,hip --profile aligned16 --cases 2000 --max-tokens 64 --json "$OUT/fuzz-ref-hip.json"

# 2. Every benchmark case, bf16 and fp8 caches, copy and zero-copy: auto (fast_v4, specialised,
#    with programmatic dependent launch), nopdl (the same kernel, plain launches), v3 (the previous
#    kernel).
step bench-hot 240 "$BIN" bench --backend hip --variant auto,nopdl --mode copy,zero_copy \
  --budget 0.1 --json "$OUT/bench-hot.json"
# 2b. The plan's variant twice more (copy mode): the run-to-run spread of the same binary.
step bench-hot-r2 90 "$BIN" bench --backend hip --variant auto --mode copy --budget 0.1 --json "$OUT/bench-hot-r2.json"
step bench-hot-r3 90 "$BIN" bench --backend hip --variant auto --mode copy --budget 0.1 --json "$OUT/bench-hot-r3.json"
# 3. Cold (input sets rotated beyond L2), the plan's variant, two cases.
step bench-cold 40 "$BIN" bench --backend hip --cold --variant auto --mode copy --cache bf16 \
  --case deepseek-v3:128 --case deepseek-v3:4096 --budget 0.15 --json "$OUT/bench-cold.json"
# 4. fast_v4 groups per block and one/two q rows per group at the decode sizes, bf16 cache.
step bench-sweep 60 "$BIN" bench --backend hip --cache bf16 --mode copy --variant auto,gpb=2,gpb=4,gpb=8,qp=0,qp=1 \
  --case deepseek-v3:1 --case deepseek-v3:32 --case deepseek-v3:128 --case deepseek-v3-tp8:512 \
  --case kimi-k2-tp8:512 --budget 0.1 --json "$OUT/bench-sweep.json"

echo
echo "== sweep: best variant per case (us/call)"
if command -v python3 > /dev/null; then
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
def load(n):
    p = os.path.join(out, n)
    return json.load(open(p)) if os.path.exists(p) else None
sw = load("bench-sweep.json")
if sw:
    best = {}
    for r in sw["results"]:
        k = r["case"]
        if k not in best or r["us_median"] < best[k]["us_median"]: best[k] = r
    auto = {r["case"]: r for r in sw["results"] if r["variant_request"] == "auto"}
    for k, r in best.items():
        print(f"  {k:<36} best {r['us_median']:7.2f} us ({r['variant_request']}, {r['variant']})  auto {auto[k]['us_median']:7.2f} us")
hot = load("bench-hot.json")
if not hot:
    print("no bench-hot.json"); sys.exit(0)
print(f"\n== {hot['device']['name']}, copy {hot['copy']['gbps_read_plus_write']:.0f} GB/s, commit {hot['commit']}")
targets = {("deepseek-v3", 1): 1.8, ("deepseek-v3", 32): 3.4, ("deepseek-v3", 128): 10.0, ("deepseek-v3-tp8", 512): 5.5}
print(f"{'case':<36} {'mode':<9} {'variant':<8} {'us':>8} {'MB':>8} {'%copy':>6}  target")
cold = {(r['case'], r['mode']): r for r in (load('bench-cold.json') or {'results': []})['results']}
for r in hot["results"]:
    preset, rest = r["case"].split(":", 1) if ":" in r["case"] else (r["case"], "0")
    tokens = int(rest.split()[0]) if rest.split()[0].isdigit() else 0
    t = targets.get((preset, tokens))
    mb = r["bytes_total"] / 1e6
    if r["mode"] == "copy" and t is not None:
        verdict = f"<= {t} us: {'MET' if r['us_median'] <= t else 'MISSED'}"
    elif r["mode"] == "copy" and mb >= 300:
        verdict = f">= 92%: {'MET' if r['pct_of_copy'] >= 92 else 'MISSED'}"
    else:
        verdict = ""
    c = cold.get((r["case"], r["mode"])) if r["variant_request"] == "auto" else None
    cs = f"  cold {c['us_median']:.2f} us" if c else ""
    print(f"{r['case']:<36} {r['mode']:<9} {r['variant_request']:<8} {r['us_median']:8.2f} {mb:8.1f} {r['pct_of_copy']:6.1f}  {verdict}{cs}")
# the plan's variant in three runs of the same binary (bench-hot, -r2, -r3): each run and the median
runs = [x for x in (hot, load("bench-hot-r2.json"), load("bench-hot-r3.json")) if x]
print(f"\n== auto, copy mode, {len(runs)} runs (us; %copy against each run's own copy)")
for r in hot["results"]:
    if r["mode"] != "copy" or r["variant_request"] != "auto":
        continue
    same = [x for run in runs for x in run["results"] if x["case"] == r["case"] and x["mode"] == "copy" and x["variant_request"] == "auto"]
    us = sorted(x["us_median"] for x in same)
    pct = sorted(x["pct_of_copy"] for x in same)
    med_us, med_pct = us[len(us) // 2], pct[len(pct) // 2]
    preset, rest = r["case"].split(":", 1)
    t = targets.get((preset, int(rest.split()[0])))
    verdict = (f"<= {t}: {'MET' if med_us <= t else 'MISSED'}" if t is not None
               else f">= 92%: {'MET' if med_pct >= 92 else 'MISSED'}" if r["bytes_total"] / 1e6 >= 300 else "")
    print(f"{r['case']:<36} {' '.join(f'{x:8.2f}' for x in (x['us_median'] for x in same))}  median {med_us:8.2f} us {med_pct:6.1f}%  {verdict}")
PY
else
  tail -n +2 "$OUT/bench-hot.txt"
fi
echo "fuzz: $(tail -1 "$OUT/fuzz.txt" 2>/dev/null)"
echo "128-bit LDG/STG in SASS: $(cat "$OUT/sass-128bit-count.txt" 2>/dev/null || echo n/a)"
exit $status
