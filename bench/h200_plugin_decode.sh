#!/usr/bin/env bash
# GPU plugins and decode outputs on one NVIDIA H200 (< 10 minutes):
#  - examples/plugin_gpu (a user's CUDA kernel in a shared library) fuzzed against the reference:
#    unpinned (what it does not support is reported as skipped, with why), then pinned to its
#    domain (bf16 cache and q_out, host scales), and a short campaign under --isolate (each backend call
#    in a child process that opens the GPU itself);
#  - decode outputs (decode_q_pe_out, k_pe_out, the zero buffer): ref vs hip and sim vs hip bit
#    for bit, both profiles;
#  - every golden case on hip;
#  - the host-scale joint fast path benched before and after in one call (the two binaries
#    alternated, three runs each), then the decode outputs' bench rows beside plain ones.
# Summary last.
#   ROPEKV_BIN         the nvcc build of ropekv under test (default build-gpubin/ropekv)
#   ROPEKV_BIN_BEFORE  the nvcc build of the commit before device scales (bench; skipped if unset)
#   ROPEKV_PLUGIN_GPU  the nvcc build of examples/plugin_gpu (default build-gpubin/examples/plugin_gpu/libplugin_gpu.so)
#   PART               fuzz (campaigns and golden cases), bench, or all (default; over 10 minutes)
set -uo pipefail
BEFORE=${ROPEKV_BIN_BEFORE:-}
NAME_DEFAULT_OUT=plugin-decode-out
source "$(dirname "$0")/h200_lib.sh"
PLUGIN=${ROPEKV_PLUGIN_GPU:-$ROOT/build-gpubin/examples/plugin_gpu/libplugin_gpu.so}
PART=${PART:-all}
[ -n "$BEFORE" ] && say "before $("$BEFORE" info | head -1)"
if [ "$PART" != bench ]; then
campaign ref-plugin-gpu "ref,plugin:$PLUGIN" 5000 --seed 20261211
campaign ref-plugin-gpu-domain "ref,plugin:$PLUGIN" 6000 --seed 20261212 --pin 'cache=bf16 qo=bf16 scales=host layout=joint dec_out=none'
t0=$SECONDS
"$BIN" fuzz --backends "ref,plugin:$PLUGIN" --cases 100 --seed 20261213 --max-tokens 64 --isolate \
  --pin 'cache=bf16 qo=bf16 scales=host' --json "$OUT/ref-plugin-gpu-isolate.json" > "$W/ref-plugin-gpu-isolate.log" 2>&1
say "ref-plugin-gpu-isolate (--isolate, 100 cases): $(tail -1 "$W/ref-plugin-gpu-isolate.log") ($((SECONDS - t0)) s)"
grep '^skipped' "$W/ref-plugin-gpu-0.log" | sed 's/^/  shard 0 of ref-plugin-gpu: /' | tee -a "$summary"
campaign ref-hip-decode ref,hip 5000 --seed 20261214 --pin dec_out=qzk
campaign ref-hip-decode-aligned16 ref,hip 5000 --seed 20261215 --pin dec_out=qzk --profile aligned16
campaign sim-hip-decode-bitwise sim,hip 2000 --seed 20261216 --pin dec_out=qzk --bitwise
campaign sim-hip-decode-aligned16-bitwise sim,hip 2000 --seed 20261217 --pin dec_out=qzk --profile aligned16 --bitwise
campaign ref-hip ref,hip 5000 --seed 20261218
golden_on_hip
fi
[ "$PART" = fuzz ] && exit 0
cases=(--case deepseek-v3:1 --case deepseek-v3:32 --case deepseek-v3:4096 --case deepseek-v3-tp8:8192)
bench_before_after --layout joint --cache bf16,fp8_e4m3fn --mode copy "${cases[@]}"
"$BIN" bench --backend hip --layout joint --cache bf16,fp8_e4m3fn --mode copy --decode 32 \
  "${cases[@]}" --json "$OUT/bench-decode.json" > "$W/bench-decode.log" 2>&1
say "bench, decode outputs (N = min(32, Tq)), joint, copy mode:"
tee -a "$summary" < "$W/bench-decode.log"
