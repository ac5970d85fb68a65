// Host conversions: one generic decoder and one generic round-to-nearest-even encoder, driven by
// float_format parameters. f16/bf16 from float32 go through Eigen (as the contract says); the
// tests check Eigen against the generic encoder on every input class.
#include "core/convert.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>  // SSE2 is part of x86-64: _mm_stream_si128, _mm_sfence
#define ROPEKV_STREAM_STORES 1
#if defined(__GNUC__) && defined(__linux__)
#include <immintrin.h>  // AVX-512BW copies of the streaming loops (runtime CPU check)
#define ROPEKV_STREAM_AVX512 1
#endif
#endif

// The row-wise loops are plain C++ that compilers vectorize; where GCC can dispatch at load
// time (x86-64 Linux), they are also built for AVX2 and the CPU picks the version it can run.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define ROPEKV_ROW_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define ROPEKV_ROW_CLONES
#endif

namespace ropekv {

namespace {

struct layout {
  const float_format* fmt;
  int width_bits;       // 1 + exp_bits + man_bits
  uint32_t sign_bit;
  uint32_t exp_mask;    // exponent field, in place
  uint32_t man_mask;
  uint32_t max_bits;    // magnitude bits of max_finite
};

layout layout_of(dtype t) {
  const float_format& f = float_format_of(t);  // throws for non-float dtypes
  layout l;
  l.fmt = &f;
  l.width_bits = 1 + f.exp_bits + f.man_bits;
  l.sign_bit = 1u << (f.exp_bits + f.man_bits);
  l.man_mask = (1u << f.man_bits) - 1u;
  l.exp_mask = ((1u << f.exp_bits) - 1u) << f.man_bits;
  if (f.has_inf) {
    l.max_bits = (l.exp_mask - (1u << f.man_bits)) | l.man_mask;  // exponent all-ones minus 1
  } else if (f.fnuz) {
    l.max_bits = l.exp_mask | l.man_mask;  // 0x7f: every magnitude is finite
  } else if (f.nan_all_ones_mantissa_only) {
    l.max_bits = (l.exp_mask | l.man_mask) - 1u;  // S.1111.110
  } else {
    throw error("layout_of: float format of " + std::string(dtype_name(t)) +
                " has no known special-value scheme");
  }
  return l;
}

uint32_t width_mask(const layout& l) {
  return l.width_bits >= 32 ? 0xffffffffu : ((1u << l.width_bits) - 1u);
}

uint32_t canonical_nan(const layout& l, bool negative) {
  const float_format& f = *l.fmt;
  if (f.fnuz) return l.sign_bit;  // 0x80, unsigned
  const uint32_t s = negative ? l.sign_bit : 0u;
  if (f.has_inf) return s | l.exp_mask | (1u << (f.man_bits - 1));  // quiet NaN
  return s | l.exp_mask | l.man_mask;                               // e4m3fn: S.1111.111
}

uint32_t inf_bits(const layout& l, bool negative) {
  return (negative ? l.sign_bit : 0u) | l.exp_mask;
}

}  // namespace

double decode_to_f64(dtype t, uint32_t bits) {
  if (t == dtype::f32) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return static_cast<double>(f);
  }
  const layout l = layout_of(t);
  const float_format& f = *l.fmt;
  bits &= width_mask(l);
  const bool negative = (bits & l.sign_bit) != 0;
  const uint32_t exp_field = (bits & l.exp_mask) >> f.man_bits;
  const uint32_t man_field = bits & l.man_mask;
  const uint32_t exp_all_ones = (1u << f.exp_bits) - 1u;
  if (f.fnuz) {
    if (bits == l.sign_bit) return std::nan("");
  } else if (f.has_inf) {
    if (exp_field == exp_all_ones) {
      if (man_field == 0) return negative ? -INFINITY : INFINITY;
      return negative ? -std::nan("") : std::nan("");
    }
  } else if (f.nan_all_ones_mantissa_only) {
    if (exp_field == exp_all_ones && man_field == l.man_mask)
      return negative ? -std::nan("") : std::nan("");
  }
  double magnitude;
  if (exp_field == 0) {
    magnitude = std::ldexp(static_cast<double>(man_field), 1 - f.bias - f.man_bits);
  } else {
    magnitude = std::ldexp(static_cast<double>(man_field | (1u << f.man_bits)),
                           static_cast<int>(exp_field) - f.bias - f.man_bits);
  }
  return negative ? -magnitude : magnitude;
}

