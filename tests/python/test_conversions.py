"""Cross-check of ropekv's host conversions (core/convert.cpp) against ml_dtypes.

ropekv_convert_dump (tests/tools/convert_dump.cpp, built into $ROPEKV_BUILD) decodes every code
and encodes arrays of inputs; this test compares with ml_dtypes / numpy:
- decode: every code of f16, bf16 and the four fp8 formats;
- encode, ieee mode (= ml_dtypes): every tie between consecutive representable values (both
  signs, the tie just above max included) with its float32 neighbours, the boundaries around max
  and the smallest subnormal, specials, and >= 10^6 random float32 values per format;
- encode, saturate mode: clip to +-max first, then ml_dtypes (fp8 only; f16/bf16/f32 ignore it).
"""
import os
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

SMALL = {
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "fp8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "fp8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
    "fp8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32}
MODES = ["saturate", "ieee"]
N_RANDOM = 1_000_000
# Casting NaN / inf / overflowing values is the point of these tests: numpy's cast warnings
# are expected noise.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(scope="module")
def dump_tool() -> str:
    build = os.environ.get("ROPEKV_BUILD")
    if not build:
        pytest.skip("ROPEKV_BUILD is not set (point it at the CMake build dir holding ropekv_convert_dump)")
    path = Path(build) / "ropekv_convert_dump"
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: build the ropekv_convert_dump target")
    return str(path)


def run_encode(tool, tmp_path, x: np.ndarray, dtype_name: str, mode: str, np_dtype) -> np.ndarray:
    kind = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}[x.dtype]
    src, dst = tmp_path / f"in_{dtype_name}_{mode}.bin", tmp_path / f"out_{dtype_name}_{mode}.bin"
    x.astype(x.dtype.newbyteorder("<")).tofile(src)
    subprocess.run([tool, "encode", kind, dtype_name, mode, str(src), str(dst)], check=True)
    width = np.dtype(np_dtype).itemsize
    return np.fromfile(dst, dtype=np.dtype(UINT[width]).newbyteorder("<")).astype(UINT[width])


def all_codes(np_dtype) -> np.ndarray:
    width = np.dtype(np_dtype).itemsize
    return np.arange(1 << (8 * width), dtype=np.uint64).astype(UINT[width])


def finite_values(np_dtype) -> np.ndarray:
    """Sorted distinct finite non-negative values of the format, via ml_dtypes."""
    v = all_codes(np_dtype).view(np_dtype).astype(np.float64)
    v = v[np.isfinite(v)]
    return np.unique(np.abs(v))


def tie_and_boundary_inputs(np_dtype) -> np.ndarray:
    """Every representable value, every midpoint (incl. the one above max), their float32
    neighbours, both signs, and specials. All are exact float32 values."""
    v = finite_values(np_dtype)
    spacing_at_max = v[-1] - v[-2]
    ext = np.append(v, v[-1] + spacing_at_max)  # virtual next-above
    mids = (ext[:-1] + ext[1:]) / 2
    mids32 = mids.astype(np.float32)
    assert np.all(mids32.astype(np.float64) == mids), "midpoints must be exact float32"
    pts = [v.astype(np.float32), mids32,
           np.nextafter(mids32, np.float32(0)), np.nextafter(mids32, np.float32(np.inf)),
           np.float32([ext[-1], 2 * ext[-1], np.finfo(np.float32).max, np.inf, np.nan, 0.0,
                       v[1] / 4, np.finfo(np.float32).smallest_subnormal, 1e-30, 1e30])]
    x = np.concatenate(pts).astype(np.float32)
    return np.concatenate([x, -x])


def random_inputs(np_dtype, seed: int) -> np.ndarray:
    """N_RANDOM float32: half arbitrary bit patterns, half log-uniform over the format's range
    (+-3 binades), random signs."""
    rng = np.random.default_rng(seed)
    n_bits = N_RANDOM // 2
    a = rng.integers(0, 1 << 32, size=n_bits, dtype=np.uint64).astype(np.uint32).view(np.float32)
    info = ml_dtypes.finfo(np_dtype)
    lo = np.log2(float(info.smallest_subnormal)) - 3
    hi = np.log2(float(info.max)) + 3
    e = rng.uniform(lo, hi, size=N_RANDOM - n_bits)
    b = (np.exp2(e) * rng.choice([-1.0, 1.0], size=e.size)).astype(np.float32)
    return np.concatenate([a, b])


