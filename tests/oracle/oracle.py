"""Independent numpy oracle for the ropekv op (contract version 1).

Written from core/SPEC.md and docs/golden-format.md alone; it shares no code with the C++
reference (core/, backends/). Public API:

  parse_repro(text)                 -> dict of problem parameters (defaults as core/problem.h)
  load_golden(path)                 -> (meta, tensors): tensors in their real dtypes
  expected_outputs(params, tensors) -> {"q_out.expected": ..., "cache.expected": ..., ...}

Numerics (core/SPEC.md, "Numerics"):
  * data-movement (nope) elements: fp32(x), then for fp8 one fp32 divide or multiply by
    fp32(1/scale) (numpy float32 ops, IEEE), saturate, one ml_dtypes rounding;
  * rope elements: the EXACT value x*C + R(x)*S of the fp32 operands (for fp8 outputs exactly
    divided by scale, or multiplied by fp32(1/scale)), rounded ONCE, to nearest even, by this
    module's own rounding (round_exact_to_format), saturating for fp8.
    The fast path evaluates in np.longdouble (x86 80-bit: products of two fp32 are exact, the
    sum and the scaling carry a relative error <= 2^-63 each); every element whose approximate
    value lies within a guard band of a rounding midpoint is recomputed with
    fractions.Fraction, so the result is the correctly rounded exact value.
  * The contract's own evaluation (double fma, then the scale in double, then one rounding)
    differs from the exact value only where the double result lands exactly on a midpoint of
    the output format. expected_outputs(..., evaluation="double") computes that variant, so a
    test can tell a documented double-rounding tie from a bug.
"""
from __future__ import annotations

import json
import re
import math
import os
import struct
from fractions import Fraction

import ml_dtypes
import numpy as np

if np.finfo(np.longdouble).nmant < 63:  # pragma: no cover - x86-64 Linux has 80-bit longdouble
    raise ImportError("the oracle needs np.longdouble with >= 64-bit significand (x86 80-bit)")

# ---------------------------------------------------------------------------------------------
# dtypes

NP_DTYPES = {
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "fp8_e4m3fnuz": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "fp8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "fp8_e5m2fnuz": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8),
}
FP8 = ("fp8_e4m3fn", "fp8_e4m3fnuz", "fp8_e5m2", "fp8_e5m2fnuz")


class Format:
    """A binary floating-point format: man_bits stored mantissa bits, emin the exponent of the
    smallest normal, max_finite, has_inf (IEEE overflow to inf; fp8 outputs saturate instead)."""

    def __init__(self, name, man_bits, emin, max_finite, has_inf):
        self.name, self.man_bits, self.emin = name, man_bits, emin
        self.max_finite, self.has_inf = float(max_finite), has_inf
        self.saturating = name in FP8

    def __repr__(self):
        return f"Format({self.name})"


FORMATS = {
    "f32": Format("f32", 23, -126, float(np.finfo(np.float32).max), True),
    "f16": Format("f16", 10, -14, 65504.0, True),
    "bf16": Format("bf16", 7, -126, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), True),
    "fp8_e4m3fn": Format("fp8_e4m3fn", 3, -6, 448.0, False),
    "fp8_e4m3fnuz": Format("fp8_e4m3fnuz", 3, -7, 240.0, False),
    "fp8_e5m2": Format("fp8_e5m2", 2, -14, 57344.0, True),
    "fp8_e5m2fnuz": Format("fp8_e5m2fnuz", 2, -15, 57344.0, False),
}
# sanity: our table agrees with ml_dtypes' view of each format
for _n, _f in FORMATS.items():
    _fi = ml_dtypes.finfo(NP_DTYPES[_n]) if _n not in ("f32", "f16") else np.finfo(NP_DTYPES[_n])
    assert float(_fi.max) == _f.max_finite and int(_fi.nmant) == _f.man_bits, _n
    assert float(_fi.smallest_normal) == 2.0 ** _f.emin, _n

# ---------------------------------------------------------------------------------------------
# repro strings

_INT_KEYS = ("tq", "ts", "tk", "h", "kh", "dn", "dr", "p", "bs", "nb", "row_pad", "entry_pad",
             "block_pad", "table_pad", "pad_slots", "seed", "dec")
