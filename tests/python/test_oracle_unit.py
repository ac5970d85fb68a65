"""Self-tests of the numpy oracle that need no C++ build: hand-computed tiny cases (Dr = 4, f32)
pinning each option of core/SPEC.md, the exact-rounding helper against Fraction (ties
included), and the saturation rules."""
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import oracle as o

F32 = np.float32
NAN = float("nan")


def make_case(repro, q_pe=None, k_pe=None, q_nope=None, kv_c=None, positions=None, slots=None,
              cos=(1.0, 1.0), sin=(0.0, 0.0), table_rows=None, fill=-7.0):
    """A tiny f32 case: Dr = 4, Dn = 2, H = 1 unless the repro says otherwise. Row 0 of the
    table is the identity (cos 1, sin 0); the last row holds cos/sin; outputs start at `fill`
    (a poison value no correct write produces)."""
    p = o.parse_repro("h=1 dn=2 dr=4 p=2 bs=2 nb=2 in=f32 table_dtype=f32 qo=f32 cache=f32 "
                      + repro)
    tq, ts, tk, h, dn, dr, P = p["tq"], p["ts"], p["tk"], p["h"], p["dn"], p["dr"], p["p"]
    half = dr // 2
    dt = o.NP_DTYPES[p["in"]]
    tab = np.zeros((P, half), F32), np.zeros((P, half), F32)
    tab[0][:] = 1.0
    tab[0][P - 1] = cos
    tab[1][P - 1] = sin
    t = {}
    rng = np.random.default_rng(0)
    t["q_pe"] = (np.asarray(q_pe, F32) if q_pe is not None else
                 rng.integers(-4, 5, (tq, h, dr)).astype(F32)).reshape(tq, h, dr).astype(dt)
    t["k_pe"] = (np.asarray(k_pe, F32) if k_pe is not None else
                 rng.integers(-4, 5, (tk, dr)).astype(F32)).reshape(tk, dr).astype(dt)
    t["q_nope"] = (np.asarray(q_nope, F32) if q_nope is not None else
                   np.arange(tq * h * dn, dtype=F32) + 1).reshape(tq, h, dn).astype(dt)
    t["kv_c"] = (np.asarray(kv_c, F32) if kv_c is not None else
                 np.arange(tk * dn, dtype=F32) + 100).reshape(tk, dn).astype(dt)
    t["positions"] = np.asarray(positions if positions is not None else [P - 1] * tk, np.int64)
    t["slot_mapping"] = np.asarray(slots if slots is not None else list(range(ts)), np.int64)
    tdt = o.NP_DTYPES[p["table_dtype"]]
    if p["table"] == "one":
        t["cos_sin"] = np.concatenate(tab, axis=1).astype(tdt)
    else:
        t["cos"], t["sin"] = tab[0].astype(tdt), tab[1].astype(tdt)
    qo, cd = o.NP_DTYPES[p["qo"]], o.NP_DTYPES[p["cache"]]
    t["q_out.initial"] = np.full((tq, h, dn + dr), fill, F32).astype(qo)
    nb, bs = p["nb"], p["bs"]
    if p["layout"] == "joint":
        t["cache.initial"] = np.full((nb, bs, dn + dr), fill, F32).astype(cd)
    else:
        t["ckv_cache.initial"] = np.full((nb, bs, dn), fill, F32).astype(cd)
        t["kpe_cache.initial"] = np.full((nb, bs, dr), fill, F32).astype(cd)
    return p, t


def f(a):
    return np.asarray(a, dtype=np.float64).tolist()


# --- rope styles and tables ------------------------------------------------------------------
# q_pe = [1, 2, 3, 4], C = [0.5, 2], S = [0.25, -1]
# gptj pairs (0,1), (2,3): [1*.5 - 2*.25, 2*.5 + 1*.25, 3*2 - 4*-1, 4*2 + 3*-1] = [0, 1.25, 10, 5]
# neox pairs (0,2), (1,3): [1*.5 - 3*.25, 2*2 - 4*-1, 3*.5 + 1*.25, 4*2 + 2*-1] = [-.25, 8, 1.75, 6]
@pytest.mark.parametrize("table", ["one", "two"])
@pytest.mark.parametrize("style,want", [("gptj", [0, 1.25, 10, 5]), ("neox", [-0.25, 8, 1.75, 6])])
def test_rope_styles_and_tables(style, want, table):
    p, t = make_case(f"style={style} table={table}", q_pe=[1, 2, 3, 4], k_pe=[1, 2, 3, 4],
                     cos=(0.5, 2.0), sin=(0.25, -1.0))
    out = o.expected_outputs(p, t)
    assert f(out["q_out.expected"][0, 0]) == [1, 2] + want
    # slot 0 -> block 0, entry 0; joint nope_first
    assert f(out["cache.expected"][0, 0]) == [100, 101] + want
    assert f(out["cache.expected"][0, 1]) == [-7] * 6 and f(out["cache.expected"][1]) == [[-7] * 6] * 2


