#!/usr/bin/env bash
# Regenerates data/golden/ (the committed golden cases the tests replay) from the repro strings
# below. Each case is small (< 1 MB). Run after a change to the contract, then review the diff.
#   scripts/make_golden_data.sh [NAME...]   only the named cases (default: all, old files removed)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${ROPEKV_BIN:-build/ropekv}"
out=data/golden
mkdir -p "$out"
[ $# -eq 0 ] && rm -f "$out"/*.safetensors
wanted() { [ $# -eq 1 ] && [ ${#only[@]} -eq 0 ] && return 0; local n; for n in "${only[@]}"; do [ "$n" = "$1" ] && return 0; done; return 1; }
only=("$@")
check_size() {
  size=$(stat -c %s "$out/$1.safetensors")
  [ "$size" -lt 1048576 ] || { echo "$1: $size bytes, over 1 MB" >&2; exit 1; }
  echo "$1 ($size bytes)"
}
while read -r name repro; do
  [ -z "$name" ] || [ "${name#\#}" != "$name" ] && continue
  wanted "$name" || continue
  "$bin" golden write --force --repro "$repro" --out "$out/$name.safetensors" >/dev/null
  check_size "$name"
done <<'CASES'
# name                       repro (missing keys take their defaults: bf16, joint nope_first, gptj, divide)
deepseek-v3-tp8-decode      tq=3 ts=3 tk=3 h=16 p=1024 rope_table=deepseek-v3 nb=1 bs=64 seed=11
deepseek-v3-fp8-cache       tq=2 ts=2 tk=2 h=16 p=1024 rope_table=deepseek-v3 nb=1 cache=fp8_e4m3fn k_scale=0.0625 amp=40 seed=12
kimi-k2-tp8-decode          tq=4 ts=4 tk=4 h=8 p=1024 rope_table=kimi-k2 nb=1 seed=13
deepseek-v2-lite-prefill    tq=5 ts=5 tk=5 h=16 p=1024 rope_table=deepseek-v2-lite nb=1 bs=16 seed=14
neox-f16-two-tables         tq=3 ts=3 tk=3 h=4 dn=64 p=64 style=neox in=f16 table_dtype=f32 table=two qo=f16 cache=f16 nb=2 bs=4 seed=15
fp8-e4m3fnuz-reciprocal     tq=3 ts=3 tk=3 h=4 dn=128 p=64 cache=fp8_e4m3fnuz scale_conv=reciprocal k_scale=0.37 amp=200 nb=1 bs=16 seed=16
fp8-e5m2-q-and-cache        tq=3 ts=3 tk=3 h=4 dn=128 p=64 cache=fp8_e5m2 qo=fp8_e4m3fn k_scale=0.5 q_scale=3 amp=100 nb=1 bs=16 seed=17
fp8-e5m2fnuz-saturating     tq=2 ts=2 tk=2 h=2 dn=64 p=32 cache=fp8_e5m2fnuz qo=fp8_e5m2fnuz k_scale=0.001 q_scale=0.001 amp=300 nb=1 bs=8 seed=18
split-flashinfer            tq=4 ts=4 tk=4 h=8 dn=512 p=256 layout=split nb=2 bs=4 entry_pad=8 block_pad=16 seed=19
joint-rope-first-padded     tq=4 ts=4 tk=4 h=4 dn=64 p=64 order=rope_first entry_pad=4 block_pad=12 nb=3 bs=3 seed=20
padding-skipped             tq=6 ts=6 tk=6 h=4 dn=64 p=64 pad_slots=2 pad_at=head pad_q=skipped nb=1 bs=8 seed=21
padding-computed-graph-pad  tq=3 ts=5 tk=7 h=4 dn=64 p=64 pad_slots=2 pad_at=spread pad_q=computed nb=2 bs=4 seed=22
positions-clamped           tq=4 ts=4 tk=4 h=2 dn=32 p=16 pos_oob=clamp pos=i32 slot=i32 nb=1 bs=8 seed=23
inplace-f32-near-end        tq=3 ts=3 tk=3 h=2 dn=32 p=64 in=f32 table_dtype=f32 qo=f32 cache=f32 inplace_q=1 inplace_k=1 positions=near_end nb=1 bs=4 seed=24
strided-views               tq=3 ts=3 tk=4 h=4 dn=64 p=64 q_layout=head_major kv_layout=fused row_pad=8 table_pad=2 nb=2 bs=2 seed=25
shuffled-aiter-bf16         tq=4 ts=6 tk=6 h=16 p=256 bs=16 nb=2 table=two layout=shuffled pad_slots=1 pad_at=middle rope_table=deepseek-v3 seed=41
shuffled-aiter-fp8          tq=3 ts=5 tk=5 h=8 p=256 bs=32 nb=2 table_dtype=f32 cache=fp8_e4m3fn table=two layout=shuffled scale_conv=reciprocal k_scale=0.75 block_pad=16 pad_slots=1 pad_at=head rope_table=kimi-k2 seed=42
scale-tensors-fp8           tq=3 ts=4 tk=4 h=8 dn=128 p=128 bs=16 nb=1 cache=fp8_e4m3fn qo=fp8_e5m2 k_scale=0.37 q_scale=3 scales=tensor amp=60 seed=43
decode-outputs-bf16         tq=4 ts=6 tk=7 h=16 p=256 bs=16 nb=1 pad_slots=2 pad_at=spread pad_q=skipped dec_out=qzk dec=3 rope_table=deepseek-v3 seed=44
ds-mla-v32-pow2             tq=4 ts=6 tk=6 h=16 p=256 bs=64 nb=1 layout=fp8_ds_mla cache=u8 ds_scale=pow2 pad_slots=1 pad_at=middle amp=20 rope_table=deepseek-v3 seed=45
ds-mla-v32-amax-f16         tq=3 ts=4 tk=5 h=8 p=256 bs=16 nb=2 in=f16 table_dtype=f32 layout=fp8_ds_mla cache=u8 ds_scale=amax entry_pad=16 block_pad=64 amp=300 rope_table=deepseek-v3 seed=46
kv-heads-aiter              tq=4 ts=5 tk=6 h=16 kh=4 dn=128 p=256 bs=16 nb=2 layout=shuffled block_pad=32 pad_slots=1 pad_at=middle inplace_k=1 dec_out=k rope_table=deepseek-v3 seed=47
CASES

# fp8_ds_mla tiles holding the values a random draw never gives (core/SPEC.md "The fp8_ds_mla
# layout"): +-inf (scale inf, the positive NaN 0x7f for each infinity), NaNs of both signs (kept,
# skipped by the amax), an all-zero tile with -0, a tile of subnormals only, the largest finite
# bf16 values. The inputs of a drawn case, edited here, then written with `golden write --inputs`.
while read -r name repro; do
  wanted "$name" || continue
  tmp=$(mktemp -d)
  "$bin" golden write --force --repro "$repro" --out "$tmp/drawn.safetensors" >/dev/null
  python3 - "$tmp/drawn.safetensors" "$tmp/inputs.safetensors" <<'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
names = ["q_nope", "q_pe", "kv_c", "k_pe", "positions", "slot_mapping", "cos_sin"]
tensors = {k: bytearray(data[header[k]["data_offsets"][0]:header[k]["data_offsets"][1]]) for k in names}
kv = tensors["kv_c"]  # [Tk, 512] bf16
assert header["kv_c"]["dtype"] == "BF16" and header["kv_c"]["shape"][1] == 512, header["kv_c"]
def put(t, d, bits):
    struct.pack_into("<H", kv, 2 * (t * 512 + d), bits)
put(0, 130, 0x7F80); put(0, 131, 0xFF80); put(0, 140, 0x3F80)  # tile 1: +inf, -inf, 1.0
put(0, 300, 0xFF80)                                              # tile 2: -inf alone
put(1, 5, 0x7FC0); put(1, 6, 0xFFC1); put(1, 200, 0xFFC0)        # NaNs of both signs
for d in range(384, 512):                                        # tile 3: zeros, -0 on odd d
    put(1, d, 0x8000 if d & 1 else 0)
for d in range(0, 128):                                          # tile 0: subnormals only
    put(2, d, (1 + (d & 7)) | (0x8000 if d & 2 else 0))
put(2, 256, 0x7F7F); put(2, 257, 0xFF7F)                         # the largest finite bf16
meta, offset, out_header, blobs = {}, 0, {}, []
for k in names:
    b = bytes(tensors[k])
    out_header[k] = {"dtype": header[k]["dtype"], "shape": header[k]["shape"], "data_offsets": [offset, offset + len(b)]}
    offset += len(b); blobs.append(b)
h = json.dumps(out_header, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
open(dst, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
  "$bin" golden write --force --repro "$repro" --inputs "$tmp/inputs.safetensors" --out "$out/$name.safetensors" >/dev/null
  rm -rf "$tmp"
  check_size "$name"
done <<'CASES'
ds-mla-v32-specials-amax    tq=3 ts=3 tk=3 h=4 p=64 bs=16 nb=1 layout=fp8_ds_mla cache=u8 ds_scale=amax seed=48
ds-mla-v32-specials-pow2    tq=3 ts=3 tk=3 h=4 p=64 bs=16 nb=1 style=neox layout=fp8_ds_mla cache=u8 ds_scale=pow2 seed=49
CASES
