// Conversions: exhaustive decode, encode on every tie and boundary and on >= 10^6 random inputs
// against a brute-force nearest-value search over the sorted table of representable values.
#include <doctest/doctest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/convert.h"
#include "core/error.h"
#include "core/rng.h"

using namespace ropekv;

namespace {

const dtype small_floats[] = {dtype::f16, dtype::bf16, dtype::fp8_e4m3fn, dtype::fp8_e4m3fnuz,
                              dtype::fp8_e5m2, dtype::fp8_e5m2fnuz};
const overflow_mode modes[] = {overflow_mode::saturate, overflow_mode::ieee};

uint32_t f32_bits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }
float f32_from_bits(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
const char* mode_name(overflow_mode m) { return m == overflow_mode::saturate ? "saturate" : "ieee"; }


// Independent decode of an fp8 / f16 / bf16 code, written from the format definitions with pow()
// and explicit per-format special-value rules (not from float_format).
struct spec {
  int e, m, bias;
  enum { ieee_specials, fn_specials, fnuz_specials } kind;
};
spec spec_of(dtype t) {
  switch (t) {
    case dtype::f16: return {5, 10, 15, spec::ieee_specials};
    case dtype::bf16: return {8, 7, 127, spec::ieee_specials};
    case dtype::fp8_e4m3fn: return {4, 3, 7, spec::fn_specials};
    case dtype::fp8_e4m3fnuz: return {4, 3, 8, spec::fnuz_specials};
    case dtype::fp8_e5m2: return {5, 2, 15, spec::ieee_specials};
    case dtype::fp8_e5m2fnuz: return {5, 2, 16, spec::fnuz_specials};
    default: FAIL("spec_of: not a small float: " << dtype_name(t)); return {};
  }
}
double independent_decode(dtype t, uint32_t code) {
  const spec s = spec_of(t);
  const uint32_t sign = code >> (s.e + s.m);
  const uint32_t ef = (code >> s.m) & ((1u << s.e) - 1);
  const uint32_t mf = code & ((1u << s.m) - 1);
  const double sgn = sign ? -1.0 : 1.0;
  const uint32_t emax_field = (1u << s.e) - 1;
  if (s.kind == spec::fnuz_specials && code == (1u << (s.e + s.m))) return NAN;
  if (s.kind == spec::ieee_specials && ef == emax_field) return mf ? NAN : sgn * INFINITY;
  if (s.kind == spec::fn_specials && ef == emax_field && mf == (1u << s.m) - 1) return NAN;
  const double frac = static_cast<double>(mf) / std::pow(2.0, s.m);
  if (ef == 0) return sgn * frac * std::pow(2.0, 1 - s.bias);
  return sgn * (1.0 + frac) * std::pow(2.0, static_cast<double>(ef) - s.bias);
}

// Sorted table of the finite values of a format, each with its code, plus a sentinel one step
// above max ("virtual next-above", the value an unbounded exponent would give) marked overflow.
struct entry {
  double value;
  uint32_t code;
  bool overflow;
};
struct value_table {
  dtype t;
  std::vector<entry> pos;  // non-negative values, ascending (0 first), sentinel last
  double max_finite;
};
value_table build_table(dtype t) {
  value_table vt{t, {}, 0.0};
  const spec s = spec_of(t);
  const uint32_t sign_bit = 1u << (s.e + s.m);
  uint32_t max_code = 0;
  for (uint32_t c = 0; c < sign_bit; ++c) {
    const double v = independent_decode(t, c);
    if (std::isnan(v) || std::isinf(v)) continue;
    vt.pos.push_back({v, c, false});
    if (v > vt.max_finite) { vt.max_finite = v; max_code = c; }
  }
  std::sort(vt.pos.begin(), vt.pos.end(), [](const entry& a, const entry& b) { return a.value < b.value; });
  // The spacing just below max is the spacing at max (max is not a power of two in any format).
  const double spacing = vt.pos.back().value - vt.pos[vt.pos.size() - 2].value;
  vt.pos.push_back({vt.max_finite + spacing, max_code + 1, true});
  return vt;
}

uint32_t expected_nan(dtype t, bool negative) {
  const spec s = spec_of(t);
  const uint32_t sign = negative ? (1u << (s.e + s.m)) : 0u;
  switch (s.kind) {
    case spec::fnuz_specials: return 1u << (s.e + s.m);
    case spec::fn_specials: return sign | ((1u << (s.e + s.m)) - 1);
    case spec::ieee_specials: return sign | (((1u << s.e) - 1) << s.m) | (1u << (s.m - 1));
  }
  return 0;
}

// Brute force: nearest value of the table; ties go to the even code; the sentinel means overflow.
uint32_t brute_encode(const value_table& vt, double x, overflow_mode mode) {
  const dtype t = vt.t;
  const spec s = spec_of(t);
  const uint32_t sign_bit = 1u << (s.e + s.m);
  const bool negative = std::signbit(x);
  if (std::isnan(x)) return expected_nan(t, negative);
  const bool saturate = mode == overflow_mode::saturate && dtype_is_fp8(t);
  const uint32_t max_code = vt.pos[vt.pos.size() - 2].code;
  const auto overflow = [&]() -> uint32_t {
    if (saturate) return (negative ? sign_bit : 0u) | max_code;
    if (s.kind == spec::ieee_specials) return (negative ? sign_bit : 0u) | (((1u << s.e) - 1) << s.m);
    return expected_nan(t, negative);
  };
  double a = std::fabs(x);
  if (saturate && a > vt.max_finite) a = vt.max_finite;  // clip first (covers inf)
  if (std::isinf(a)) return overflow();
  const auto it = std::lower_bound(vt.pos.begin(), vt.pos.end(), a,
                                   [](const entry& e, double v) { return e.value < v; });
  const entry* chosen;
  if (it == vt.pos.end()) {
    chosen = &vt.pos.back();  // beyond the sentinel
  } else if (it->value == a || it == vt.pos.begin()) {
    chosen = &*it;
  } else {
    const entry& hi = *it;
    const entry& lo = *(it - 1);
    // Both differences are exact in double: lo <= a <= hi are multiples of a's quantum (or
    // lo == 0) and lo >= a / 2, so each difference has at most 53 significant bits.
    const double dlo = a - lo.value, dhi = hi.value - a;
    if (dlo < dhi) chosen = &lo;
    else if (dhi < dlo) chosen = &hi;
    else chosen = (lo.code % 2 == 0) ? &lo : &hi;
  }
  if (chosen->overflow) return overflow();
  if (chosen->code == 0) return (negative && s.kind != spec::fnuz_specials) ? sign_bit : 0u;
  return (negative ? sign_bit : 0u) | chosen->code;
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%x", v);
  return buf;
}

// Checks both entry points (f64 always; f32 when x is exactly a float) against the brute force.
// Returns the number of mismatches, reporting the first few.
int check_encode(const value_table& vt, double x, overflow_mode mode, int& reported) {
  const uint32_t want = brute_encode(vt, x, mode);
  int bad = 0;
  const uint32_t got64 = encode_from_f64(vt.t, x, mode);
  if (got64 != want) {
    ++bad;
    if (reported++ < 5)
      FAIL_CHECK(dtype_name(vt.t) << " " << mode_name(mode) << " encode_from_f64(" << x
                 << ") = " << hex(got64) << ", brute force " << hex(want));
  }
  const float xf = static_cast<float>(x);
  if (static_cast<double>(xf) == x || std::isnan(x)) {
    const uint32_t got32 = encode_from_f32(vt.t, xf, mode);
    if (got32 != want) {
      ++bad;
      if (reported++ < 5)
        FAIL_CHECK(dtype_name(vt.t) << " " << mode_name(mode) << " encode_from_f32(" << x
                   << ") = " << hex(got32) << ", brute force " << hex(want));
    }
  }
  return bad;
}

}  // namespace

