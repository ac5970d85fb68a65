"""The presets' YaRN tables against an independent numpy recomputation.

The numpy code below is written from vLLM's DeepseekScalingRotaryEmbedding formulas
(_compute_inv_freq, _compute_cos_sin_cache, yarn_find_correction_range, yarn_linear_ramp_mask,
yarn_get_mscale), in float32 like torch. inv_freq must match bit for bit; cos/sin within 1 fp32
ulp (both sides evaluate cos/sin of the float32 angle; numpy's own float32 cos may differ by an
ulp from the correctly-rounded value, so the reference here rounds numpy's float64 cos).
"""
import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

# name -> (theta, factor, beta_fast, beta_slow, original_max_pos, mscale, mscale_all_dim)
PRESETS = {
    "deepseek-v3": (1e4, 40.0, 32.0, 1.0, 4096, 1.0, 1.0),
    "deepseek-v3-tp8": (1e4, 40.0, 32.0, 1.0, 4096, 1.0, 1.0),
    "deepseek-v2-lite": (1e4, 40.0, 32.0, 1.0, 4096, 1.0, 1.0),
    "kimi-k2": (5e4, 32.0, 1.0, 1.0, 4096, 1.0, 1.0),
    "kimi-k2-tp8": (5e4, 32.0, 1.0, 1.0, 4096, 1.0, 1.0),
}
F32 = np.float32


def numpy_yarn(theta, factor, beta_fast, beta_slow, orig, mscale, mscale_all_dim, dim, rows):
    exponents = np.arange(0, dim, 2, dtype=F32) / F32(dim)
    # float32 pow, correctly rounded (= glibc powf, torch CPU's scalar path). numpy's own float32
    # power uses an AVX-512 SIMD routine that is not: it is 1-2 ulp off for 4 of DeepSeek's 32
    # exponents. So: pow in float64, rounded once to float32.
    pos_freqs = np.power(np.float64(F32(theta)), exponents.astype(np.float64)).astype(F32)
    inv_extrapolation = F32(1.0) / pos_freqs
    inv_interpolation = F32(1.0) / (F32(factor) * pos_freqs)

    def correction_dim(rotations):
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = (np.arange(dim // 2, dtype=F32) - F32(low)) / F32(high - low)
    ramp = np.clip(ramp, F32(0), F32(1)).astype(F32)
    mask = (F32(1) - ramp) * F32(1)  # extrapolation_factor = 1
    inv_freq = inv_interpolation * (F32(1) - mask) + inv_extrapolation * mask
    assert inv_freq.dtype == F32

    def get_mscale(scale, m):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m = F32(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
    t = np.arange(rows, dtype=F32)
    freqs = np.outer(t, inv_freq).astype(F32)  # one float32 product per element
    cos = np.cos(freqs.astype(np.float64)).astype(F32) * m
    sin = np.sin(freqs.astype(np.float64)).astype(F32) * m
    return inv_freq, np.concatenate([cos, sin], axis=1), freqs


def ulp_distance_f32(a, b):
    def key(x):
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    return np.abs(key(a) - key(b))


@pytest.fixture(scope="module")
def dump_tool():
    build = os.environ.get("ROPEKV_BUILD")
    if not build:
        pytest.skip("ROPEKV_BUILD is not set (the build folder holding ropekv_yarn_dump)")
    tool = Path(build) / "ropekv_yarn_dump"
    assert tool.is_file(), f"{tool} missing: build the ropekv_yarn_dump target"
    return tool


def cpp_yarn(tool, tmp_path, name, dim, rows):
    inv_path, table_path = tmp_path / "inv.bin", tmp_path / "table.bin"
    subprocess.run([str(tool), name, str(dim), str(rows), str(inv_path), str(table_path)], check=True)
    inv = np.fromfile(inv_path, dtype="<f4")
    table = np.fromfile(table_path, dtype="<f4").reshape(rows, dim)
    return inv, table


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_full_table_matches_numpy(dump_tool, tmp_path, name):
    theta, factor, *_ = PRESETS[name]
    rows = int(math.ceil(4096 * factor))  # vLLM: arange(original_max_pos * factor)
    inv_np, table_np, freqs = numpy_yarn(*PRESETS[name], dim=64, rows=rows)
    inv_cpp, table_cpp = cpp_yarn(dump_tool, tmp_path, name, 64, rows)
    assert inv_cpp.shape == (32,)
    np.testing.assert_array_equal(inv_cpp.view(np.uint32), inv_np.view(np.uint32))
    assert table_cpp.shape == table_np.shape == (rows, 64)
    d = ulp_distance_f32(table_cpp, table_np)
    assert d.max() <= 1, f"max ulp {d.max()} at {np.unravel_index(d.argmax(), d.shape)}"
    # unit magnitude with mscale = 1, and row 0 = [1]*32 + [0]*32
    assert np.all(table_cpp[0, :32] == 1) and np.all(table_cpp[0, 32:] == 0)
    mag = table_cpp[:, :32].astype(np.float64) ** 2 + table_cpp[:, 32:].astype(np.float64) ** 2
    assert np.abs(mag - 1).max() < 1e-6
    # numpy's own float32 cos (SIMD) may round differently; it stays within a few ulp
    d32 = ulp_distance_f32(table_cpp[:, :32], np.cos(freqs))
    assert d32.max() <= 4


@pytest.mark.parametrize("dim", [2, 6, 16, 128])
def test_other_widths_match_numpy(dump_tool, tmp_path, dim):
    for name in ("deepseek-v3", "kimi-k2"):
        inv_np, table_np, _ = numpy_yarn(*PRESETS[name], dim=dim, rows=3000)
        inv_cpp, table_cpp = cpp_yarn(dump_tool, tmp_path, name, dim, 3000)
        np.testing.assert_array_equal(inv_cpp.view(np.uint32), inv_np.view(np.uint32))
        assert ulp_distance_f32(table_cpp, table_np).max() <= 1


def test_detects_a_wrong_table(dump_tool, tmp_path):
    """The comparison can fail: a table built with another factor is far from this one."""
    inv_np, table_np, _ = numpy_yarn(1e4, 32.0, 32.0, 1.0, 4096, 1.0, 1.0, dim=64, rows=1000)
    _, table_cpp = cpp_yarn(dump_tool, tmp_path, "deepseek-v3", 64, 1000)
    assert ulp_distance_f32(table_cpp, table_np).max() > 1000