_ENUMS = {
    "in": ("f32", "f16", "bf16"),
    "table_dtype": ("f32", "f16", "bf16"),
    "pos": ("i32", "i64"),
    "slot": ("i32", "i64"),
    "qo": tuple(FORMATS),
    "cache": tuple(FORMATS) + ("u8",),  # u8: layout fp8_ds_mla's byte entries
    "table": ("one", "two"),
    "style": ("gptj", "neox"),
    "layout": ("joint", "split", "shuffled", "fp8_ds_mla"),
    "ds_scale": ("amax", "pow2"),
    "order": ("nope_first", "rope_first"),
    "scale_conv": ("divide", "reciprocal"),
    "pad_q": ("computed", "skipped"),
    "pos_oob": ("error", "clamp"),
    "q_layout": ("token_major", "head_major"),
    "kv_layout": ("separate", "fused"),
    "scales": ("host", "tensor"),
    "pad_at": ("head", "middle", "tail", "spread"),
    "positions": ("random", "near_end", "same"),
}
DEFAULTS = {
    "tq": 1, "ts": 1, "tk": 1, "h": 128, "kh": 1, "dn": 512, "dr": 64, "p": 4096, "bs": 64, "nb": 1,
    "in": "bf16", "table_dtype": "bf16", "pos": "i64", "slot": "i64", "qo": "bf16",
    "cache": "bf16", "table": "one", "style": "gptj", "layout": "joint", "ds_scale": "amax", "order": "nope_first",
    "scale_conv": "divide", "pad_q": "computed", "pos_oob": "error", "inplace_q": False,
    "inplace_k": False, "k_scale": np.float32(1.0), "q_scale": np.float32(1.0),
    "scales": "host", "q_layout": "token_major", "zero_copy": False, "kv_layout": "separate", "row_pad": 0,
    "entry_pad": 0,
    "block_pad": 0, "table_pad": 0, "pad_slots": 0, "pad_at": "tail", "positions": "random",
    "rope_table": "random", "amp": 4.0, "seed": 1, "dec_out": "none", "dec": 0,
}

_DEC_OUT = re.compile(r"^(none|q?z?k?)$")


def float32_from_decimal(text: str) -> np.float32:
    """Correctly rounded decimal -> binary32 (no detour through double)."""
    v = Fraction(text)
    return np.float32(round_fraction_to_format(v, FORMATS["f32"]))


def parse_repro(text: str) -> dict:
    """Parses a repro string (any order, any subset; missing keys take core/problem.h defaults).
    Raises ValueError naming the key on an unknown key or malformed value."""
    out = dict(DEFAULTS)
    for token in text.split():
        key, sep, value = token.partition("=")
        if not sep or not value:
            raise ValueError(f"repro: expected key=value, got {token!r}")
        if key in _INT_KEYS:
            try:
                out[key] = int(value)
            except ValueError:
                raise ValueError(f"repro: {key} expects an integer, got {value!r}") from None
        elif key in _ENUMS:
            if value not in _ENUMS[key]:
                raise ValueError(f"repro: {key} expects one of {_ENUMS[key]}, got {value!r}")
            out[key] = value
        elif key in ("inplace_q", "inplace_k", "zero_copy"):
            if value not in ("0", "1"):
                raise ValueError(f"repro: {key} expects 0|1, got {value!r}")
            out[key] = value == "1"
        elif key in ("k_scale", "q_scale"):
            try:
                out[key] = float32_from_decimal(value)
            except (ValueError, ZeroDivisionError):
                raise ValueError(f"repro: {key} expects a float, got {value!r}") from None
        elif key == "dec_out":
            # decode outputs passed: none, or letters q (decode_q_pe_out), z (q_nope_zeros_out),
            # k (k_pe_out) in that order
            if not _DEC_OUT.match(value):
                raise ValueError(f"repro: dec_out expects none or letters of qzk in order, got {value!r}")
            out[key] = value
        elif key == "amp":
            out[key] = float(value)
        elif key == "rope_table":
            out[key] = value
        else:
            raise ValueError(f"repro: unknown key {key!r}")
    return out


# ---------------------------------------------------------------------------------------------
# golden files

def _reinterpret(raw: np.ndarray, ropekv_dtype: str, shape) -> np.ndarray:
    dt = NP_DTYPES[ropekv_dtype]
    flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if flat.size != math.prod(shape) * dt.itemsize:
        raise ValueError(f"tensor of {flat.size} bytes cannot hold {shape} {ropekv_dtype}")
    return flat.view(dt).reshape(shape)


