// fast_v4 (rk_fast4_body, launched as hip_backend.hip rk_fast4_kernel<S, R, D>): one 32-thread
// group per q_out row or cache entry, every load of a row before its first store, token-major
// groups, a template over its dtypes and rope style (rk_v4_spec; the host picks the
// instantiation: launch_plan.h rk_v4_visit). Its row functions (rk_v4_q_row, rk_v4_q_rope_rows,
// rk_v4_q_row_pair, rk_v4_kv_row, rk_v4_ds_mla_row for fp8_ds_mla records) and the 16-byte units
// they share. launch_plan.h rk_v4_refusal says where it runs; the general body (kernel_general.h)
// takes the rest and writes the same bytes. Part of kernel.h.
#pragma once
#include <cstdint>

#include "backends/hip/gpu_compat.h"
#include "backends/hip/kernel_cache.h"
#include "backends/hip/kernel_convert.h"
#include "backends/hip/kernel_dtype.h"
#include "backends/hip/kernel_params.h"

namespace ropekv_gpu {

// ------------------------------------------------------------------ rope units of 16 bytes
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

// 8 fp32 values of the k side -> 8 codes of fp8 format ct in o[0..1], k_scale (ks, resolved
// once per thread: rk_k_scale_for) applied as rk_to_output applies it.
ROPEKV_DEVICE void rk_fp8_pack8_k(const float* v, const rk_side_scale& ks, int32_t ct, uint32_t* o) {
  float s[8];
  ROPEKV_UNROLL
  for (int m = 0; m < 8; ++m) s[m] = ks.mul ? ROPEKV_FMUL_RN(v[m], ks.inv_scale) : ROPEKV_FDIV_RN(v[m], ks.scale);
  o[0] = rk_encode_fp8x2(ct, s[0], s[1]) | (rk_encode_fp8x2(ct, s[2], s[3]) << 16);
  o[1] = rk_encode_fp8x2(ct, s[4], s[5]) | (rk_encode_fp8x2(ct, s[6], s[7]) << 16);
}

// 8 values -> 8 codes of the 16-bit dtype t in o[0..4), in order (no scale).
ROPEKV_DEVICE void rk_pack16x8(int32_t t, const float* v, uint32_t* o) {
  o[0] = o[1] = o[2] = o[3] = 0u;
  ROPEKV_UNROLL
  for (int m = 0; m < 8; ++m) o[m >> 1] |= (rk_encode(t, v[m]) & 0xffffu) << (16 * (m & 1));
}

// 8 rope values -> cache dtype ct (scaled for fp8): 4 words (16-bit) or 2 words (fp8).
ROPEKV_DEVICE void rk_pack8(const float* v, const rk_side_scale& ks, int32_t ct, uint32_t* o) {
  if (rk_is_fp8(ct)) {
    rk_fp8_pack8_k(v, ks, ct, o);
  } else {
    rk_pack16x8(ct, v, o);
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
  uint32_t o[4];
  rk_pack16x8(qt, ra, o);
  rk_store_words(out_pe + unit * 16, 16, o);
  if (neox) {
    uint32_t ob[4];
    rk_pack16x8(qt, rb, ob);
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
ROPEKV_DEVICE void rk_v4_q_row(const rk_params& p, int64_t t, int64_t h, int32_t lane) {
  constexpr int32_t lanes = 32;  // one group per row
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
  // decode zero buffer: every nope chunk (the group's lanes of this row)
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
// MaxRows: the most rows the code holds (rk_v4_zc_rows_max, or 1 for v4_zc_rows = 1: the decode
// sizes, where the 4-row loop's run-time bounds cost 0.05-0.12 µs).
constexpr int32_t rk_v4_zc_rows_max = 4;
template <class S, int D, int MaxRows>
ROPEKV_DEVICE void rk_v4_q_rope_rows(const rk_params& p, int64_t t, int64_t h0, int64_t step, int32_t lane,
                                     int32_t lanes) {
  const int32_t qt = S::q >= 0 ? S::q : p.q_dtype;
  const bool neox = S::neox >= 0 ? S::neox != 0 : p.neox != 0;
  const int32_t tt = S::table >= 0 ? S::table : p.table_dtype;
  const bool rope_lane = lane < p.v4_units;
  const int64_t slot = p.pad_q_computed ? 0 : rk_load_index(p.slots, t, p.slots_s0, p.slots_i64);
  int64_t pos = rope_lane ? rk_load_index(p.positions, t, p.positions_s0, p.positions_i64) : 0;
  uint32_t wa[MaxRows][4], wb[MaxRows][4];
  ROPEKV_UNROLL
  for (int i = 0; i < MaxRows; ++i) {
    const int64_t h = h0 + i * step;
    ROPEKV_UNROLL
    for (int m = 0; m < 4; ++m) wa[i][m] = wb[i][m] = 0u;
    if (rope_lane && (MaxRows == 1 || (i < p.v4_zc_rows && h < p.heads))) {
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
    for (int32_t i = 0; i < MaxRows && i < p.v4_zc_rows && h0 + i * step < p.heads; ++i)
      rk_v4_zero_row(p, t, h0 + i * step, lane, lanes);
  }
  if (!pos_ok) return;
  ROPEKV_UNROLL
  for (int i = 0; i < MaxRows; ++i) {
    const int64_t h = h0 + i * step;
    if (MaxRows == 1 || (i < p.v4_zc_rows && h < p.heads)) {
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
// instantiations, rk_params::ds_mla). A token's 656-byte entry takes G + 1 groups, G =
// 2^v4_kv_split_log2 (1, 2 or 4): parts 0 .. G - 1 the 512 nope values and the tile scales (the
// entry's lane L = 32 part + lane has V = 16 / G values [V L, V L + V), tile V L / 128), part G
// the rope units (lanes < v4_units). Without cooperation between threads (kernel.h's rule, which
// the sim relies on), each lane takes its tile's amax itself from the tile's 16 chunks: the
// tile's 128 / V lanes read the same 256 bytes, which L1 serves after the first (global traffic
// unchanged). More groups per entry shorten the per-lane chain of conversions after the amax
// (16 values per lane at G = 1, 4 at G = 4): the decode cases, where one entry's chain is the
// kernel's critical path. Entry stores in pieces of v4_ds_align bytes (16, 8 or 4: the entry
// addresses' alignment, set by the host).
template <int B>  // B bytes (4, 8 or 16) of w at dst, in pieces of at most `align` bytes
ROPEKV_DEVICE void rk_ds_store(char* dst, const uint32_t* w, int32_t align) {
  if (align >= B) {
    rk_store_words(dst, B, w);
  } else if (align == 8) {
    ROPEKV_UNROLL
    for (int i = 0; i < B / 8; ++i) rk_store_words(dst + 8 * i, 8, w + 2 * i);
  } else {
    ROPEKV_UNROLL
    for (int i = 0; i < B / 4; ++i) rk_store_words(dst + 4 * i, 4, w + i);
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
// A lane's V 16-bit kt values (2 V bytes at src: 16-byte aligned for V >= 8, 8-byte for V = 4),
// as words and as floats in order.
template <int V>
ROPEKV_DEVICE void rk_ds_load_own(const char* src, uint32_t* w) {
  ROPEKV_UNROLL
  for (int c = 0; c < (V + 7) / 8; ++c) rk_load_words(src + 16 * c, V >= 8 ? 16 : 2 * V, w + 4 * c);
}
template <int V>
ROPEKV_DEVICE void rk_ds_decode(int32_t kt, const uint32_t* w, float* v) {
  ROPEKV_UNROLL
  for (int i = 0; i < V; ++i) v[i] = rk_decode(kt, (w[i >> 1] >> (16 * (i & 1))) & 0xffffu);
}
// Entry lane L's V nope values (L in [0, 512 / V)): codes and, from the tile's first lane, its scale.
template <class S, int V>
ROPEKV_DEVICE void rk_v4_ds_mla_nope(const rk_params& p, int64_t t, int32_t lane) {
  constexpr int32_t lanes_per_tile = static_cast<int32_t>(rk_ds_tile) / V;
  const int32_t kt = S::q >= 0 ? S::q : p.k_dtype;
  const char* kv_row = p.kv_c + t * p.kv_c_s0 * 2;  // [Dn = 512] 16-bit
  const char* tile = kv_row + (lane / lanes_per_tile) * (rk_ds_tile * 2);
  const int64_t slot = rk_load_index(p.slots, t, p.slots_s0, p.slots_i64);
  uint32_t own[V / 2];
  rk_ds_load_own<V>(kv_row + lane * (2 * V), own);
  const uint32_t inf = kt == rk_bf16 ? 0x7f80u : 0x7c00u;
  const uint32_t m = rk_ds_tile_amax_bits(tile, inf);
  if (slot < 0 || slot >= p.cache.num_slots) return;  // padding (or an unchecked slot)
  const float scale = rk_ds_tile_scale(rk_decode(kt, m), p.ds_pow2);
  float v[V];
  rk_ds_decode<V>(kt, own, v);
  if (p.ds_pow2) {
    // v / 2^k == v * 2^-k for every v (both the exact value rounded once; 2^-k is exact); a NaN
    // input keeps its sign (a GPU multiply would canonicalise it)
    const float inv = rk_pow2_inverse(scale);
    ROPEKV_UNROLL
    for (int i = 0; i < V; ++i) v[i] = v[i] != v[i] ? v[i] : ROPEKV_FMUL_RN(v[i], inv);
  } else {
    const double inv_d = rk_tile_scale_inverse(scale);
    ROPEKV_UNROLL
    for (int i = 0; i < V; ++i) v[i] = rk_div_by_tile_scale(v[i], inv_d);
  }
  if (m == inf) {  // rare: a tile with +-inf (scale inf): each infinity's quotient is rk_ds_quotient's
    // NaN, whatever the platform's inf * 0 gives; the lane's chunks are read again (L1) so that
    // the common path keeps no input word live past its conversion
    rk_ds_load_own<V>(kv_row + lane * (2 * V), own);
    float x[V];
    rk_ds_decode<V>(kt, own, x);
    ROPEKV_UNROLL
    for (int i = 0; i < V; ++i) v[i] = rk_ds_quotient(x[i], v[i]);
  }
  char* entry = p.cache.entry(p.cache.nope, slot);
  uint32_t o[V / 4];
  ROPEKV_UNROLL
  for (int i = 0; i < V / 4; ++i)
    o[i] = rk_encode_fp8x2_sat<rk_e4m3fn>(v[4 * i], v[4 * i + 1]) |
           (rk_encode_fp8x2_sat<rk_e4m3fn>(v[4 * i + 2], v[4 * i + 3]) << 16);
  rk_ds_store<V>(entry + lane * V, o, p.v4_ds_align);
  if (lane % lanes_per_tile == 0) {  // the tile's first lane: its scale (f32, 4-byte aligned by the layout)
    const uint32_t bits = rk_f32_bits(scale);
    rk_store_words(entry + rk_ds_scales_at + (lane / lanes_per_tile) * 4, 4, &bits);
  }
}
template <class S, int D>
ROPEKV_DEVICE void rk_v4_ds_mla_row(const rk_params& p, int64_t t, int32_t part, int32_t lane) {
  const int32_t ks = p.v4_kv_split_log2;  // 0, 1 or 2 (the plan's)
  if (part < (1 << ks)) {  // nope
    if (ks == 0) {
      rk_v4_ds_mla_nope<S, 16>(p, t, lane);
    } else if (ks == 1) {
      rk_v4_ds_mla_nope<S, 8>(p, t, 32 * part + lane);
    } else {
      rk_v4_ds_mla_nope<S, 4>(p, t, 32 * part + lane);
    }
    return;
  }
  // rope: 64 values in kt at byte rk_ds_rope_at, unscaled
  const int32_t kt = S::q >= 0 ? S::q : p.k_dtype;
  const bool neox = S::neox >= 0 ? S::neox != 0 : p.neox != 0;
  const int32_t tt = S::table >= 0 ? S::table : p.table_dtype;
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
  uint32_t o[4];
  rk_pack16x8(kt, ra, o);
  rk_ds_store<16>(rope + lane * 16, o, p.v4_ds_align);
  if (neox) {
    rk_pack16x8(kt, rb, o);
    rk_ds_store<16>(rope + p.dr + lane * 16, o, p.v4_ds_align);
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
// R: the q rows' shape, rk_v4_q_shape (1: a copy-mode row per group, 2: two, 0: zero-copy rows;
// each kernel holds the code of its own shape only, so the zero-copy rows' registers do not
// weigh on the copy-mode kernels).
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
  if constexpr (R == 0) {  // zero-copy: 2^(5 - ql) rows side by side, v4_zc_rows of them per lane
    const int32_t ql = p.v4_q_lanes_log2;
    const int64_t per_pass = int64_t{1} << (5 - ql);
    const int64_t h0 = (r - kv_groups) * per_pass * p.v4_zc_rows + (l32 >> ql);
    if (h0 >= p.heads) return;
    if (p.v4_zc_rows == 1) {
      rk_v4_q_rope_rows<S, D, 1>(p, t, h0, per_pass, l32 & ((1 << ql) - 1), 1 << ql);
    } else {
      rk_v4_q_rope_rows<S, D, rk_v4_zc_rows_max>(p, t, h0, per_pass, l32 & ((1 << ql) - 1), 1 << ql);
    }
  } else if constexpr (R == 2) {  // v4_q_pairs: heads 2 (r - kv_groups) and the next
    rk_v4_q_row_pair<S, D>(p, t, 2 * (r - kv_groups), l32);
  } else {
    if (r - kv_groups >= p.heads) return;
    rk_v4_q_row<S, D>(p, t, r - kv_groups, l32);
  }
}

}  // namespace ropekv_gpu