float decode_to_f32(dtype t, uint32_t bits) {
  if (t == dtype::f32) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  return static_cast<float>(decode_to_f64(t, bits));  // exact: every format fits in binary32
}

namespace {
void check_overflow_mode(overflow_mode mode, const char* where) {
  switch (mode) {
    case overflow_mode::saturate:
    case overflow_mode::ieee:
      return;
    default:
      throw error(std::string(where) + ": invalid overflow_mode " + std::to_string(static_cast<int>(mode)));
  }
}
}  // namespace

uint32_t encode_from_f64(dtype t, double value, overflow_mode mode) {
  const layout l = layout_of(t);
  const float_format& f = *l.fmt;
  check_overflow_mode(mode, "encode_from_f64");
  // f32, f16, bf16 always overflow the IEEE way (see convert.h).
  const bool saturate = mode == overflow_mode::saturate && dtype_is_fp8(t);
  const bool negative = std::signbit(value);
  if (std::isnan(value)) return canonical_nan(l, negative);
  const uint32_t sign = negative ? l.sign_bit : 0u;
  const auto overflow = [&]() -> uint32_t {
    if (saturate) return sign | l.max_bits;
    if (f.has_inf) return inf_bits(l, negative);
    return canonical_nan(l, negative);
  };
  if (std::isinf(value)) return overflow();
  const double a = std::fabs(value);
  if (a == 0.0) return f.fnuz ? 0u : sign;

  // Quantum (spacing) of the format at a: 2^(E - man_bits) for normals, min_subnormal below.
  int exp2;
  std::frexp(a, &exp2);  // a = m * 2^exp2, m in [0.5, 1)
  const int unbiased = exp2 - 1;
  const int min_exp = 1 - f.bias;
  const bool subnormal = unbiased < min_exp;
  const int quantum_exp = (subnormal ? min_exp : unbiased) - f.man_bits;
  const double n = std::ldexp(a, -quantum_exp);  // exact: a scaled by a power of two
  // Round n to nearest integer, ties to even (explicit, independent of the FP environment).
  double r = std::floor(n);
  const double frac = n - r;  // exact
  if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;

  if (std::ldexp(r, quantum_exp) > f.max_finite) return overflow();
  if (r == 0.0) return f.fnuz ? 0u : sign;  // rounds to zero; fnuz has no -0
  const uint32_t ri = static_cast<uint32_t>(r);  // <= 2^(man_bits + 1)
  uint32_t magnitude;
  if (subnormal) {
    magnitude = ri;  // r == 2^man_bits carries into the smallest normal exactly
  } else {
    // r in [2^m, 2^(m+1)]: the implicit bit adds one to the biased exponent field.
    magnitude = (static_cast<uint32_t>(unbiased + f.bias - 1) << f.man_bits) + ri;
  }
  return sign | magnitude;
}

uint32_t encode_from_f32(dtype t, float value, overflow_mode mode) {
  switch (t) {
    case dtype::f32: {
      uint32_t bits;
      std::memcpy(&bits, &value, sizeof bits);
      return bits;
    }
    case dtype::f16:
      if (std::isnan(value)) return encode_from_f64(t, value, mode);  // canonical NaN
      return Eigen::numext::bit_cast<uint16_t>(Eigen::half(value));
    case dtype::bf16:
      if (std::isnan(value)) return encode_from_f64(t, value, mode);
      return Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(value));
    case dtype::fp8_e4m3fn:
    case dtype::fp8_e4m3fnuz:
    case dtype::fp8_e5m2:
    case dtype::fp8_e5m2fnuz:
      return encode_from_f64(t, static_cast<double>(value), mode);
    case dtype::i32:
    case dtype::i64:
    case dtype::u8:
      throw arg_error("dtype", "a float dtype (f32, f16, bf16, fp8_*)", dtype_name(t));
  }
  throw error("encode_from_f32: invalid dtype value " + std::to_string(static_cast<int>(t)));
}