def test_table_one_reads_cos_then_sin_halves():
    # table one row = [c0, c1, s0, s1]; swapping the halves must change the result
    p, t = make_case("", q_pe=[1, 0, 0, 0], cos=(0.0, 0.0), sin=(1.0, 1.0))
    assert f(t["cos_sin"][1]) == [0, 0, 1, 1]
    assert f(o.expected_outputs(p, t)["q_out.expected"][0, 0, 2:]) == [0, 1, 0, 0]


def test_position_selects_row_and_is_shared_by_q_and_k():
    # token 0 at position 0 (identity), token 1 at position 1 (cos 0, sin 1: a' = -b, b' = a)
    p, t = make_case("tq=2 ts=2 tk=2", q_pe=[[1, 2, 3, 4], [1, 2, 3, 4]],
                     k_pe=[[5, 6, 7, 8], [5, 6, 7, 8]], positions=[0, 1], cos=(0, 0), sin=(1, 1))
    out = o.expected_outputs(p, t)
    assert f(out["q_out.expected"][:, 0, 2:]) == [[1, 2, 3, 4], [-2, 1, -4, 3]]
    assert f(out["cache.expected"][0, :, 2:]) == [[5, 6, 7, 8], [-6, 5, -8, 7]]


# --- positions out of range ------------------------------------------------------------------
def test_pos_oob_clamp_and_error():
    kw = dict(q_pe=[1, 2, 3, 4], cos=(0, 0), sin=(1, 1))
    p, t = make_case("pos_oob=clamp", positions=[5], **kw)  # clamped to P - 1 = 1
    assert f(o.expected_outputs(p, t)["q_out.expected"][0, 0, 2:]) == [-2, 1, -4, 3]
    p, t = make_case("pos_oob=clamp", positions=[-3], **kw)  # clamped to 0 (identity)
    assert f(o.expected_outputs(p, t)["q_out.expected"][0, 0, 2:]) == [1, 2, 3, 4]
    p, t = make_case("", positions=[2], **kw)
    with pytest.raises(ValueError, match="positions"):
        o.expected_outputs(p, t)


def test_unused_token_position_is_never_read():
    # token 1: slot -1, q skipped -> unused; its position 99 is out of range but no error
    p, t = make_case("tq=2 ts=2 tk=3 pad_q=skipped", slots=[0, -1], positions=[1, 99, 99])
    out = o.expected_outputs(p, t)
    assert f(out["q_out.expected"][1, 0]) == [-7] * 6
    p, t = make_case("tq=2 ts=2 tk=3 pad_q=computed", slots=[0, -1], positions=[1, 99, 99])
    with pytest.raises(ValueError, match="positions"):
        o.expected_outputs(p, t)


# --- padding tokens, pad_q, tokens >= Ts ---------------------------------------------------
@pytest.mark.parametrize("pad_q", ["computed", "skipped"])
def test_padding_slot(pad_q):
    p, t = make_case(f"tq=2 ts=3 tk=4 pad_q={pad_q} inplace_k=1 inplace_q=1",
                     q_pe=[[1, 2, 3, 4], [1, 2, 3, 4]], k_pe=[[1, 2, 3, 4]] * 4,
                     slots=[-1, 3, 0], cos=(0, 0), sin=(1, 1))
    out = o.expected_outputs(p, t)
    rot = [-2, 1, -4, 3]
    # token 0 is padding: no cache write; its q row computed or left as it was
    assert f(out["q_out.expected"][0, 0]) == ([1, 2] + rot if pad_q == "computed" else [-7] * 6)
    assert f(out["q_pe.expected"][0, 0]) == (rot if pad_q == "computed" else [1, 2, 3, 4])
    assert f(out["q_out.expected"][1, 0]) == [3, 4] + rot
    # token 1 -> slot 3 = block 1 entry 1; token 2 (t >= Tq) -> slot 0; token 3 (t >= Ts) nothing
    c = out["cache.expected"]
    assert f(c[1, 1]) == [102, 103] + rot and f(c[0, 0]) == [104, 105] + rot
    assert f(c[0, 1]) == [-7] * 6 and f(c[1, 0]) == [-7] * 6
    assert f(out["k_pe.expected"]) == [[1, 2, 3, 4], rot, rot, [1, 2, 3, 4]]


