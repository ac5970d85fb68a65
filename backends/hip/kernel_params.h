// The kernel's parameters (rk_params: filled on the host by launch_plan.h, passed by value to
// every kernel) and the small helpers both bodies use: index loads, one side's fp8 scale as the
// conversions take it, alignment. Part of kernel.h.
#pragma once
#include <cstdint>

#include "backends/hip/gpu_compat.h"
#include "backends/hip/kernel_cache.h"
#include "backends/hip/kernel_dtype.h"

namespace ropekv_gpu {

// ------------------------------------------------------------------ parameters
struct rk_params {
  // sizes
  int64_t tq, ts, tk, heads, dn, dr, table_rows;
  // inputs ([..] shapes; strides in elements, innermost 1)
  const char* q_nope;  // [Tq, H, Dn]
  int64_t q_nope_s0, q_nope_s1;
  char* q_pe;          // [Tq, H, Dr] (written when inplace_q)
  int64_t q_pe_s0, q_pe_s1;
  const char* kv_c;    // [Tk, Dn] or [Tk, KH, Dn]
  int64_t kv_c_s0;
  char* k_pe;          // [Tk, Dr] or [Tk, KH, Dr] (written when inplace_k)
  int64_t k_pe_s0;
  // kv heads (core/SPEC.md): KH, and the head strides of kv_c, k_pe, k_pe_out (0 for rank 2).
  // The general body writes every head's entry (rk_write_cache); fast_v4 takes KH = 1 only.
  int64_t kv_heads;
  int64_t kv_c_s1, k_pe_s1, k_pe_out_s1;
  int32_t q_dtype, k_dtype;
  const char* positions;  // [Tk] i32|i64
  int64_t positions_s0;
  const char* slots;      // [Ts] i32|i64
  int64_t slots_s0;
  int32_t positions_i64, slots_i64;
  const char* cos;        // [P, Dr/2] (table one: the first half of cos_sin rows)
  const char* sin;        // [P, Dr/2] (table one: the second half)
  int64_t cos_s0, sin_s0;
  int32_t table_dtype;
  // outputs
  char* q_out;            // [Tq, H, Dn + Dr]
  int64_t q_out_s0, q_out_s1;
  int32_t q_out_dtype;
  rk_paged_cache cache;
  // options
  int32_t neox, reciprocal, pad_q_computed, pos_clamp, inplace_q, inplace_k;
  float k_scale, q_scale;          // divide
  float k_inv_scale, q_inv_scale;  // reciprocal: fp32(1 / scale), computed once on the host
  // 1: fp8 outputs of this side are v * inv_scale: reciprocal mode, or divide mode with a scale
  // 2^k, -126 <= k <= 126, where inv_scale = 2^-k is exact and v / 2^k == v * 2^-k for every v
  // (both are the exact v * 2^-k rounded once). 0: v / scale (an IEEE division). Host-set.
  int32_t k_mul, q_mul;
  // Scales as tensors (core/SPEC.md "Scale tensors"): when set, the [1] f32 scale of that side
  // is read here at run time (a captured graph sees a new value on its next replay), and the
  // side's three fields above are unused. nullptr: the host floats above.
  const float* k_scale_ptr;
  const float* q_scale_ptr;
  // Decode outputs (core/SPEC.md "Decode outputs"), nullptr when absent; the general body
  // (rk_general_q, rk_write_cache) and fast_v4 (rk_v4_q_row, rk_v4_q_row_pair, rk_v4_kv_row:
  // 16-byte rows, launch_plan.h rk_v4_decode_refusal) write them.
  char* decode_q_pe_out;    // [N, H, Dr] q dtype: rope(q_pe) of q rows t < N, unscaled
  int64_t dec_q_pe_s0, dec_q_pe_s1;
  char* q_nope_zeros_out;   // [N, H, Dn] q dtype: +0 in q rows t < N
  int64_t zeros_s0, zeros_s1;
  char* k_pe_out;           // [Tk, Dr] k dtype: rope(k_pe) of tokens whose cache entry is written
  int64_t k_pe_out_s0;
  int64_t num_decode;       // N (0 when neither [N, H, ..] output is given)
  // Layout fp8_ds_mla (core/SPEC.md): cache entries of 656 bytes written by the general body
  // (rk_write_ds_mla_entry) or fast_v4 (rk_v4_ds_mla_row). The cache's parts
  // then address bytes (cache.dtype e4m3fn). ds_pow2: tile scales rounded up to a power of two.
  int32_t ds_mla, ds_pow2;
  int32_t v4_ds_align;  // fast_v4: bytes (16, 8, 4) every entry address is a multiple of
  // general body launch shape: heads of one token per block
  int64_t heads_per_block;
  // zero-copy concat (core/SPEC.md): q_nope is the first Dn columns of q_out; skip the nope copy.
  int32_t skip_q_nope;
  // fast_v4 (rk_fast4_body), chosen on the host (launch_plan.h rk_v4_refusal): rows of 32-thread
  // groups, token-major; a cache entry is split over 2^v4_kv_split_log2 groups, a group holds
  // 2^(5 - v4_q_lanes_log2) q rows.
  int64_t v4_q_token_groups;  // Tq * (q groups per token + cache groups per token) (< 2^32)
  int32_t v4_kv_split_log2, v4_q_lanes_log2;
  int32_t v4_kv_rope_group;   // 1: a cache entry's rope units get a group of their own
  int32_t v4_q_pairs;         // 1: a copy-mode q group holds two rows (heads 2i, 2i + 1;
                              // rk_v4_q_row_pair), launched as rk_fast4_kernel<S, 2>
  int32_t v4_decode;          // 1: decode outputs given, launched as rk_fast4_kernel<S, R, 1>
  int32_t v4_zc_rows;         // zero-copy: q rows per lane (rk_v4_q_rope_rows; 1..rk_v4_zc_rows_max)
  int32_t v4_q_groups_per_token;  // ceil(H / q rows per group)
  int32_t v4_nope_chunks;     // Dn / 8
  int32_t v4_units;           // rope units per row: Dr / 8 (gptj) or Dr / 16 (neox)
  uint32_t v4_gpt_magic, v4_gpt_shift;  // group / groups per token by multiply-high (rk_div_u32)
};


// Elements per nope chunk: one 16-byte access on the wider of input and output.
ROPEKV_HOST_DEVICE int rk_vec_elems(int32_t in_t, int32_t out_t) {
  const int a = rk_size_bytes(in_t), b = rk_size_bytes(out_t);
  return 16 / (a > b ? a : b);
}

ROPEKV_DEVICE int64_t rk_load_index(const char* base, int64_t i, int64_t stride, int32_t is_i64) {
  return is_i64 ? reinterpret_cast<const int64_t*>(base)[i * stride]
                : static_cast<int64_t>(reinterpret_cast<const int32_t*>(base)[i * stride]);
}

// Whether v / scale == v * fp32(1 / scale) for every fp32 v (rk_params::k_mul): scale is 2^k
// with -126 <= k <= 126, so 1 / scale = 2^-k is exact and normal, and both sides are the exact
// v * 2^-k rounded once. (k_scale = 1, the common uncalibrated case, is one.) Host and device:
// the host sets k_mul / q_mul with it, the kernel decides so for a scale tensor's value.
ROPEKV_HOST_DEVICE bool rk_exact_inverse(float scale) {
  const uint32_t bits = rk_f32_bits(scale);
  const uint32_t exp_field = (bits >> 23) & 0xffu;
  return (bits >> 31) == 0 && (bits & 0x7fffffu) == 0 && exp_field >= 1 && exp_field <= 253;
}

// One side's fp8 scale as the conversions take it (rk_to_output's mul, scale, inv_scale).
struct rk_side_scale {
  float scale, inv_scale;
  int32_t mul;
};

// The host's fields, or (ptr set) the tensor's value read now, with inv_scale and mul derived
// from it as the host derives them from a float (launch_plan.h).
ROPEKV_DEVICE rk_side_scale rk_scale_of(const float* ptr, float scale, float inv_scale, int32_t mul,
                                        int32_t reciprocal) {
  if (ptr == nullptr) return {scale, inv_scale, mul};
  const float s = *ptr;
  return {s, ROPEKV_FDIV_RN(1.0f, s), (reciprocal || rk_exact_inverse(s)) ? 1 : 0};
}
ROPEKV_DEVICE rk_side_scale rk_k_scale(const rk_params& p) {
  return rk_scale_of(p.k_scale_ptr, p.k_scale, p.k_inv_scale, p.k_mul, p.reciprocal);
}
ROPEKV_DEVICE rk_side_scale rk_q_scale(const rk_params& p) {
  return rk_scale_of(p.q_scale_ptr, p.q_scale, p.q_inv_scale, p.q_mul, p.reciprocal);
}
// The k scale a thread's fp8 cache stores use, resolved once at the thread's start (a scale
// tensor is loaded once, not per 8-value pack); unused (no load) for a 16-bit cache.
ROPEKV_DEVICE rk_side_scale rk_k_scale_for(const rk_params& p, int32_t ct) {
  return rk_is_fp8(ct) ? rk_k_scale(p) : rk_side_scale{1.0f, 1.0f, 1};
}

// bytes: a power of two. Host and device (launch_plan.h checks eligibility with it).
ROPEKV_HOST_DEVICE bool rk_aligned(const void* p, int64_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & static_cast<uintptr_t>(bytes - 1)) == 0;
}

}  // namespace ropekv_gpu