bool is_nan_bits(dtype t, uint32_t bits) {
  const layout l = layout_of(t);
  const float_format& f = *l.fmt;
  bits &= width_mask(l);
  if (f.fnuz) return bits == l.sign_bit;
  const uint32_t magnitude = bits & ~l.sign_bit;
  if (f.has_inf) return (magnitude & l.exp_mask) == l.exp_mask && (magnitude & l.man_mask) != 0;
  return magnitude == (l.exp_mask | l.man_mask);  // e4m3fn
}

ROPEKV_ROW_CLONES void decode_row_to_f32(dtype t, const void* src, float* dst, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  switch (t) {
    case dtype::f32:
      std::memcpy(dst, p, static_cast<size_t>(n) * 4);  // decode_to_f32(f32) is the bits
      return;
    case dtype::bf16:
      for (int64_t i = 0; i < n; ++i) {  // a bf16 is the upper half of the f32 of equal value
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        const uint32_t u = static_cast<uint32_t>(b) << 16;
        std::memcpy(dst + i, &u, 4);
      }
      return;
    case dtype::f16:
      for (int64_t i = 0; i < n; ++i) {  // exact: every f16 is a float
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        dst[i] = static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(b));
      }
      return;
    case dtype::fp8_e4m3fn:
    case dtype::fp8_e4m3fnuz:
    case dtype::fp8_e5m2:
    case dtype::fp8_e5m2fnuz:
      for (int64_t i = 0; i < n; ++i) dst[i] = decode_to_f32(t, p[i]);
      return;
    case dtype::i32:
    case dtype::i64:
    case dtype::u8:
      throw arg_error("dtype", "a float dtype (f32, f16, bf16, fp8_*)", dtype_name(t));
  }
  throw error("decode_row_to_f32: invalid dtype value " + std::to_string(static_cast<int>(t)));
}

namespace {

// The constants encode_row_from_f64 needs for one format and overflow mode.
struct row_encode_consts {
  dtype type;
  overflow_mode mode;
  double min_normal;
  uint64_t rebias;    // (1023 - bias) << man_bits: double's exponent bias to the format's
  uint64_t max_bits;  // magnitude code of max_finite
  uint32_t sign_bit;
  uint32_t overflow_pos, overflow_neg;  // what encode_from_f64's overflow() gives, per sign
};

// A double a >= min_normal rounds to nearest even at the format's precision by integer
// arithmetic on its bits: add just under half a quantum plus the lowest kept bit, drop the
// DropBits = 52 - man_bits low bits (a carry moves into the exponent, which is the next binade,
// exactly), then rebias the exponent. A result beyond max_bits is an overflow, as in
// encode_from_f64 (rounded value > max_finite; inf included). The first pass does that for
// every element without branches (so compilers vectorize it); a second pass, only when the
// row holds one, re-encodes NaN, zero and subnormal results with the scalar encode_from_f64.
// DropBits is a template argument so that the shifts are immediates; the constants are
// copied into locals so that they stay in registers.
template <int DropBits, typename Code>
ROPEKV_ROW_CLONES void encode_row_loop(const row_encode_consts& k, const double* src, uint8_t* out, int64_t n) {
  constexpr uint64_t below_half = (uint64_t{1} << (DropBits - 1)) - 1;
  constexpr int64_t abs_mask = INT64_MAX, inf_bits_f64 = 0x7ff0000000000000;
  int64_t min_normal_bits;
  std::memcpy(&min_normal_bits, &k.min_normal, 8);
  const uint64_t rebias = k.rebias;
  const int64_t max_bits = static_cast<int64_t>(k.max_bits);
  const int64_t sign_bit = k.sign_bit, overflow_pos = k.overflow_pos, overflow_neg = k.overflow_neg;
  int64_t specials = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t bits;
    std::memcpy(&bits, src + i, 8);
    const int64_t a = bits & abs_mask;  // |v|, as bits (ordered like the values)
    const bool negative = bits < 0;
    // unsigned: a NaN's bits may wrap (its code is redone below); the magnitude of every other
    // element is small and fits an int64
    const uint64_t ua = static_cast<uint64_t>(a);
    const int64_t magnitude = static_cast<int64_t>(((ua + below_half + ((ua >> DropBits) & 1u)) >> DropBits) - rebias);
    const int64_t overflow = negative ? overflow_neg : overflow_pos;
    const int64_t code = magnitude > max_bits ? overflow : (magnitude | (negative ? sign_bit : 0));
    specials += (a < min_normal_bits) | (a > inf_bits_f64);  // 0, subnormal; NaN
    const Code c = static_cast<Code>(code);
    std::memcpy(out + sizeof(Code) * static_cast<size_t>(i), &c, sizeof(Code));
  }
  if (specials == 0) return;
  for (int64_t i = 0; i < n; ++i) {
    const double a = std::fabs(src[i]);
    if (a >= k.min_normal && a <= INFINITY) continue;
    const Code c = static_cast<Code>(encode_from_f64(k.type, src[i], k.mode));
    std::memcpy(out + sizeof(Code) * static_cast<size_t>(i), &c, sizeof(Code));
  }
}