def test_zero_tokens_is_a_no_op():
    p, t = make_case("tq=0 ts=0 tk=2 inplace_k=1", positions=[7, 7])
    out = o.expected_outputs(p, t)
    assert out["q_out.expected"].shape == (0, 1, 6)
    assert (out["cache.expected"] == t["cache.initial"]).all()
    assert (out["k_pe.expected"] == t["k_pe"]).all()


# --- cache addressing and layouts -------------------------------------------------------------
def test_block_and_entry_and_order():
    p, t = make_case("ts=3 tk=3 tq=1 bs=3 nb=3 order=rope_first", k_pe=[[1, 2, 3, 4]] * 3,
                     slots=[7, 2, 3])
    c = o.expected_outputs(p, t)["cache.expected"]
    # slot 7 -> block 2 entry 1; slot 2 -> block 0 entry 2; slot 3 -> block 1 entry 0
    assert f(c[2, 1]) == [1, 2, 3, 4, 100, 101]
    assert f(c[0, 2]) == [1, 2, 3, 4, 102, 103]
    assert f(c[1, 0]) == [1, 2, 3, 4, 104, 105]
    written = {(2, 1), (0, 2), (1, 0)}
    for b in range(3):
        for e in range(3):
            if (b, e) not in written:
                assert f(c[b, e]) == [-7] * 6


def test_split_layout():
    p, t = make_case("layout=split ts=2 tk=2", k_pe=[[1, 2, 3, 4]] * 2, slots=[3, 0],
                     cos=(0, 0), sin=(1, 1))
    out = o.expected_outputs(p, t)
    assert "cache.expected" not in out
    assert f(out["ckv_cache.expected"][1, 1]) == [100, 101]
    assert f(out["kpe_cache.expected"][1, 1]) == [-2, 1, -4, 3]
    assert f(out["ckv_cache.expected"][0, 0]) == [102, 103]
    assert f(out["kpe_cache.expected"][0, 1]) == [-7] * 4


def test_duplicate_and_out_of_range_slots_are_errors():
    p, t = make_case("ts=2 tk=2", slots=[1, 1])
    with pytest.raises(ValueError, match="duplicate"):
        o.expected_outputs(p, t)
    p, t = make_case("ts=2 tk=2", slots=[1, 4])  # nb * bs = 4
    with pytest.raises(ValueError, match="slot_mapping"):
        o.expected_outputs(p, t)
    p, t = make_case("ts=2 tk=2", slots=[-1, -1])  # duplicate padding slots are fine
    o.expected_outputs(p, t)


def test_inplace_written_in_input_dtype_without_scale():
    # bf16 inputs, fp8 outputs with scale 2: in-place values are bf16 and unscaled
    p, t = make_case("in=bf16 qo=fp8_e4m3fn cache=fp8_e4m3fn k_scale=2 q_scale=4 inplace_q=1 "
                     "inplace_k=1", q_pe=[1, 2, 3, 4], k_pe=[1, 2, 3, 4], q_nope=[8, 16],
                     kv_c=[8, 16], cos=(0, 0), sin=(1, 1))
    out = o.expected_outputs(p, t)
    assert out["q_pe.expected"].dtype == ml_dtypes.bfloat16
    assert f(out["q_pe.expected"][0, 0]) == [-2, 1, -4, 3]
    assert f(out["k_pe.expected"][0]) == [-2, 1, -4, 3]
    assert f(out["q_out.expected"][0, 0]) == [2, 4, -0.5, 0.25, -1, 0.75]
    assert f(out["cache.expected"][0, 0]) == [4, 8, -1, 0.5, -2, 1.5]


def test_non_fp8_outputs_ignore_scales():
    p, t = make_case("k_scale=3 q_scale=5 scale_conv=reciprocal", q_pe=[1, 2, 3, 4],
                     q_nope=[1, 2])
    out = o.expected_outputs(p, t)
    assert f(out["q_out.expected"][0, 0]) == [1, 2, 1, 2, 3, 4]


