// The fused MLA kernel body: RoPE + paged KV-cache write + q concat (core/SPEC.md).
//
// This file is device code that compiles three ways (backends/hip/gpu_compat.h): hipcc, nvcc,
// and host C++ for the simulation (backends/sim includes it unchanged). It must not include
// anything from core/: the kernel carries its own conversions and cache addressing, so that the
// reference (backends/cpu, core/convert) and the kernel are independent and checked against
// each other.
//
// Work decomposition (no intra-block cooperation, no shared memory, no __syncthreads):
//   grid.x = Ts tokens (Tq <= Ts), grid.y = ceil(H / heads_per_block) head groups.
//   Block (t, g) writes q_out rows of heads [g*hpb, (g+1)*hpb) of token t (if t < Tq) and,
//   when g == 0, the cache entry of token t (and k_pe in place). Threads stride over "units":
//   a nope unit is one chunk of `vec` elements (one 16-byte access on the wider side when the
//   row is aligned, scalar otherwise and for the tail chunk); a rope unit is one pair, done
//   wholly by one thread (so in-place writes never race with reads of the partner).
//
// Planted bugs for the mutation tests (ROPEKV_MUTATION, default 0 = correct kernel):
//   1: off-by-one in the cache entry offset (one element past the entry start),
//   2: wrong rope partner for neox (i pairs with Dr - 1 - i instead of i + Dr/2),
//   3: dropped vector tail (the last, partial chunk of a nope row is not written; fast_v4,
//      whose rows have no partial chunk: the last chunk of every nope row is not written).
// Mutation 2 acts on fast_v4 through the shared rk_rope4_f; mutation 1 through the shared
// rk_paged_cache::entry makes fast_v4's vector stores misaligned, so the plan refuses fast_v4
// and the general body carries it.
//
// fast_v4 (rk_fast4_body, below) is a second kernel entry with its own decomposition: one
// 32-thread group per row (see its comment). launch_plan.h picks the kernel: fast_v4 where its
// preconditions hold (rk_v4_refusal), else this general body.
#pragma once
#include <cstdint>

#include "backends/hip/fp8_encode.h"
#include "backends/hip/gpu_compat.h"

#ifndef ROPEKV_MUTATION
#define ROPEKV_MUTATION 0
#endif

namespace ropekv_gpu {

// Float formats the kernel reads or writes. Its own numbering: not core's dtype.
enum rk_dtype : int32_t {  // fp8 codes equal fp8_encode.h's rk_fp8_* (static_assert below)
  rk_f32 = 0,
  rk_f16 = 1,
  rk_bf16 = 2,
  rk_e4m3fn = 3,
  rk_e4m3fnuz = 4,
  rk_e5m2 = 5,
  rk_e5m2fnuz = 6,
};

static_assert(rk_e4m3fn == rk_fp8_e4m3fn && rk_e4m3fnuz == rk_fp8_e4m3fnuz && rk_e5m2 == rk_fp8_e5m2 &&
                  rk_e5m2fnuz == rk_fp8_e5m2fnuz,
              "kernel.h and fp8_encode.h number the fp8 formats alike");

ROPEKV_HOST_DEVICE int rk_size_bytes(int32_t t) {
  return t == rk_f32 ? 4 : (t == rk_f16 || t == rk_bf16) ? 2 : 1;
}
ROPEKV_HOST_DEVICE bool rk_is_fp8(int32_t t) { return t >= rk_e4m3fn; }

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

// n / d for 32-bit n by a host-computed multiplier (Granlund-Montgomery, round-up variant):
// shift = ceil(log2 d), magic = floor(2^32 (2^shift - d) / d) + 1; n / d = (mulhi(n, magic) + n)
// >> shift, the sum taken in 64 bits. d = 1: magic 0, shift 0. Exact for every n < 2^32.
ROPEKV_HOST_DEVICE uint32_t rk_div_u32(uint32_t n, uint32_t magic, uint32_t shift) {
  const uint64_t hi = (static_cast<uint64_t>(n) * magic) >> 32;
  return static_cast<uint32_t>((hi + n) >> shift);
}

// ------------------------------------------------------------------ paged cache addressing
// FlashInfer paged_kv_t style: a base pointer per part and int64 element strides. The kernel's
// own struct; core/ and the reference address the cache independently.
// Two layouts (core/SPEC.md): rows (joint, split: an entry's part is contiguous) and shuffled
// (16-entry tiles, features in runs of 16 bytes). One formula serves both:
//   entry:   block * block_stride + (e >> 4) * tile_stride + (e & 15) * entry_stride
//   feature: (d >> run_shift) * run_stride + (d & run_mask)
// rows: tile_stride = 16 * entry_stride, run_shift 62, run_stride 0, run_mask ~0 (feature d at
// d); shuffled: entry_stride = W, tile_stride = 16 * part width, run_stride = 16 * W.
struct rk_paged_part {
  char* base;                  // element [0, 0, 0] of this part (nope or rope features)
  int64_t block_stride_elems;
  int64_t entry_stride_elems;
  int64_t tile_stride_elems;   // between 16-entry tiles of a block
  int64_t head_stride_elems;   // between kv heads (rank-4 caches; 0 with one head): the general
                               // body's rk_write_cache only (launch_plan.h keeps KH > 1 off fast_v4)
};
struct rk_paged_cache {
  rk_paged_part nope;          // Dn features
  rk_paged_part rope;          // Dr features
  int64_t block_size;
  int64_t num_slots;           // num_blocks * block_size
  int32_t dtype;
  // num_slots < 2^32: slot / block_size by multiply-high (rk_div_u32) instead of a 64-bit
  // division (~70 instructions on a GPU); set by the host (launch_plan.h rk_set_slot_division).
  int32_t slots_u32;
  uint32_t bs_magic, bs_shift;
  int32_t run_shift;           // features: see rk_paged_part
  int64_t run_stride_elems, run_mask;
  // 1: the fast bodies' cache stores carry an L2 evict_last hint (gpu_compat.h
  // rk_store_words_keep_l2; launch_plan.h sets it for the shuffled layout).
  int32_t keep_l2;
  ROPEKV_HOST_DEVICE char* entry(const rk_paged_part& part, int64_t slot) const {
    int64_t block, in_block;
    if (slots_u32) {
      const uint32_t s32 = static_cast<uint32_t>(slot);
      const uint32_t b32 = rk_div_u32(s32, bs_magic, bs_shift);
      block = b32;
      in_block = s32 - b32 * static_cast<uint32_t>(block_size);
    } else {
      block = slot / block_size;
      in_block = slot - block * block_size;
    }
    int64_t off = block * part.block_stride_elems + (in_block >> 4) * part.tile_stride_elems +
                  (in_block & 15) * part.entry_stride_elems;
#if ROPEKV_MUTATION == 1
    off += 1;
#endif
    return part.base + off * static_cast<int64_t>(rk_size_bytes(dtype));
  }
  // Feature d of the part whose entry() is `entry_ptr`. Features [d, d + n) are contiguous when
  // d and n are multiples of n and n divides the run (16 bytes; rows: any).
  ROPEKV_HOST_DEVICE char* feature(char* entry_ptr, int64_t d) const {
    return entry_ptr + ((d >> run_shift) * run_stride_elems + (d & run_mask)) * static_cast<int64_t>(rk_size_bytes(dtype));
  }
  // Stores `bytes` (4, 8 or 16) of w at dst, a feature() address of this cache.
  ROPEKV_DEVICE void store(char* dst, int bytes, const uint32_t* w) const {
    if (keep_l2) {
      rk_store_words_keep_l2(dst, bytes, w);
    } else {
      rk_store_words(dst, bytes, w);
    }
  }
};

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

// fp32 value -> output bits, with the fp8 scale applied (data movement and rope alike).
// mul: p.k_mul or p.q_mul (multiply by inv_scale, else divide by scale).
ROPEKV_DEVICE uint32_t rk_to_output(float v, int32_t out_t, int32_t mul, float scale,
                                    float inv_scale) {
  if (rk_is_fp8(out_t)) v = mul ? ROPEKV_FMUL_RN(v, inv_scale) : ROPEKV_FDIV_RN(v, scale);
  return rk_encode(out_t, v);
}

// Copies one chunk [c * vec, min((c + 1) * vec, n)) of a nope row, converting in_t -> out_t;
// out_chunk is where element c * vec goes (the chunk's elements follow it).
ROPEKV_DEVICE void rk_copy_chunk(const char* in_row, int32_t in_t, char* out_chunk, int32_t out_t,
                                 int64_t n, int64_t c, int vec, bool row_vec_ok,
                                 int32_t mul, float scale, float inv_scale) {
  const int in_sz = rk_size_bytes(in_t), out_sz = rk_size_bytes(out_t);
  const int64_t first = c * vec;
  const int64_t count = (n - first) < vec ? (n - first) : vec;
  if (row_vec_ok && count == vec) {
    uint32_t w_in[4], w_out[4] = {0u, 0u, 0u, 0u};
    rk_load_words(in_row + first * in_sz, vec * in_sz, w_in);
    for (int j = 0; j < vec; ++j) {
      uint32_t bits;
      if (in_sz == 4) bits = w_in[j];
      else bits = (w_in[j >> 1] >> (16 * (j & 1))) & 0xffffu;
      const uint32_t o = rk_to_output(rk_decode(in_t, bits), out_t, mul, scale, inv_scale);
      if (out_sz == 4) w_out[j] = o;
      else if (out_sz == 2) w_out[j >> 1] |= (o & 0xffffu) << (16 * (j & 1));
      else w_out[j >> 2] |= (o & 0xffu) << (8 * (j & 3));
    }
    rk_store_words(out_chunk, vec * out_sz, w_out);
  } else {
    for (int64_t i = first; i < first + count; ++i) {
      const float v = rk_decode(in_t, rk_load_elem(in_t, in_row + i * in_sz));
      rk_store_elem(out_t, out_chunk + (i - first) * out_sz, rk_to_output(v, out_t, mul, scale, inv_scale));
    }
  }
}

// bytes: a power of two. Host and device (launch_plan.h checks eligibility with it).
ROPEKV_HOST_DEVICE bool rk_aligned(const void* p, int64_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & static_cast<uintptr_t>(bytes - 1)) == 0;
}