// bf16 (the rope rows of the common case) by round-to-odd through float, a cheaper exact route
// than encode_row_loop's 64-bit integer arithmetic: vectorizes in 32-bit lanes.
// Step 1, round to odd at float precision: f = float(d) is one of the two floats around d
// (whatever the rounding mode); stepping its magnitude one code toward zero when it is above
// |d| gives the truncation, and setting the lowest bit when float(d) != d marks the value
// inexact (the sticky bit). Step 2, RNE from those float bits to bf16 by the rounding-bias add
// (a carry moves into the exponent: the next binade, or inf above max). Rounding to odd at 24
// bits, then to nearest even at 8 bits, is the single RNE of d (the odd bit lies 16 places
// below bf16's last bit, so it can never fake or hide a tie; Boldo & Melquiond, "Emulation of
// FMA and correctly rounded sums: proved algorithms using rounding to odd", 2008). That holds
// on the float subnormal grid (a fixed quantum, still 16 bits finer than bf16's) and at
// overflow: d beyond FLT_MAX truncates to FLT_MAX, odd, and rounds to inf as encode_from_f64
// does (bf16 overflows the IEEE way in every mode). A NaN gives the canonical quiet NaN of its
// sign, 0x7fc0 | sign. Equal to encode_from_f64(bf16, d, any mode) for every double
// (test_convert.cpp checks every tie, its double and float neighbours, and random values).
ROPEKV_ROW_CLONES void encode_row_bf16(const double* src, uint8_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double d = src[i];
    const float f = static_cast<float>(d);
    const double back = static_cast<double>(f);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits -= static_cast<uint32_t>(std::fabs(back) > std::fabs(d));  // truncation (NaN: false)
    bits |= static_cast<uint32_t>(back != d);                       // sticky (NaN: true)
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const uint32_t nan_code = ((bits >> 16) & 0x8000u) | 0x7fc0u;
    const uint16_t code = static_cast<uint16_t>(d != d ? nan_code : rounded);
    std::memcpy(out + 2 * i, &code, 2);
  }
}

}  // namespace