TEST_CASE("conv: decode of every f16 and bf16 pattern matches Eigen and bit shifting") {
  for (uint32_t c = 0; c < 65536; ++c) {
    const double d16 = decode_to_f64(dtype::f16, c);
    const float e16 = static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(static_cast<uint16_t>(c)));
    const double dbf = decode_to_f64(dtype::bf16, c);
    const float ebf = f32_from_bits(c << 16);  // bf16 is the top half of a binary32
    if (std::isnan(e16)) {
      REQUIRE(std::isnan(d16));
      REQUIRE(is_nan_bits(dtype::f16, c));
    } else {
      REQUIRE(!is_nan_bits(dtype::f16, c));
      REQUIRE(f32_bits(decode_to_f32(dtype::f16, c)) == f32_bits(e16));
      REQUIRE(d16 == static_cast<double>(e16));
      REQUIRE(std::signbit(d16) == std::signbit(e16));
    }
    if (std::isnan(ebf)) {
      REQUIRE(std::isnan(dbf));
      REQUIRE(is_nan_bits(dtype::bf16, c));
    } else {
      REQUIRE(!is_nan_bits(dtype::bf16, c));
      REQUIRE(f32_bits(decode_to_f32(dtype::bf16, c)) == f32_bits(ebf));
      REQUIRE(std::signbit(dbf) == std::signbit(ebf));
    }
  }
}

TEST_CASE("conv: decode of every code of every fp8 format matches an independent decode") {
  for (dtype t : {dtype::fp8_e4m3fn, dtype::fp8_e4m3fnuz, dtype::fp8_e5m2, dtype::fp8_e5m2fnuz}) {
    CAPTURE(dtype_name(t));
    int nans = 0, infs = 0;
    for (uint32_t c = 0; c < 256; ++c) {
      CAPTURE(c);
      const double want = independent_decode(t, c);
      const double got = decode_to_f64(t, c);
      REQUIRE(std::isnan(got) == std::isnan(want));
      REQUIRE(is_nan_bits(t, c) == std::isnan(want));
      nans += std::isnan(want);
      infs += std::isinf(want);
      if (!std::isnan(want)) {
        REQUIRE(got == want);
        REQUIRE(std::signbit(got) == std::signbit(want));
        REQUIRE(static_cast<double>(decode_to_f32(t, c)) == want);
      }
    }
    // Special-value census, from the format definitions.
    switch (t) {
      case dtype::fp8_e4m3fn: CHECK(nans == 2); CHECK(infs == 0); break;
      case dtype::fp8_e4m3fnuz: CHECK(nans == 1); CHECK(infs == 0); break;
      case dtype::fp8_e5m2: CHECK(nans == 6); CHECK(infs == 2); break;
      case dtype::fp8_e5m2fnuz: CHECK(nans == 1); CHECK(infs == 0); break;
      default: FAIL("unexpected dtype"); break;
    }
  }
  // Anchors from the format documents.
  CHECK(decode_to_f64(dtype::fp8_e4m3fn, 0x7e) == 448.0);
  CHECK(decode_to_f64(dtype::fp8_e4m3fn, 0x01) == 0x1p-9);
  CHECK(decode_to_f64(dtype::fp8_e4m3fn, 0x38) == 1.0);
  CHECK(decode_to_f64(dtype::fp8_e4m3fnuz, 0x7f) == 240.0);
  CHECK(decode_to_f64(dtype::fp8_e4m3fnuz, 0x40) == 1.0);
  CHECK(decode_to_f64(dtype::fp8_e4m3fnuz, 0x01) == 0x1p-10);
  CHECK(decode_to_f64(dtype::fp8_e5m2, 0x7b) == 57344.0);
  CHECK(std::isinf(decode_to_f64(dtype::fp8_e5m2, 0x7c)));
  CHECK(decode_to_f64(dtype::fp8_e5m2, 0x3c) == 1.0);
  CHECK(decode_to_f64(dtype::fp8_e5m2fnuz, 0x7f) == 57344.0);
  CHECK(decode_to_f64(dtype::fp8_e5m2fnuz, 0x40) == 1.0);
  CHECK(decode_to_f64(dtype::fp8_e5m2fnuz, 0x01) == 0x1p-17);
  CHECK(decode_to_f64(dtype::f16, 0x7bff) == 65504.0);
  CHECK(decode_to_f64(dtype::bf16, 0x3f80) == 1.0);
}