// Rotates pair i of a rope row. `in_row` and `inplace_row` may be the same memory: both
// elements are read before anything is written. Writes the pair into out_row (output dtype,
// scaled; cache_out: out_row is a cache entry's rope part, its features placed by
// p.cache.feature) and, when inplace_row / copy_row is set, into it (input dtype, unscaled:
// copy_row is a decode output row, decode_q_pe_out or k_pe_out).
ROPEKV_DEVICE void rk_rope_pair(const rk_params& p, const char* in_row, int32_t in_t,
                                char* inplace_row, char* copy_row, char* out_row, bool cache_out, int32_t out_t,
                                float scale, float inv_scale, int32_t mul, int64_t i,
                                const char* cos_row, const char* sin_row) {
  const int64_t half = p.dr / 2;
  int64_t ia, ib;
  if (p.neox) {
    ia = i;
#if ROPEKV_MUTATION == 2
    ib = p.dr - 1 - i;
#else
    ib = i + half;
#endif
  } else {
    ia = 2 * i;
    ib = 2 * i + 1;
  }
  const int in_sz = rk_size_bytes(in_t), out_sz = rk_size_bytes(out_t);
  const int tab_sz = rk_size_bytes(p.table_dtype);
  const float a = rk_decode(in_t, rk_load_elem(in_t, in_row + ia * in_sz));
  const float b = rk_decode(in_t, rk_load_elem(in_t, in_row + ib * in_sz));
  const float c = rk_decode(p.table_dtype, rk_load_elem(p.table_dtype, cos_row + i * tab_sz));
  const float s = rk_decode(p.table_dtype, rk_load_elem(p.table_dtype, sin_row + i * tab_sz));
  // x' = x*C + R(x)*S with R(a) = -b, R(b) = a: one fp32 product, one fp32 fma.
  const float ra = ROPEKV_FMAF(a, c, ROPEKV_FMUL_RN(-b, s));
  const float rb = ROPEKV_FMAF(b, c, ROPEKV_FMUL_RN(a, s));
  if (inplace_row != nullptr) {
    rk_store_elem(in_t, inplace_row + ia * in_sz, rk_encode(in_t, ra));
    rk_store_elem(in_t, inplace_row + ib * in_sz, rk_encode(in_t, rb));
  }
  if (copy_row != nullptr) {
    rk_store_elem(in_t, copy_row + ia * in_sz, rk_encode(in_t, ra));
    rk_store_elem(in_t, copy_row + ib * in_sz, rk_encode(in_t, rb));
  }
  char* out_a = cache_out ? p.cache.feature(out_row, ia) : out_row + ia * out_sz;
  char* out_b = cache_out ? p.cache.feature(out_row, ib) : out_row + ib * out_sz;
  rk_store_elem(out_t, out_a, rk_to_output(ra, out_t, mul, scale, inv_scale));
  rk_store_elem(out_t, out_b, rk_to_output(rb, out_t, mul, scale, inv_scale));
}

ROPEKV_DEVICE int64_t rk_num_chunks(int64_t n, int vec) {
#if ROPEKV_MUTATION == 3
  return n / vec;  // planted bug: the partial last chunk is dropped
#else
  return (n + vec - 1) / vec;
#endif
}

// Writes +0 (all-zero bits in f32, f16, bf16) over chunk c [c * vec, min((c + 1) * vec, n)) of
// a row of dtype t: one store when whole and aligned, else element by element.
ROPEKV_DEVICE void rk_zero_chunk(char* row, int32_t t, int64_t n, int64_t c, int vec) {
  const int sz = rk_size_bytes(t);
  const int64_t first = c * vec;
  const int64_t count = (n - first) < vec ? (n - first) : vec;
  char* dst = row + first * sz;
  if (count == vec && rk_aligned(dst, vec * sz)) {
    const uint32_t w[4] = {0u, 0u, 0u, 0u};
    rk_store_words(dst, vec * sz, w);
  } else {
    for (int64_t i = 0; i < count; ++i) rk_store_elem(t, dst + i * sz, 0u);
  }
}

// ------------------------------------------------------------------ general path
// q rows of heads [g*hpb, (g+1)*hpb) of token t, any dtypes, layouts and alignments: threads
// stride over units (a nope chunk of `vec` elements, or one rope pair).
ROPEKV_DEVICE void rk_general_q(const rk_params& p, int64_t t, int64_t group, const char* cos_row,
                                const char* sin_row) {
  const int64_t half = p.dr / 2;
  const int64_t tid = static_cast<int64_t>(threadIdx.x);
  const int64_t nthreads = static_cast<int64_t>(blockDim.x);
  const int64_t h0 = group * p.heads_per_block;
  const int64_t h_end = (h0 + p.heads_per_block) < p.heads ? (h0 + p.heads_per_block) : p.heads;
  const int vec = rk_vec_elems(p.q_dtype, p.q_out_dtype);
  const int64_t nope_chunks = rk_num_chunks(p.dn, vec);
  const int64_t units_per_head = nope_chunks + half;
  const int64_t units = (h_end - h0) * units_per_head;
  const int q_sz = rk_size_bytes(p.q_dtype), o_sz = rk_size_bytes(p.q_out_dtype);
  const rk_side_scale qs = rk_q_scale(p);
  // decode outputs: q rows t < N (core/SPEC.md "Decode outputs")
  const bool dec_row = t < p.num_decode;
  char* const zeros = dec_row ? p.q_nope_zeros_out : nullptr;
  char* const dec_pe = dec_row ? p.decode_q_pe_out : nullptr;
  for (int64_t u = tid; u < units; u += nthreads) {
    const int64_t h = h0 + u / units_per_head;
    const int64_t r = u - (h - h0) * units_per_head;
    char* out_row = p.q_out + (t * p.q_out_s0 + h * p.q_out_s1) * o_sz;
    if (r < nope_chunks) {
      if (zeros != nullptr)
        rk_zero_chunk(zeros + (t * p.zeros_s0 + h * p.zeros_s1) * q_sz, p.q_dtype, p.dn, r, vec);
      if (p.skip_q_nope) continue;  // zero-copy concat: the nope part already sits in q_out
      const char* in_row = p.q_nope + (t * p.q_nope_s0 + h * p.q_nope_s1) * q_sz;
      const bool ok = rk_aligned(in_row, vec * q_sz) && rk_aligned(out_row, vec * o_sz);
      rk_copy_chunk(in_row, p.q_dtype, out_row + r * vec * o_sz, p.q_out_dtype, p.dn, r, vec, ok,
                    qs.mul, qs.scale, qs.inv_scale);
    } else {
      char* pe_row = p.q_pe + (t * p.q_pe_s0 + h * p.q_pe_s1) * q_sz;
      char* dec_row_ptr = dec_pe != nullptr ? dec_pe + (t * p.dec_q_pe_s0 + h * p.dec_q_pe_s1) * q_sz : nullptr;
      rk_rope_pair(p, pe_row, p.q_dtype, p.inplace_q ? pe_row : nullptr, dec_row_ptr, out_row + p.dn * o_sz,
                   false, p.q_out_dtype, qs.scale, qs.inv_scale, qs.mul, r - nope_chunks, cos_row, sin_row);
    }
  }
}

// Layout fp8_ds_mla, the kernel's own constants: bytes of an entry's nope part (512 e4m3fn
// values, 4 tiles of 128), then 4 f32 tile scales, then 64 rope values in k's 16-bit dtype.
constexpr int64_t rk_ds_tile = 128, rk_ds_tiles = 4, rk_ds_scales_at = 512, rk_ds_rope_at = 528;

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

