// Fast f32 -> fp8 (saturating) and f32 -> f16 encoders for the GPU kernel.
//
// Bit-exact replacements for kernel_convert.h's general rk_encode_narrow (64-bit integer math and
// branches, ~100 instructions per value):
//   rk_encode_fp8_sat<C>(v) == rk_encode_narrow(v, rk_format_of(C), /*saturate=*/true)
//   rk_encode_f16_fast(v)   == rk_encode_narrow(v, rk_format_of(rk_f16), /*saturate=*/false)
// for every f32 bit pattern: tests/cpp/test_fp8_encode.cpp checks a stratified 6.7M patterns per
// format; all 2^32 inputs were checked once, on the host (g++ -O2) and on an H200 (nvcc -O3,
// with and without -ftz=true), both 0 mismatches in all five encoders.
// 32-bit integer and float operations only, no loops, no branches (the compiler turns the
// selects into predicated moves). sm_90a SASS (nvcc 13.0): 13 instructions for e4m3fn / e5m2 /
// f16, 16 for the fnuz formats (rk_encode_narrow: ~62 with branches); a compute-bound loop over
// 2^32 values on the H200 runs 2.5-3.4x faster than with rk_encode_narrow.
//
// The idea, for a narrow format with M mantissa bits and exponent bias B
// (|v| = mag as f32 bits, s = 23 - M dropped mantissa bits):
//   - normal results (|v| >= 2^(1-B), the smallest normal of the narrow format): the f32 bits of
//     |v| are already "exponent:mantissa" in the right order. Rounding to nearest even is an
//     integer add of (2^(s-1) - 1) plus the lowest kept bit, then a right shift by s; a carry out
//     of the mantissa rounds up into the exponent for free. Re-biasing the exponent from 127 to B
//     is subtracting (127 - B) << 23 before the shift, folded into the same add constant.
//   - subnormal results (|v| < 2^(1-B)): the float "magic add" |v| + 2^k with k = 24 - B - M.
//     The ulp of 2^k in f32 is 2^(k-23) = 2^(1-B-M), the narrow format's smallest subnormal, so
//     the FPU rounds |v| to a multiple of it, to nearest even. The low bits of the sum are then
//     the narrow code (a round-up to 1 << M is the smallest normal: also the right code). f32
//     subnormal inputs give a code of 0 whether or not the FPU flushes them.
//   - saturation is an unsigned min against the max finite code (f16: against the inf code
//     0x7c00, so overflow gives inf); +-inf takes the normal path and lands there too.
//   - NaN (mag > 0x7f800000) is selected last; the sign is ORed in, except that fnuz formats
//     have no negative zero (code 0 stays 0x00) and a single unsigned NaN 0x80.
#pragma once
#include <cstdint>

#include "backends/hip/gpu_compat.h"
#if defined(__CUDACC__) && !defined(__HIP__) && !defined(ROPEKV_SIM)
#include <cuda_fp8.h>  // __nv_cvt_float2_to_fp8x2 (rk_encode_fp8x2_sat)
#endif

