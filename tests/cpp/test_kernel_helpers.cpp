// Unit tests of fast_v4's bit tricks (backends/hip/kernel.h, host-compiled as in the sim):
// the multiply-high division of a q row index by H, and the packed NaN canonicalisation of the
// 16-bit copies. Each is checked against the plain operation it replaces.
#include <doctest/doctest.h>
#ifndef ROPEKV_SIM
#define ROPEKV_SIM 1
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/hip/kernel.h"
#include "backends/hip/launch_plan.h"
#include "core/rng.h"

namespace {

using namespace ropekv_gpu;

// One lane, the definition (core/SPEC.md round(fp32(x)) of a 16-bit x): x, except that a NaN
// becomes the format's canonical NaN with x's sign.
uint32_t canon_lane(uint32_t x, int32_t t) {
  const uint32_t inf = t == rk_bf16 ? 0x7f80u : 0x7c00u;
  const uint32_t qnan = t == rk_bf16 ? 0x7fc0u : 0x7e00u;
  return (x & 0x7fffu) > inf ? ((x & 0x8000u) | qnan) : x;
}

float bits_f(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

}  // namespace

TEST_CASE("rk_div_u32: multiply-high division equals n / d") {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 1100; ++d) divisors.push_back(d);
  for (uint32_t d : {4095u, 4096u, 4097u, 65535u, 65536u, 65537u, 1000003u, 0x7fffffffu, 0x80000000u,
                     0x80000001u, 0xfffffffeu, 0xffffffffu})
    divisors.push_back(d);
  ropekv::rng_stream rng{2026, 1};
  for (uint32_t d : divisors) {
    uint32_t magic = 0, shift = 0;
    rk_div_magic(d, &magic, &shift);
    auto check = [&](uint32_t n) {
      if (rk_div_u32(n, magic, shift) != n / d) {
        FAIL_CHECK("d=", d, " n=", n, " got ", rk_div_u32(n, magic, shift), " want ", n / d);
      }
    };
    for (uint32_t n : {0u, 1u, d - 1, d, d + 1, 2 * d - 1, 0x7fffffffu, 0x80000000u, 0xfffffffeu, 0xffffffffu})
      check(n);
    for (uint32_t k = 1; k < 64; ++k) {  // around multiples of d
      const uint64_t m = static_cast<uint64_t>(d) * (k * 0x3fffffffull / 63 / d + 1);
      if (m <= 0xffffffffull) {
        check(static_cast<uint32_t>(m));
        check(static_cast<uint32_t>(m - 1));
      }
    }
    for (int i = 0; i < 2000; ++i) check(static_cast<uint32_t>(rng.next_u64()));
  }
  CHECK_THROWS(rk_div_magic(0, nullptr, nullptr));
}

TEST_CASE("rk_canon_nan16x2 / x8: every 16-bit lane value, both lanes, both formats") {
  for (int32_t t : {rk_bf16, rk_f16}) {
    int64_t bad = 0;
    for (uint32_t x = 0; x < 65536; ++x) {
      for (uint32_t other : {0x0000u, 0x3f80u, 0x7fc1u, 0xfc01u}) {
        const uint32_t lo = x | (other << 16), hi = other | (x << 16);
        const uint32_t want_lo = canon_lane(x, t) | (canon_lane(other, t) << 16);
        const uint32_t want_hi = canon_lane(other, t) | (canon_lane(x, t) << 16);
        bad += rk_canon_nan16x2(lo, t) != want_lo;
        bad += rk_canon_nan16x2(hi, t) != want_hi;
        uint32_t w[4] = {0x3f803f80u, lo, 0x12345678u, hi};
        rk_canon_nan16x8(w, t);
        bad += w[0] != 0x3f803f80u || w[1] != want_lo || w[2] != 0x12345678u || w[3] != want_hi;
      }
    }
    INFO("dtype ", t);
    CHECK(bad == 0);
  }
  // spot values: signalling-style and negative payloads, inf untouched
  CHECK(rk_canon_nan16x2(0xffd37f81u, rk_bf16) == 0xffc07fc0u);
  CHECK(rk_canon_nan16x2(0x7f80ff80u, rk_bf16) == 0x7f80ff80u);
  CHECK(rk_canon_nan16x2(0xfc017c00u, rk_f16) == 0xfe007c00u);
}