// Token t's fp8_ds_mla entry: units 0..3 are the nope tiles (each thread reduces its tile's
// amax alone: the general body, not a fast path), units 4.. the rope pairs.
ROPEKV_DEVICE void rk_write_ds_mla_entry(const rk_params& p, int64_t t, int64_t slot, const char* cos_row,
                                         const char* sin_row) {
  const int64_t tid = static_cast<int64_t>(threadIdx.x);
  const int64_t nthreads = static_cast<int64_t>(blockDim.x);
  const int k_sz = rk_size_bytes(p.k_dtype);
  char* dst = p.cache.entry(p.cache.nope, slot);  // byte 0 of the entry (cache.dtype: 1 byte)
  const char* kv_row = p.kv_c + t * p.kv_c_s0 * k_sz;
  char* kpe_row = p.k_pe + t * p.k_pe_s0 * k_sz;
  char* kpe_out_row = p.k_pe_out != nullptr ? p.k_pe_out + t * p.k_pe_out_s0 * k_sz : nullptr;
  const int64_t units = rk_ds_tiles + p.dr / 2;
  for (int64_t u = tid; u < units; u += nthreads) {
    if (u < rk_ds_tiles) {
      const char* src = kv_row + u * rk_ds_tile * k_sz;
      float amax = 0.0f;
      for (int64_t i = 0; i < rk_ds_tile; ++i) {
        const float a = rk_bits_f32(rk_f32_bits(rk_decode(p.k_dtype, rk_load_elem(p.k_dtype, src + i * k_sz))) & 0x7fffffffu);
        if (a > amax) amax = a;  // fmaxf: a NaN never wins
      }
      const float scale = rk_ds_tile_scale(amax, p.ds_pow2);
      rk_store_elem(rk_f32, dst + rk_ds_scales_at + 4 * u, rk_f32_bits(scale));
      for (int64_t i = 0; i < rk_ds_tile; ++i) {
        const float x = rk_decode(p.k_dtype, rk_load_elem(p.k_dtype, src + i * k_sz));
        rk_store_elem(rk_e4m3fn, dst + u * rk_ds_tile + i, rk_encode(rk_e4m3fn, rk_ds_quotient(x, ROPEKV_FDIV_RN(x, scale))));
      }
    } else {  // rope into k's own dtype, unscaled (a 16-bit output: the scale arguments are unused)
      rk_rope_pair(p, kpe_row, p.k_dtype, p.inplace_k ? kpe_row : nullptr, kpe_out_row, dst + rk_ds_rope_at, false,
                   p.k_dtype, 1.0f, 1.0f, 1, u - rk_ds_tiles, cos_row, sin_row);
    }
  }
}

// The cache entry of token t, kv head kh (and k_pe in place): one row, any dtypes (nope chunks
// vectorised when aligned, rope pairs scalar).
ROPEKV_DEVICE void rk_write_cache(const rk_params& p, int64_t t, int64_t kh, int64_t slot, const char* cos_row,
                                  const char* sin_row) {
  const int64_t half = p.dr / 2;
  const int64_t tid = static_cast<int64_t>(threadIdx.x);
  const int64_t nthreads = static_cast<int64_t>(blockDim.x);
  const int vec = rk_vec_elems(p.k_dtype, p.cache.dtype);
  const int64_t nope_chunks = rk_num_chunks(p.dn, vec);
  const int64_t units = nope_chunks + half;
  const int k_sz = rk_size_bytes(p.k_dtype), c_sz = rk_size_bytes(p.cache.dtype);
  char* nope_dst = p.cache.entry(p.cache.nope, slot) + kh * p.cache.nope.head_stride_elems * c_sz;
  char* rope_dst = p.cache.entry(p.cache.rope, slot) + kh * p.cache.rope.head_stride_elems * c_sz;
  const char* kv_row = p.kv_c + (t * p.kv_c_s0 + kh * p.kv_c_s1) * k_sz;
  char* kpe_row = p.k_pe + (t * p.k_pe_s0 + kh * p.k_pe_s1) * k_sz;
  const bool ok = rk_aligned(kv_row, vec * k_sz) && rk_aligned(nope_dst, vec * c_sz);
  const rk_side_scale ks = rk_k_scale(p);
  // decode output k_pe_out: the rows the cache gets (core/SPEC.md "Decode outputs")
  char* kpe_out_row = p.k_pe_out != nullptr ? p.k_pe_out + (t * p.k_pe_out_s0 + kh * p.k_pe_out_s1) * k_sz : nullptr;
  for (int64_t u = tid; u < units; u += nthreads) {
    if (u < nope_chunks) {
      rk_copy_chunk(kv_row, p.k_dtype, p.cache.feature(nope_dst, u * vec), p.cache.dtype, p.dn, u,
                    vec, ok, ks.mul, ks.scale, ks.inv_scale);
    } else {
      rk_rope_pair(p, kpe_row, p.k_dtype, p.inplace_k ? kpe_row : nullptr, kpe_out_row, rope_dst, true,
                   p.cache.dtype, ks.scale, ks.inv_scale, ks.mul, u - nope_chunks, cos_row, sin_row);
    }
  }
}

// ------------------------------------------------------------------ 16-byte helpers of fast_v4
// Same-dtype 2-byte copy: round(fp32(x)) is x itself except for NaN, which becomes the format's
// canonical NaN with its sign (what rk_encode does), so the nope copy is bit operations only.
// Packed, two 16-bit lanes per word: a lane is NaN when its magnitude exceeds inf's; adding
// (0x7fff - inf) to the magnitude carries into the lane's bit 15 exactly then (no carry leaves
// the lane: 0x7fff + 0x3ff < 2^16). Returns 0x8000 in each NaN lane, 0 elsewhere.
ROPEKV_DEVICE uint32_t rk_nan16x2_sum(uint32_t w, int32_t t) {
  return (w & 0x7fff7fffu) + (t == rk_bf16 ? 0x007f007fu : 0x03ff03ffu);
}
ROPEKV_DEVICE uint32_t rk_canon_nan16x2(uint32_t w, int32_t t) {
  const uint32_t m = rk_nan16x2_sum(w, t) & 0x80008000u;
  if (m == 0u) return w;
  const uint32_t qnan = t == rk_bf16 ? 0x7fc07fc0u : 0x7e007e00u;
  const uint32_t lanes = (m >> 15) * 0x7fffu;  // 0x7fff in each NaN lane: all but its sign
  return (w & ~lanes) | (qnan & lanes);
}
// A 16-byte chunk (8 lanes): one test for the whole chunk on the common no-NaN path.
ROPEKV_DEVICE void rk_canon_nan16x8(uint32_t* w, int32_t t) {
  const uint32_t any = (rk_nan16x2_sum(w[0], t) | rk_nan16x2_sum(w[1], t) | rk_nan16x2_sum(w[2], t) |
                        rk_nan16x2_sum(w[3], t)) & 0x80008000u;
  if (any == 0u) return;
  ROPEKV_UNROLL
  for (int i = 0; i < 4; ++i) w[i] = rk_canon_nan16x2(w[i], t);
}
// Four table values from `p` (aligned to 4 values): one 8-byte (f16/bf16) or 16-byte (f32) load.
ROPEKV_DEVICE void rk_load_table4(int32_t t, const char* p, float* v) {
  uint32_t w[4];
  if (t == rk_f32) {
    rk_load_words(p, 16, w);
    ROPEKV_UNROLL
    for (int j = 0; j < 4; ++j) v[j] = rk_bits_f32(w[j]);
  } else {
    rk_load_words(p, 8, w);
    ROPEKV_UNROLL
    for (int j = 0; j < 4; ++j) v[j] = rk_decode(t, (w[j >> 1] >> (16 * (j & 1))) & 0xffffu);
  }
}
ROPEKV_DEVICE uint32_t rk_lane16(const uint32_t* w, int m) { return (w[m >> 1] >> (16 * (m & 1))) & 0xffffu; }

// Rotates the 4 pairs of one rope unit held in w (8 lanes of 16 bits). Lanes: gptj
// a_i = lane 2i, b_i = lane 2i+1; neox a_i = lane i, b_i = lane 4+i (mutation 2: the b half was
// loaded reversed, so b_i = lane 7-i). NEOX is a template parameter so that every lane index is
// a constant after unrolling (no local-memory arrays).
// The rotated values in fp32, r[lane] (8 lanes): the caller encodes them (a 16-bit q_out row,
// an fp8 or 16-bit cache entry).
template <bool NEOX>
ROPEKV_DEVICE void rk_rope4_f(int32_t qt, const uint32_t* w, const float* cs, const float* sn,
                              float* r) {
  ROPEKV_UNROLL
  for (int i = 0; i < 4; ++i) {
    const int la = NEOX ? i : 2 * i;
#if ROPEKV_MUTATION == 2
    const int lb = NEOX ? 7 - i : 2 * i + 1;
#else
    const int lb = NEOX ? 4 + i : 2 * i + 1;
#endif
    const float a = rk_decode(qt, rk_lane16(w, la));
    const float b = rk_decode(qt, rk_lane16(w, lb));
    // x' = x*C + R(x)*S with R(a) = -b, R(b) = a: one fp32 product, one fp32 fma.
    r[la] = ROPEKV_FMAF(a, cs[i], ROPEKV_FMUL_RN(-b, sn[i]));
    r[lb] = ROPEKV_FMAF(b, cs[i], ROPEKV_FMUL_RN(a, sn[i]));
  }
}