def load_golden(path):
    """Reads a golden case: a .safetensors file (parsed by hand: 8-byte header length, JSON
    header, data) or a --format npy folder (meta.json + NAME.npy). Returns (meta, tensors);
    meta is the metadata dict with meta["dtypes"] decoded from JSON; tensors map name ->
    numpy array in its real dtype (ml_dtypes for bf16/fp8; fnuz from F8_E4M3FNUZ / F8_E5M2FNUZ
    or, in files written before those names, from U8)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        with open(os.path.join(path, "meta.json")) as f:
            meta = json.load(f)
        dtypes = meta["dtypes"]
        if isinstance(dtypes, str):
            dtypes = json.loads(dtypes)
        meta = dict(meta, dtypes=dtypes)
        derived = meta.get("derived", {})
        if isinstance(derived, str):
            derived = json.loads(derived)
        tensors = {}
        for name, dt in dtypes.items():
            if name in derived:
                continue
            raw = np.load(os.path.join(path, name + ".npy"), allow_pickle=False)
            tensors[name] = _reinterpret(raw, dt, raw.shape)
        return meta, _rebuild_derived(path, tensors, dtypes, derived)
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if 8 + header_len > len(blob):
        raise ValueError(f"{path}: header length {header_len} past end of file")
    header = json.loads(blob[8:8 + header_len].decode("utf-8"))
    data = memoryview(blob)[8 + header_len:]
    meta = dict(header.pop("__metadata__", {}) or {})
    dtypes = json.loads(meta.get("dtypes", "{}"))
    meta["dtypes"] = dtypes
    st_sizes = {"F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
                "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1, "U8": 1, "I32": 4,
                "I64": 8}
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        shape = tuple(int(s) for s in info["shape"])
        if not (0 <= begin <= end <= len(data)):
            raise ValueError(f"{path}: tensor {name} offsets {begin}..{end} outside data")
        if info["dtype"] not in st_sizes:
            raise ValueError(f"{path}: tensor {name} has unknown dtype {info['dtype']}")
        if name not in dtypes:
            raise ValueError(f"{path}: tensor {name} missing from the dtypes metadata")
        if st_sizes[info["dtype"]] != NP_DTYPES[dtypes[name]].itemsize:
            raise ValueError(f"{path}: {name}: safetensors {info['dtype']} vs {dtypes[name]}")
        raw = np.frombuffer(data[begin:end], dtype=np.uint8)
        tensors[name] = _reinterpret(raw, dtypes[name], shape).copy()
    return meta, _rebuild_derived(path, tensors, dtypes, json.loads(meta.get("derived", "{}")))


def _rebuild_derived(path, tensors, dtypes, derived):
    """Format version 2: the tensors the file leaves out, from the recipes of its `derived`
    metadata (docs/golden-format.md): {"fill_byte": B, "shape": S}, every byte B; or
    {"concat_last": [names], "shape": S}, stored tensors joined along the last axis. A stored
    tensor named only as a source (q_out.expected.rope) is a part and is dropped."""
    parts = set()
    out = dict(tensors)
    for name, r in derived.items():
        if name in tensors:
            raise ValueError(f"{path}: {name} is both stored and derived")
        shape = tuple(int(d) for d in r["shape"])
        dt = NP_DTYPES[dtypes[name]]
        if set(r) == {"fill_byte", "shape"}:
            raw = np.full(math.prod(shape) * dt.itemsize, int(r["fill_byte"]), dtype=np.uint8)
            out[name] = raw.view(dt).reshape(shape)
        elif set(r) == {"concat_last", "shape"}:
            srcs = [tensors[n] for n in r["concat_last"]]
            parts.update(r["concat_last"])
            out[name] = np.concatenate(srcs, axis=-1)
            if out[name].shape != shape or out[name].dtype != dt:
                raise ValueError(f"{path}: {name}: recipe gives {out[name].dtype}{out[name].shape}")
        else:
            raise ValueError(f"{path}: {name}: unknown recipe {r}")
    for n in parts:
        if not (n.endswith(".initial") or n.endswith(".expected") or "." not in n):
            del out[n]
    return out


# ---------------------------------------------------------------------------------------------
# exact rounding

def round_fraction_to_format(v: Fraction, fmt: Format, negative_zero: bool = False) -> float:
    """Rounds an exact rational to fmt, nearest even. Overflow: inf for IEEE formats, +-max
    for saturating (fp8) formats. Returns a Python float holding the result exactly (zero
    carries the sign of v, or of negative_zero when v == 0)."""
    if v == 0:
        return -0.0 if negative_zero else 0.0
    neg = v < 0
    a = -v if neg else v
    # e = floor(log2(a))
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    elif Fraction(2) ** (e + 1) <= a:
        e += 1
    qe = max(e, fmt.emin) - fmt.man_bits  # exponent of the quantum (spacing) at a
    k = a / Fraction(2) ** qe
    n = k.numerator // k.denominator
    rem = k - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1):
        n += 1
    r = math.ldexp(float(n), qe)
    if r > fmt.max_finite:
        r = fmt.max_finite if fmt.saturating or not fmt.has_inf else math.inf
    return -r if neg else r


def _round_ld(q: np.ndarray, fmt: Format, exact_input: bool):
    """Nearest-even rounding of longdouble values to fmt. Returns (rounded float64 values,
    ambiguous mask). When exact_input is False, q approximates the true value with a relative
    error far below 2^-60, and elements within a guard band of a midpoint are flagged ambiguous
    (their result is left unset for the caller's exact recomputation). Non-finite inputs give
    NaN / +-inf (saturated by the caller for fp8)."""
    q = np.asarray(q, dtype=np.longdouble)
    out = np.empty(q.shape, dtype=np.float64)
    ambiguous = np.zeros(q.shape, dtype=bool)
    finite = np.isfinite(q)
    out[~finite] = q[~finite].astype(np.float64)
    a = np.abs(q[finite])
    neg = np.signbit(q[finite])
    _, e = np.frexp(a)  # a = m * 2^e with m in [0.5, 1)
    e = e.astype(np.int64) - 1
    qe = np.maximum(e, fmt.emin) - fmt.man_bits
    k = np.ldexp(a, (-qe).astype(np.int32))  # exact: power-of-two scaling
    n = np.floor(k)
    rem = k - n  # exact
    up = (rem > 0.5) | ((rem == 0.5) & (np.fmod(n, 2) == 1))
    n = n + up
    r = np.ldexp(n, qe.astype(np.int32)).astype(np.float64)  # exact: n has <= man_bits+2 bits
    over = r > fmt.max_finite
    r[over] = fmt.max_finite if (fmt.saturating or not fmt.has_inf) else np.inf
    r = np.where(neg, -r, r)
    out[finite] = r
    if not exact_input:
        band = 2.0 ** -30
        amb = np.abs(rem - 0.5) <= band
        ambiguous[finite] = amb
    return out, ambiguous


def round_exact_to_format(a, b, fmt: Format, conv: str | None = None, scale=None):
    """Correctly rounded value of (a + b) [/ scale | * scale] in fmt, where a and b are float64
    arrays holding exact products of two fp32 values, and scale is a float32 (conv "divide":
    the divisor; "reciprocal": the fp32 multiplier). Returns float64 values representable in
    fmt (saturated to +-max for fp8; NaN stays NaN). The sign of an exact zero follows IEEE
    addition (a + b). Elements near a midpoint are recomputed with Fraction."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    q = a.astype(np.longdouble) + b.astype(np.longdouble)
    if conv == "divide":
        q = q / np.longdouble(scale)
    elif conv == "reciprocal":
        q = q * np.longdouble(scale)
    elif conv is not None:
        raise ValueError(f"conv: expected divide|reciprocal|None, got {conv!r}")
    out, amb = _round_ld(q, fmt, exact_input=False)
    # zero: IEEE sign of a + b (exact cancellation gives +0 in round-to-nearest)
    zero = q == 0
    out[zero] = np.copysign(0.0, a[zero] + b[zero])
    amb &= ~zero
    if amb.any():
        for idx in zip(*np.nonzero(amb)):
            v = Fraction(float(a[idx])) + Fraction(float(b[idx]))
            if conv == "divide":
                v = v / Fraction(float(scale))
            elif conv == "reciprocal":
                v = v * Fraction(float(scale))
            out[idx] = round_fraction_to_format(v, fmt)
    return _saturate(out, fmt)


def round_double_eval_to_format(a, b, fmt: Format, conv: str | None = None, scale=None):
    """The contract's own evaluation: d = fl64(a + b) (one double fma of exact products), the
    scale applied in double, then one nearest-even rounding into fmt (saturating for fp8)."""
    d = np.asarray(a, dtype=np.float64) + np.asarray(b, dtype=np.float64)
    if conv == "divide":
        d = d / np.float64(scale)
    elif conv == "reciprocal":
        d = d * np.float64(scale)
    elif conv is not None:
        raise ValueError(f"conv: expected divide|reciprocal|None, got {conv!r}")
    out, _ = _round_ld(d.astype(np.longdouble), fmt, exact_input=True)
    zero = d == 0
    out[zero] = d[zero]
    return _saturate(out, fmt)


def _saturate(v: np.ndarray, fmt: Format) -> np.ndarray:
    if fmt.saturating:
        return np.where(np.isnan(v), v, np.clip(v, -fmt.max_finite, fmt.max_finite))
    return v


def encode(values: np.ndarray, dtype_name: str) -> np.ndarray:
    """Casts float64 values that are exactly representable in dtype_name (the output of the
    rounding functions above) into that dtype; no rounding happens here."""
    out = np.asarray(values, dtype=np.float64).astype(NP_DTYPES[dtype_name])
    back = out.astype(np.float64)
    ok = (back == values) | (np.isnan(back) & np.isnan(values))
    if not ok.all():
        raise AssertionError(f"encode: value not representable in {dtype_name}")
    return out


# ---------------------------------------------------------------------------------------------
# data movement (nope) elements

def convert_nope(x: np.ndarray, out_dtype: str, conv: str, scale: np.float32) -> np.ndarray:
    """round(fp32(x)), or for fp8 round_sat(fp32(fp32(x) / scale)) (divide) or
    round_sat(fp32(fp32(x) * fp32(1 / scale))) (reciprocal): numpy float32 ops are IEEE."""
    x32 = np.asarray(x).astype(np.float32)
    if out_dtype not in FP8:
        return x32.astype(NP_DTYPES[out_dtype])
    s = np.float32(scale)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if conv == "divide":
            v = x32 / s
        elif conv == "reciprocal":
            v = x32 * (np.float32(1.0) / s)
        else:
            raise ValueError(f"scale_conv: expected divide|reciprocal, got {conv!r}")
    assert v.dtype == np.float32
    m = np.float32(FORMATS[out_dtype].max_finite)
    v = np.where(np.isnan(v), v, np.clip(v, -m, m))
    return v.astype(NP_DTYPES[out_dtype])


# ---------------------------------------------------------------------------------------------
# rope

def rope_pairs(dr: int, style: str):
    """For every rope element j: (pair index i, partner index, sign of R): element x becomes
    x*C[i] + sign*v[partner]*S[i]; R(a) = -b, R(b) = a."""
    if dr <= 0 or dr % 2:
        raise ValueError(f"dr: expected even and > 0, got {dr}")
    half = dr // 2
    pair = np.empty(dr, np.int64)
    partner = np.empty(dr, np.int64)
    sign = np.empty(dr, np.float64)
    for i in range(half):
        if style == "gptj":
            ia, ib = 2 * i, 2 * i + 1
        elif style == "neox":
            ia, ib = i, i + half
        else:
            raise ValueError(f"style: expected gptj|neox, got {style!r}")
        pair[ia] = pair[ib] = i
        partner[ia], partner[ib] = ib, ia
        sign[ia], sign[ib] = -1.0, 1.0
    return pair, partner, sign


def rope_products(v32: np.ndarray, cos32: np.ndarray, sin32: np.ndarray, style: str):
    """v32 [..., Dr] fp32 values; cos32/sin32 [..., Dr/2] fp32 rows broadcastable against v32's
    leading dims. Returns (x*C, R(x)*S) as float64 arrays [..., Dr]: both exact."""
    dr = v32.shape[-1]
    pair, partner, sign = rope_pairs(dr, style)
    x = v32.astype(np.float64)
    r = x[..., partner] * sign  # negation is exact
    c = cos32.astype(np.float64)[..., pair]
    s = sin32.astype(np.float64)[..., pair]
    return x * c, r * s


def rope_round(v32, cos32, sin32, style, out_dtype, conv=None, scale=None, evaluation="exact"):
    """Rope elements rounded once into out_dtype (fp8: scaled by conv/scale and saturated)."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 is NaN, as IEEE says
        a, b = rope_products(v32, cos32, sin32, style)
    fmt = FORMATS[out_dtype]
    if out_dtype in FP8:
        if conv == "divide":
            sc = np.float32(scale)
        elif conv == "reciprocal":
            sc = np.float32(1.0) / np.float32(scale)  # fp32(1/scale)
        else:
            raise ValueError(f"scale_conv: expected divide|reciprocal, got {conv!r}")
    else:
        conv, sc = None, None
    with np.errstate(invalid="ignore", over="ignore"):
        if evaluation == "exact":
            vals = round_exact_to_format(a, b, fmt, conv, sc)
        elif evaluation == "double":
            vals = round_double_eval_to_format(a, b, fmt, conv, sc)
        else:
            raise ValueError(f"evaluation: expected exact|double, got {evaluation!r}")
    return encode(vals, out_dtype)


# ---------------------------------------------------------------------------------------------
# the op

def _need(tensors, name, shape):
    if name not in tensors:
        raise ValueError(f"golden case lacks tensor {name}")
    t = tensors[name]
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
    return t


def shuffled_run(cache_dtype: str) -> int:
    """Layout shuffled: features per 16-byte run (core/SPEC.md)."""
    return 16 // (4 if cache_dtype == "f32" else 2 if cache_dtype in ("f16", "bf16") else 1)


def shuffle_cache(logical: np.ndarray, dn: int, w: int) -> np.ndarray:
    """[nb, bs, Dn + Dr] entries (AITER's unshuffled cache) -> the shuffled tensor, by reshapes
    alone: per block all nope parts, then all rope parts; per 16-entry tile and part, run r of
    every entry (W features), entry by entry, then run r + 1."""
    nb, bs, d = logical.shape

    def part(x):
        width = x.shape[2]
        tiles = x.reshape(nb, bs // 16, 16, width // w, w).transpose(0, 1, 3, 2, 4)
        return tiles.reshape(nb, bs * width)

    blocks = np.concatenate([part(logical[:, :, :dn]), part(logical[:, :, dn:])], axis=1)
    return blocks.reshape(nb, bs, d)


def unshuffle_cache(physical: np.ndarray, dn: int, w: int) -> np.ndarray:
    """The inverse of shuffle_cache."""
    nb, bs, d = physical.shape
    flat = physical.reshape(nb, bs * d)

    def part(x, width):
        return x.reshape(nb, bs // 16, width // w, 16, w).transpose(0, 1, 3, 2, 4).reshape(nb, bs, width)

    return np.concatenate([part(flat[:, :bs * dn], dn), part(flat[:, bs * dn:], d - dn)], axis=2)


DS_MLA_ENTRY_BYTES = 656  # 512 e4m3fn bytes, 4 f32 tile scales, 64 16-bit rope values


def ds_mla_tile_scales(kv_c_rows: np.ndarray, rule: str) -> np.ndarray:
    """Layout fp8_ds_mla (SPEC "The fp8_ds_mla layout"): [k, 512] inputs -> [k, 4] float32
    scales. amax of each 128-value tile (NaN skipped, as fmaxf), fp32(amax / 448); rule amax:
    at least FLT_MIN; rule pow2: the smallest power of two >= max(that, fp32(1e-4))."""
    x32 = np.asarray(kv_c_rows).astype(np.float32).reshape(len(kv_c_rows), 4, 128)
    amax = np.fmax.reduce(np.abs(x32), axis=-1, initial=np.float32(0.0)).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        s = (amax / np.float32(448.0)).astype(np.float32)  # IEEE float32 division
    if rule == "amax":
        return np.maximum(s, np.float32(2.0 ** -126)).astype(np.float32)
    if rule != "pow2":
        raise ValueError(f"ds_scale: expected amax|pow2, got {rule!r}")
    s = np.maximum(s, np.float32(1e-4))
    out = np.empty_like(s)
    for i, v in np.ndenumerate(s):
        if not np.isfinite(v):
            out[i] = v
            continue
        f = Fraction(float(v))  # exact; the smallest power of two >= it, by doubling
        p = Fraction(1)
        while p < f:
            p *= 2
        while p / 2 >= f:
            p /= 2
        out[i] = np.float32(float(p)) if p <= Fraction(float(np.finfo(np.float32).max)) else np.float32(np.inf)
    return out


def ds_mla_entries(kv_c_rows, rope_rows, rule: str) -> np.ndarray:
    """[k, 512] kv_c rows and [k, 64] rounded rope rows (their 16-bit dtype) -> [k, 656] u8
    entries: e4m3fn of round_sat(fp32(fp32(x) / scale)), the f32 scales, the rope bytes."""
    k = len(kv_c_rows)
    scales = ds_mla_tile_scales(kv_c_rows, rule)  # [k, 4]
    x32 = np.asarray(kv_c_rows).astype(np.float32).reshape(k, 4, 128)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        v = (x32 / scales[:, :, None]).astype(np.float32)
    v = np.where(np.isnan(v) & ~np.isnan(x32), np.float32(np.nan), v)  # +-inf / inf: the positive NaN
    m = np.float32(448.0)
    v = np.where(np.isnan(v), v, np.clip(v, -m, m))
    nope = v.reshape(k, 512).astype(NP_DTYPES["fp8_e4m3fn"])  # one RNE rounding of a float32
    out = np.empty((k, DS_MLA_ENTRY_BYTES), dtype=np.uint8)
    out[:, :512] = nope.view(np.uint8)
    out[:, 512:528] = scales.astype("<f4").view(np.uint8).reshape(k, 16)
    rope = np.ascontiguousarray(rope_rows)
    assert rope.dtype.itemsize == 2 and rope.shape == (k, 64), (rope.dtype, rope.shape)
    out[:, 528:] = rope.view(np.uint8).reshape(k, 128)
    return out


def expected_outputs(params: dict, tensors: dict, evaluation: str = "exact") -> dict:
    """Computes every *.expected tensor of a golden case from its inputs and *.initial tensors,
    literally per core/SPEC.md. params is parse_repro's dict. evaluation="double" reproduces
    the contract's double evaluation of rope elements instead of the exact value (used only to
    classify double-rounding ties)."""
    p = params
    tq, ts, tk, h, dn, dr = p["tq"], p["ts"], p["tk"], p["h"], p["dn"], p["dr"]
    P, bs, nb = p["p"], p["bs"], p["nb"]
    if not (0 <= tq <= ts <= tk):
        raise ValueError(f"tq/ts/tk: expected tq <= ts <= tk, got {tq}/{ts}/{tk}")
    style, conv = p["style"], p["scale_conv"]
    half = dr // 2
    # scales=tensor: the scales are the [1] float32 tensors k_scale / q_scale (SPEC "Scale
    # tensors"), not the repro's floats.
    if p["scales"] == "tensor":
        k_scale = np.float32(_need(tensors, "k_scale", (1,))[0])
        q_scale = np.float32(_need(tensors, "q_scale", (1,))[0])
    else:
        k_scale, q_scale = p["k_scale"], p["q_scale"]
    in_dt, qo_dt, cache_dt = p["in"], p["qo"], p["cache"]

    q_nope = _need(tensors, "q_nope", (tq, h, dn))
    q_pe = _need(tensors, "q_pe", (tq, h, dr))
    # kv heads (SPEC "kv heads"): kh > 1 stores kv_c / k_pe / k_pe_out as [Tk, KH, D] and the
    # caches as [nb, KH, bs, D]; kh = 1 the rank-2 rows and rank-3 caches. Below, every k tensor
    # is handled with its head dimension (size 1 for kh = 1), reshaped back at the end.
    kh = p["kh"]
    if kh < 1 or h % kh:
        raise ValueError(f"kh: expected a divisor of h = {h}, got {kh}")
    k_shape = (lambda w: (tk, kh, w)) if kh > 1 else (lambda w: (tk, w))
    c_shape = (lambda w: (nb, kh, bs, w)) if kh > 1 else (lambda w: (nb, bs, w))

    def heads4(a):  # a cache [nb, (KH,) bs, D] -> [nb, KH, bs, D] (a view)
        return a if kh > 1 else a[:, None]

    def heads3(a):  # k rows [Tk, (KH,) D] -> [Tk, KH, D]
        return a if kh > 1 else a[:, None]

    def unheads(a):  # back to the file's rank
        return a if kh > 1 else a[:, 0]

    kv_c = heads3(_need(tensors, "kv_c", k_shape(dn)))
    k_pe = heads3(_need(tensors, "k_pe", k_shape(dr)))
    positions = _need(tensors, "positions", (tk,)).astype(np.int64)
    slots = _need(tensors, "slot_mapping", (ts,)).astype(np.int64)
    if p["table"] == "one":
        cs = _need(tensors, "cos_sin", (P, dr)).astype(np.float32)
        cos_tab, sin_tab = cs[:, :half], cs[:, half:]
    else:
        cos_tab = _need(tensors, "cos", (P, half)).astype(np.float32)
        sin_tab = _need(tensors, "sin", (P, half)).astype(np.float32)

    # which tokens are used / written
    t_s = np.arange(ts)
    writes_cache = slots >= 0                                   # [Ts]
    q_computed = (slots[:tq] >= 0) | (p["pad_q"] == "computed")  # [Tq]
    used = writes_cache.copy()
    used[:tq] |= q_computed
    pos = positions[:ts].copy()
    oob = used & ((pos < 0) | (pos >= P))
    if p["pos_oob"] == "clamp":
        pos = np.clip(pos, 0, P - 1)
    elif oob.any():
        t = int(np.nonzero(oob)[0][0])
        raise ValueError(f"positions: expected [0, {P}) for used token {t}, got {pos[t]}")
    pos = np.where(used, pos, 0)  # unused tokens' positions are never read

    out = {}
    # q_out
    q_out = _need(tensors, "q_out.initial", (tq, h, dn + dr)).copy()
    q_rows = np.nonzero(q_computed)[0]
    if q_rows.size:
        c = cos_tab[pos[q_rows]][:, None, :]  # [rows, 1, Dr/2]
        s = sin_tab[pos[q_rows]][:, None, :]
        qpe32 = q_pe[q_rows].astype(np.float32)  # [rows, H, Dr]
        q_out[q_rows, :, :dn] = convert_nope(q_nope[q_rows], qo_dt, conv, q_scale)
        q_out[q_rows, :, dn:] = rope_round(qpe32, c, s, style, qo_dt, conv, q_scale,
                                           evaluation)
    out["q_out.expected"] = q_out
    if p["inplace_q"]:
        q_pe_new = q_pe.copy()
        if q_rows.size:
            q_pe_new[q_rows] = rope_round(qpe32, c, s, style, in_dt, evaluation=evaluation)
        out["q_pe.expected"] = q_pe_new

    # cache
    k_rows = t_s[writes_cache]
    s_k = slots[k_rows]
    if s_k.size and s_k.max() >= nb * bs:
        raise ValueError(f"slot_mapping: expected < {nb * bs}, got {s_k.max()}")
    if np.unique(s_k).size != s_k.size:
        raise ValueError("slot_mapping: duplicate slot among written tokens")
    blk, ent = s_k // bs, s_k % bs
    ds_mla = p["layout"] == "fp8_ds_mla"
    if ds_mla and (cache_dt != "u8" or dn != 512 or dr != 64 or in_dt not in ("bf16", "f16")
                   or p["order"] != "nope_first"):
        raise ValueError(f"layout fp8_ds_mla: expected cache u8, Dn 512, Dr 64, a 16-bit input, nope_first, "
                         f"got cache={cache_dt} dn={dn} dr={dr} in={in_dt} order={p['order']}")
    if ds_mla and kh != 1:
        raise ValueError(f"layout fp8_ds_mla: expected kh = 1, got {kh}")
    if k_rows.size:
        ck = cos_tab[pos[k_rows]][:, None, :]  # [rows, 1, Dr/2]: one position for every head
        sk = sin_tab[pos[k_rows]][:, None, :]
        kpe32 = k_pe[k_rows].astype(np.float32)  # [rows, KH, Dr]
        if not ds_mla:
            nope_vals = convert_nope(kv_c[k_rows], cache_dt, conv, k_scale)
            rope_vals = rope_round(kpe32, ck, sk, style, cache_dt, conv, k_scale, evaluation)
    if ds_mla:
        cache = _need(tensors, "cache.initial", (nb, bs, DS_MLA_ENTRY_BYTES)).copy()
        if k_rows.size:
            rope16 = rope_round(kpe32, ck, sk, style, in_dt, evaluation=evaluation)  # no scale
            cache[blk, ent] = ds_mla_entries(kv_c[k_rows][:, 0], rope16[:, 0], p["ds_scale"])
        out["cache.expected"] = cache
    elif p["layout"] == "shuffled":
        w = shuffled_run(cache_dt)
        if bs % 16 or dn % w or dr % w or p["order"] != "nope_first":
            raise ValueError(f"layout shuffled: expected bs % 16 == 0, Dn and Dr multiples of {w}, "
                             f"nope_first, got bs={bs} dn={dn} dr={dr} order={p['order']}")
        # each (block, head) pair is one block's tiled run: unshuffle / shuffle them as blocks
        phys = heads4(_need(tensors, "cache.initial", c_shape(dn + dr))).reshape(nb * kh, bs, dn + dr)
        cache = unshuffle_cache(phys, dn, w).reshape(nb, kh, bs, dn + dr).copy()
        if k_rows.size:
            cache[blk, :, ent, :dn] = nope_vals
            cache[blk, :, ent, dn:] = rope_vals
        out["cache.expected"] = unheads(shuffle_cache(cache.reshape(nb * kh, bs, dn + dr), dn, w)
                                        .reshape(nb, kh, bs, dn + dr))
    elif p["layout"] == "joint":
        cache = heads4(_need(tensors, "cache.initial", c_shape(dn + dr)).copy())
        if k_rows.size:  # [blk, :, ent] selects [rows, KH, D]
            if p["order"] == "nope_first":
                cache[blk, :, ent, :dn] = nope_vals
                cache[blk, :, ent, dn:] = rope_vals
            else:
                cache[blk, :, ent, :dr] = rope_vals
                cache[blk, :, ent, dr:] = nope_vals
        out["cache.expected"] = unheads(cache)
    else:
        ckv = heads4(_need(tensors, "ckv_cache.initial", c_shape(dn)).copy())
        kpe = heads4(_need(tensors, "kpe_cache.initial", c_shape(dr)).copy())
        if k_rows.size:
            ckv[blk, :, ent] = nope_vals
            kpe[blk, :, ent] = rope_vals
        out["ckv_cache.expected"] = unheads(ckv)
        out["kpe_cache.expected"] = unheads(kpe)
    if p["inplace_k"]:
        k_pe_new = k_pe.copy()
        if k_rows.size:
            k_pe_new[k_rows] = rope_round(kpe32, ck, sk, style, in_dt, evaluation=evaluation)
        out["k_pe.expected"] = unheads(k_pe_new)

    # decode outputs (SPEC "Decode outputs"): rows t < N of computed q rows; k_pe_out the rows
    # the cache gets; all rounded like in-place values (input dtype, no scale)
    dec_out, n_dec = p["dec_out"], p["dec"]
    if n_dec > tq:
        raise ValueError(f"dec: expected N <= Tq = {tq}, got {n_dec}")
    dec_rows = q_rows[q_rows < n_dec]
    if "q" in dec_out:
        d = _need(tensors, "decode_q_pe_out.initial", (n_dec, h, dr)).copy()
        if dec_rows.size:
            cd = cos_tab[pos[dec_rows]][:, None, :]
            sd = sin_tab[pos[dec_rows]][:, None, :]
            d[dec_rows] = rope_round(q_pe[dec_rows].astype(np.float32), cd, sd, style, in_dt,
                                     evaluation=evaluation)
        out["decode_q_pe_out.expected"] = d
    if "z" in dec_out:
        z = _need(tensors, "q_nope_zeros_out.initial", (n_dec, h, dn)).copy()
        z[dec_rows] = np.zeros((), dtype=z.dtype)  # +0: all-zero bits
        out["q_nope_zeros_out.expected"] = z
    if "k" in dec_out:
        ko = heads3(_need(tensors, "k_pe_out.initial", k_shape(dr)).copy())
        if k_rows.size:
            ko[k_rows] = rope_round(kpe32, ck, sk, style, in_dt, evaluation=evaluation)
        out["k_pe_out.expected"] = unheads(ko)
    return out
