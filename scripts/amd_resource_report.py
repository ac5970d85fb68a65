#!/usr/bin/env python3
"""Per-kernel resource table from AMDGPU resource-usage remarks (stdin or files).

Reads the compiler's `-Rpass-analysis=kernel-resource-usage` remarks (clang / hipcc), which
report for every kernel the values the compiler writes into its code object's metadata:
SGPRs, VGPRs, AGPRs, scratch bytes per lane, occupancy (waves per SIMD), SGPR / VGPR spills and
LDS bytes per block. Prints one markdown row per kernel, fast_v4 instantiations named as
`fast4<q,cache,style,table>[R,D]` (R: q rows shape, 0 zero-copy / 1 / 2 rows per group; D: bit 0
decode outputs, bit 1 fp8_ds_mla), the dtype codes as in backends/hip/kernel_dtype.h.
Usage: amd_resource_report.py [LOG ...] > table.md
"""
import re
import subprocess
import sys

FIELDS = [("SGPRs", "sgpr"), ("VGPRs", "vgpr"), ("AGPRs", "agpr"), ("ScratchSize [bytes/lane]", "scratch"),
          ("Occupancy [waves/SIMD]", "occupancy"), ("SGPRs Spill", "sgpr_spill"), ("VGPRs Spill", "vgpr_spill"),
          ("LDS Size [bytes/block]", "lds")]
DTYPES = {"-1": "any", "0": "f32", "1": "f16", "2": "bf16", "3": "e4m3fn", "4": "e4m3fnuz", "5": "e5m2",
          "6": "e5m2fnuz"}


def parse(lines):
    kernels, cur = [], None
    for line in lines:
        m = re.search(r"remark: Function Name: (\S+)", line)
        if m:
            cur = {"mangled": m.group(1)}
            kernels.append(cur)
            continue
        if cur is None:
            continue
        for label, key in FIELDS:
            m = re.search(r"remark:\s+" + re.escape(label) + r": (\d+)", line)
            if m:
                cur[key] = int(m.group(1))
    return kernels


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return names


def short(name):
    m = re.search(r"rk_fast4_kernel<ropekv_gpu::rk_v4_spec<(-?\d+), (-?\d+), (-?\d+), (-?\d+)>, (\d+), (\d+)>", name)
    if m:
        q, c, neox, table, r, d = m.groups()
        style = {"-1": "any", "0": "gptj", "1": "neox"}[neox]
        if (q, c, neox, table) == ("-1", "-1", "-1", "-1"):
            return f"fast4<generic>[R{r},D{d}]"
        return f"fast4<{DTYPES[q]},{DTYPES[c]},{style},{DTYPES[table]}>[R{r},D{d}]"
    m = re.search(r"rk_fast4_kernel<ropekv_gpu::rk_v4_generic, (\d+), (\d+)>", name)
    if m:
        return f"fast4<generic>[R{m.group(1)},D{m.group(2)}]"
    name = re.sub(r"\(.*\)$", "", name)
    return name.replace("ropekv_gpu::", "")


def main():
    lines = []
    if len(sys.argv) > 1:
        for path in sys.argv[1:]:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines += f.readlines()
    else:
        lines = sys.stdin.readlines()
    kernels = parse(lines)
    if not kernels:
        sys.exit("amd_resource_report: no kernel-resource-usage remarks in the input")
    names = demangle([k["mangled"] for k in kernels])
    rows = sorted(((short(n), k) for n, k in zip(names, kernels)), key=lambda x: x[0])
    print("| kernel | VGPRs | AGPRs | SGPRs | scratch B/lane | waves/SIMD | VGPR spills | SGPR spills |")
    print("|---|---|---|---|---|---|---|---|")
    for name, k in rows:
        print(f"| {name} | {k.get('vgpr', '?')} | {k.get('agpr', '?')} | {k.get('sgpr', '?')} | {k.get('scratch', '?')} "
              f"| {k.get('occupancy', '?')} | {k.get('vgpr_spill', '?')} | {k.get('sgpr_spill', '?')} |")


if __name__ == "__main__":
    main()
