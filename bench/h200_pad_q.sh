#!/usr/bin/env bash
# pad_q = skipped against computed in copy mode (whether the q rows' nope loads are in flight with
# the slot's load or wait for its `slot < 0` exit): the DeepSeek V3 shape x 1, 32 and 4096 tokens
# in both modes, $ROPEKV_BIN alone or alternated with $ROPEKV_BIN_BEFORE, $RUNS runs each
# (default 3); `bench --verify` of two skipped repros with padding slots; the SASS of the
# copy-mode one-row bf16 kernel, its first loads, branches and exits in order. Results in OUT.
#   ROPEKV_BIN         the nvcc build under test (default build-gpubin/ropekv)
#   ROPEKV_BIN_BEFORE  the nvcc build before
set -uo pipefail
BEFORE=${ROPEKV_BIN_BEFORE:-}
NAME_DEFAULT_OUT=pad-q-out
source "$(dirname "$0")/h200_lib.sh"
[ -n "$BEFORE" ] && say "before $("$BEFORE" info | head -1)"
shape='h=128 dn=512 dr=64 p=163840 bs=64 in=bf16 qo=bf16 cache=bf16 rope_table=deepseek-v3'
repros=()
for pad in skipped computed; do
  repros+=(--repro "tq=1 ts=1 tk=1 nb=1 $shape pad_q=$pad")
  repros+=(--repro "tq=32 ts=32 tk=32 nb=1 $shape pad_q=$pad")
  repros+=(--repro "tq=4096 ts=4096 tk=4096 nb=64 $shape pad_q=$pad")
done
# (with one preset case too, so that a build whose bench runs the default cases beside --repro
# runs the same rows: its repro rows are all named "repro", in the order given)
if [ -n "$BEFORE" ]; then
  bench_before_after --mode copy --cache bf16 --case deepseek-v3:1 "${repros[@]}"
else
  bench_runs pad-q --mode copy --cache bf16 --case deepseek-v3:1 "${repros[@]}"
fi
"$BIN" bench --backend hip --verify --mode copy --budget 0.02 --threads 16 \
  --repro "tq=32 ts=32 tk=32 nb=1 $shape pad_q=skipped pad_slots=5 pad_at=spread" \
  --repro "tq=256 ts=256 tk=256 nb=4 $shape pad_q=skipped pad_slots=40" > "$W/verify.log" 2>&1
say "bench --verify (rc $?): $(grep -E 'verification' "$W/verify.log")"
if command -v cuobjdump > /dev/null; then
  for b in ${BEFORE:+"$BEFORE"} "$BIN"; do
    # the copy-mode, one-row bf16 gptj kernel: rk_fast4_kernel<rk_v4_spec<2, 2, 0, 2>, 1, 0>
    cuobjdump --dump-sass --function '_ZN10ropekv_gpu15rk_fast4_kernelINS_10rk_v4_specILi2ELi2ELi0ELi2EEELi1ELi0EEEvNS_9rk_paramsE' \
      "$b" > "$W/sass-$(basename "$b").txt" 2>&1
    say "SASS $(basename "$b"): first lines with LDG or EXIT or BRA (in order):"
    grep -nE 'LDG|EXIT|BRA' "$W/sass-$(basename "$b").txt" | head -14 | cut -c1-110 | tee -a "$summary"
  done
fi
rm -rf "$W"