TEST_CASE("the chunk NaN test: the GPUs' word form and the sim's vector form, every lane value at every lane") {
  // rk_canon_nan16x8's test for "any NaN lane" runs as rk_any_carry15_words on the GPUs and as
  // ROPEKV_ANY_CARRY15_16X8 here (an SSE2 form on x86): both must say exactly "some lane is NaN".
  for (int32_t t : {rk_bf16, rk_f16}) {
    const uint32_t add = rk_nan16x2_addend(t), inf = t == rk_bf16 ? 0x7f80u : 0x7c00u;
    int64_t bad_words = 0, bad_sim = 0;
    for (int lane = 0; lane < 8; ++lane) {
      for (uint32_t x = 0; x < 65536; ++x) {
        for (uint32_t other : {0x0000u, 0x8000u, 0x7f80u, 0xfc00u, 0x7bffu}) {  // 0, -0, infs, max f16
          uint32_t w[4];
          for (int k = 0; k < 4; ++k) w[k] = other | (other << 16);
          w[lane >> 1] = (w[lane >> 1] & ~(0xffffu << (16 * (lane & 1)))) | (x << (16 * (lane & 1)));
          bool want = false;
          for (int m = 0; m < 8; ++m) want = want || (rk_lane16(w, m) & 0x7fffu) > inf;
          bad_words += rk_any_carry15_words(w, add) != want;
          bad_sim += ROPEKV_ANY_CARRY15_16X8(w, add) != want;
        }
      }
    }
    INFO("dtype ", t);
    CHECK(bad_words == 0);
    CHECK(bad_sim == 0);
  }
}

TEST_CASE("rk_paged_cache::entry: multiply-high and 64-bit division give the same address") {
  ropekv::rng_stream rng{77, 2};
  for (int64_t block_size : {int64_t{1}, int64_t{3}, int64_t{16}, int64_t{64}, int64_t{100}, int64_t{4096},
                             int64_t{65537}}) {
    rk_paged_cache wide{};
    wide.nope = {reinterpret_cast<char*>(uintptr_t{1} << 40), block_size * 640 + 64, 640};
    wide.block_size = block_size;
    wide.num_slots = (int64_t{1} << 32) - 1;
    wide.dtype = rk_bf16;
    rk_paged_cache fast = wide;
    fast.slots_u32 = 1;
    rk_div_magic(static_cast<uint32_t>(block_size), &fast.bs_magic, &fast.bs_shift);
    int64_t bad = 0;
    for (int i = 0; i < 20000; ++i) {
      const int64_t slot = i < 64 ? (i < 32 ? i : wide.num_slots - 1 - (i - 32))
                                  : static_cast<int64_t>(rng.below(static_cast<uint64_t>(wide.num_slots)));
      bad += fast.entry(fast.nope, slot) != wide.entry(wide.nope, slot);
    }
    INFO("block_size ", block_size);
    CHECK(bad == 0);
  }
}

TEST_CASE("rk_exact_inverse: v / 2^k == v * 2^-k for every v; other scales are divided") {
  ropekv::rng_stream rng{5, 3};
  auto same = [](float a, float b) { return std::memcmp(&a, &b, 4) == 0 || (a != a && b != b); };
  int64_t checked = 0, bad = 0;
  for (int k = -126; k <= 126; ++k) {
    const float scale = std::ldexp(1.0f, k);
    REQUIRE(rk_exact_inverse(scale));
    const float inv = 1.0f / scale;
    for (int i = 0; i < 4000; ++i) {
      const float v = bits_f(static_cast<uint32_t>(rng.next_u64()));
      bad += !same(v / scale, v * inv);
      ++checked;
    }
  }
  CHECK(checked == 253 * 4000);
  CHECK(bad == 0);
  for (float s : {0.37f, 3.0f, 1.5f, 0.1f, std::ldexp(1.0f, 127), std::ldexp(1.0f, -127), std::ldexp(1.0f, -140),
                  -1.0f, 0.0f})
    CHECK_MESSAGE(!rk_exact_inverse(s), s);
  // the reason: 2^127 has no normal inverse; 0.37 rounds differently somewhere
  bool differs = false;
  for (int i = 0; i < 100000 && !differs; ++i) {
    const float v = bits_f(static_cast<uint32_t>(rng.next_u64()) & 0x3fffffffu);
    differs = !same(v / 0.37f, v * (1.0f / 0.37f));
  }
  CHECK(differs);
}

