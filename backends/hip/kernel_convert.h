// The kernel's conversions, bit operations only: fp32 <-> f16 / bf16 / fp8 by run-time dtype
// (rk_encode, rk_decode; fp8_encode.h holds the branch-free per-format encoders they call, and
// its pair encoder behind rk_encode_fp8x2), element loads and stores by dtype, the scaled output
// conversion (rk_to_output), 16-bit NaN canonicalisation and the fp8_ds_mla tile-scale
// arithmetic. Shared by the general body and fast_v4. The reference (backends/cpu, core/convert)
// has its own conversions on purpose: the two are checked against each other. Part of kernel.h.
#pragma once
#include <cstdint>

#include "backends/hip/fp8_encode.h"
#include "backends/hip/gpu_compat.h"
#include "backends/hip/kernel_dtype.h"

namespace ropekv_gpu {

// ------------------------------------------------------------------ conversions (bit ops only)
// Layout of the narrow formats: exponent bits, mantissa bits, bias.
struct rk_format {
  int exp_bits, man_bits, bias;
  uint32_t max_code;   // largest finite magnitude code
  uint32_t nan_code;   // canonical NaN magnitude code (sign added where signed NaN exists)
  bool fnuz;           // single NaN 0x80, no negative zero
  bool has_inf;
};
ROPEKV_HOST_DEVICE rk_format rk_format_of(int32_t t) {
  switch (t) {
    case rk_f16: return {5, 10, 15, 0x7bffu, 0x7e00u, false, true};
    case rk_e4m3fn: return {4, 3, 7, 0x7eu, 0x7fu, false, false};
    case rk_e4m3fnuz: return {4, 3, 8, 0x7fu, 0x80u, true, false};
    case rk_e5m2: return {5, 2, 15, 0x7bu, 0x7eu, false, true};
    case rk_e5m2fnuz: return {5, 2, 16, 0x7fu, 0x80u, true, false};
    default: return {0, 0, 0, 0u, 0u, false, false};  // not a narrow format: callers never ask
  }
}

// f32 -> f16 or fp8, round to nearest even. Overflow (and inf): saturate to the max finite
// value when `saturate`, else inf (f16). NaN -> the format's NaN, sign kept where signed.
ROPEKV_HOST_DEVICE uint32_t rk_encode_narrow(float v, rk_format f, bool saturate) {
  const uint32_t bits = rk_f32_bits(v);
  const uint32_t sign = bits >> 31;
  const uint32_t mag = bits & 0x7fffffffu;
  const int width = 1 + f.exp_bits + f.man_bits;
  const uint32_t sign_bit = sign << (width - 1);
  if (mag > 0x7f800000u) return f.fnuz ? f.nan_code : (f.nan_code | sign_bit);
  uint32_t code;
  const int f32_exp = static_cast<int>(mag >> 23);
  if (f32_exp == 0) {
    code = 0;  // f32 zero or subnormal: far below half the smallest subnormal of every format
  } else {
    const uint64_t full = (1ull << 23) | (mag & 0x7fffffu);  // 24-bit significand
    const int e = f32_exp - 127;
    const int emin = 1 - f.bias;
    if (e >= emin) {
      const uint64_t base = static_cast<uint64_t>(e - emin + 1) << f.man_bits;  // exponent field
      const int shift = 23 - f.man_bits;
      // significand without the implicit bit, shifted: exponent carry works by addition
      const uint64_t kept = (full & 0x7fffffull) >> shift;
      const uint64_t rem = full & ((1ull << shift) - 1);
      const uint64_t half = 1ull << (shift - 1);
      uint64_t c = base + kept;
      if (rem > half || (rem == half && (c & 1ull))) c += 1;
      code = c > 0xffffull ? 0xffffu : static_cast<uint32_t>(c);
    } else {
      const int shift = 23 - f.man_bits + (emin - e);
      if (shift > 24) {
        code = 0;
      } else {
        const uint64_t kept = full >> shift;
        const uint64_t rem = full & ((1ull << shift) - 1);
        const uint64_t half = 1ull << (shift - 1);
        uint64_t c = kept;
        if (rem > half || (rem == half && (c & 1ull))) c += 1;
        code = static_cast<uint32_t>(c);
      }
    }
  }
  if (code > f.max_code) {
    if (saturate || !f.has_inf) {
      code = f.max_code;
    } else {
      code = static_cast<uint32_t>(((1u << f.exp_bits) - 1u) << f.man_bits);  // inf
    }
  }
  if (code == 0 && f.fnuz) return 0;  // fnuz has no negative zero
  return code | sign_bit;
}

ROPEKV_HOST_DEVICE uint32_t rk_encode_bf16(float v) {
  const uint32_t bits = rk_f32_bits(v);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return ((bits >> 16) & 0x8000u) | 0x7fc0u;
  return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;  // RNE; overflow carries into inf
}

// Encodes fp32 into format t (RNE). fp8 saturates; f16/bf16 overflow to inf (core/SPEC.md).
// f16 and fp8 go through fp8_encode.h's branch-free encoders (~13-16 instructions
// instead of ~60): bit-exact to rk_encode_narrow above, which stays as their readable definition
// (tests/cpp/test_fp8_encode.cpp checks one against the other; all 2^32 inputs were checked once).
ROPEKV_HOST_DEVICE uint32_t rk_encode(int32_t t, float v) {
  switch (t) {
    case rk_f32: return rk_f32_bits(v);
    case rk_bf16: return rk_encode_bf16(v);
    case rk_f16: return rk_encode_f16_fast(v);
    case rk_e4m3fn: return rk_encode_fp8_sat<rk_e4m3fn>(v);
    case rk_e4m3fnuz: return rk_encode_fp8_sat<rk_e4m3fnuz>(v);
    case rk_e5m2: return rk_encode_fp8_sat<rk_e5m2>(v);
    case rk_e5m2fnuz: return rk_encode_fp8_sat<rk_e5m2fnuz>(v);
    default: return 0xffffffffu;  // unreachable: the host plan rejects unknown formats
  }
}

// Narrow format -> fp32, exact.
ROPEKV_HOST_DEVICE float rk_decode_narrow(uint32_t code, rk_format f) {
  const int width = 1 + f.exp_bits + f.man_bits;
  const uint32_t sign = (code >> (width - 1)) & 1u;
  const uint32_t mag = code & ((1u << (width - 1)) - 1u);
  const uint32_t exp_field = mag >> f.man_bits;
  const uint32_t man = mag & ((1u << f.man_bits) - 1u);
  const uint32_t exp_all_ones = (1u << f.exp_bits) - 1u;
  uint32_t out;
  if (f.fnuz && code == 0x80u) {
    out = 0x7fc00000u;
  } else if (!f.fnuz && f.has_inf && exp_field == exp_all_ones) {
    out = (sign << 31) | (man ? 0x7fc00000u : 0x7f800000u);
  } else if (!f.fnuz && !f.has_inf && mag == f.nan_code) {
    out = (sign << 31) | 0x7fc00000u;
  } else if (exp_field == 0) {
    if (man == 0) {
      out = sign << 31;
    } else {  // subnormal: normalise
      int e = 1 - f.bias + 127;
      uint32_t m = man;
      while ((m & (1u << f.man_bits)) == 0) {
        m <<= 1;
        --e;
      }
      m &= (1u << f.man_bits) - 1u;
      out = (sign << 31) | (static_cast<uint32_t>(e) << 23) | (m << (23 - f.man_bits));
    }
  } else {
    const uint32_t e = exp_field - static_cast<uint32_t>(f.bias) + 127u;
    out = (sign << 31) | (e << 23) | (man << (23 - f.man_bits));
  }
  return rk_bits_f32(out);
}

ROPEKV_HOST_DEVICE float rk_decode(int32_t t, uint32_t bits) {
  switch (t) {
    case rk_f32: return rk_bits_f32(bits);
    case rk_bf16: return rk_bits_f32(bits << 16);
    case rk_f16:
    case rk_e4m3fn:
    case rk_e4m3fnuz:
    case rk_e5m2:
    case rk_e5m2fnuz: return rk_decode_narrow(bits, rk_format_of(t));
    default: return rk_bits_f32(0x7fc00000u);  // unreachable: the host plan rejects it
  }
}

ROPEKV_DEVICE uint32_t rk_load_elem(int32_t t, const void* p) {
  switch (rk_size_bytes(t)) {
    case 4: return *static_cast<const uint32_t*>(p);
    case 2: return *static_cast<const uint16_t*>(p);
    default: return *static_cast<const uint8_t*>(p);
  }
}
ROPEKV_DEVICE void rk_store_elem(int32_t t, void* p, uint32_t bits) {
  switch (rk_size_bytes(t)) {
    case 4: *static_cast<uint32_t*>(p) = bits; break;
    case 2: *static_cast<uint16_t*>(p) = static_cast<uint16_t>(bits); break;
    default: *static_cast<uint8_t*>(p) = static_cast<uint8_t>(bits); break;
  }
}

// fp32 value -> output bits, with the fp8 scale applied (data movement and rope alike).
// mul: p.k_mul or p.q_mul (multiply by inv_scale, else divide by scale).
ROPEKV_DEVICE uint32_t rk_to_output(float v, int32_t out_t, int32_t mul, float scale,
                                    float inv_scale) {
  if (rk_is_fp8(out_t)) v = mul ? ROPEKV_FMUL_RN(v, inv_scale) : ROPEKV_FDIV_RN(v, scale);
  return rk_encode(out_t, v);
}

// ------------------------------------------------------------------ fp8_ds_mla tile scales
// The smallest power of two >= s, for a finite s >= 2^-126 (inf stays inf; past 2^127: inf).
ROPEKV_HOST_DEVICE float rk_pow2_at_least(float s) {
  const uint32_t bits = rk_f32_bits(s);
  if ((bits & 0x7fffffu) == 0u || (bits >> 23) >= 0xffu) return s;  // a power of two, or inf
  return rk_bits_f32(((bits >> 23) + 1u) << 23);                    // exponent + 1, mantissa 0
}

// A tile's scale from its amax (core/SPEC.md "The fp8_ds_mla layout"): fp32(amax / 448), then
// pow2: the smallest power of two >= max(s, fp32(1e-4)); else max(s, FLT_MIN).
// fp32(amax / 448) without a division: fp32(double(amax) * d), d = the double nearest 1 / 448.
// The product is within 2^-52 (relative) of amax / 448, while amax / 448 = (amax / 64) / 7 is
// never within 2^-28 of an fp32 rounding midpoint in the normal range (a quotient by 7 repeats a
// 3-bit pattern that is never 1000...), so both round to the same fp32. Below FLT_MIN the two may
// differ, and the clamps below give FLT_MIN (or 2^-13) either way.
ROPEKV_DEVICE float rk_ds_tile_scale(float amax, int32_t pow2) {
  const float s = static_cast<float>(ROPEKV_DMUL_RN(static_cast<double>(amax), 1.0 / 448.0));
  if (pow2) return rk_pow2_at_least(s > 1e-4f ? s : 1e-4f);
  return s > 1.17549435e-38f ? s : 1.17549435e-38f;  // FLT_MIN
}

// The quotient q of x by its tile scale, NaN signs made platform-independent (core/SPEC.md "The
// fp8_ds_mla layout"): a NaN x stays itself (its sign kept); +-inf / inf is the positive quiet
// NaN on every platform (GPUs give it; x86 would give the negative default NaN).
ROPEKV_DEVICE float rk_ds_quotient(float x, float q) {
  return x != x ? x : (q != q ? rk_bits_f32(0x7fc00000u) : q);
}

// fp32(x / scale) for x a 16-bit value (bf16 / f16) and scale a tile scale (a finite fp32 >= 2^-126,
// or inf), without an fp32 division per value: fp32(double(x) * inv_d), inv_d = the double
// 1 / scale rounded once. Exact: the double product is within 2^-52 (relative) of x / scale,
// while an x / scale that is not an fp32 rounding midpoint is at least 2^-49 (relative) away
// from every midpoint (x, scale: 24-bit significands, a midpoint: 25 bits), and it is never a
// midpoint in the normal range (the odd 25-bit significand times scale's would need more than
// 24 bits); below 2^-126 (fp32 subnormals) the quotient's e4m3fn code is a zero of x's sign
// either way. scale = inf: inv_d = 0, so finite x gives +-0 as x / inf does, and +-inf gives a
// NaN whose sign is the platform's (the caller makes it rk_ds_quotient's). A NaN x stays itself.
ROPEKV_DEVICE float rk_div_by_tile_scale(float x, double inv_d) {
  const float q = static_cast<float>(ROPEKV_DMUL_RN(static_cast<double>(x), inv_d));
  return x != x ? x : q;
}

// The inv_d that rk_div_by_tile_scale's proof needs, within 2^-51 (relative) of 1 / s, without a
// double division, from r0, any fp32 with |1 - s r0| <= 2^-21 (the hardware reciprocal: 1 ulp,
// 2^-23): e = 1 - s r0 is exact in double (s, r0: 24-bit significands, s r0 fits in 48 bits),
// 1 / s = r0 / (1 - e) = r0 (1 + e + e^2 + e^3 / (1 - e)), so r0 + r0 (e + e^2) is within
// |e|^3 + 2^-73 of it before its own rounding (2^-53): 2^-52.99 in all. For a finite s >= FLT_MIN.
ROPEKV_DEVICE double rk_refine_inverse(float s, float r0) {
  const double sd = static_cast<double>(s), rd = static_cast<double>(r0);
  const double e = ROPEKV_DFMA_RN(-sd, rd, 1.0);
  const double t = ROPEKV_DFMA_RN(e, e, e);
  return ROPEKV_DFMA_RN(rd, t, rd);
}
// rk_div_by_tile_scale's inv_d for a tile scale s (finite >= FLT_MIN, or inf: 0).
ROPEKV_DEVICE double rk_tile_scale_inverse(float s) {
  return s > 3.40282347e38f ? 0.0 : rk_refine_inverse(s, ROPEKV_FRCP_APPROX(s));
}
// 1 / s for a positive power of two s or inf (the pow2 tile scales: 2^-13 .. inf), exact: for
// -126 <= k <= 126 the exponent mirrored (2^k -> 2^-k); the rest by the division.
ROPEKV_DEVICE float rk_pow2_inverse(float s) {
  const uint32_t bits = rk_f32_bits(s);
  return bits - 0x00800000u < 0x7e800000u ? rk_bits_f32(0x7f000000u - bits) : ROPEKV_FDIV_RN(1.0f, s);
}

// ------------------------------------------------------------------ 16-bit NaN canonicalisation
// Same-dtype 2-byte copy: round(fp32(x)) is x itself except for NaN, which becomes the format's
// canonical NaN with its sign (what rk_encode does), so the nope copy is bit operations only.
// Packed, two 16-bit lanes per word: a lane is NaN when its magnitude exceeds inf's; adding
// (0x7fff - inf) to the magnitude carries into the lane's bit 15 exactly then (no carry leaves
// the lane: 0x7fff + 0x3ff < 2^16). Returns 0x8000 in each NaN lane, 0 elsewhere.
// The addend, two copies of 0x7fff - inf (one per 16-bit lane of a word).
ROPEKV_DEVICE uint32_t rk_nan16x2_addend(int32_t t) { return t == rk_bf16 ? 0x007f007fu : 0x03ff03ffu; }
ROPEKV_DEVICE uint32_t rk_nan16x2_sum(uint32_t w, int32_t t) { return (w & 0x7fff7fffu) + rk_nan16x2_addend(t); }
ROPEKV_DEVICE uint32_t rk_canon_nan16x2(uint32_t w, int32_t t) {
  const uint32_t m = rk_nan16x2_sum(w, t) & 0x80008000u;
  if (m == 0u) return w;
  const uint32_t qnan = t == rk_bf16 ? 0x7fc07fc0u : 0x7e007e00u;
  const uint32_t lanes = (m >> 15) * 0x7fffu;  // 0x7fff in each NaN lane: all but its sign
  return (w & ~lanes) | (qnan & lanes);
}
// A 16-byte chunk (8 lanes): one test for the whole chunk on the common no-NaN path.
ROPEKV_DEVICE void rk_canon_nan16x8(uint32_t* w, int32_t t) {
  if (!ROPEKV_ANY_CARRY15_16X8(w, rk_nan16x2_addend(t))) return;
  ROPEKV_UNROLL
  for (int i = 0; i < 4; ++i) w[i] = rk_canon_nan16x2(w[i], t);
}

ROPEKV_DEVICE uint32_t rk_lane16(const uint32_t* w, int m) { return (w[m >> 1] >> (16 * (m & 1))) & 0xffffu; }

// ------------------------------------------------------------------ fp8 pairs
// Two scaled values -> two fp8 codes of ct (lo in bits 0-7): fp8_encode.h's pair encoder (the
// hardware conversion where there is one), the same codes as rk_encode on each.
ROPEKV_DEVICE uint32_t rk_encode_fp8x2(int32_t ct, float lo, float hi) {
  switch (ct) {
    case rk_e4m3fn: return rk_encode_fp8x2_sat<rk_e4m3fn>(lo, hi);
    case rk_e4m3fnuz: return rk_encode_fp8x2_sat<rk_e4m3fnuz>(lo, hi);
    case rk_e5m2: return rk_encode_fp8x2_sat<rk_e5m2>(lo, hi);
    case rk_e5m2fnuz: return rk_encode_fp8x2_sat<rk_e5m2fnuz>(lo, hi);
    default: return 0xffffffffu;  // unreachable: callers pass an fp8 format
  }
}

}  // namespace ropekv_gpu
