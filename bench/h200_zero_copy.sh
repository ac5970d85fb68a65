#!/usr/bin/env bash
# Zero-copy mode (q_nope already in q_out) with several q rows per lane, on one NVIDIA GPU:
#  - verify (PART=verify): `bench --verify` in zero-copy mode at mid-sized cases (the row code
#    does not depend on the size; a 4096 x 128 check costs ~15 s on the host), both caches, rows
#    per lane 1, 2, 4 and the plan's choice, plus neox and pad_q=skipped repros: every row
#    checked against the reference before it is timed; the kernels' registers and local memory
#    beside the build before (cuobjdump);
#  - ab (PART=ab): copy and zero-copy mode, the build before and this one alternated, three runs
#    each (each run measures its own copy ceiling);
#  - sweep (PART=sweep): zero-copy rows per lane 1, 2, 4 and the plan's choice at the large
#    cases, one run;
#  - fuzz (PART=fuzz): ref vs hip FUZZ_CASES (2000) cases, sim vs hip bit for bit half as many.
#   RUNS               ab: runs per binary (default 3)
#   ROPEKV_BIN         the nvcc build under test (default build-gpubin/ropekv)
#   ROPEKV_BIN_BEFORE  the nvcc build before (ab and the register diff; skipped if unset)
#   ROPEKV_BIN_EXTRA   a third build for ab (optional)
#   PART               verify, ab, sweep, fuzz, fuzzzc, a comma list of them, or all (default);
#                      fuzzzc: fuzz pinned to zero_copy=1 (ref vs hip FUZZ_CASES, sim vs hip half)
# Keeps at most 8 files under OUT (the device returns no more).
set -uo pipefail
BEFORE=${ROPEKV_BIN_BEFORE:-}
EXTRA=${ROPEKV_BIN_EXTRA:-}
NAME_DEFAULT_OUT=zero-copy-out
source "$(dirname "$0")/h200_lib.sh"
PART=${PART:-all}
part() { [ "$PART" = all ] || [[ ",$PART," == *",$1,"* ]]; }
[ -n "$BEFORE" ] && say "before $("$BEFORE" info | head -1)"
cases=(--case deepseek-v3:1 --case deepseek-v3:32 --case deepseek-v3:1024 --case deepseek-v3:4096
       --case deepseek-v3-tp8:8192)
if part verify; then
  neox='tq=256 ts=256 tk=256 h=128 dn=512 dr=64 p=163840 bs=64 nb=5 in=bf16 qo=bf16 cache=bf16 style=neox rope_table=deepseek-v3'
  skip='tq=256 ts=256 tk=256 h=128 dn=512 dr=64 p=163840 bs=64 nb=5 in=bf16 qo=bf16 cache=fp8_e4m3fn pad_slots=40 pad_q=skipped rope_table=deepseek-v3'
  "$BIN" bench --backend hip --verify --threads 16 --budget 0.05 --mode zero_copy --cache bf16,fp8_e4m3fn \
    --case deepseek-v3:1 --case deepseek-v3:256 --case deepseek-v3-tp8:1024 --case kimi-k2-tp8:512 \
    --repro "$neox" --repro "$skip" --variant auto,zcr=1,zcr=2,zcr=4 \
    --json "$OUT/bench-verify.json" > "$W/verify.log" 2>&1
  say "bench --verify (rc $?):"
  grep -E "^(deepseek|kimi|repro)|verification|FAILED|replay" "$W/verify.log" | tee -a "$summary"
  if [ -n "$BEFORE" ]; then
    for b in "$BEFORE" "$BIN"; do
      cuobjdump --dump-resource-usage "$b" | awk '/Function/ {f = $2} /REG:/ {print f, $1, $2, $5}' | sort > "$W/regs-$(basename "$b").txt"
    done
    say "kernels whose registers or local memory changed (< before, > after):"
    diff "$W/regs-$(basename "$BEFORE").txt" "$W/regs-$(basename "$BIN").txt" | grep '^[<>]' | cut -c1-200 | tee -a "$summary"
  fi
fi
if part ab; then
  bench_before_after --cache bf16,fp8_e4m3fn --mode copy,zero_copy "${cases[@]}"
fi
if part sweep; then
  "$BIN" bench --backend hip --mode zero_copy --cache bf16,fp8_e4m3fn --case deepseek-v3:1024 --case deepseek-v3:4096 \
    --case deepseek-v3-tp8:8192 --variant auto,zcr=1,zcr=2,zcr=4 --json "$OUT/bench-sweep.json" > "$W/sweep.log" 2>&1
  say "--- zero-copy rows per lane (rc $?):"
  tee -a "$summary" < "$W/sweep.log"
fi
if part fuzz; then
  campaign ref-hip ref,hip ${FUZZ_CASES:-2000} --seed 20261207
  campaign sim-hip-bitwise sim,hip $(( ${FUZZ_CASES:-2000} / 2 )) --seed 20261208 --bitwise
fi
if part fuzzzc; then
  campaign ref-hip-zero-copy ref,hip ${FUZZ_CASES:-2000} --seed 20261209 --pin zero_copy=1
  campaign sim-hip-zero-copy-bitwise sim,hip $(( ${FUZZ_CASES:-2000} / 2 )) --seed 20261210 --pin zero_copy=1 --bitwise
  campaign ref-hip-zero-copy-aligned16 ref,hip ${FUZZ_CASES:-2000} --seed 20261211 --pin zero_copy=1 --profile aligned16
  mv "$OUT"/ref-hip-zero-copy*.json "$OUT"/sim-hip-zero-copy*.json "$W/" 2>/dev/null
fi
rm -rf "$W"