# --- scale conventions ------------------------------------------------------------------------
def test_divide_vs_reciprocal_rope():
    # v = 3.1875: v / 3 = 1.0625 exactly, a tie of e4m3fn between 1.0 and 1.125 -> 1.0 (even);
    # v * fp32(1/3) = 1.06250003... -> 1.125
    for conv, want in (("divide", 1.0), ("reciprocal", 1.125)):
        p, t = make_case(f"qo=fp8_e4m3fn q_scale=3 scale_conv={conv}", q_pe=[3.1875, 0, 0, 0],
                         q_nope=[3.1875, 0])
        q = o.expected_outputs(p, t)["q_out.expected"][0, 0]
        assert float(q[2]) == want, conv
        # nope goes through fp32: fp32(3.1875 / 3) = 1.0625 and fp32(3.1875 * fp32(1/3)) =
        # fp32(1.06250003166) = 1.0625 too: both the tie, both -> 1.0
        assert float(q[0]) == 1.0, conv


def test_divide_vs_reciprocal_nope_fp32_rounding():
    # data-movement elements go through fp32: x / s vs x * fp32(1/s) differ in fp32 for some x
    x = np.float32(np.arange(1, 2000, dtype=np.float32) / 7)
    s = np.float32(3)
    d = o.convert_nope(x, "f32", "divide", s)  # non-fp8: scale ignored
    assert (d == x).all()
    dv = (x / s).astype(ml_dtypes.float8_e4m3fn)
    rc = (x * (np.float32(1) / s)).astype(ml_dtypes.float8_e4m3fn)
    assert (o.convert_nope(x, "fp8_e4m3fn", "divide", s).view(np.uint8) == dv.view(np.uint8)).all()
    assert (o.convert_nope(x, "fp8_e4m3fn", "reciprocal", s).view(np.uint8)
            == rc.view(np.uint8)).all()


# --- saturation -------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,mx", [("fp8_e4m3fn", 448), ("fp8_e4m3fnuz", 240),
                                    ("fp8_e5m2", 57344), ("fp8_e5m2fnuz", 57344)])
def test_fp8_saturation(fmt, mx):
    x = np.array([1e6, -1e6, np.inf, -np.inf, mx, -mx, np.nan], F32)
    nope = o.convert_nope(x, fmt, "divide", np.float32(1)).astype(np.float64)
    assert f(nope[:6]) == [mx, -mx, mx, -mx, mx, -mx] and np.isnan(nope[6])
    # rope elements with cos = sin = 1: a' = a - b, b' = b + a (an inf times sin 0 would be NaN)
    big = mx * 1.5
    p, t = make_case(f"tq=2 ts=2 tk=2 cache={fmt} qo={fmt}",
                     q_pe=[[1e6, 1, -1e6, 1], [np.inf, 1, -np.inf, 1]],
                     k_pe=[[np.nan, 1, 2, 1], [big, 0, -big, 0]], cos=(1, 1), sin=(1, 1))
    with np.errstate(invalid="ignore"):
        out = o.expected_outputs(p, t)
    q = out["q_out.expected"].astype(np.float64)
    assert f(q[:, 0, 2:]) == [[mx, mx, -mx, -mx]] * 2
    c = out["cache.expected"].astype(np.float64)
    assert np.isnan(c[0, 0, 2:4]).all() and f(c[0, 0, 4:]) == [1, 3]
    assert f(c[0, 1, 2:]) == [mx, mx, -mx, -mx]


def test_fp8_just_below_saturation_rounds_normally():
    # e4m3fn: 464 is the midpoint between 448 and 480 (not a value); below it rounds to 448
    fmt = o.FORMATS["fp8_e4m3fn"]
    assert o.round_fraction_to_format(Fraction(460), fmt) == 448
    assert o.round_fraction_to_format(Fraction(-10**9), fmt) == -448
    assert o.round_fraction_to_format(Fraction(432), fmt) == 448  # tie 416|448 -> even 448
    assert o.round_fraction_to_format(Fraction(424), fmt) == 416


def test_ieee_outputs_overflow_to_inf():
    fmt = o.FORMATS["f16"]
    assert o.round_fraction_to_format(Fraction(65519), fmt) == 65504
    assert o.round_fraction_to_format(Fraction(65520), fmt) == math.inf  # tie, 65504 is odd
    r = o.round_exact_to_format(np.array([65520.0, -65520.0, 65519.0]), np.zeros(3), fmt)
    assert r.tolist() == [math.inf, -math.inf, 65504]