// ------------------------------------------------------------------ fast_v4 specialisation and units
// A rope unit is 8 elements: gptj the 4 pairs of elements [8u, 8u + 8); neox (Dr % 16 == 0)
// the 8 pairs (i, i + Dr/2) for i in [8u, 8u + 8): a 16-byte load from each half.
// Arithmetic and conversions are those of the general path (rk_rope4_f, rk_to_output,
// rk_canon_nan16), so the bytes are identical.

// Compile-time specialisation: fast_v4 is a template over the few things that change
// its code: q/kv dtype (Q, also kv's), cache dtype (C), rope style (NEOX), table dtype (T). A
// value rk_v4_dyn means "read it from rk_params at run time": rk_v4_generic is the one
// instantiation that covers every problem the plan accepts. The host picks the instantiation
// once (launch_plan.h rk_v4_visit). The conversions are the same functions as everywhere else
// (rk_encode, rk_decode, rk_to_output, rk_canon_nan16x2) called with a compile-time dtype, so
// the compiler folds their switches away and the bytes stay those of the general path.
constexpr int32_t rk_v4_dyn = -1;
template <int32_t Q, int32_t C, int32_t NEOX, int32_t T>
struct rk_v4_spec {
  static constexpr int32_t q = Q, cache = C, neox = NEOX, table = T;
};
using rk_v4_generic = rk_v4_spec<rk_v4_dyn, rk_v4_dyn, rk_v4_dyn, rk_v4_dyn>;

// 8 rope values -> cache dtype ct (scaled for fp8): 4 words (16-bit) or 2 words (fp8).
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
// 8 fp32 values of the k side -> 8 codes of fp8 format ct in o[0..1], k_scale (ks, resolved
// once per thread: rk_k_scale_for) applied as rk_to_output applies it.
ROPEKV_DEVICE void rk_fp8_pack8_k(const float* v, const rk_side_scale& ks, int32_t ct, uint32_t* o) {
  float s[8];
  ROPEKV_UNROLL
  for (int m = 0; m < 8; ++m) s[m] = ks.mul ? ROPEKV_FMUL_RN(v[m], ks.inv_scale) : ROPEKV_FDIV_RN(v[m], ks.scale);
  o[0] = rk_encode_fp8x2(ct, s[0], s[1]) | (rk_encode_fp8x2(ct, s[2], s[3]) << 16);
  o[1] = rk_encode_fp8x2(ct, s[4], s[5]) | (rk_encode_fp8x2(ct, s[6], s[7]) << 16);
}

ROPEKV_DEVICE void rk_pack8(const float* v, const rk_side_scale& ks, int32_t ct, uint32_t* o) {
  if (rk_is_fp8(ct)) {
    rk_fp8_pack8_k(v, ks, ct, o);
  } else {
    o[0] = o[1] = o[2] = o[3] = 0u;
    ROPEKV_UNROLL
    for (int m = 0; m < 8; ++m) o[m >> 1] |= (rk_encode(ct, v[m]) & 0xffffu) << (16 * (m & 1));
  }
}

// Rotates one rope unit: gptj w = 8 lanes of the unit; neox wa, wb = the 8 lanes of each half.
// cs/sn: the unit's cos/sin (4 values gptj, 8 neox). Results r[0..8) (gptj) or ra, rb (neox).
ROPEKV_DEVICE void rk_v4_rope(bool neox, int32_t t, const uint32_t* wa, const uint32_t* wb,
                              const float* cs, const float* sn, float* ra, float* rb) {
  if (!neox) {
    rk_rope4_f<false>(t, wa, cs, sn, ra);
    return;
  }
  // two neox groups of 4 pairs: lanes 0-3 = a half, lanes 4-7 = b half
  const uint32_t w0[4] = {wa[0], wa[1], wb[0], wb[1]};
  const uint32_t w1[4] = {wa[2], wa[3], wb[2], wb[3]};
  float r0[8], r1[8];
  rk_rope4_f<true>(t, w0, cs, sn, r0);
  rk_rope4_f<true>(t, w1, cs + 4, sn + 4, r1);
  ROPEKV_UNROLL
  for (int m = 0; m < 4; ++m) {
    ra[m] = r0[m];
    ra[4 + m] = r1[m];
    rb[m] = r0[4 + m];
    rb[4 + m] = r1[4 + m];
  }
}

// The cos and sin values of rope unit `unit` from table row pos (4 each gptj, 8 neox).
ROPEKV_DEVICE void rk_load_cos_sin_unit(const rk_params& p, int32_t tt, bool neox, int64_t pos,
                                        int32_t unit, float* cs, float* sn) {
  const int tab_sz = rk_size_bytes(tt);
  const char* cos_row = p.cos + pos * p.cos_s0 * tab_sz;
  const char* sin_row = p.sin + pos * p.sin_s0 * tab_sz;
  const int per = neox ? 8 : 4;
  const int64_t off = static_cast<int64_t>(unit) * per * tab_sz;
  rk_load_table4(tt, cos_row + off, cs);
  rk_load_table4(tt, sin_row + off, sn);
  if (neox) {
    rk_load_table4(tt, cos_row + off + 4 * tab_sz, cs + 4);
    rk_load_table4(tt, sin_row + off + 4 * tab_sz, sn + 4);
  }
}

// A rotated rope unit into a 16-bit rope row out_pe of dtype qt (a q_out row's rope part, or a
// decode output row: decode_q_pe_out, k_pe_out), unscaled: gptj one 16-byte store, neox one in
// each half (half_bytes = Dr/2 elements further).
ROPEKV_DEVICE void rk_store_q_rope_unit(int32_t qt, bool neox, char* out_pe, int64_t half_bytes,
                                        int32_t unit, const float* ra, const float* rb) {
  uint32_t o[4] = {0u, 0u, 0u, 0u};
  ROPEKV_UNROLL
  for (int m = 0; m < 8; ++m) o[m >> 1] |= (rk_encode(qt, ra[m]) & 0xffffu) << (16 * (m & 1));
  rk_store_words(out_pe + unit * 16, 16, o);
  if (neox) {
    uint32_t ob[4] = {0u, 0u, 0u, 0u};
    ROPEKV_UNROLL
    for (int m = 0; m < 8; ++m) ob[m >> 1] |= (rk_encode(qt, rb[m]) & 0xffffu) << (16 * (m & 1));
    rk_store_words(out_pe + half_bytes + unit * 16, 16, ob);
  }
}

// A rotated rope unit into the rope part of cache entry `slot` (dtype ct, k_scale for fp8).
ROPEKV_DEVICE void rk_store_cache_rope_unit(const rk_params& p, const rk_side_scale& ks, int32_t ct, bool neox,
                                            int64_t slot, int32_t unit, const float* ra, const float* rb) {
  const int c_bytes8 = 8 * rk_size_bytes(ct);  // bytes of 8 cache elements: 16 or 8
  char* dst = p.cache.entry(p.cache.rope, slot);
  uint32_t o[4];
  rk_pack8(ra, ks, ct, o);
  p.cache.store(p.cache.feature(dst, static_cast<int64_t>(unit) * 8), c_bytes8, o);
  if (neox) {
    rk_pack8(rb, ks, ct, o);
    p.cache.store(p.cache.feature(dst, p.dr / 2 + static_cast<int64_t>(unit) * 8), c_bytes8, o);
  }
}

// 8 kv nope elements (one 16-byte chunk, kt) into the cache dtype ct: 16 bytes (same 16-bit
// dtype, NaN canonicalised) or 8 bytes (fp8, k_scale applied); returns the bytes to store from w.
// With kt = ct = q's dtype it is also the q nope chunk (the canonicalisation only).
ROPEKV_DEVICE int rk_cache_chunk8(const rk_side_scale& ks, int32_t kt, int32_t ct, uint32_t* w) {
  if (!rk_is_fp8(ct)) {
    rk_canon_nan16x8(w, ct);
    return 16;
  }
  float v[8];
  ROPEKV_UNROLL
  for (int m = 0; m < 8; ++m) v[m] = rk_decode(kt, rk_lane16(w, m));
  rk_fp8_pack8_k(v, ks, ct, w);
  return 8;
}

// Whether nope chunk j of a row of `chunks` chunks is written (mutation 3: the last one is not).
ROPEKV_DEVICE bool rk_v4_nope_written(int32_t j, int32_t chunks) {
#if ROPEKV_MUTATION == 3
  return j != chunks - 1;  // planted bug: the tail chunk of every nope row is dropped
#else
  (void)j;
  (void)chunks;
  return true;
#endif
}

