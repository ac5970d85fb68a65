// backends/hip/fp8_encode.h (the kernel's fast fp8 / f16 encoders) against kernel.h's general
// rk_encode_narrow, bit for bit, on stratified subsets of all f32 bit patterns that cover every
// exponent and sign and the rounding boundaries (ties, just above, just below) of every output
// exponent, normal and subnormal. All 2^32 patterns were checked once outside CI (see the
// report of the performance work); this test keeps a few seconds' worth.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#ifndef ROPEKV_SIM
#define ROPEKV_SIM 1
#endif
#include "backends/hip/fp8_encode.h"
#include "backends/hip/kernel.h"

namespace {

using namespace ropekv_gpu;

float f32_of_bits(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

struct mismatch_count {
  uint64_t checked = 0;
  uint64_t mismatches = 0;
  uint32_t first_bits = 0, first_fast = 0, first_ref = 0;
};

template <typename Fast, typename Ref>
void check_pattern(uint32_t bits, Fast fast, Ref ref, mismatch_count& m) {
  const float v = f32_of_bits(bits);
  const uint32_t got = fast(v);
  const uint32_t want = ref(v);
  ++m.checked;
  if (got != want) {
    if (m.mismatches == 0) {
      m.first_bits = bits;
      m.first_fast = got;
      m.first_ref = want;
    }
    ++m.mismatches;
  }
}

// (a) every pattern whose low 16 bits are one of six values, any high 16 bits;
// (b) every pattern whose low 12 bits are one of six values, any high 20 bits. The round bit of
// an e4m3 normal is bit 19 (e5m2: 20, f16: 12) and moves up for subnormal outputs; with it and
// everything above it free, the low bits {0, 1, 0x7ff, 0x800, 0x801, 0xfff} give exact ties,
// ties + 1 ulp, and just-below-tie (all sticky bits set) at every rounding position >= 12.
template <typename Fast, typename Ref>
mismatch_count check_strata(Fast fast, Ref ref) {
  mismatch_count m;
  static const uint32_t low16[] = {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
  for (uint32_t hi = 0; hi < (1u << 16); ++hi) {
    for (uint32_t lo : low16) check_pattern((hi << 16) | lo, fast, ref, m);
  }
  static const uint32_t low12[] = {0x000u, 0x001u, 0x7ffu, 0x800u, 0x801u, 0xfffu};
  for (uint32_t hi = 0; hi < (1u << 20); ++hi) {
    for (uint32_t lo : low12) check_pattern((hi << 12) | lo, fast, ref, m);
  }
  return m;
}

std::string hex(uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", x);
  return buf;
}

template <int32_t C>
void check_fp8_format(const char* name) {
  const rk_format f = rk_format_of(C);
  const mismatch_count m = check_strata([](float v) { return rk_encode_fp8_sat<C>(v); },
                                        [f](float v) { return rk_encode_narrow(v, f, true); });
  INFO(std::string(name), ": ", m.mismatches, " of ", m.checked, " patterns differ; first: f32 bits ",
       hex(m.first_bits), " fast ", hex(m.first_fast), " reference ", hex(m.first_ref));
  CHECK(m.checked == 6ull * (1ull << 16) + 6ull * (1ull << 20));
  CHECK(m.mismatches == 0);
}

}  // namespace

TEST_CASE("fp8_encode: rk_encode_fp8_sat equals rk_encode_narrow (saturating) on stratified f32 patterns") {
  static_assert(rk_fp8_e4m3fn == rk_e4m3fn && rk_fp8_e4m3fnuz == rk_e4m3fnuz &&
                    rk_fp8_e5m2 == rk_e5m2 && rk_fp8_e5m2fnuz == rk_e5m2fnuz,
                "fp8_encode.h codes must match kernel.h's rk_dtype");
  SUBCASE("e4m3fn") { check_fp8_format<rk_fp8_e4m3fn>("e4m3fn"); }
  SUBCASE("e4m3fnuz") { check_fp8_format<rk_fp8_e4m3fnuz>("e4m3fnuz"); }
  SUBCASE("e5m2") { check_fp8_format<rk_fp8_e5m2>("e5m2"); }
  SUBCASE("e5m2fnuz") { check_fp8_format<rk_fp8_e5m2fnuz>("e5m2fnuz"); }
}

TEST_CASE("fp8_encode: rk_encode_f16_fast equals rk_encode_narrow (f16, inf on overflow) on stratified f32 patterns") {
  const rk_format f = rk_format_of(rk_f16);
  const mismatch_count m = check_strata([](float v) { return rk_encode_f16_fast(v); },
                                        [f](float v) { return rk_encode_narrow(v, f, false); });
  INFO("f16: ", m.mismatches, " of ", m.checked, " patterns differ; first: f32 bits ",
       hex(m.first_bits), " fast ", hex(m.first_fast), " reference ", hex(m.first_ref));
  CHECK(m.mismatches == 0);
}

// Literal expectations, independent of rk_encode_narrow (values from the OCP / fnuz format
// definitions; ml_dtypes gives the same codes for the finite, in-range values).
TEST_CASE("fp8_encode: known codes (fp8 and f16)") {
  const float inf = f32_of_bits(0x7f800000u);
  const float nan_pos = f32_of_bits(0x7fc00000u);
  const float nan_neg = f32_of_bits(0xffc00001u);
  const float f32_denorm_neg = f32_of_bits(0x80000001u);
  const float two_m9 = 1.0f / 512.0f;  // smallest e4m3fn subnormal

  // e4m3fn: bias 7, max 448 = 0x7e, NaN 0x7f / 0xff, signed zero.
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(1.0f) == 0x38u);
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(-1.0f) == 0xb8u);
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(448.0f) == 0x7eu);
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(464.0f) == 0x7eu);   // tie 448 | 480: even is 448
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(1e9f) == 0x7eu);     // saturates
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(-inf) == 0xfeu);
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(nan_pos) == 0x7fu);
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(nan_neg) == 0xffu);
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(-0.0f) == 0x80u);
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(f32_denorm_neg) == 0x80u);
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(two_m9) == 0x01u);
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(two_m9 * 0.5f) == 0x00u);   // tie 0 | 2^-9: even is 0
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(two_m9 * 1.5f) == 0x02u);   // tie 1 | 2: even is 2
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(two_m9 * 7.5f) == 0x08u);   // rounds up to min normal
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(1.0625f) == 0x38u);         // tie 1 | 1.125: even is 1
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fn>(1.1875f) == 0x3au);         // tie 1.125 | 1.25: 1.25

  // e4m3fnuz: bias 8, max 240 = 0x7f, single NaN 0x80, no negative zero.
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fnuz>(1.0f) == 0x40u);
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fnuz>(240.0f) == 0x7fu);
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fnuz>(-1e9f) == 0xffu);
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fnuz>(nan_neg) == 0x80u);
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fnuz>(-0.0f) == 0x00u);
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fnuz>(-two_m9 / 4.0f) == 0x00u);  // -2^-11 rounds to -0: 0x00
  CHECK(rk_encode_fp8_sat<rk_fp8_e4m3fnuz>(-two_m9 / 2.0f) == 0x81u);  // -2^-10: smallest subnormal

  // e5m2: bias 15, max 57344 = 0x7b, NaN 0x7e / 0xfe, inf saturates.
  CHECK(rk_encode_fp8_sat<rk_fp8_e5m2>(1.0f) == 0x3cu);
  CHECK(rk_encode_fp8_sat<rk_fp8_e5m2>(57344.0f) == 0x7bu);
  CHECK(rk_encode_fp8_sat<rk_fp8_e5m2>(inf) == 0x7bu);
  CHECK(rk_encode_fp8_sat<rk_fp8_e5m2>(nan_neg) == 0xfeu);
  CHECK(rk_encode_fp8_sat<rk_fp8_e5m2>(-0.0f) == 0x80u);

  // e5m2fnuz: bias 16, max 57344 = 0x7f, single NaN 0x80.
  CHECK(rk_encode_fp8_sat<rk_fp8_e5m2fnuz>(1.0f) == 0x40u);
  CHECK(rk_encode_fp8_sat<rk_fp8_e5m2fnuz>(-57344.0f) == 0xffu);
  CHECK(rk_encode_fp8_sat<rk_fp8_e5m2fnuz>(nan_pos) == 0x80u);
  CHECK(rk_encode_fp8_sat<rk_fp8_e5m2fnuz>(-0.0f) == 0x00u);

  // f16: overflow -> inf, NaN 0x7e00 with sign.
  CHECK(rk_encode_f16_fast(1.0f) == 0x3c00u);
  CHECK(rk_encode_f16_fast(65504.0f) == 0x7bffu);
  CHECK(rk_encode_f16_fast(65519.0f) == 0x7bffu);
  CHECK(rk_encode_f16_fast(65520.0f) == 0x7c00u);  // tie 65504 | 65536: even is inf
  CHECK(rk_encode_f16_fast(-inf) == 0xfc00u);
  CHECK(rk_encode_f16_fast(nan_neg) == 0xfe00u);
  CHECK(rk_encode_f16_fast(5.9604645e-8f) == 0x0001u);  // 2^-24, smallest subnormal
  CHECK(rk_encode_f16_fast(-0.0f) == 0x8000u);
}