TEST_CASE("conv: encode at every tie and its neighbours, both signs, both overflow modes") {
  for (dtype t : small_floats) {
    const value_table vt = build_table(t);
    for (overflow_mode mode : modes) {
      CAPTURE(dtype_name(t));
      CAPTURE(mode_name(mode));
      int bad = 0, reported = 0;
      int64_t checked = 0;
      for (size_t i = 0; i + 1 < vt.pos.size(); ++i) {  // includes the tie just above max
        const double lo = vt.pos[i].value, hi = vt.pos[i + 1].value;
        const double mid = lo + (hi - lo) / 2;  // exact
        for (double sgn : {1.0, -1.0}) {
          for (double x : {lo, mid, std::nextafter(mid, 0.0), std::nextafter(mid, INFINITY)}) {
            bad += check_encode(vt, sgn * x, mode, reported);
            ++checked;
          }
          // Float neighbours of the midpoint (the f32 path sees only floats).
          const float mf = static_cast<float>(mid);
          REQUIRE(static_cast<double>(mf) == mid);
          for (float xf : {std::nextafterf(mf, 0.0f), std::nextafterf(mf, INFINITY)}) {
            bad += check_encode(vt, sgn * static_cast<double>(xf), mode, reported);
            ++checked;
          }
        }
      }
      CHECK(bad == 0);
      CHECK(checked > 8 * static_cast<int64_t>(vt.pos.size()));
    }
  }
}

TEST_CASE("conv: encode at the boundaries around max and the smallest subnormal") {
  for (dtype t : small_floats) {
    const value_table vt = build_table(t);
    const float_format& f = float_format_of(t);
    const double max = vt.max_finite;
    const double below = vt.pos[vt.pos.size() - 3].value;
    const double above = vt.pos.back().value;  // virtual next-above
    const double min_sub = vt.pos[1].value;
    REQUIRE(f.max_finite == max);
    REQUIRE(f.min_subnormal == min_sub);
    const double xs[] = {max, below, (max + below) / 2, std::nextafter(max, 0.0),
                         std::nextafter(max, INFINITY), (max + above) / 2,
                         std::nextafter((max + above) / 2, 0.0),
                         std::nextafter((max + above) / 2, INFINITY), above, 2 * above,
                         static_cast<double>(FLT_MAX), INFINITY, 1e300,
                         min_sub, min_sub / 2, std::nextafter(min_sub / 2, 0.0),
                         std::nextafter(min_sub / 2, 1.0), 1.5 * min_sub, min_sub / 4,
                         static_cast<double>(FLT_TRUE_MIN), 0x1p-1074, 0.0, NAN};
    for (overflow_mode mode : modes) {
      CAPTURE(dtype_name(t));
      CAPTURE(mode_name(mode));
      int reported = 0;
      for (double x : xs) {
        CAPTURE(x);
        CHECK(check_encode(vt, x, mode, reported) == 0);
        CHECK(check_encode(vt, -x, mode, reported) == 0);
      }
    }
  }
  // Hand-written anchors, independent of the brute force.
  const auto enc = [](dtype t, double x, overflow_mode m) { return encode_from_f64(t, x, m); };
  const auto sat = overflow_mode::saturate;
  const auto ieee = overflow_mode::ieee;
  CHECK(enc(dtype::fp8_e4m3fn, 464.0, ieee) == 0x7e);          // tie above max: to even (448)
  CHECK(enc(dtype::fp8_e4m3fn, 464.0001, ieee) == 0x7f);       // past it: NaN
  CHECK(enc(dtype::fp8_e4m3fn, -464.0001, ieee) == 0xff);
  CHECK(enc(dtype::fp8_e4m3fn, 1e6, sat) == 0x7e);
  CHECK(enc(dtype::fp8_e4m3fn, -INFINITY, sat) == 0xfe);
  CHECK(enc(dtype::fp8_e4m3fnuz, 248.0, ieee) == 0x80);        // tie above 240: odd max -> up
  CHECK(enc(dtype::fp8_e4m3fnuz, 247.9, ieee) == 0x7f);
  CHECK(enc(dtype::fp8_e4m3fnuz, 248.0, sat) == 0x7f);
  CHECK(enc(dtype::fp8_e4m3fnuz, -0.0, ieee) == 0x00);         // no -0
  CHECK(enc(dtype::fp8_e4m3fnuz, -0x1p-11, ieee) == 0x00);     // -min_sub/2 rounds to 0
  CHECK(enc(dtype::fp8_e4m3fn, -0x1p-10, ieee) == 0x80);       // -0 exists in e4m3fn
  CHECK(enc(dtype::fp8_e5m2, 61440.0, ieee) == 0x7c);          // tie above 57344 -> inf
  CHECK(enc(dtype::fp8_e5m2, 61440.0, sat) == 0x7b);
  CHECK(enc(dtype::fp8_e5m2fnuz, 61440.0, ieee) == 0x80);
  CHECK(enc(dtype::fp8_e4m3fn, 0x1.8p-9, ieee) == 0x02);       // 1.5 min_sub -> 2 (even)
  CHECK(enc(dtype::fp8_e4m3fn, 0x1.4p0, ieee) == 0x3a);        // 1.25 exact
  CHECK(enc(dtype::fp8_e4m3fn, 0x1.1p0, ieee) == 0x38);        // 1.0625: tie, to even 1.0
  CHECK(enc(dtype::fp8_e4m3fn, 0x1.3p0, ieee) == 0x3a);        // 1.1875: tie, to even 1.25
  CHECK(enc(dtype::f16, 65520.0, sat) == 0x7c00);              // saturate ignored for f16
  CHECK(enc(dtype::bf16, 0x1.ffp127, ieee) == 0x7f80);
  CHECK(enc(dtype::f16, NAN, ieee) == 0x7e00);
  CHECK(enc(dtype::bf16, -NAN, sat) == 0xffc0);
  CHECK(enc(dtype::fp8_e5m2fnuz, NAN, sat) == 0x80);
  CHECK(is_nan_bits(dtype::f16, encode_from_f32(dtype::f16, NAN, ieee)));
}