// A loaded position, clamped (pos_oob = clamp) or refused (false: error mode, an unchecked
// device value out of range: write nothing for it).
ROPEKV_DEVICE bool rk_position_ok(const rk_params& p, int64_t* pos) {
  if (*pos >= 0 && *pos < p.table_rows) return true;
  if (!p.pos_clamp) return false;
  *pos = *pos < 0 ? 0 : p.table_rows - 1;
  return true;
}
// ------------------------------------------------------------------ fast_v4
// One group of 32 consecutive threads per row (no warp intrinsics: on a 64-wide AMD wavefront a
// wave holds two groups). A row is a q_out row (token t, head h) or a cache entry (token t),
// each [Dn nope | Dr rope]. Lane l of the group copies nope chunks l, l + 32, ... (8 elements,
// 16 bytes; Dn = 512: two per lane, both loaded before the first store) and, for l < units,
// rotates rope unit l (gptj 4 pairs of one 16-byte load, neox 8 pairs from a 16-byte load in
// each half). Every load a row needs (slot, position, q_pe/k_pe unit, the
// first nope batch) is issued before the first wait; the cos/sin loads wait for the position
// only. Groups, token-major (rk_fast4_body): a token's cache entry (its nope part split over
// 2^kv_split_log2 groups, its rope units in part 0 or, with kv_rope_group, in a group of their
// own after them), then its q rows (32 lanes per row, or with zero-copy concat, no nope chunks,
// 2^q_lanes_log2 >= units lanes per row and several rows per group). Cache slice s takes nope
// chunks s*32 + l, (s + split)*32 + l, ... The group index is split into (token, group) by a
// host-computed multiply-high division (rk_div_u32). Preconditions (host, launch_plan.h
// rk_v4_refusal): q f16|bf16 with q_out of the same dtype; kv f16|bf16 with the cache of the
// same dtype or fp8; Dn % 8 == 0; Dr % 8 (gptj) or % 16 (neox) == 0, at most 32 rope units;
// every row 16-byte aligned (8-byte for an fp8 cache); table rows aligned to 4 values; one kv
// head; no in-place rope. Same conversions and rope arithmetic as the general body: bytes
// identical to it; same behaviour for unchecked device values (an out-of-range position skips the rope
// units, an out-of-range slot the cache entry). Decode outputs (rk_v4_zero_row and the stores
// after a row's rope unit) go with the q row / cache entry they belong to: the zero buffer with
// the q row's nope chunks, decode_q_pe_out and k_pe_out with its rope units.
constexpr int32_t rk_v4_batch = 2;  // nope chunks per lane loaded before the first store
// (The batch loops of rk_v4_q_row / rk_v4_kv_row are written out in place: moved into shared
// load/store helpers they cost the fp8-cache instantiations a 4-8 byte register spill under
// their 48-register cap, nvcc 13.0 sm_90a, so they stay as measured on the H200.)

// Decode outputs on fast_v4 (core/SPEC.md "Decode outputs"; rows 16-byte aligned, launch_plan.h
// rk_v4_decode_refusal). Compiled only into the D = 1 instantiations (rk_params::v4_decode, set
// by the host plan when any decode output is given), so a launch without them runs the code and
// registers it ran before. There the callers test `t < p.num_decode` and the output's pointer
// once per row: uniform over the group (one token per group), nothing in the chunk loops.
// The values are the ones the row's q_out / cache rope stores get, rounded into the input dtype
// without a scale (rk_store_q_rope_unit), so they equal the general path's bit for bit.
// Row (t, h) of decode_q_pe_out: [Dr] in q's 16-bit dtype.
ROPEKV_DEVICE char* rk_v4_dec_q_pe_row(const rk_params& p, int64_t t, int64_t h) {
  return p.decode_q_pe_out + (t * p.dec_q_pe_s0 + h * p.dec_q_pe_s1) * 2;
}
// +0 (all-zero bits) over nope chunks first, first + step, ... (8 elements, 16 bytes each) of
// row (t, h) of q_nope_zeros_out: [Dn] in q's 16-bit dtype.
ROPEKV_DEVICE void rk_v4_zero_row(const rk_params& p, int64_t t, int64_t h, int32_t first, int32_t step) {
  char* row = p.q_nope_zeros_out + (t * p.zeros_s0 + h * p.zeros_s1) * 2;  // [Dn] 16-bit
  const uint32_t zero[4] = {0u, 0u, 0u, 0u};
  for (int32_t j = first; j < p.v4_nope_chunks; j += step) rk_store_words(row + static_cast<int64_t>(j) * 16, 16, zero);
}