void encode_row_from_f64(dtype t, const double* src, void* dst, int64_t n, overflow_mode mode) {
  check_overflow_mode(mode, "encode_row_from_f64");
  if (t == dtype::bf16) {  // the common rope row: no format lookup per call
    static const bool bf16_table_ok = float_format_of(dtype::bf16).man_bits == 7 && dtype_size_bytes(dtype::bf16) == 2;
    if (!bf16_table_ok) throw error("encode_row_from_f64: format table of bf16 changed");
    return encode_row_bf16(src, static_cast<uint8_t*>(dst), n);
  }
  const layout l = layout_of(t);  // throws for non-float dtypes
  const float_format& f = *l.fmt;
  // the general loop's constants (bf16 has its own loop and needs none)
  const auto consts = [&] {
    const bool saturate = mode == overflow_mode::saturate && dtype_is_fp8(t);
    row_encode_consts k;
    k.type = t;
    k.mode = mode;
    k.min_normal = f.min_normal;
    k.rebias = static_cast<uint64_t>(1023 - f.bias) << f.man_bits;
    k.max_bits = l.max_bits;
    k.sign_bit = l.sign_bit;
    k.overflow_pos = saturate ? l.max_bits : (f.has_inf ? inf_bits(l, false) : canonical_nan(l, false));
    k.overflow_neg = saturate ? (l.sign_bit | l.max_bits) : (f.has_inf ? inf_bits(l, true) : canonical_nan(l, true));
    return k;
  };
  uint8_t* out = static_cast<uint8_t*>(dst);
  // One instantiation per (52 - man_bits, code width); checked against the format table.
  const auto check = [&](int man_bits, size_t bytes) {
    if (f.man_bits != man_bits || dtype_size_bytes(t) != bytes) {
      throw error("encode_row_from_f64: format table of " + std::string(dtype_name(t)) + " changed");
    }
  };
  switch (t) {
    case dtype::f32: check(23, 4); return encode_row_loop<52 - 23, uint32_t>(consts(), src, out, n);
    case dtype::f16: check(10, 2); return encode_row_loop<52 - 10, uint16_t>(consts(), src, out, n);
    case dtype::bf16: break;  // above
    case dtype::fp8_e4m3fn:
    case dtype::fp8_e4m3fnuz: check(3, 1); return encode_row_loop<52 - 3, uint8_t>(consts(), src, out, n);
    case dtype::fp8_e5m2:
    case dtype::fp8_e5m2fnuz: check(2, 1); return encode_row_loop<52 - 2, uint8_t>(consts(), src, out, n);
    case dtype::i32:
    case dtype::i64:
    case dtype::u8: break;  // layout_of threw already
  }
  throw error("encode_row_from_f64: invalid dtype value " + std::to_string(static_cast<int>(t)));
}

ROPEKV_ROW_CLONES void recode_row_same_dtype(dtype t, const void* src, void* dst, int64_t n) {
  const layout l = layout_of(t);  // throws for non-float dtypes
  const size_t es = dtype_size_bytes(t);
  uint8_t* p = static_cast<uint8_t*>(dst);
  if (es == 2) {
    // f16 / bf16 (IEEE-style): a code is NaN iff its magnitude is above the inf code. Copy and
    // track the largest magnitude in one pass; re-encode only when the row holds a NaN.
    const uint8_t* q = static_cast<const uint8_t*>(src);
    const int16_t magnitude_mask = static_cast<int16_t>(~l.sign_bit & 0x7fffu);
    int16_t max_magnitude = 0;  // magnitudes are < 2^15: a signed max
    for (int64_t i = 0; i < n; ++i) {  // element by element: src == dst is fine
      int16_t b;
      std::memcpy(&b, q + 2 * i, 2);
      std::memcpy(p + 2 * i, &b, 2);
      max_magnitude = std::max<int16_t>(max_magnitude, static_cast<int16_t>(b & magnitude_mask));
    }
    if (static_cast<uint32_t>(max_magnitude) <= l.exp_mask) return;  // no NaN (inf is exp_mask)
  } else {
    std::memmove(dst, src, static_cast<size_t>(n) * es);  // memmove: src == dst is allowed
    if (t == dtype::f32) return;  // encode_from_f32 into f32 is the bit pattern, NaN included
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = static_cast<uint32_t>(load_bits(t, p + i * static_cast<int64_t>(es)));
    if (is_nan_bits(t, b)) store_bits(t, p + i * static_cast<int64_t>(es), canonical_nan(l, (b & l.sign_bit) != 0));
  }
}