def expected(x: np.ndarray, np_dtype, mode: str, is_fp8: bool) -> np.ndarray:
    width = np.dtype(np_dtype).itemsize
    if mode == "saturate" and is_fp8:
        m = float(ml_dtypes.finfo(np_dtype).max)
        x = np.where(np.isnan(x), x, np.clip(x, -m, m)).astype(x.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np_dtype).view(UINT[width])


def compare_codes(name, mode, x, got, want, np_dtype):
    """Bits must be equal, except that any NaN matches any NaN (payload/sign of NaN is not part
    of the contract for ml_dtypes; ropekv's canonical NaN is checked in the C++ tests)."""
    got_nan = np.isnan(got.view(np_dtype).astype(np.float32))
    want_nan = np.isnan(want.view(np_dtype).astype(np.float32))
    bad = (got != want) & ~(got_nan & want_nan)
    if bad.any():
        idx = np.flatnonzero(bad)[:8]
        lines = [f"x={x[i]!r} ({np.float64(x[i]).hex()}): ropekv 0x{int(got[i]):x}, ml_dtypes 0x{int(want[i]):x}"
                 for i in idx]
        pytest.fail(f"{name} {mode}: {bad.sum()} of {x.size} encodings differ:\n" + "\n".join(lines))


@pytest.mark.parametrize("name", list(SMALL))
def test_decode_every_code_matches_ml_dtypes(dump_tool, tmp_path, name):
    np_dtype = SMALL[name]
    out = tmp_path / f"decode_{name}.bin"
    subprocess.run([dump_tool, "decode", name, str(out)], check=True)
    got = np.fromfile(out, dtype="<f8")
    want = all_codes(np_dtype).view(np_dtype).astype(np.float64)
    assert got.size == want.size == (1 << (8 * np.dtype(np_dtype).itemsize))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok], want[ok])
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(SMALL))
def test_encode_ties_boundaries_and_random_match_ml_dtypes(dump_tool, tmp_path, name, mode):
    np_dtype = SMALL[name]
    is_fp8 = name.startswith("fp8")
    seed = 1000 + list(SMALL).index(name)
    x = np.concatenate([tie_and_boundary_inputs(np_dtype), random_inputs(np_dtype, seed)])
    assert x.dtype == np.float32 and x.size >= N_RANDOM
    got = run_encode(dump_tool, tmp_path, x, name, mode, np_dtype)
    assert got.size == x.size
    compare_codes(name, mode, x, got, expected(x, np_dtype, mode, is_fp8), np_dtype)


def nearest_even_reference(x: np.ndarray, np_dtype, mode: str) -> np.ndarray:
    """Single round-to-nearest-even of float64 x into an fp8 format, by searching the sorted
    table of its values (codes from ml_dtypes' decode); overflow as ml_dtypes / saturate."""
    codes = all_codes(np_dtype)
    vals = codes.view(np_dtype).astype(np.float64)
    keep = np.isfinite(vals) & ~np.signbit(vals)
    order = np.argsort(vals[keep], kind="stable")
    tv, tc = vals[keep][order], codes[keep][order].astype(np.int64)
    tv = np.append(tv, 2 * tv[-1] - tv[-2])  # virtual next-above max: overflow
    tc = np.append(tc, -1)
    a = np.abs(x)
    if mode == "saturate":
        a = np.minimum(a, tv[-2])
    hi = np.clip(np.searchsorted(tv, a, side="left"), 1, tv.size - 1)
    lo = hi - 1
    dlo, dhi = a - tv[lo], tv[hi] - a  # exact in float64 (see test_convert.cpp)
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (tc[lo] % 2 == 1))
    pick_hi |= a > tv[-1]
    code = np.where(pick_hi, tc[hi], tc[lo])
    nan_code = int(np.array(np.nan, dtype=np.float32).astype(np_dtype).view(np.uint8)) & 0x7F
    has_inf = bool(np.isinf(np.float32(np.inf).astype(np_dtype).astype(np.float64)))
    over = (code == -1) | np.isinf(a)
    code = np.where(over, int(np.float32(np.inf).astype(np_dtype).view(np.uint8)) if has_inf
                    else nan_code, code)
    code = np.where(np.isnan(a), nan_code, code)
    fnuz = "fnuz" in np.dtype(np_dtype).name
    if fnuz:  # no -0; the single NaN is 0x80
        code = np.where(np.isnan(a) | (over & ~has_inf), 0x80, code)
        neg = np.signbit(x) & (code != 0) & (code != 0x80)
    else:
        neg = np.signbit(x)
    code = np.where(neg, code | 0x80, code)
    return code.astype(np.uint8)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", [n for n in SMALL if n.startswith("fp8")] + ["f16"])