TEST_CASE("conv: encode of 10^6 random inputs per format and mode matches the brute force") {
  const uint64_t seed = 20261129;
  for (dtype t : small_floats) {
    const value_table vt = build_table(t);
    const float_format& f = float_format_of(t);
    int exp_lo, exp_hi;
    std::frexp(f.min_subnormal, &exp_lo);
    std::frexp(f.max_finite, &exp_hi);
    for (overflow_mode mode : modes) {
      CAPTURE(dtype_name(t));
      CAPTURE(mode_name(mode));
      int bad = 0, reported = 0;
      const uint64_t tensor_id = static_cast<uint64_t>(t) * 2 + (mode == overflow_mode::ieee);
      const int n = 1000000;
      for (int i = 0; i < n; ++i) {
        const uint64_t r = rng_u64(seed, tensor_id, static_cast<uint64_t>(i));
        double x;
        switch (i % 4) {
          case 0:  // any float bit pattern (all exponents, NaN, inf)
            x = static_cast<double>(f32_from_bits(static_cast<uint32_t>(r)));
            break;
          case 1:
          case 2: {  // a float in the format's range, +-3 binades
            const int e = exp_lo - 3 + static_cast<int>((r >> 32) % static_cast<uint64_t>(exp_hi - exp_lo + 7));
            const float m = 1.0f + static_cast<float>(r & 0x7fffff) * 0x1p-23f;
            x = std::ldexp(static_cast<double>(m), e - 1) * ((r >> 63) ? -1.0 : 1.0);
            break;
          }
          default: {  // a double in the same range (53-bit mantissa: the f64 path only)
            const int e = exp_lo - 3 + static_cast<int>((r >> 52) % static_cast<uint64_t>(exp_hi - exp_lo + 7));
            const uint64_t r2 = rng_u64(seed, tensor_id + 1000, static_cast<uint64_t>(i));
            const double m = 1.0 + static_cast<double>(r2 >> 12) * 0x1p-52;
            x = std::ldexp(m, e - 1) * ((r2 & 1) ? -1.0 : 1.0);
            break;
          }
        }
        bad += check_encode(vt, x, mode, reported);
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("conv: encode_from_f64 into f32 equals the hardware double->float rounding") {
  int bad = 0;
  const auto check = [&](double x) {
    const float want = static_cast<float>(x);  // IEEE RNE, overflow -> inf
    const uint32_t got = encode_from_f64(dtype::f32, x, overflow_mode::ieee);
    const uint32_t got_sat = encode_from_f64(dtype::f32, x, overflow_mode::saturate);
    const bool ok = std::isnan(want) ? is_nan_bits(dtype::f32, got) && got == got_sat
                                     : got == f32_bits(want) && got_sat == got;
    if (!ok && bad++ < 5) FAIL_CHECK("f32 encode of " << x << " gave " << hex(got));
  };
  for (int i = 0; i < 1000000; ++i) {
    const uint64_t r = rng_u64(7, 1, static_cast<uint64_t>(i));
    double x;
    if (i % 2) {
      std::memcpy(&x, &r, 8);  // any double
    } else {                   // doubles around the f32 range, incl. subnormals and overflow
      const int e = -155 + static_cast<int>((r >> 53) % 290);
      x = std::ldexp(1.0 + static_cast<double>(r & ((1ull << 52) - 1)) * 0x1p-52, e);
      if (r >> 63) x = -x;
    }
    check(x);
  }
  // Ties between consecutive floats, around max, and around the smallest subnormal.
  for (int i = 0; i < 100000; ++i) {
    const float a = f32_from_bits(static_cast<uint32_t>(rng_u64(7, 2, static_cast<uint64_t>(i))) & 0x7f7fffffu);
    const double mid = (static_cast<double>(a) + std::nextafterf(a, INFINITY)) / 2;
    check(mid);
    check(-mid);
    check(std::nextafter(mid, 0.0));
    check(std::nextafter(mid, INFINITY));
  }
  for (double x : std::initializer_list<double>{static_cast<double>(FLT_MAX), 0x1.ffffffp127, std::nextafter(0x1.ffffffp127, 0.0),
                   0x1p128, 0x1p-150, std::nextafter(0x1p-150, 1.0), 0x1.8p-149, 1e-300, 0.0, -0.0,
                   static_cast<double>(INFINITY), -static_cast<double>(INFINITY), static_cast<double>(NAN)})
    check(x);
  CHECK(bad == 0);
  CHECK(encode_from_f64(dtype::f32, 0x1.ffffffp127, overflow_mode::ieee) == 0x7f800000u);
  CHECK(encode_from_f64(dtype::f32, 0x1p-150, overflow_mode::ieee) == 0u);
  CHECK(encode_from_f64(dtype::f32, std::nextafter(0x1p-150, 1.0), overflow_mode::ieee) == 1u);
  CHECK(encode_from_f32(dtype::f32, -1.5f, overflow_mode::ieee) == f32_bits(-1.5f));
}

TEST_CASE("conv: non-float dtypes are rejected") {
  CHECK_THROWS_AS(encode_from_f64(dtype::i32, 1.0, overflow_mode::ieee), ropekv::arg_error);
  CHECK_THROWS_AS(encode_from_f32(dtype::u8, 1.0f, overflow_mode::ieee), ropekv::arg_error);
  CHECK_THROWS_AS(decode_to_f64(dtype::i64, 0), ropekv::arg_error);
  CHECK_THROWS_AS(ulp_distance(dtype::i32, 0, 1), ropekv::arg_error);
}

TEST_CASE("conv: load_bits and store_bits round-trip every element size") {
  unsigned char buf[16] = {};
  store_bits(dtype::i64, buf + 1, 0x0123456789abcdefull);  // unaligned on purpose
  CHECK(load_bits(dtype::i64, buf + 1) == 0x0123456789abcdefull);
  store_bits(dtype::bf16, buf + 3, 0xfffff3f80ull);          // high bits dropped
  CHECK(load_bits(dtype::bf16, buf + 3) == 0x3f80u);
  CHECK(load_bits(dtype::u8, buf + 1) == 0xefu);
  store_bits(dtype::fp8_e5m2, buf + 9, 0x17c);
  CHECK(load_bits(dtype::fp8_e5m2, buf + 9) == 0x7cu);
  CHECK(buf[10] == 0);
  store_bits(dtype::f32, buf + 12, f32_bits(2.5f));
  CHECK(load_bits(dtype::f32, buf + 12) == f32_bits(2.5f));
  CHECK(load_bits(dtype::i32, buf + 12) == f32_bits(2.5f));
}

TEST_CASE("conv: ulp_distance edge cases") {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::fp8_e4m3fn, dtype::fp8_e4m3fnuz,
                  dtype::fp8_e5m2, dtype::fp8_e5m2fnuz}) {
    CAPTURE(dtype_name(t));
    const float_format& f = float_format_of(t);
    const auto enc = [t](double x) { return encode_from_f64(t, x, overflow_mode::ieee); };
    const uint32_t nan = enc(NAN);
    const uint32_t pz = enc(0.0), nz = enc(-0.0);
    CHECK(ulp_distance(t, pz, nz) == 0);
    CHECK(ulp_distance(t, nan, nan) == 0);
    CHECK(ulp_distance(t, nan, enc(1.0)) == ulp_distance_nan);
    CHECK(ulp_distance(t, enc(1.0), nan) == ulp_distance_nan);
    CHECK(ulp_distance(t, nan, pz) == ulp_distance_nan);
    CHECK(ulp_distance(t, enc(f.min_subnormal), enc(-f.min_subnormal)) == 2);
    CHECK(ulp_distance(t, enc(f.min_subnormal), pz) == 1);
    CHECK(ulp_distance(t, nz, enc(-f.min_subnormal)) == 1);
    CHECK(ulp_distance(t, enc(1.0), enc(1.0 + ulp_at(t, 1.0))) == 1);
    CHECK(ulp_distance(t, enc(1.0), enc(1.0 - ulp_at(t, 0.75))) == 1);  // across a binade
    CHECK(ulp_distance(t, enc(1.0), enc(2.0)) == (int64_t{1} << f.man_bits));
    CHECK(ulp_distance(t, enc(-1.0), enc(1.0)) == 2 * ulp_distance(t, pz, enc(1.0)));
    CHECK(ulp_distance(t, enc(f.min_normal), enc(f.min_normal - f.min_subnormal)) == 1);
    const uint32_t max = enc(f.max_finite), neg_max = enc(-f.max_finite);
    CHECK(ulp_distance(t, max, enc(f.max_finite - ulp_at(t, f.max_finite))) == 1);
    if (f.has_inf) {
      const uint32_t inf = enc(INFINITY), ninf = enc(-INFINITY);
      CHECK(ulp_distance(t, inf, inf) == 0);
      CHECK(ulp_distance(t, ninf, ninf) == 0);
      CHECK(ulp_distance(t, inf, ninf) == ulp_distance_nan);
      CHECK(ulp_distance(t, inf, max) == ulp_distance_nan);
      CHECK(ulp_distance(t, neg_max, ninf) == ulp_distance_nan);
      CHECK(ulp_distance(t, inf, nan) == ulp_distance_nan);
    }
    // Every NaN pattern equals every other NaN pattern.
    if (t == dtype::fp8_e4m3fn) CHECK(ulp_distance(t, 0x7f, 0xff) == 0);
    if (t == dtype::fp8_e5m2) CHECK(ulp_distance(t, 0x7d, 0xff) == 0);
    if (t == dtype::f16) CHECK(ulp_distance(t, 0x7c01, 0xfe00) == 0);
  }
  // Exhaustive over fp8: the distance between two finite codes is the difference of their
  // ranks in the sorted list of distinct values.
  for (dtype t : {dtype::fp8_e4m3fn, dtype::fp8_e4m3fnuz, dtype::fp8_e5m2, dtype::fp8_e5m2fnuz}) {
    CAPTURE(dtype_name(t));
    std::vector<double> values;
    for (uint32_t c = 0; c < 256; ++c) {
      const double v = decode_to_f64(t, c);
      if (std::isfinite(v)) values.push_back(v);
    }
    std::sort(values.begin(), values.end());
    values.erase(std::unique(values.begin(), values.end()), values.end());  // +0 == -0
    const auto rank = [&](double v) {
      return std::lower_bound(values.begin(), values.end(), v) - values.begin();
    };
    for (uint32_t a = 0; a < 256; ++a) {
      for (uint32_t b = 0; b < 256; ++b) {
        const double va = decode_to_f64(t, a), vb = decode_to_f64(t, b);
        if (!std::isfinite(va) || !std::isfinite(vb)) continue;
        REQUIRE(ulp_distance(t, a, b) == std::abs(rank(va) - rank(vb)));
      }
    }
  }
}

TEST_CASE("conv: ulp_at at powers of two, subnormals and beyond max") {
  CHECK(ulp_at(dtype::f32, 1.0) == 0x1p-23);
  CHECK(ulp_at(dtype::f32, 0.999) == 0x1p-24);
  CHECK(ulp_at(dtype::f32, -1.0) == 0x1p-23);
  CHECK(ulp_at(dtype::f32, 0x1p-126) == 0x1p-149);
  CHECK(ulp_at(dtype::f32, 0x1p-140) == 0x1p-149);
  CHECK(ulp_at(dtype::f16, 1024.0) == 1.0);
  CHECK(ulp_at(dtype::f16, 1023.0) == 0.5);
  CHECK(ulp_at(dtype::f16, 0x1p-14) == 0x1p-24);
  CHECK(ulp_at(dtype::f16, 0x1p-20) == 0x1p-24);
  CHECK(ulp_at(dtype::f16, 0.0) == 0x1p-24);
  CHECK(ulp_at(dtype::f16, 1e6) == 32.0);  // beyond max: spacing at 65504
  CHECK(ulp_at(dtype::bf16, 1.0) == 0x1p-7);
  CHECK(ulp_at(dtype::bf16, 0x1p-130) == 0x1p-133);
  CHECK(ulp_at(dtype::fp8_e4m3fn, 1.0) == 0.125);
  CHECK(ulp_at(dtype::fp8_e4m3fn, 448.0) == 32.0);
  CHECK(ulp_at(dtype::fp8_e4m3fn, 1e9) == 32.0);
  CHECK(ulp_at(dtype::fp8_e4m3fn, 0x1p-6) == 0x1p-9);
  CHECK(ulp_at(dtype::fp8_e4m3fn, 0x1p-7) == 0x1p-9);
  CHECK(ulp_at(dtype::fp8_e4m3fnuz, 1.0) == 0.125);
  CHECK(ulp_at(dtype::fp8_e4m3fnuz, 240.0) == 16.0);
  CHECK(ulp_at(dtype::fp8_e4m3fnuz, 0x1p-8) == 0x1p-10);
  CHECK(ulp_at(dtype::fp8_e5m2, 1.0) == 0.25);
  CHECK(ulp_at(dtype::fp8_e5m2, 57344.0) == 8192.0);
  CHECK(ulp_at(dtype::fp8_e5m2fnuz, 0x1p-16) == 0x1p-17);
  // Consistency with the code space: ulp_at(v) is the gap from v to the next code above.
  for (dtype t : {dtype::f16, dtype::bf16, dtype::fp8_e4m3fn, dtype::fp8_e4m3fnuz, dtype::fp8_e5m2,
                  dtype::fp8_e5m2fnuz}) {
    CAPTURE(dtype_name(t));
    const float_format& f = float_format_of(t);
    const uint32_t max_bits = encode_from_f64(t, f.max_finite, overflow_mode::ieee);
    for (uint32_t c = 0; c < max_bits; ++c) {
      const double v = decode_to_f64(t, c), next = decode_to_f64(t, c + 1);
      REQUIRE(next - v == ulp_at(t, v));
    }
  }
}

// ---- Row-wise conversions (decode_row_to_f32, encode_row_from_f64, recode_row_same_dtype):
// each must give, element by element, what the scalar function gives.

namespace {

const dtype all_floats[] = {dtype::f32,          dtype::f16,          dtype::bf16,
                            dtype::fp8_e4m3fn,   dtype::fp8_e4m3fnuz, dtype::fp8_e5m2,
                            dtype::fp8_e5m2fnuz};

// Every code of a format narrower than f32; for f32, 2^20 codes spread over all exponents plus
// the special patterns (zeros, smallest subnormal, max, inf, NaN payloads of both signs).
std::vector<uint32_t> row_test_codes(dtype t) {
  std::vector<uint32_t> codes;
  if (t != dtype::f32) {
    const uint32_t n = 1u << (8 * dtype_size_bytes(t));
    for (uint32_t b = 0; b < n; ++b) codes.push_back(b);
    return codes;
  }
  for (uint32_t i = 0; i < (1u << 20); ++i) codes.push_back(static_cast<uint32_t>(rng_u64(7, 1, i)));
  for (uint32_t b : {0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007fffffu, 0x00800000u,
                     0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                     0x7f800001u, 0xffbfffffu, 0x7fc12345u}) {
    codes.push_back(b);
  }
  return codes;
}

// The codes as a row of elements of t (little-endian, dtype_size_bytes(t) each).
std::vector<uint8_t> row_of_codes(dtype t, const std::vector<uint32_t>& codes) {
  const size_t es = dtype_size_bytes(t);
  std::vector<uint8_t> row(codes.size() * es);
  for (size_t i = 0; i < codes.size(); ++i) store_bits(t, row.data() + i * es, codes[i]);
  return row;
}

// Doubles that probe encode: for every pair of neighbouring finite codes (f32: of the sampled
// codes and their next code) the lower value, the midpoint and its double and float neighbours
// and values a hair off it, both signs; specials; random doubles over the format's range +-8
// binades.
std::vector<double> encode_probes(dtype t) {
  std::vector<double> xs;
  const float_format& f = float_format_of(t);
  auto add_pair = [&](double lo, double hi) {
    const double mid = lo + (hi - lo) / 2;  // exact
    for (double x : {lo, mid, std::nextafter(mid, 0.0), std::nextafter(mid, INFINITY),
                     mid + mid * 0x1p-30, mid - mid * 0x1p-30,
                     static_cast<double>(std::nextafterf(static_cast<float>(mid), 0.0f)),
                     static_cast<double>(std::nextafterf(static_cast<float>(mid), INFINITY))}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  };
  if (t == dtype::f32) {
    const std::vector<uint32_t> codes = row_test_codes(t);
    for (size_t i = 0; i < codes.size(); i += 4) {  // 2^18 sampled codes
      const uint32_t mag = codes[i] & 0x7fffffffu;
      if (mag >= 0x7f7fffffu) continue;
      add_pair(static_cast<double>(f32_from_bits(mag)), static_cast<double>(f32_from_bits(mag + 1)));
    }
    add_pair(static_cast<double>(FLT_MAX), 0x1p128);  // the tie above max
  } else {
    std::vector<double> values;
    for (uint32_t b : row_test_codes(t)) {
      const double v = decode_to_f64(t, b);
      if (std::isfinite(v) && !std::signbit(v)) values.push_back(v);
    }
    std::sort(values.begin(), values.end());
    int top_exp;
    std::frexp(f.max_finite, &top_exp);
    values.push_back(f.max_finite + std::ldexp(1.0, top_exp - 1 - f.man_bits));  // virtual next
    for (size_t i = 0; i + 1 < values.size(); ++i) add_pair(values[i], values[i + 1]);
  }
  const double inf = INFINITY, nan = NAN;
  for (double x : {0.0, -0.0, f.min_subnormal, f.min_subnormal / 2, f.min_normal,
                   std::nextafter(f.min_normal, 0.0), f.max_finite, 1e300, -1e300,
                   static_cast<double>(FLT_MAX), 0x1p-1074, inf, -inf, nan, -nan}) {
    xs.push_back(x);
  }
  int exp_lo, exp_hi;
  std::frexp(f.min_subnormal, &exp_lo);
  std::frexp(f.max_finite, &exp_hi);
  for (uint64_t i = 0; i < 200000; ++i) {
    const uint64_t r = rng_u64(11, static_cast<uint64_t>(t), i);
    const int e = exp_lo - 8 + static_cast<int>((r >> 52) % static_cast<uint64_t>(exp_hi - exp_lo + 17));
    const double m = 1.0 + static_cast<double>(rng_u64(12, static_cast<uint64_t>(t), i) >> 12) * 0x1p-52;
    xs.push_back(std::ldexp(m, e - 1) * ((r & 1) ? -1.0 : 1.0));
  }
  return xs;
}

}  // namespace

TEST_CASE("conv rows: decode_row_to_f32 equals decode_to_f32 on every code (f32: 2^20 codes)") {
  for (dtype t : all_floats) {
    CAPTURE(dtype_name(t));
    const std::vector<uint32_t> codes = row_test_codes(t);
    const size_t es = dtype_size_bytes(t);
    std::vector<uint8_t> row(codes.size() * es);
    for (size_t i = 0; i < codes.size(); ++i) store_bits(t, row.data() + i * es, codes[i]);
    std::vector<float> got(codes.size() + 1, 12345.0f);  // one guard element
    decode_row_to_f32(t, row.data(), got.data(), static_cast<int64_t>(codes.size()));
    int64_t bad = 0;
    for (size_t i = 0; i < codes.size(); ++i) {
      const float want = decode_to_f32(t, codes[i]);
      if (std::isnan(want)) {
        bad += !std::isnan(got[i]) || std::signbit(got[i]) != std::signbit(want);
      } else {
        bad += f32_bits(got[i]) != f32_bits(want);
      }
    }
    CHECK(bad == 0);
    CHECK(got.back() == 12345.0f);
  }
  CHECK_THROWS_AS(decode_row_to_f32(dtype::i32, nullptr, nullptr, 0), arg_error);
}

TEST_CASE("conv rows: encode_row_from_f64 equals encode_from_f64 at every tie, boundary and 2e5 random doubles") {
  for (dtype t : all_floats) {
    const std::vector<double> xs = encode_probes(t);
    const size_t es = dtype_size_bytes(t);
    for (overflow_mode mode : modes) {
      CAPTURE(dtype_name(t));
      CAPTURE(mode_name(mode));
      std::vector<uint8_t> out((xs.size() + 1) * es, 0xa5);  // one guard element
      encode_row_from_f64(t, xs.data(), out.data(), static_cast<int64_t>(xs.size()), mode);
      int64_t bad = 0, reported = 0;
      for (size_t i = 0; i < xs.size(); ++i) {
        const uint32_t got = static_cast<uint32_t>(load_bits(t, out.data() + i * es));
        const uint32_t want = encode_from_f64(t, xs[i], mode);
        if (got != want && reported++ < 5) MESSAGE("x = " << xs[i] << " got " << got << " want " << want);
        bad += got != want;
      }
      CHECK(bad == 0);
      CHECK(xs.size() > 200000);
      for (size_t b = xs.size() * es; b < out.size(); ++b) CHECK(out[b] == 0xa5);
    }
  }
  // A deliberately truncating encoder would differ at the first tie above 1: the row path
  // must round 1 + 3/2 ulp of bf16 up to even.
  const double x = 1.0 + 3 * 0x1p-8;
  uint16_t got = 0;
  encode_row_from_f64(dtype::bf16, &x, &got, 1, overflow_mode::ieee);
  CHECK(got == 0x3f82);
  CHECK_THROWS_AS(encode_row_from_f64(dtype::i64, &x, &got, 1, overflow_mode::ieee), arg_error);
}

// encode_row_from_f64 into bf16 rounds to odd at float precision, then to nearest even at
// bf16's: its traps are doubles whose float rounding lands on, or crosses, a bf16 tie. For every
// pair of neighbouring bf16 values (subnormals, the virtual pair above max), both signs: the
// tie, its 1..3 double neighbours, the float neighbours of the tie and the float half-way points
// either side (float ties, which plain float rounding sends to even), each +-1 double ulp.
// Rows of every length 1..37 cut from the probe list (vector bodies and scalar tails).
TEST_CASE("conv rows: bf16 row encode equals encode_from_f64 at every bf16 tie's double and float neighbours") {
  std::vector<double> values;
  for (uint32_t b = 0; b < 0x7f80u; ++b) values.push_back(decode_to_f64(dtype::bf16, b));
  values.push_back(0x1p128);  // max_finite + one bf16 spacing (0x1.fep127 + 0x1p120)
  std::vector<double> xs;
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const double mid = values[i] + (values[i + 1] - values[i]) / 2;  // exact
    const double f_ulp = std::max(0x1p-149, std::ldexp(1.0, std::ilogb(mid) - 23));  // float spacing at mid
    std::vector<double> around = {values[i], mid};
    for (double base : {mid, mid - f_ulp / 2, mid + f_ulp / 2, mid - f_ulp, mid + f_ulp}) {
      double lo = base, hi = base;
      around.push_back(base);
      for (int k = 0; k < 3; ++k) {
        lo = std::nextafter(lo, 0.0);
        hi = std::nextafter(hi, INFINITY);
        around.push_back(lo);
        around.push_back(hi);
      }
    }
    for (double x : around) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  for (double x : {0.0, -0.0, 0x1p-1074, -0x1p-1074, 0x1p-150, 0x1p-149, 0x1.8p-150, 1e300, -1e300,
                   static_cast<double>(FLT_MAX), std::nextafter(static_cast<double>(FLT_MAX), 1e300),
                   1.0 / 0.0, -1.0 / 0.0, std::nan(""), -std::nan("")}) {
    xs.push_back(x);
  }
  CHECK(xs.size() > 1000000);
  int64_t bad = 0, reported = 0;
  for (overflow_mode mode : modes) {
    std::vector<uint16_t> out(xs.size() + 1, 0xa5a5);  // one guard element
    size_t at = 0;
    for (int64_t len = 1; at < xs.size(); len = len % 37 + 1) {
      const int64_t n = std::min<int64_t>(len, static_cast<int64_t>(xs.size() - at));
      encode_row_from_f64(dtype::bf16, xs.data() + at, out.data() + at, n, mode);
      at += static_cast<size_t>(n);
    }
    for (size_t i = 0; i < xs.size(); ++i) {
      const uint32_t want = encode_from_f64(dtype::bf16, xs[i], mode);
      if (out[i] != want && reported++ < 5) MESSAGE("x = " << xs[i] << " got " << out[i] << " want " << want);
      bad += out[i] != want;
    }
    CHECK(out.back() == 0xa5a5);
  }
  CHECK(bad == 0);
}

TEST_CASE("conv rows: recode_row_same_dtype is round(fp32(x)) into x's dtype, copied and in place") {
  for (dtype t : all_floats) {
    CAPTURE(dtype_name(t));
    const std::vector<uint32_t> codes = row_test_codes(t);
    const size_t es = dtype_size_bytes(t);
    const int64_t n = static_cast<int64_t>(codes.size());
    const std::vector<uint8_t> src = row_of_codes(t, codes);
    std::vector<uint8_t> copied(src.size() + es, 0x5a), in_place = src;
    recode_row_same_dtype(t, src.data(), copied.data(), n);
    recode_row_same_dtype(t, in_place.data(), in_place.data(), n);
    int64_t bad = 0, nan_codes = 0;
    for (size_t i = 0; i < codes.size(); ++i) {
      const uint32_t want = encode_from_f32(t, decode_to_f32(t, codes[i]), overflow_mode::ieee);
      nan_codes += is_nan_bits(t, codes[i]);
      bad += load_bits(t, copied.data() + i * es) != want;
      bad += load_bits(t, in_place.data() + i * es) != want;
    }
    CHECK(bad == 0);
    CHECK(nan_codes > 0);  // the fix-up path ran
    for (size_t b = src.size(); b < copied.size(); ++b) CHECK(copied[b] == 0x5a);
  }
  // A row without NaN is a plain copy.
  const uint16_t plain[3] = {0x3f80, 0x7f80, 0x8001};
  uint16_t out[3] = {0, 0, 0};
  recode_row_same_dtype(dtype::bf16, plain, out, 3);
  CHECK(out[0] == 0x3f80);
  CHECK(out[1] == 0x7f80);
  CHECK(out[2] == 0x8001);
  CHECK_THROWS_AS(recode_row_same_dtype(dtype::u8, plain, out, 1), arg_error);
}

TEST_CASE("conv rows: recode_row_same_dtype_stream equals recode_row_same_dtype at every code, offset and length") {
  for (dtype t : all_floats) {
    CAPTURE(dtype_name(t));
    const std::vector<uint32_t> codes = row_test_codes(t);
    const size_t es = dtype_size_bytes(t);
    const int64_t n = static_cast<int64_t>(codes.size());
    const std::vector<uint8_t> src = row_of_codes(t, codes);
    std::vector<uint8_t> want(src.size());
    recode_row_same_dtype(t, src.data(), want.data(), n);
    // Every destination misalignment to 64 bytes (the unaligned heads to 16 and to 64 bytes),
    // source offsets, and lengths that end anywhere in a 16-byte chunk or a 64-byte line (the
    // tails), with guard bytes on both sides; with and without the AVX-512 line path.
    int64_t bad = 0, guard_bad = 0, runs = 0;
    for (bool avx512 : {true, false}) {
    stream_stores_allow_avx512(avx512);
    for (int64_t dst_off = 0; dst_off < 64; dst_off += static_cast<int64_t>(es)) {
      for (int64_t src_elem : {int64_t{0}, int64_t{1}, int64_t{3}}) {
        for (int64_t len : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{31}, int64_t{32},
                            int64_t{33}, int64_t{63}, int64_t{64}, int64_t{65}, int64_t{100}, n - src_elem}) {
          const size_t bytes = static_cast<size_t>(len) * es;
          std::vector<uint8_t> buf(bytes + 192, 0xc3);  // 64 guard + data + guard
          uint8_t* base = buf.data() + ((64 - (reinterpret_cast<uintptr_t>(buf.data()) & 63u)) & 63u);
          uint8_t* dst = base + 64 + dst_off;
          recode_row_same_dtype_stream(t, src.data() + src_elem * static_cast<int64_t>(es), dst, len);
          stream_store_fence();
          ++runs;
          bad += std::memcmp(dst, want.data() + src_elem * static_cast<int64_t>(es), bytes) != 0;
          for (uint8_t* g = buf.data(); g < dst; ++g) guard_bad += *g != 0xc3;
          for (uint8_t* g = dst + bytes; g < buf.data() + buf.size(); ++g) guard_bad += *g != 0xc3;
        }
      }
    }
    }
    stream_stores_allow_avx512(true);
    CHECK(runs > 0);
    CHECK(bad == 0);
    CHECK(guard_bad == 0);
  }
  // The NaN rule itself, not only agreement: bf16 and f16 NaN codes of both signs become the
  // canonical quiet NaN of their sign; inf and max stay (lanes of one 16-byte store and the tail).
  alignas(16) uint16_t out[10] = {};
  const uint16_t bf16_in[10] = {0x7f81, 0xffff, 0x7f80, 0xff80, 0x7f7f, 0x0001, 0x7fc1, 0x8000, 0xffc0, 0x7fa0};
  recode_row_same_dtype_stream(dtype::bf16, bf16_in, out, 10);
  stream_store_fence();
  const uint16_t bf16_want[10] = {0x7fc0, 0xffc0, 0x7f80, 0xff80, 0x7f7f, 0x0001, 0x7fc0, 0x8000, 0xffc0, 0x7fc0};
  for (int i = 0; i < 10; ++i) CHECK(out[i] == bf16_want[i]);
  const uint16_t f16_in[10] = {0x7c01, 0xfdff, 0x7c00, 0xfc00, 0x7bff, 0x0001, 0x7e00, 0x8000, 0xffff, 0x7d00};
  recode_row_same_dtype_stream(dtype::f16, f16_in, out, 10);
  stream_store_fence();
  const uint16_t f16_want[10] = {0x7e00, 0xfe00, 0x7c00, 0xfc00, 0x7bff, 0x0001, 0x7e00, 0x8000, 0xfe00, 0x7e00};
  for (int i = 0; i < 10; ++i) CHECK(out[i] == f16_want[i]);
  CHECK_THROWS_AS(recode_row_same_dtype_stream(dtype::u8, bf16_in, out, 1), arg_error);
}

TEST_CASE("conv rows: copy_bytes_stream equals memcpy at every alignment and length") {
  std::vector<uint8_t> src(4096 + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(rng_u64(21, 0, i));
  // destination offsets to a 64-byte line (the AVX-512 path stores whole lines), both paths
  int64_t bad = 0, guard_bad = 0, runs = 0;
  for (bool avx512 : {true, false}) {
  stream_stores_allow_avx512(avx512);
  for (int64_t src_off = 0; src_off < 16; ++src_off) {
    for (int64_t dst_off = 0; dst_off < 64; ++dst_off) {
      for (int64_t len : {0, 1, 2, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 127, 128, 129, 191, 192, 1024, 1151, 4096}) {
        std::vector<uint8_t> buf(static_cast<size_t>(len) + 192, 0x3c);
        uint8_t* base = buf.data() + ((64 - (reinterpret_cast<uintptr_t>(buf.data()) & 63u)) & 63u);
        uint8_t* dst = base + 64 + dst_off;
        copy_bytes_stream(src.data() + src_off, dst, len);
        stream_store_fence();
        ++runs;
        bad += std::memcmp(dst, src.data() + src_off, static_cast<size_t>(len)) != 0;
        for (uint8_t* g = buf.data(); g < dst; ++g) guard_bad += *g != 0x3c;
        for (uint8_t* g = dst + len; g < buf.data() + buf.size(); ++g) guard_bad += *g != 0x3c;
      }
    }
  }
  }
  stream_stores_allow_avx512(true);
  CHECK(runs == 2 * 16 * 64 * 21);
  CHECK(bad == 0);
  CHECK(guard_bad == 0);
}