#if ROPEKV_STREAM_AVX512
namespace {
// Whole 64-byte lines of streaming stores: one store fills one write-combining buffer, which
// on x86-64 leaves the core at once (16-byte stores fill it in four steps). Measured on this
// project's VM (AMD EPYC, 1 thread, 512 MiB): 16-byte streaming copy 41-44 GB/s, 64-byte
// 48-52 GB/s. Used where the CPU has AVX-512BW (checked once per process).
bool allow_avx512_streams = true;  // stream_stores_allow_avx512 (tests run both paths)
bool have_avx512bw() {
  static const bool yes = __builtin_cpu_supports("avx512bw") != 0;
  return yes && allow_avx512_streams;
}

// The 16-bit NaN fix-up of recode_row_same_dtype_stream on n elements (n a multiple of 32),
// dst 64-byte aligned: r = (x & ~sign) > inf ? (x & sign) | qnan : x, 32 lanes at a time.
__attribute__((target("avx512f,avx512bw"))) void recode16_lines_avx512(const uint8_t* q, uint8_t* p, int64_t n,
                                                                    uint16_t sign, uint16_t inf, uint16_t qnan) {
  const __m512i v_magnitude = _mm512_set1_epi16(static_cast<short>(~sign));
  const __m512i v_sign = _mm512_set1_epi16(static_cast<short>(sign));
  const __m512i v_inf = _mm512_set1_epi16(static_cast<short>(inf));
  const __m512i v_qnan = _mm512_set1_epi16(static_cast<short>(qnan));
  for (int64_t i = 0; i < n; i += 32) {
    const __m512i x = _mm512_loadu_si512(q + 2 * i);
    // magnitudes are < 2^15: the signed compare is the unsigned one
    const __mmask32 is_nan = _mm512_cmpgt_epi16_mask(_mm512_and_si512(x, v_magnitude), v_inf);
    const __m512i nan = _mm512_or_si512(_mm512_and_si512(x, v_sign), v_qnan);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p + 2 * i), _mm512_mask_mov_epi16(x, is_nan, nan));
  }
}

// bytes (a multiple of 64) from q to p (64-byte aligned), 64-byte streaming stores.
__attribute__((target("avx512f"))) void copy_lines_avx512(const uint8_t* q, uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p + i), _mm512_loadu_si512(q + i));
  }
}
}  // namespace
#endif

namespace {
// The 16-bit NaN rule of recode_row_same_dtype_stream for f16 or bf16, from the format table.
struct nan16_rule {
  uint16_t sign, inf, qnan;
};
nan16_rule nan16_rule_of(dtype t) {
  const layout l = layout_of(t);
  if (dtype_size_bytes(t) != 2 || !l.fmt->has_inf || l.fmt->fnuz) {
    throw error("nan16_rule_of: " + std::string(dtype_name(t)) + " is not a 16-bit IEEE-style format");
  }
  return {static_cast<uint16_t>(l.sign_bit), static_cast<uint16_t>(l.exp_mask),
          static_cast<uint16_t>(canonical_nan(l, false))};
}
}  // namespace