// fp8_ds_mla on fast_v4 divides by the tile scale through a double product
// (rk_div_by_tile_scale): for every bf16 and f16 value and scales across the whole range
// (random significands, powers of two and their neighbours, FLT_MIN, the largest, inf), the
// fp32 quotient equals the IEEE division wherever it is a normal number, and the e4m3fn code
// the entry stores is the same everywhere (subnormal quotients: a zero of the value's sign).
TEST_CASE("rk_div_by_tile_scale: the double product gives the fp32 division's quotient and code") {
  ropekv::rng_stream rng{7, 11};
  std::vector<float> scales = {1.17549435e-38f, std::ldexp(1.0f, -13), 1.0f, 0.75f, 336.0f / 448.0f,
                               std::nextafter(1.0f, 2.0f), std::nextafter(1.0f, 0.0f), std::ldexp(1.0f, 120),
                               3.4028235e38f / 448.0f, std::numeric_limits<float>::infinity()};
  for (int i = 0; i < 240; ++i) {  // random significands, exponents over [-126, 120]
    const uint32_t exp = 1u + static_cast<uint32_t>(rng.next_u64() % 247u);
    scales.push_back(bits_f((exp << 23) | (static_cast<uint32_t>(rng.next_u64()) & 0x7fffffu)));
  }
  int64_t values = 0, quotient_bad = 0, code_bad = 0;
  // inv_d as the kernel computes it (rk_tile_scale_inverse: a refined fp32 reciprocal, here the
  // correctly rounded one) and from fp32 reciprocals 3 ulps off either way (the GPUs' approximate
  // reciprocal is within 1 ulp): every one gives the division's quotient
  int64_t inverses = 0;
  for (const int32_t t : {rk_bf16, rk_f16}) {
    for (size_t k = 0; k < scales.size(); ++k) {
      const float scale = scales[k];
      std::vector<double> inverses_d = {rk_tile_scale_inverse(scale)};
      if (k % 4 == 0 && scale < 3.40282347e38f) {
        for (const int ulps : {-3, 3}) {
          uint32_t r0 = 0;
          const float rn = 1.0f / scale;
          std::memcpy(&r0, &rn, 4);
          inverses_d.push_back(rk_refine_inverse(scale, bits_f(r0 + static_cast<uint32_t>(ulps))));
        }
      }
      for (const double inv_d : inverses_d) {
        ++inverses;
        for (uint32_t code = 0; code < 65536u; ++code) {
          const float x = rk_decode(t, code);
          const float want = x / scale, got = rk_div_by_tile_scale(x, inv_d);
          ++values;
          if (std::fabs(want) >= 1.17549435e-38f && std::memcmp(&want, &got, 4) != 0) ++quotient_bad;
          if (rk_encode(rk_e4m3fn, want) != rk_encode(rk_e4m3fn, got)) ++code_bad;
        }
      }
    }
  }
  CHECK(inverses > 2 * static_cast<int64_t>(scales.size()));
  CHECK(values == 65536 * inverses);
  CHECK(quotient_bad == 0);
  CHECK(code_bad == 0);
}

// rk_refine_inverse: from any fp32 r0 within 2^-21 of 1 / s (8 ulps and less either way), the
// double is within 2^-51 of 1 / s (measured in long double: 64-bit significands), as
// rk_div_by_tile_scale's proof needs; the correctly rounded fp32 reciprocal alone is not.
TEST_CASE("rk_refine_inverse: a double 1 / s within 2^-51 from an fp32 reciprocal 8 ulps off") {
  static_assert(std::numeric_limits<long double>::digits >= 64, "the check needs x87 long double");
  ropekv::rng_stream rng{7, 12};
  const long double bound = std::ldexp(1.0L, -51);
  long double worst = 0.0L, unrefined = 0.0L;
  int64_t checked = 0;
  for (int i = 0; i < 20000; ++i) {
    const uint32_t exp = 1u + static_cast<uint32_t>(rng.next_u64() % 253u);  // s in [2^-126, 2^127)
    const float s = bits_f((exp << 23) | (static_cast<uint32_t>(rng.next_u64()) & 0x7fffffu));
    const float rn = 1.0f / s;
    uint32_t r0 = 0;
    std::memcpy(&r0, &rn, 4);
    for (int ulps = -8; ulps <= 8; ++ulps) {
      const float r = bits_f(r0 + static_cast<uint32_t>(ulps));
      if (std::fabs(1.0L - static_cast<long double>(s) * r) > std::ldexp(1.0L, -21)) continue;
      const long double err = std::fabs(static_cast<long double>(rk_refine_inverse(s, r)) * s - 1.0L);
      worst = err > worst ? err : worst;
      if (ulps == 0) unrefined = std::fmax(unrefined, std::fabs(static_cast<long double>(rn) * s - 1.0L));
      ++checked;
    }
  }
  CHECK(checked > 20000 * 10);
  CHECK(worst <= bound);
  CHECK(unrefined > bound);  // the refinement is what brings it there
  CHECK(rk_tile_scale_inverse(std::numeric_limits<float>::infinity()) == 0.0);
  CHECK(rk_tile_scale_inverse(1.17549435e-38f) == std::ldexp(1.0, 126));
}