def test_encode_from_double(dump_tool, tmp_path, name, mode):
    """The f64 entry point on doubles that are not floats: neighbours of every tie in double
    precision, and random doubles. numpy's float64 -> float16 cast rounds once: compared
    directly. For fp8, ropekv is compared with a single-rounding nearest-value search. ml_dtypes
    is then a cross-check of that search: releases from 0.7 on round float64 -> fp8 once (equal
    to it); older releases round through float32, and every disagreement must then be such a
    double-rounding case (float32(x) is a tie, x is not)."""
    np_dtype = SMALL[name]
    v = finite_values(np_dtype)
    ext = np.append(v, 2 * v[-1] - v[-2])
    mids = (ext[:-1] + ext[1:]) / 2
    rng = np.random.default_rng(77)
    info = ml_dtypes.finfo(np_dtype)
    e = rng.uniform(np.log2(float(info.smallest_subnormal)) - 3, np.log2(float(info.max)) + 3, 200_000)
    x = np.concatenate([mids, np.nextafter(mids, 0.0), np.nextafter(mids, np.inf), np.exp2(e),
                        [np.inf, np.nan, 0.0, 1e300, 1e-300]])
    x = np.concatenate([x, -x]).astype(np.float64)
    got = run_encode(dump_tool, tmp_path, x, name, mode, np_dtype)
    ml = expected(x, np_dtype, mode, name.startswith("fp8"))
    if name == "f16":
        compare_codes(name, mode, x, got, ml, np_dtype)
        return
    ref = nearest_even_reference(x, np_dtype, mode)
    compare_codes(name, mode, x, got, ref, np_dtype)
    differ = (ml != ref) & ~(np.isnan(x))
    x32 = x.astype(np.float32).astype(np.float64)
    on_tie = np.isin(np.abs(x32), mids) & (x32 != x)
    assert np.all(on_tie[differ]), (
        f"ml_dtypes {ml_dtypes.__version__} differs from single rounding on {int(differ.sum())} "
        f"inputs, not all explained by rounding through float32")


@pytest.mark.parametrize("mode", MODES)
def test_f32_encode(dump_tool, tmp_path, mode):
    """float32 -> f32 is the identity on bits; float64 -> f32 is numpy's IEEE rounding."""
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 1 << 32, size=200_000, dtype=np.uint64).astype(np.uint32)
    x32 = bits.view(np.float32)
    got = run_encode(dump_tool, tmp_path, x32, "f32", mode, np.float32)
    np.testing.assert_array_equal(got, bits)
    x64 = np.concatenate([
        rng.integers(0, 1 << 64, size=200_000, dtype=np.uint64).view(np.float64),
        np.exp2(rng.uniform(-155, 130, 200_000)) * rng.choice([-1.0, 1.0], 200_000)])
    got = run_encode(dump_tool, tmp_path, x64, "f32", mode, np.float32)
    with np.errstate(over="ignore"):
        compare_codes("f32", mode, x64, got, x64.astype(np.float32).view(np.uint32), np.float32)