void recode_row_same_dtype_stream(dtype t, const void* src, void* dst, int64_t n) {
  // non-float dtypes: the error here, not from inside the target_clones function below (an
  // exception raised there and unwound through this frame aborted under ASan, GCC 12)
  if (!dtype_is_float(t)) {
    throw arg_error("dtype", "a float dtype (f32, f16, bf16, fp8_*)", std::string(dtype_name(t)));
  }
#if ROPEKV_STREAM_STORES
  if (t == dtype::bf16 || t == dtype::f16) {
    // f16 / bf16: NaN iff the magnitude is above the inf code (exp_mask); a NaN becomes the
    // canonical quiet NaN of its sign (canonical_nan), everything else is copied. The same rule
    // as recode_row_same_dtype, without branches: r = nan ? (x & sign) | qnan : x. The
    // constants are read from the format table once per process (a row is one call).
    static const nan16_rule bf16_rule = nan16_rule_of(dtype::bf16), f16_rule = nan16_rule_of(dtype::f16);
    const nan16_rule& rule = t == dtype::bf16 ? bf16_rule : f16_rule;
    const uint16_t sign = rule.sign;
    const uint16_t inf = rule.inf;
    const uint16_t qnan = rule.qnan;
    const auto one = [&](uint16_t x) -> uint16_t {
      return (x & static_cast<uint16_t>(~sign)) > inf ? static_cast<uint16_t>((x & sign) | qnan) : x;
    };
    const uint8_t* q = static_cast<const uint8_t*>(src);
    uint8_t* p = static_cast<uint8_t*>(dst);
    int64_t i = 0;
    for (; i < n && (reinterpret_cast<uintptr_t>(p + 2 * i) & 15u) != 0; ++i) {  // head: to 16 B
      uint16_t x;
      std::memcpy(&x, q + 2 * i, 2);
      x = one(x);
      std::memcpy(p + 2 * i, &x, 2);
    }
#if ROPEKV_STREAM_AVX512
    if (have_avx512bw()) {  // 16-byte aligned now; up to 64 with 16-byte stores, then lines
      for (; i + 8 <= n && (reinterpret_cast<uintptr_t>(p + 2 * i) & 63u) != 0; i += 8) {
        const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 2 * i));
        const __m128i m = _mm_set1_epi16(static_cast<short>(~sign));
        const __m128i is_nan = _mm_cmpgt_epi16(_mm_and_si128(x, m), _mm_set1_epi16(static_cast<short>(inf)));
        const __m128i nan = _mm_or_si128(_mm_and_si128(x, _mm_set1_epi16(static_cast<short>(sign))),
                                         _mm_set1_epi16(static_cast<short>(qnan)));
        _mm_stream_si128(reinterpret_cast<__m128i*>(p + 2 * i),
                         _mm_or_si128(_mm_andnot_si128(is_nan, x), _mm_and_si128(is_nan, nan)));
      }
      const int64_t lines_elems = (n - i) / 32 * 32;
      recode16_lines_avx512(q + 2 * i, p + 2 * i, lines_elems, sign, inf, qnan);
      i += lines_elems;
    }
#endif
    const __m128i v_magnitude = _mm_set1_epi16(static_cast<short>(~sign));
    const __m128i v_sign = _mm_set1_epi16(static_cast<short>(sign));
    const __m128i v_inf = _mm_set1_epi16(static_cast<short>(inf));
    const __m128i v_qnan = _mm_set1_epi16(static_cast<short>(qnan));
    for (; i + 8 <= n; i += 8) {  // 8 elements, one aligned 16-byte streaming store
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 2 * i));
      // magnitudes are < 2^15: the signed compare is the unsigned one
      const __m128i is_nan = _mm_cmpgt_epi16(_mm_and_si128(x, v_magnitude), v_inf);
      const __m128i nan = _mm_or_si128(_mm_and_si128(x, v_sign), v_qnan);
      const __m128i r = _mm_or_si128(_mm_andnot_si128(is_nan, x), _mm_and_si128(is_nan, nan));
      _mm_stream_si128(reinterpret_cast<__m128i*>(p + 2 * i), r);
    }
    for (; i < n; ++i) {  // tail
      uint16_t x;
      std::memcpy(&x, q + 2 * i, 2);
      x = one(x);
      std::memcpy(p + 2 * i, &x, 2);
    }
    return;
  }
#endif
  recode_row_same_dtype(t, src, dst, n);  // throws for non-float dtypes
}

void copy_bytes_stream(const void* src, void* dst, int64_t bytes) {
  if (bytes <= 0) return;
#if ROPEKV_STREAM_STORES
  const uint8_t* q = static_cast<const uint8_t*>(src);
  uint8_t* p = static_cast<uint8_t*>(dst);
  const int64_t head = std::min<int64_t>(bytes, static_cast<int64_t>((16u - (reinterpret_cast<uintptr_t>(p) & 15u)) & 15u));
  if (head > 0) std::memcpy(p, q, static_cast<size_t>(head));
  int64_t i = head;
#if ROPEKV_STREAM_AVX512
  if (have_avx512bw()) {  // 16-byte aligned now; up to 64 with 16-byte stores, then lines
    for (; i + 16 <= bytes && (reinterpret_cast<uintptr_t>(p + i) & 63u) != 0; i += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(p + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i)));
    }
    const int64_t line_bytes = (bytes - i) / 64 * 64;
    copy_lines_avx512(q + i, p + i, line_bytes);
    i += line_bytes;
  }