// rk_pow2_inverse: 1 / s exactly for every power of two the pow2 tile scales take, and inf.
TEST_CASE("rk_pow2_inverse: the exact 1 / 2^k for every k, and 0 for inf") {
  for (int k = -149; k <= 127; ++k) {
    const float s = std::ldexp(1.0f, k), want = 1.0f / s, got = rk_pow2_inverse(s);
    CHECK_MESSAGE(std::memcmp(&want, &got, 4) == 0, "2^" << k);
  }
  CHECK(rk_pow2_inverse(std::numeric_limits<float>::infinity()) == 0.0f);
}

// rk_ds_tile_scale divides amax by 448 through a double product: the scale equals the
// definition (fp32(amax / 448), then the clamps) for every bf16 and f16 amax and a sample of
// every 97th fp32 bit pattern (the general body's f32 input), in both scale modes.
TEST_CASE("rk_ds_tile_scale: fp32(amax / 448) and its clamps, without a division") {
  auto defined = [](float amax, int32_t pow2) {
    const float s = amax / 448.0f;
    if (pow2) return rk_pow2_at_least(s > 1e-4f ? s : 1e-4f);
    return s > 1.17549435e-38f ? s : 1.17549435e-38f;
  };
  int64_t checked = 0, bad = 0;
  auto check = [&](float amax) {
    for (const int32_t pow2 : {0, 1}) {
      const float want = defined(amax, pow2), got = rk_ds_tile_scale(amax, pow2);
      ++checked;
      if (std::memcmp(&want, &got, 4) != 0) ++bad;
    }
  };
  for (const int32_t t : {rk_bf16, rk_f16})
    for (uint32_t code = 0; code <= 0x7fffu; ++code) {
      const float amax = rk_decode(t, code);
      if (amax == amax) check(amax);
    }
  for (uint64_t b = 0; b <= 0x7f800000u; b += 97) check(bits_f(static_cast<uint32_t>(b)));
  CHECK(checked > 2 * (0x7f800000 / 97));
  CHECK(bad == 0);
}

// rk_max_u16x2 is the halfword-wise maximum, and rk_ds_tile_amax_bits the largest magnitude of a
// tile's 128 values with NaNs skipped (random tiles: both formats, NaNs and infinities of both
// signs in some).
TEST_CASE("rk_max_u16x2 and rk_ds_tile_amax_bits: halfword maxima and a tile's amax") {
  ropekv::rng_stream rng{7, 13};
  for (int i = 0; i < 100000; ++i) {
    const uint32_t a = static_cast<uint32_t>(rng.next_u64()), b = static_cast<uint32_t>(rng.next_u64());
    const uint32_t lo = std::max(a & 0xffffu, b & 0xffffu), hi = std::max(a >> 16, b >> 16);
    REQUIRE(rk_max_u16x2(a, b) == (lo | (hi << 16)));
  }
  alignas(16) uint16_t tile[128];
  int nan_tiles = 0;
  for (int i = 0; i < 4000; ++i) {
    const int32_t t = i % 2 ? rk_bf16 : rk_f16;
    const uint32_t inf = t == rk_bf16 ? 0x7f80u : 0x7c00u;
    const int specials = static_cast<int>(rng.next_u64() % 4);  // 0: none; else some NaN / inf values
    for (auto& v : tile) {
      v = static_cast<uint16_t>(rng.next_u64() % (inf + 1) | (rng.next_u64() % 2) << 15);
      if (specials && rng.next_u64() % 16 == 0)
        v = static_cast<uint16_t>((specials == 1 ? inf : inf + 1 + rng.next_u64() % 0x3f) | (rng.next_u64() % 2) << 15);
    }
    uint32_t want = 0;
    bool nan = false;
    for (const uint16_t v : tile) {
      const uint32_t m = v & 0x7fffu;
      if (m > inf) nan = true;
      else want = std::max(want, m);
    }
    nan_tiles += nan;
    REQUIRE(rk_ds_tile_amax_bits(reinterpret_cast<const char*>(tile), inf) == want);
  }
  CHECK(nan_tiles > 500);
}