def test_fnuz_has_no_negative_zero_and_fn_keeps_it():
    for name in o.FP8:
        # -1e-9 rounds to -0; -0 + -0 is -0
        vals = o.round_exact_to_format(np.array([-1e-9, -0.0]), np.array([0.0, -0.0]),
                                       o.FORMATS[name])
        bits = o.encode(vals, name).view(np.uint8).tolist()
        assert bits == ([0, 0] if name.endswith("fnuz") else [0x80, 0x80]), name


def test_zero_sign_follows_ieee_addition():
    fmt = o.FORMATS["f32"]
    r = o.round_exact_to_format(np.array([1.5, -0.0, 0.0]), np.array([-1.5, -0.0, -0.0]), fmt)
    assert [math.copysign(1, x) for x in r] == [1, -1, 1]


# --- exact rounding vs Fraction ---------------------------------------------------------------
def _fr(x):
    return Fraction(float(x))


def _ties_for(fmt, rng, n):
    """Values a, b (exact products of fp32 values) whose sum lies exactly on a midpoint of
    fmt, or one fp32 product away from it, across the normal and subnormal range."""
    emin, m = fmt.emin, fmt.man_bits
    e = rng.integers(emin - m, min(emin + 40, 127) if fmt.name != "f32" else 100, n)
    mant = rng.integers(0, 2 ** m, n)
    y = np.ldexp((2 ** m + mant).astype(np.float64), np.maximum(e, emin) - m)  # normal
    y = np.where(e < emin, np.ldexp(mant.astype(np.float64), emin - m), y)    # subnormal
    half_q = np.ldexp(1.0, np.maximum(e, emin) - m - 1)
    a = y.astype(F32).astype(np.float64)
    assert (a == y).all()
    wobble = rng.choice([1.0, 1 + 2.0 ** -23, 1 - 2.0 ** -24], n)
    b = half_q.astype(F32).astype(np.float64) * wobble.astype(F32).astype(np.float64)
    sign = rng.choice([-1.0, 1.0], n)
    return sign * a, sign * b