#endif
  for (; i + 16 <= bytes; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i)));
  }
  if (i < bytes) std::memcpy(p + i, q + i, static_cast<size_t>(bytes - i));
#else
  std::memcpy(dst, src, static_cast<size_t>(bytes));
#endif
}

bool stream_stores_allow_avx512(bool allow) {
#if ROPEKV_STREAM_AVX512
  allow_avx512_streams = allow;
  return have_avx512bw();
#else
  (void)allow;
  return false;
#endif
}

void stream_store_fence() {
#if ROPEKV_STREAM_STORES
  _mm_sfence();
#endif
}

double ulp_at(dtype t, double value) {
  const float_format& f = float_format_of(t);
  if (std::isnan(value)) return value;
  const double a = std::fabs(value);
  if (a < f.min_normal) return f.min_subnormal;
  int exp2;
  std::frexp(a >= f.max_finite ? f.max_finite : a, &exp2);
  return std::ldexp(1.0, exp2 - 1 - f.man_bits);
}

int64_t ulp_distance(dtype t, uint32_t a_bits, uint32_t b_bits) {
  const layout l = layout_of(t);
  const uint32_t mask = width_mask(l);
  a_bits &= mask;
  b_bits &= mask;
  const bool a_nan = is_nan_bits(t, a_bits);
  const bool b_nan = is_nan_bits(t, b_bits);
  if (a_nan || b_nan) return (a_nan && b_nan) ? 0 : ulp_distance_nan;
  if (l.fmt->has_inf) {
    const bool a_inf = (a_bits & ~l.sign_bit) == l.exp_mask;
    const bool b_inf = (b_bits & ~l.sign_bit) == l.exp_mask;
    if (a_inf || b_inf) return (a_inf && b_inf && a_bits == b_bits) ? 0 : ulp_distance_nan;
  }
  // Ordered keys: magnitude codes of finite values are consecutive; the sign flips them.
  const auto key = [&](uint32_t bits) -> int64_t {
    const int64_t magnitude = static_cast<int64_t>(bits & ~l.sign_bit);
    return (bits & l.sign_bit) ? -magnitude : magnitude;
  };
  const int64_t d = key(a_bits) - key(b_bits);
  return d < 0 ? -d : d;
}

uint64_t load_bits(dtype t, const void* ptr) {
  switch (dtype_size_bytes(t)) {
    case 1: { uint8_t v; std::memcpy(&v, ptr, 1); return v; }
    case 2: { uint16_t v; std::memcpy(&v, ptr, 2); return v; }
    case 4: { uint32_t v; std::memcpy(&v, ptr, 4); return v; }
    case 8: { uint64_t v; std::memcpy(&v, ptr, 8); return v; }
    default:
      throw error("load_bits: unsupported element size " +
                  std::to_string(dtype_size_bytes(t)) + " of dtype " + dtype_name(t));
  }
}

void store_bits(dtype t, void* ptr, uint64_t bits) {
  switch (dtype_size_bytes(t)) {
    case 1: { const uint8_t v = static_cast<uint8_t>(bits); std::memcpy(ptr, &v, 1); return; }
    case 2: { const uint16_t v = static_cast<uint16_t>(bits); std::memcpy(ptr, &v, 2); return; }
    case 4: { const uint32_t v = static_cast<uint32_t>(bits); std::memcpy(ptr, &v, 4); return; }
    case 8: { std::memcpy(ptr, &bits, 8); return; }
    default:
      throw error("store_bits: unsupported element size " +
                  std::to_string(dtype_size_bytes(t)) + " of dtype " + dtype_name(t));
  }
}

}  // namespace ropekv
