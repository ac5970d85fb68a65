// Host conversions between float32/double and every float dtype, and the ULP metric.
// This is the host side of the contract (core/SPEC.md). The GPU kernels carry their own
// conversions (backends/hip): the two are checked against each other and must not share code.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace ropekv {

// What happens to a finite value beyond the format's max (and to ±inf):
// - saturate: clamp to ±max (what GPU kernels do for fp8); inf -> ±max; NaN stays NaN.
// - ieee: what ml_dtypes does: overflow -> inf where the format has inf (f16, bf16, f32,
//   e5m2), NaN where it has none (e4m3fn, e4m3fnuz, e5m2fnuz).
// f32, f16 and bf16 outputs always use ieee in ropekv; saturate is meaningful for fp8 only and
// is ignored (treated as ieee) for f32, f16 and bf16.
// fnuz formats have no -0: -0 and negative values that round to zero encode as 0x00.
enum class overflow_mode : uint8_t { saturate, ieee };

// Decodes the bit pattern of a float dtype (in the low bits of `bits`) to float32 (exact for
// every format except that f32 is returned as is).
float decode_to_f32(dtype t, uint32_t bits);
double decode_to_f64(dtype t, uint32_t bits);

// Rounds `value` once, to nearest even, into float dtype t; returns the bit pattern in the low
// bits. NaN input gives the format's canonical NaN (sign kept where the format has signed NaN).
uint32_t encode_from_f64(dtype t, double value, overflow_mode mode);
// float32 input: f16 and bf16 go through Eigen::half / Eigen::bfloat16; fp8 through the same
// rounding as encode_from_f64 (a float is exactly a double).
uint32_t encode_from_f32(dtype t, float value, overflow_mode mode);

bool is_nan_bits(dtype t, uint32_t bits);

// Row-wise forms of the scalar conversions, for hot loops (the reference): one dispatch per row
// and the same result, element by element, as the scalar function named (test_convert.cpp
// checks every code, every tie and its neighbours, and random values against it). Rows are n
// contiguous elements of dtype t.
//
// decode_to_f32(t, src[i]) for every element; a NaN code gives a NaN of the same sign (payload
// unspecified).
void decode_row_to_f32(dtype t, const void* src, float* dst, int64_t n);
// encode_from_f64(t, src[i], mode) for every element.
void encode_row_from_f64(dtype t, const double* src, void* dst, int64_t n, overflow_mode mode);
// encode_from_f32(t, decode_to_f32(t, src[i]), ieee) for every element: round(fp32(x)) of x into
// its own dtype. That keeps every code except a NaN code of a format narrower than f32, which
// becomes the canonical NaN of its sign (f32 keeps NaN payloads: encode_from_f32 into f32 is
// the bit pattern). A copy plus a NaN fix-up. src == dst is allowed; any other overlap is not.
void recode_row_same_dtype(dtype t, const void* src, void* dst, int64_t n);
// recode_row_same_dtype with non-temporal (streaming) stores: the same bits at dst, written
// around the caches, so a large output that is not read back soon (q_out, the cache) costs no
// read-for-ownership of its lines. f16 and bf16 on x86-64 stream (16-byte SSE2 stores, plain
// stores for the unaligned head and tail of dst); every other dtype, and every other target,
// runs recode_row_same_dtype. src and dst must not overlap (src == dst: use
// recode_row_same_dtype).
// Streaming stores are weakly ordered: call stream_store_fence() after the last one, before
// another thread may read dst (e.g. once per thread before an OpenMP barrier). The fence is
// not in the row functions because one per row costs ~3x (1152-byte rows: 17.7 vs 54.7 GB/s).
void recode_row_same_dtype_stream(dtype t, const void* src, void* dst, int64_t n);
// memcpy(dst, src, bytes) with non-temporal stores where the target has them (x86-64), as
// above: the same bytes, no overlap, stream_store_fence() after the last one.
void copy_bytes_stream(const void* src, void* dst, int64_t bytes);
// The two functions above write whole 64-byte lines with AVX-512 streaming stores where the CPU
// has AVX-512BW (the same bytes; 16-byte stores fill a write-combining buffer in four steps:
// 1 thread, 512 MiB streaming copy 41-44 GB/s with 16-byte stores, 48-52 GB/s with 64-byte).
// For tests: allow (default) or forbid that path; returns whether it is now used. Not
// thread-safe: call it while no row function runs.
bool stream_stores_allow_avx512(bool allow);
// Orders every streaming store of the calling thread before its later stores (x86: sfence);
// a no-op where the row functions above use plain stores.
void stream_store_fence();

// Spacing of format t at |value| (value finite): at a power of two the spacing above it; below
// the smallest normal the subnormal spacing. Beyond max_finite: the spacing at max_finite.
double ulp_at(dtype t, double value);

// ULP distance between two bit patterns of float dtype t, via ordered-integer keys:
// +0 == -0 (distance 0); NaN equals only NaN (distance 0); NaN vs non-NaN -> ulp_distance_nan;
// inf equals only inf of the same sign (inf vs finite or -inf -> ulp_distance_nan).
inline constexpr int64_t ulp_distance_nan = INT64_MAX;
int64_t ulp_distance(dtype t, uint32_t a_bits, uint32_t b_bits);

// Reads / writes one element of any dtype at `ptr` as raw bits (zero-extended).
uint64_t load_bits(dtype t, const void* ptr);
void store_bits(dtype t, void* ptr, uint64_t bits);

}  // namespace ropekv
