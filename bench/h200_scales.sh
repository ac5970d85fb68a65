#!/usr/bin/env bash
# Scales as device tensors on one NVIDIA H200 (< 8 minutes): ref vs hip and sim vs hip (bit for
# bit) with `scales=tensor` over the default stream and the aligned16 profile (the fast paths),
# the shuffled layout bit for bit once more (its store helper changed with this build), every
# golden case on hip, and the host-scale fast path benched before and after in one call (the
# two binaries alternated, three runs each, one GPU), then host vs tensor scales side by side.
# Summary last.
#   ROPEKV_BIN         the nvcc build of ropekv under test (default build-gpubin/ropekv)
#   ROPEKV_BIN_BEFORE  the nvcc build of the commit before (bench comparison; skipped if unset)
set -uo pipefail
BEFORE=${ROPEKV_BIN_BEFORE:-}
NAME_DEFAULT_OUT=scales-out
source "$(dirname "$0")/h200_lib.sh"
[ -n "$BEFORE" ] && say "before $("$BEFORE" info | head -1)"
campaign ref-hip-scales ref,hip 5000 --seed 20261206 --pin scales=tensor
campaign ref-hip-scales-aligned16 ref,hip 5000 --seed 20261207 --pin scales=tensor --profile aligned16
campaign sim-hip-scales-bitwise sim,hip 2000 --seed 20261208 --pin scales=tensor --bitwise
campaign sim-hip-scales-aligned16-bitwise sim,hip 2000 --seed 20261209 --pin scales=tensor --profile aligned16 --bitwise
campaign sim-hip-shuffled-aligned16-bitwise sim,hip 1000 --seed 20261210 --pin layout=shuffled --profile aligned16 --bitwise
golden_on_hip
cases=(--case deepseek-v3:1 --case deepseek-v3:32 --case deepseek-v3:4096 --case deepseek-v3-tp8:8192)
bench_before_after --layout joint --cache bf16,fp8_e4m3fn --mode copy "${cases[@]}"
"$BIN" bench --backend hip --layout joint,shuffled --scales host,tensor --cache bf16,fp8_e4m3fn --mode copy \
  "${cases[@]}" --json "$OUT/bench-scales.json" > "$W/bench-scales.log" 2>&1
say "bench, host vs tensor scales, joint and shuffled, copy mode:"
tee -a "$summary" < "$W/bench-scales.log"
