// The general body (rk_fused_body, variant fused_v1): every case fast_v4 refuses (launch_plan.h
// rk_v4_refusal), any dtypes, layouts and alignments; `--variant general` forces it everywhere.
//
// Work decomposition (no intra-block cooperation, no shared memory, no __syncthreads):
//   grid.x = Ts tokens (Tq <= Ts), grid.y = ceil(H / heads_per_block) head groups.
//   Block (t, g) writes q_out rows of heads [g*hpb, (g+1)*hpb) of token t (if t < Tq) and,
//   when g == 0, the cache entry of token t (and k_pe in place). Threads stride over "units":
//   a nope unit is one chunk of `vec` elements (one 16-byte access on the wider side when the
//   row is aligned, scalar otherwise and for the tail chunk); a rope unit is one pair, done
//   wholly by one thread (so in-place writes never race with reads of the partner).
// Part of kernel.h.
#pragma once
#include <cstdint>

#include "backends/hip/gpu_compat.h"
#include "backends/hip/kernel_cache.h"
#include "backends/hip/kernel_convert.h"
#include "backends/hip/kernel_dtype.h"
#include "backends/hip/kernel_params.h"

namespace ropekv_gpu {

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