template <class S, int D>
ROPEKV_DEVICE void rk_v4_q_row(const rk_params& p, int64_t t, int64_t h, int32_t lane, int32_t lanes) {
  const int32_t qt = S::q >= 0 ? S::q : p.q_dtype;
  const bool neox = S::neox >= 0 ? S::neox != 0 : p.neox != 0;
  const int32_t tt = S::table >= 0 ? S::table : p.table_dtype;
  const char* nope_row = p.q_nope + (t * p.q_nope_s0 + h * p.q_nope_s1) * 2;  // [Dn] 16-bit
  const char* pe_row = p.q_pe + (t * p.q_pe_s0 + h * p.q_pe_s1) * 2;          // [Dr]
  char* out_row = p.q_out + (t * p.q_out_s0 + h * p.q_out_s1) * 2;            // [Dn + Dr]
  const int32_t nc = p.v4_nope_chunks;  // copy mode: zero-copy rows go to rk_v4_q_rope_rows
  const bool rope_lane = lane < p.v4_units;
  // every independent load first
  // (the position is checked only after every load is issued: a branch on it here would make
  // the whole group wait for it before loading the nope chunks)
  const int64_t slot = p.pad_q_computed ? 0 : rk_load_index(p.slots, t, p.slots_s0, p.slots_i64);
  int64_t pos = rope_lane ? rk_load_index(p.positions, t, p.positions_s0, p.positions_i64) : 0;
  uint32_t wa[4] = {0u, 0u, 0u, 0u}, wb[4] = {0u, 0u, 0u, 0u};
  if (rope_lane) {
    rk_load_words(pe_row + lane * 16, 16, wa);
    if (neox) rk_load_words(pe_row + p.dr + lane * 16, 16, wb);  // the second half: Dr/2 x 2 bytes
  }
  uint32_t w[rk_v4_batch][4];
  ROPEKV_UNROLL
  for (int k = 0; k < rk_v4_batch; ++k) {
    const int32_t j = lane + k * lanes;
    if (j < nc) rk_load_words(nope_row + static_cast<int64_t>(j) * 16, 16, w[k]);
  }
  if (slot < 0) return;  // padding token, pad_q = skipped: q_out row left as it was
  const bool pos_ok = rope_lane && rk_position_ok(p, &pos);
  float cs[8], sn[8];
  if (pos_ok) {
    rk_load_cos_sin_unit(p, tt, neox, pos, lane, cs, sn);
  }
  ROPEKV_UNROLL
  for (int k = 0; k < rk_v4_batch; ++k) {
    const int32_t j = lane + k * lanes;
    if (j < nc && rk_v4_nope_written(j, nc)) {
      rk_canon_nan16x8(w[k], qt);
      rk_store_words(out_row + static_cast<int64_t>(j) * 16, 16, w[k]);
    }
  }
  for (int32_t first = lane + rk_v4_batch * lanes; first < nc; first += rk_v4_batch * lanes) {
    ROPEKV_UNROLL
    for (int k = 0; k < rk_v4_batch; ++k) {
      const int32_t j = first + k * lanes;
      if (j < nc) rk_load_words(nope_row + static_cast<int64_t>(j) * 16, 16, w[k]);
    }
    ROPEKV_UNROLL
    for (int k = 0; k < rk_v4_batch; ++k) {
      const int32_t j = first + k * lanes;
      if (j < nc && rk_v4_nope_written(j, nc)) {
        rk_canon_nan16x8(w[k], qt);
        rk_store_words(out_row + static_cast<int64_t>(j) * 16, 16, w[k]);
      }
    }
  }
  // decode zero buffer: every nope chunk, zero-copy included (the group's lanes of this row)
  if ((D & 1) && t < p.num_decode && p.q_nope_zeros_out != nullptr) rk_v4_zero_row(p, t, h, lane, lanes);
  if (!pos_ok) return;
  float ra[8], rb[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  rk_v4_rope(neox, qt, wa, wb, cs, sn, ra, rb);
  if ((D & 1) && t < p.num_decode && p.decode_q_pe_out != nullptr)
    rk_store_q_rope_unit(qt, neox, rk_v4_dec_q_pe_row(p, t, h), p.dr, lane, ra, rb);
  rk_store_q_rope_unit(qt, neox, out_row + p.dn * 2, p.dr, lane, ra, rb);
}

// Zero-copy q rows (q_nope already is q_out's first Dn columns: only the rope part moves):
// lane `lane` of a `lanes`-lane row rotates rope unit `lane` of up to rk_v4_zc_rows_max rows of
// token t, heads h0, h0 + step, ... (v4_zc_rows of them, those < H). Every row's q_pe unit is
// loaded before the first store, and the slot, the position and its cos/sin unit are loaded once
// for all of them: per 16 bytes moved, a quarter of the index work and four loads in flight
// where one row per lane had one. Same conversions and order of checks as rk_v4_q_row.
constexpr int32_t rk_v4_zc_rows_max = 4;
template <class S, int D>
ROPEKV_DEVICE void rk_v4_q_rope_rows(const rk_params& p, int64_t t, int64_t h0, int64_t step, int32_t lane,
                                     int32_t lanes) {
  const int32_t qt = S::q >= 0 ? S::q : p.q_dtype;
  const bool neox = S::neox >= 0 ? S::neox != 0 : p.neox != 0;
  const int32_t tt = S::table >= 0 ? S::table : p.table_dtype;
  const bool rope_lane = lane < p.v4_units;
  const int64_t slot = p.pad_q_computed ? 0 : rk_load_index(p.slots, t, p.slots_s0, p.slots_i64);
  int64_t pos = rope_lane ? rk_load_index(p.positions, t, p.positions_s0, p.positions_i64) : 0;
  uint32_t wa[rk_v4_zc_rows_max][4], wb[rk_v4_zc_rows_max][4];
  ROPEKV_UNROLL
  for (int i = 0; i < rk_v4_zc_rows_max; ++i) {
    const int64_t h = h0 + i * step;
    ROPEKV_UNROLL
    for (int m = 0; m < 4; ++m) wa[i][m] = wb[i][m] = 0u;
    if (rope_lane && i < p.v4_zc_rows && h < p.heads) {
      const char* pe_row = p.q_pe + (t * p.q_pe_s0 + h * p.q_pe_s1) * 2;  // [Dr]
      rk_load_words(pe_row + lane * 16, 16, wa[i]);
      if (neox) rk_load_words(pe_row + p.dr + lane * 16, 16, wb[i]);  // the second half
    }
  }
  if (slot < 0) return;  // padding token, pad_q = skipped: q_out rows left as they were
  const bool pos_ok = rope_lane && rk_position_ok(p, &pos);
  float cs[8], sn[8];
  if (pos_ok) rk_load_cos_sin_unit(p, tt, neox, pos, lane, cs, sn);
  if ((D & 1) && t < p.num_decode && p.q_nope_zeros_out != nullptr) {  // decode zero buffer, every row
    for (int32_t i = 0; i < p.v4_zc_rows && h0 + i * step < p.heads; ++i) rk_v4_zero_row(p, t, h0 + i * step, lane, lanes);
  }
  if (!pos_ok) return;
  ROPEKV_UNROLL
  for (int i = 0; i < rk_v4_zc_rows_max; ++i) {
    const int64_t h = h0 + i * step;
    if (i < p.v4_zc_rows && h < p.heads) {
      float ra[8], rb[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      rk_v4_rope(neox, qt, wa[i], wb[i], cs, sn, ra, rb);
      if ((D & 1) && t < p.num_decode && p.decode_q_pe_out != nullptr)
        rk_store_q_rope_unit(qt, neox, rk_v4_dec_q_pe_row(p, t, h), p.dr, lane, ra, rb);
      char* out_row = p.q_out + (t * p.q_out_s0 + h * p.q_out_s1) * 2;  // [Dn + Dr]
      rk_store_q_rope_unit(qt, neox, out_row + p.dn * 2, p.dr, lane, ra, rb);
    }
  }
}

// Two q rows of token t in one group (heads h0 and h0 + 1 when h0 + 1 < H): lane l copies nope
// chunks l and l + 32 of both rows (four 16-byte loads in flight before the first store at
// Dn = 512) and rotates rope unit l of row h0 (l < units) or unit l - units of row h0 + 1
// (units <= l < 2 units): the slot, the position and its cos/sin row serve both rows, so the
// per-row index work and the position -> cos/sin chain are paid once per two rows. Same
// conversions and order of checks as rk_v4_q_row; needs 2 units <= 32 and no zero-copy.
template <class S, int D>
ROPEKV_DEVICE void rk_v4_q_row_pair(const rk_params& p, int64_t t, int64_t h0, int32_t lane) {
  const int32_t qt = S::q >= 0 ? S::q : p.q_dtype;
  const bool neox = S::neox >= 0 ? S::neox != 0 : p.neox != 0;
  const int32_t tt = S::table >= 0 ? S::table : p.table_dtype;
  const int64_t rows = h0 + 1 < p.heads ? 2 : 1;
  const int64_t nope_s1 = p.q_nope_s1 * 2, out_s1 = p.q_out_s1 * 2;  // bytes from row h0 to h0 + 1
  const char* nope_row = p.q_nope + (t * p.q_nope_s0 + h0 * p.q_nope_s1) * 2;  // [2, Dn] 16-bit
  char* out_row = p.q_out + (t * p.q_out_s0 + h0 * p.q_out_s1) * 2;            // [2, Dn + Dr]
  const int32_t nc = p.v4_nope_chunks;
  const int32_t units = p.v4_units;
  const int32_t second = lane >= units ? 1 : 0;  // the rope lane's row: h0 + second
  const int32_t unit = lane - second * units;
  const bool rope_lane = lane < rows * units;
  // every independent load first (rk_v4_q_row)
  const int64_t slot = p.pad_q_computed ? 0 : rk_load_index(p.slots, t, p.slots_s0, p.slots_i64);
  int64_t pos = rope_lane ? rk_load_index(p.positions, t, p.positions_s0, p.positions_i64) : 0;
  uint32_t wa[4] = {0u, 0u, 0u, 0u}, wb[4] = {0u, 0u, 0u, 0u};
  if (rope_lane) {
    const char* pe_row = p.q_pe + (t * p.q_pe_s0 + (h0 + second) * p.q_pe_s1) * 2;  // [Dr]
    rk_load_words(pe_row + unit * 16, 16, wa);
    if (neox) rk_load_words(pe_row + p.dr + unit * 16, 16, wb);
  }
  uint32_t w[2][rk_v4_batch][4];
  ROPEKV_UNROLL
  for (int r = 0; r < 2; ++r) {
    ROPEKV_UNROLL
    for (int k = 0; k < rk_v4_batch; ++k) {
      const int32_t j = lane + k * 32;
      if (r < rows && j < nc) rk_load_words(nope_row + r * nope_s1 + static_cast<int64_t>(j) * 16, 16, w[r][k]);
    }
  }
  if (slot < 0) return;  // padding token, pad_q = skipped: q_out rows left as they were
  const bool pos_ok = rope_lane && rk_position_ok(p, &pos);
  float cs[8], sn[8];
  if (pos_ok) {
    rk_load_cos_sin_unit(p, tt, neox, pos, unit, cs, sn);
  }
  ROPEKV_UNROLL
  for (int r = 0; r < 2; ++r) {
    ROPEKV_UNROLL
    for (int k = 0; k < rk_v4_batch; ++k) {
      const int32_t j = lane + k * 32;
      if (r < rows && j < nc && rk_v4_nope_written(j, nc)) {
        rk_canon_nan16x8(w[r][k], qt);
        rk_store_words(out_row + r * out_s1 + static_cast<int64_t>(j) * 16, 16, w[r][k]);
      }
    }
  }
  for (int r = 0; r < rows; ++r) {  // Dn > 512: the rest, row by row, two chunks per lane at a time
    for (int32_t first = lane + rk_v4_batch * 32; first < nc; first += rk_v4_batch * 32) {
      ROPEKV_UNROLL
      for (int k = 0; k < rk_v4_batch; ++k) {
        const int32_t j = first + k * 32;
        if (j < nc) rk_load_words(nope_row + r * nope_s1 + static_cast<int64_t>(j) * 16, 16, w[0][k]);
      }
      ROPEKV_UNROLL
      for (int k = 0; k < rk_v4_batch; ++k) {
        const int32_t j = first + k * 32;
        if (j < nc && rk_v4_nope_written(j, nc)) {
          rk_canon_nan16x8(w[0][k], qt);
          rk_store_words(out_row + r * out_s1 + static_cast<int64_t>(j) * 16, 16, w[0][k]);
        }
      }
    }
  }
  if ((D & 1) && t < p.num_decode && p.q_nope_zeros_out != nullptr) {  // decode zero buffer of both rows
    for (int r = 0; r < rows; ++r) rk_v4_zero_row(p, t, h0 + r, lane, 32);
  }
  if (!pos_ok) return;
  float ra[8], rb[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  rk_v4_rope(neox, qt, wa, wb, cs, sn, ra, rb);
  if ((D & 1) && t < p.num_decode && p.decode_q_pe_out != nullptr)
    rk_store_q_rope_unit(qt, neox, rk_v4_dec_q_pe_row(p, t, h0 + second), p.dr, unit, ra, rb);
  rk_store_q_rope_unit(qt, neox, out_row + second * out_s1 + p.dn * 2, p.dr, unit, ra, rb);
}

template <class S, int D>
ROPEKV_DEVICE void rk_v4_kv_row(const rk_params& p, int64_t t, int32_t part, int32_t lane) {
  const int32_t kt = S::q >= 0 ? S::q : p.k_dtype;
  const int32_t ct = S::cache >= 0 ? S::cache : p.cache.dtype;
  const bool neox = S::neox >= 0 ? S::neox != 0 : p.neox != 0;
  const int32_t tt = S::table >= 0 ? S::table : p.table_dtype;
  const int32_t split = 1 << p.v4_kv_split_log2;
  // with v4_kv_rope_group, part `split` is a rope-only group; else part 0 also does the rope
  const bool rope_part = p.v4_kv_rope_group ? part == split : part == 0;
  const int32_t nc = (p.v4_kv_rope_group && part == split) ? 0 : p.v4_nope_chunks;
  const bool rope_lane = rope_part && lane < p.v4_units;
  const char* kv_row = p.kv_c + t * p.kv_c_s0 * 2;   // [Dn] 16-bit
  const char* kpe_row = p.k_pe + t * p.k_pe_s0 * 2;  // [Dr]
  const int64_t slot = rk_load_index(p.slots, t, p.slots_s0, p.slots_i64);
  int64_t pos = rope_lane ? rk_load_index(p.positions, t, p.positions_s0, p.positions_i64) : 0;
  const rk_side_scale ks = rk_k_scale_for(p, ct);
  uint32_t wa[4] = {0u, 0u, 0u, 0u}, wb[4] = {0u, 0u, 0u, 0u};
  if (rope_lane) {
    rk_load_words(kpe_row + lane * 16, 16, wa);
    if (neox) rk_load_words(kpe_row + p.dr + lane * 16, 16, wb);
  }
  uint32_t w[rk_v4_batch][4];
  ROPEKV_UNROLL
  for (int k = 0; k < rk_v4_batch; ++k) {
    const int32_t j = (k * split + part) * 32 + lane;
    if (j < nc) rk_load_words(kv_row + static_cast<int64_t>(j) * 16, 16, w[k]);
  }
  if (slot < 0 || slot >= p.cache.num_slots) return;  // padding (or an unchecked slot)
  const bool pos_ok = rope_lane && rk_position_ok(p, &pos);
  float cs[8], sn[8];
  if (pos_ok) {
    rk_load_cos_sin_unit(p, tt, neox, pos, lane, cs, sn);
  }
  char* nope_dst = p.cache.entry(p.cache.nope, slot);
  ROPEKV_UNROLL
  for (int k = 0; k < rk_v4_batch; ++k) {
    const int32_t j = (k * split + part) * 32 + lane;
    if (j < nc && rk_v4_nope_written(j, nc)) {
      const int bytes = rk_cache_chunk8(ks, kt, ct, w[k]);
      p.cache.store(p.cache.feature(nope_dst, static_cast<int64_t>(j) * 8), bytes, w[k]);
    }
  }
  for (int32_t first = (rk_v4_batch * split + part) * 32 + lane; first < nc; first += rk_v4_batch * split * 32) {
    ROPEKV_UNROLL
    for (int k = 0; k < rk_v4_batch; ++k) {
      const int32_t j = first + k * split * 32;
      if (j < nc) rk_load_words(kv_row + static_cast<int64_t>(j) * 16, 16, w[k]);
    }
    ROPEKV_UNROLL
    for (int k = 0; k < rk_v4_batch; ++k) {
      const int32_t j = first + k * split * 32;
      if (j < nc && rk_v4_nope_written(j, nc)) {
        const int bytes = rk_cache_chunk8(ks, kt, ct, w[k]);
        p.cache.store(p.cache.feature(nope_dst, static_cast<int64_t>(j) * 8), bytes, w[k]);
      }
    }
  }
  if (!pos_ok) return;
  float ra[8], rb[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  rk_v4_rope(neox, kt, wa, wb, cs, sn, ra, rb);
  // decode output k_pe_out [Tk, Dr] (kv's 16-bit dtype, unscaled): with the cache entry's rope
  if ((D & 1) && p.k_pe_out != nullptr) rk_store_q_rope_unit(kt, neox, p.k_pe_out + t * p.k_pe_out_s0 * 2, p.dr, lane, ra, rb);
  rk_store_cache_rope_unit(p, ks, ct, neox, slot, lane, ra, rb);
}

// Layout fp8_ds_mla on fast_v4 (core/SPEC.md "The fp8_ds_mla layout"; the D & 2
// instantiations, rk_params::ds_mla). A token's 656-byte entry takes two groups: part 0 the 512
// nope values (lane l: values [16 l, 16 l + 16), tile l / 8) and the tile scales, part 1 the rope
// units (lanes < v4_units). Without cooperation between threads (kernel.h's rule, which the sim
// relies on), each lane takes its tile's amax itself from the tile's 16 chunks: 8 lanes read
// the same 256 bytes, of which L1 serves 7 (global traffic unchanged). Entry stores in pieces
// of v4_ds_align bytes (16, 8 or 4: the entry addresses' alignment, set by the host).
ROPEKV_DEVICE void rk_ds_store16(char* dst, const uint32_t* w, int32_t align) {
  if (align >= 16) {
    rk_store_words(dst, 16, w);
  } else if (align == 8) {
    rk_store_words(dst, 8, w);
    rk_store_words(dst + 8, 8, w + 2);
  } else {
    ROPEKV_UNROLL
    for (int i = 0; i < 4; ++i) rk_store_words(dst + 4 * i, 4, w + i);
  }
}
// Largest magnitude (bits, NaN lanes skipped) of the 16-bit values of w[0..4), kt's `inf`
// magnitude bits given: for non-NaN values of one format the order of the magnitude bits is
// the order of |x|.
ROPEKV_DEVICE uint32_t rk_amax_bits16x8(const uint32_t* w, uint32_t inf, uint32_t m) {
  ROPEKV_UNROLL
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = w[i] & 0x7fffu, hi = (w[i] >> 16) & 0x7fffu;
    m = (lo <= inf && lo > m) ? lo : m;
    m = (hi <= inf && hi > m) ? hi : m;
  }
  return m;
}
// One level of a max tree over halfword pairs: a[c] = max(a[c], a[c + S]) per halfword, c < S.
template <int S>
ROPEKV_DEVICE void rk_max_fold(uint32_t* a) {
  ROPEKV_UNROLL
  for (int c = 0; c < S; ++c) a[c] = rk_max_u16x2(a[c], a[c + S]);
}
// A tile's amax bits (NaN skipped) from its 16 chunks: each value's magnitude bits (sign
// cleared) folded halfword-wise into one word per chunk as it arrives, then a tree of depth 4
// over the 16 words and the larger half, rather than one chain of 128 dependent selects. All 16
// chunk loads are in flight at once (one round trip) and no chunk stays live past its fold. A
// tile holding a NaN (a maximum above `inf`) reads its chunks again (L1) and takes the chain,
// which skips NaNs.
ROPEKV_DEVICE uint32_t rk_ds_tile_amax_bits(const char* tile, uint32_t inf) {
  uint32_t mx[16];
  ROPEKV_UNROLL
  for (int c = 0; c < 16; ++c) {
    uint32_t w[4];
    rk_load_words(tile + c * 16, 16, w);
    mx[c] = rk_max_u16x2(rk_max_u16x2(w[0] & 0x7fff7fffu, w[1] & 0x7fff7fffu),
                         rk_max_u16x2(w[2] & 0x7fff7fffu, w[3] & 0x7fff7fffu));
  }
  // the tree's levels written out: a loop over s = 8, 4, 2, 1 is not unrolled by nvcc, which
  // then keeps the words in local memory
  rk_max_fold<8>(mx);
  rk_max_fold<4>(mx);
  rk_max_fold<2>(mx);
  rk_max_fold<1>(mx);
  const uint32_t m = rk_max_u16x2(mx[0], mx[0] >> 16) & 0xffffu;
  if (m <= inf) return m;
  uint32_t r = 0u;
  for (int c = 0; c < 16; ++c) {
    uint32_t w[4];
    rk_load_words(tile + c * 16, 16, w);
    r = rk_amax_bits16x8(w, inf, r);
  }
  return r;
}
// The 16 values of a lane's two 16-byte chunks of 16-bit kt values, in order.
ROPEKV_DEVICE void rk_ds_decode16(int32_t kt, const uint32_t (*w)[4], float* v) {
  ROPEKV_UNROLL
  for (int i = 0; i < 16; ++i) v[i] = rk_decode(kt, (w[i >> 3][(i >> 1) & 3] >> (16 * (i & 1))) & 0xffffu);
}
template <class S, int D>
ROPEKV_DEVICE void rk_v4_ds_mla_row(const rk_params& p, int64_t t, int32_t part, int32_t lane) {
  const int32_t kt = S::q >= 0 ? S::q : p.k_dtype;
  const bool neox = S::neox >= 0 ? S::neox != 0 : p.neox != 0;
  const int32_t tt = S::table >= 0 ? S::table : p.table_dtype;
  const int32_t align = p.v4_ds_align;
  if (part == 1) {  // rope: 64 values in kt at byte rk_ds_rope_at, unscaled
    if (lane >= p.v4_units) return;
    const char* kpe_row = p.k_pe + t * p.k_pe_s0 * 2;  // [Dr] 16-bit
    const int64_t slot = rk_load_index(p.slots, t, p.slots_s0, p.slots_i64);
    int64_t pos = rk_load_index(p.positions, t, p.positions_s0, p.positions_i64);
    uint32_t wa[4], wb[4] = {0u, 0u, 0u, 0u};
    rk_load_words(kpe_row + lane * 16, 16, wa);
    if (neox) rk_load_words(kpe_row + p.dr + lane * 16, 16, wb);
    if (slot < 0 || slot >= p.cache.num_slots || !rk_position_ok(p, &pos)) return;
    float cs[8], sn[8];
    rk_load_cos_sin_unit(p, tt, neox, pos, lane, cs, sn);
    float ra[8], rb[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    rk_v4_rope(neox, kt, wa, wb, cs, sn, ra, rb);
    if ((D & 1) && p.k_pe_out != nullptr) rk_store_q_rope_unit(kt, neox, p.k_pe_out + t * p.k_pe_out_s0 * 2, p.dr, lane, ra, rb);
    char* rope = p.cache.entry(p.cache.nope, slot) + rk_ds_rope_at;
    uint32_t o[4] = {0u, 0u, 0u, 0u};
    ROPEKV_UNROLL
    for (int m = 0; m < 8; ++m) o[m >> 1] |= (rk_encode(kt, ra[m]) & 0xffffu) << (16 * (m & 1));
    rk_ds_store16(rope + lane * 16, o, align);
    if (neox) {
      ROPEKV_UNROLL
      for (int m = 0; m < 4; ++m) o[m] = 0u;
      ROPEKV_UNROLL
      for (int m = 0; m < 8; ++m) o[m >> 1] |= (rk_encode(kt, rb[m]) & 0xffffu) << (16 * (m & 1));
      rk_ds_store16(rope + p.dr + lane * 16, o, align);
    }
    return;
  }
  const char* kv_row = p.kv_c + t * p.kv_c_s0 * 2;  // [Dn = 512] 16-bit
  const char* tile = kv_row + (lane >> 3) * (rk_ds_tile * 2);
  const int64_t slot = rk_load_index(p.slots, t, p.slots_s0, p.slots_i64);
  uint32_t own[2][4];
  rk_load_words(kv_row + lane * 32, 16, own[0]);
  rk_load_words(kv_row + lane * 32 + 16, 16, own[1]);
  const uint32_t inf = kt == rk_bf16 ? 0x7f80u : 0x7c00u;
  const uint32_t m = rk_ds_tile_amax_bits(tile, inf);
  if (slot < 0 || slot >= p.cache.num_slots) return;  // padding (or an unchecked slot)
  const float scale = rk_ds_tile_scale(rk_decode(kt, m), p.ds_pow2);
  float v[16];
  rk_ds_decode16(kt, own, v);
  if (p.ds_pow2) {
    // v / 2^k == v * 2^-k for every v (both the exact value rounded once; 2^-k is exact); a NaN
    // input keeps its sign (a GPU multiply would canonicalise it)
    const float inv = rk_pow2_inverse(scale);
    ROPEKV_UNROLL
    for (int i = 0; i < 16; ++i) v[i] = v[i] != v[i] ? v[i] : ROPEKV_FMUL_RN(v[i], inv);
  } else {
    const double inv_d = rk_tile_scale_inverse(scale);
    ROPEKV_UNROLL
    for (int i = 0; i < 16; ++i) v[i] = rk_div_by_tile_scale(v[i], inv_d);
  }
  if (m == inf) {  // rare: a tile with +-inf (scale inf): each infinity's quotient is rk_ds_quotient's
    // NaN, whatever the platform's inf * 0 gives; the lane's chunks are read again (L1) so that
    // the common path keeps no input word live past its conversion
    rk_load_words(kv_row + lane * 32, 16, own[0]);
    rk_load_words(kv_row + lane * 32 + 16, 16, own[1]);
    float x[16];
    rk_ds_decode16(kt, own, x);
    ROPEKV_UNROLL
    for (int i = 0; i < 16; ++i) v[i] = rk_ds_quotient(x[i], v[i]);
  }
  char* entry = p.cache.entry(p.cache.nope, slot);
  uint32_t o[4];
  ROPEKV_UNROLL
  for (int i = 0; i < 4; ++i)
    o[i] = rk_encode_fp8x2_sat<rk_e4m3fn>(v[4 * i], v[4 * i + 1]) |
           (rk_encode_fp8x2_sat<rk_e4m3fn>(v[4 * i + 2], v[4 * i + 3]) << 16);
  rk_ds_store16(entry + lane * 16, o, align);
  if ((lane & 7) == 0) {  // the tile's first lane: its scale (f32, 4-byte aligned by the layout)
    const uint32_t bits = rk_f32_bits(scale);
    rk_store_words(entry + rk_ds_scales_at + (lane >> 3) * 4, 4, &bits);
  }
}

// The fast_v4 kernel body: a 1-D grid of 32-thread groups, token-major: token t < Tq has its
// 2^kv_split_log2 cache-entry groups followed by v4_q_groups_per_token groups of q rows (32
// lanes per row, or 2^q_lanes_log2 with zero-copy); tokens [Tq, Ts) have the cache groups only.
// So the arithmetic of the cache entries (fp8 conversions) is spread over the whole grid,
// interleaved with the memory-bound q rows, instead of forming one compute-bound phase, and a
// token's cache entry (the longer dependency chain) starts before its q rows: the grid ends
// with q rows, not with a conversion chain. D bit 0 (rk_params::v4_decode): also the decode
// outputs; bit 1 (rk_params::ds_mla): the cache entries are fp8_ds_mla records (rk_v4_ds_mla_row).
template <class S, int R = 1, int D = 0>
ROPEKV_DEVICE void rk_fast4_body(const rk_params& p) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t group = g >> 5;
  const int32_t l32 = static_cast<int32_t>(g & 31);
  const int32_t kv_groups = (1 << p.v4_kv_split_log2) + p.v4_kv_rope_group;
  int64_t t, r;  // token, group within the token
  if (group < p.v4_q_token_groups) {
    const uint32_t g32 = static_cast<uint32_t>(group);
    const uint32_t t32 = rk_div_u32(g32, p.v4_gpt_magic, p.v4_gpt_shift);
    t = t32;
    r = g32 - t32 * static_cast<uint32_t>(p.v4_q_groups_per_token + kv_groups);
  } else {
    const int64_t k = group - p.v4_q_token_groups;  // tokens [Tq, Ts): cache groups only
    t = p.tq + k / kv_groups;
    r = k - (t - p.tq) * kv_groups;
    if (t >= p.ts) return;
  }
  if (r < kv_groups) {
    if (D & 2) {
      rk_v4_ds_mla_row<S, D>(p, t, static_cast<int32_t>(r), l32);
    } else {
      rk_v4_kv_row<S, D>(p, t, static_cast<int32_t>(r), l32);
    }
    return;
  }
  if (R == 2) {  // v4_q_pairs: heads 2 (r - kv_groups) and the next
    rk_v4_q_row_pair<S, D>(p, t, 2 * (r - kv_groups), l32);
    return;
  }
  if (p.skip_q_nope) {  // zero-copy: 2^(5 - ql) rows side by side, v4_zc_rows of them per lane
    const int32_t ql = p.v4_q_lanes_log2;
    const int64_t per_pass = int64_t{1} << (5 - ql);
    const int64_t h0 = (r - kv_groups) * per_pass * p.v4_zc_rows + (l32 >> ql);
    if (h0 >= p.heads) return;
    rk_v4_q_rope_rows<S, D>(p, t, h0, per_pass, l32 & ((1 << ql) - 1), 1 << ql);
    return;
  }
  if (r - kv_groups >= p.heads) return;
  rk_v4_q_row<S, D>(p, t, r - kv_groups, l32, 32);
}

// The kernel body: one call per (block, thread). See the header comment for the decomposition.
ROPEKV_DEVICE void rk_fused_body(const rk_params& p) {
  const int64_t t = static_cast<int64_t>(blockIdx.x);
  const int64_t group = static_cast<int64_t>(blockIdx.y);
  if (t >= p.ts) return;
  // Both index loads in flight at once (t < Ts <= Tk: in bounds; the position of an unused
  // token is read but never used).
  const int64_t slot = rk_load_index(p.slots, t, p.slots_s0, p.slots_i64);
  int64_t pos = rk_load_index(p.positions, t, p.positions_s0, p.positions_i64);
  // A slot beyond the cache (possible only through hip_launch with unchecked device values)
  // is treated as padding for the cache: never an out-of-bounds write.
  const bool write_cache = group == 0 && slot >= 0 && slot < p.cache.num_slots;
  const bool write_q = t < p.tq && (slot >= 0 || p.pad_q_computed);
  if (!write_cache && !write_q) return;

  if (pos < 0 || pos >= p.table_rows) {
    if (!p.pos_clamp) return;  // unchecked device value in error mode: write nothing
    pos = pos < 0 ? 0 : p.table_rows - 1;
  }
  const char* cos_row = p.cos + pos * p.cos_s0 * rk_size_bytes(p.table_dtype);
  const char* sin_row = p.sin + pos * p.sin_s0 * rk_size_bytes(p.table_dtype);

  if (write_q) rk_general_q(p, t, group, cos_row, sin_row);
  if (write_cache) {
    if (p.ds_mla) {
      rk_write_ds_mla_entry(p, t, slot, cos_row, sin_row);
    } else {
      for (int64_t kh = 0; kh < p.kv_heads; ++kh) rk_write_cache(p, t, kh, slot, cos_row, sin_row);
    }
  }
}

}  // namespace ropekv_gpu