namespace ropekv_gpu {

// Same values as kernel_dtype.h's rk_dtype codes (kept independent on purpose: no include).
constexpr int32_t rk_fp8_e4m3fn = 3;
constexpr int32_t rk_fp8_e4m3fnuz = 4;
constexpr int32_t rk_fp8_e5m2 = 5;
constexpr int32_t rk_fp8_e5m2fnuz = 6;

// Layout of one fp8 format, at compile time.
template <int32_t C>
struct rk_fp8_traits;
template <>
struct rk_fp8_traits<rk_fp8_e4m3fn> {
  static constexpr int32_t man_bits = 3, bias = 7;
  static constexpr uint32_t max_code = 0x7eu, nan_code = 0x7fu;  // NaN 0x7f / 0xff (signed)
  static constexpr bool fnuz = false;
};
template <>
struct rk_fp8_traits<rk_fp8_e4m3fnuz> {
  static constexpr int32_t man_bits = 3, bias = 8;
  static constexpr uint32_t max_code = 0x7fu, nan_code = 0x80u;
  static constexpr bool fnuz = true;
};
template <>
struct rk_fp8_traits<rk_fp8_e5m2> {
  static constexpr int32_t man_bits = 2, bias = 15;
  static constexpr uint32_t max_code = 0x7bu, nan_code = 0x7eu;  // saturating: inf never made
  static constexpr bool fnuz = false;
};
template <>
struct rk_fp8_traits<rk_fp8_e5m2fnuz> {
  static constexpr int32_t man_bits = 2, bias = 16;
  static constexpr uint32_t max_code = 0x7fu, nan_code = 0x80u;
  static constexpr bool fnuz = true;
};

// The magnitude code of |v| (mag = f32 bits without the sign; not NaN), before saturation:
// round to nearest even into a format with `man_bits` mantissa bits and exponent `bias`.
// Codes at or above the format's inf/NaN/overflow range come out large (up to ~2^(9+man_bits)),
// never wrapped, so one unsigned min saturates them.
template <int32_t man_bits, int32_t bias>
ROPEKV_HOST_DEVICE uint32_t rk_fpenc_round_mag(uint32_t mag) {
  constexpr int32_t shift = 23 - man_bits;
  // Normal path: RNE bias add with the exponent re-bias folded in (mod 2^32; only used when
  // mag >= min_normal_bits > rebias, so the sum never wraps).
  constexpr uint32_t rebias = static_cast<uint32_t>(127 - bias) << 23;
  constexpr uint32_t add = ((1u << (shift - 1)) - 1u) - rebias;
  const uint32_t normal_code = (mag + add + ((mag >> shift) & 1u)) >> shift;
  // Subnormal path: magic add 2^k, k = 24 - bias - man_bits (ulp of 2^k = smallest subnormal).
  constexpr uint32_t magic_bits = static_cast<uint32_t>(127 + 24 - bias - man_bits) << 23;
  const float sum = rk_bits_f32(mag) + rk_bits_f32(magic_bits);
  const uint32_t sub_code = rk_f32_bits(sum) - magic_bits;
  constexpr uint32_t min_normal_bits = static_cast<uint32_t>(128 - bias) << 23;  // 2^(1-bias)
  return mag < min_normal_bits ? sub_code : normal_code;
}

// f32 -> fp8 code C (rk_fp8_e4m3fn .. rk_fp8_e5m2fnuz), RNE, finite overflow and +-inf saturate
// to +-max, NaN -> the format's NaN (sign kept for e4m3fn / e5m2), fnuz: no negative zero.
template <int32_t C>
ROPEKV_HOST_DEVICE uint32_t rk_encode_fp8_sat(float v) {
  using tr = rk_fp8_traits<C>;
  const uint32_t bits = rk_f32_bits(v);
  const uint32_t mag = bits & 0x7fffffffu;
  uint32_t code = rk_fpenc_round_mag<tr::man_bits, tr::bias>(mag);
  code = code < tr::max_code ? code : tr::max_code;
  code = mag > 0x7f800000u ? tr::nan_code : code;
  const uint32_t sign = (bits >> 24) & 0x80u;
  if constexpr (tr::fnuz) {
    // NaN is 0x80 already (ORing the sign into it changes nothing); zero stays unsigned.
    return code | (code != 0u ? sign : 0u);
  } else {
    return code | sign;
  }
}

// Two f32 values -> two codes of C: lo in bits 0-7, hi in bits 8-15. Same codes as
// rk_encode_fp8_sat on each. On NVIDIA sm_89+ e4m3fn and e5m2 take the hardware conversion
// (cvt.rn.satfinite.{e4m3,e5m2}x2.f32: round to nearest even, finite overflow and +-inf to
// +-max, signed zeros kept: the same codes, checked for all 2^32 inputs of each format by
// bench/h200_fp8x2_check.cu on the H200), one instruction for two values; a NaN input (which
// the hardware turns into an unsigned canonical NaN) takes the software path.
template <int32_t C>
ROPEKV_HOST_DEVICE uint32_t rk_encode_fp8x2_sat(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(__HIP__)
  if constexpr (C == rk_fp8_e4m3fn || C == rk_fp8_e5m2) {
    if (lo == lo && hi == hi)
      return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE,
                                      C == rk_fp8_e5m2 ? __NV_E5M2 : __NV_E4M3);
  }
#endif
  return rk_encode_fp8_sat<C>(lo) | (rk_encode_fp8_sat<C>(hi) << 8);
}

// f32 -> f16 bits, RNE, overflow and +-inf -> +-inf, NaN -> 0x7e00 with the sign kept.
ROPEKV_HOST_DEVICE uint32_t rk_encode_f16_fast(float v) {
  const uint32_t bits = rk_f32_bits(v);
  const uint32_t mag = bits & 0x7fffffffu;
  uint32_t code = rk_fpenc_round_mag<10, 15>(mag);
  code = code < 0x7c00u ? code : 0x7c00u;  // any code past the max finite 0x7bff is inf
  code = mag > 0x7f800000u ? 0x7e00u : code;
  return code | ((bits >> 16) & 0x8000u);
}

}  // namespace ropekv_gpu