@pytest.mark.parametrize("name", list(o.FORMATS))
def test_exact_rounding_matches_fraction(name):
    fmt = o.FORMATS[name]
    rng = np.random.default_rng(hash(name) % 2**32)
    n = 3000
    # random products of fp32 values, wide exponent range, with cancellation
    x = (rng.standard_normal((4, n)) * np.exp2(rng.integers(-30, 30, (4, n)))).astype(F32)
    a = x[0].astype(np.float64) * x[1].astype(np.float64)
    b = x[2].astype(np.float64) * x[3].astype(np.float64)
    b[: n // 4] = -a[: n // 4] * (1 + rng.integers(-3, 4, n // 4) * 2.0 ** -20)  # cancel
    ta, tb = _ties_for(fmt, rng, n)
    a, b = np.concatenate([a, ta]), np.concatenate([b, tb])
    for conv, sc in ((None, None), ("divide", F32(3)), ("reciprocal", F32(1) / F32(3)),
                     ("divide", F32(0.0078125))):
        got = o.round_exact_to_format(a, b, fmt, conv, sc)
        for i in range(a.size):
            v = _fr(a[i]) + _fr(b[i])
            if conv == "divide":
                v /= _fr(sc)
            elif conv == "reciprocal":
                v *= _fr(sc)
            want = o.round_fraction_to_format(v, fmt, negative_zero=bool(np.signbit(a[i] + b[i])))
            assert got[i] == want and math.copysign(1, got[i]) == math.copysign(1, want), (
                name, conv, a[i], b[i], got[i], want)


def test_round_fraction_brute_force_nearest_even():
    # midpoints between neighbouring values of each small format (found by decoding every code
    # with ml_dtypes) round to the neighbour with the even code; a hair off a midpoint rounds
    # to the nearer neighbour
    rng = np.random.default_rng(5)
    for name in ("f16", "bf16") + o.FP8:
        dt = o.NP_DTYPES[name]
        cdt = np.uint16 if dt.itemsize == 2 else np.uint8
        codes = np.arange(2 ** (8 * dt.itemsize), dtype=np.int64).astype(cdt)
        with np.errstate(invalid="ignore"):
            vals = codes.view(dt).astype(np.float64)
        vals = np.unique(vals[np.isfinite(vals)])
        mids = (vals[:-1] + vals[1:]) / 2
        zero = int(np.searchsorted(vals, 0.0))
        pick = np.unique(np.concatenate([np.arange(min(mids.size, 20)),
                                         np.arange(max(0, mids.size - 20), mids.size),
                                         np.arange(max(0, zero - 20), min(mids.size, zero + 20)),
                                         rng.integers(0, mids.size, 600)]))
        fmt = o.FORMATS[name]
        for i in pick:
            lo, hi, mval = vals[i], vals[i + 1], mids[i]
            lo_c = int(np.array(lo).astype(dt).view(cdt))
            hi_c = int(np.array(hi).astype(dt).view(cdt))
            even = lo if (lo_c & 1) == 0 else hi
            assert (lo_c & 1) != (hi_c & 1), (name, lo, hi)
            assert o.round_fraction_to_format(Fraction(mval), fmt) == even, (name, mval)
            tiny = Fraction(1, 2**200)
            assert o.round_fraction_to_format(Fraction(mval) + tiny, fmt) == hi, (name, mval)
            assert o.round_fraction_to_format(Fraction(mval) - tiny, fmt) == lo, (name, mval)


def test_double_rounding_tie_is_classified():
    # a = (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24: exactly an f32 midpoint; b = 2^-80 (2^-40 * 2^-40)
    # exact a + b rounds up; the double evaluation lands on the tie and rounds to even (down).
    a = np.array([float(F32(1 + 2.0 ** -12)) ** 2])
    b = np.array([float(F32(2.0 ** -40)) ** 2])
    fmt = o.FORMATS["f32"]
    exact = o.round_exact_to_format(a, b, fmt)[0]
    double = o.round_double_eval_to_format(a, b, fmt)[0]
    assert exact == 1 + 2.0 ** -11 + 2.0 ** -23
    assert double == 1 + 2.0 ** -11


# --- parsing and golden I/O -------------------------------------------------------------------
def test_parse_repro_defaults_and_values():
    p = o.parse_repro("")
    assert p["h"] == 128 and p["dn"] == 512 and p["dr"] == 64 and p["p"] == 4096
    assert p["bs"] == 64 and p["in"] == "bf16" and p["pos"] == "i64" and p["style"] == "gptj"
    assert p["inplace_q"] is False and p["k_scale"] == F32(1) and p["amp"] == 4.0
    p = o.parse_repro("k_scale=0.1 inplace_k=1 style=neox tq=3 rope_table=kimi-k2")
    assert p["k_scale"] == F32(0.1) and p["k_scale"].dtype == F32
    assert p["inplace_k"] is True and p["style"] == "neox" and p["tq"] == 3
    for bad in ("bogus=1", "tq=x", "style=foo", "inplace_q=2", "tq"):
        with pytest.raises(ValueError):
            o.parse_repro(bad)


def test_float32_from_decimal_is_correctly_rounded():
    # 1 + 2^-24 + 2^-60: decimal -> double rounds to 1 + 2^-24 (a float32 tie, -> 1.0), but the
    # exact decimal lies above the tie -> 1 + 2^-23
    exact = Fraction(1) + Fraction(1, 2**24) + Fraction(1, 2**60)
    # the exact decimal expansion (the denominator is a power of two, so it terminates)
    digits = exact.numerator * 10**60 // exact.denominator
    s = f"{digits // 10**60}.{digits % 10**60:060d}"
    assert Fraction(s) == exact
    assert np.float32(float(s)) == F32(1)  # the double detour rounds twice
    assert o.float32_from_decimal(s) == F32(1 + 2.0 ** -23)


def test_load_golden_roundtrip_every_dtype(tmp_path):
    from safetensors.numpy import save_file
    rng = np.random.default_rng(3)
    arrays, dtypes, st = {}, {}, {}
    for name, dt in o.NP_DTYPES.items():
        a = rng.integers(0, 255, (3, 5)).astype(np.uint8)
        arr = np.frombuffer(np.repeat(a, dt.itemsize).tobytes(), dtype=dt)[:15].reshape(3, 5)
        arrays[name] = arr
        dtypes[name] = name
        st[name] = arr.view(np.uint8) if name.endswith("fnuz") else arr
    import json
    save_file(st, str(tmp_path / "c.safetensors"), metadata={"dtypes": json.dumps(dtypes),
                                                            "repro": "tq=1"})
    meta, ts = o.load_golden(tmp_path / "c.safetensors")
    assert meta["repro"] == "tq=1"
    for name, arr in arrays.items():
        assert ts[name].dtype == arr.dtype and ts[name].shape == arr.shape, name
        assert ts[name].tobytes() == arr.tobytes(), name
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 12)
    with pytest.raises(ValueError):
        o.load_golden(tmp_path / "bad.safetensors")
