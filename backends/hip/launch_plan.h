// Host side of the fused kernel, shared by the hip backend and the sim (so both report the same
// "not supported" reasons and run the same launch shape): op_args -> kernel parameters and grid.
// Host-only code (it knows core/); the kernel body (kernel.h) does not.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "backends/hip/kernel.h"
#include "backends/hip/variant.h"
#include "core/error.h"
#include "core/op.h"

namespace ropekv_gpu {

enum class rk_kernel { fused, fast4 };  // rk_fused_body (the general body), rk_fast4_body (fast_v4)

struct rk_launch {
  rk_params params{};
  rk_kernel kernel = rk_kernel::fused;
  uint32_t grid_x = 0, grid_y = 0;  // tokens, head groups
  uint32_t block_threads = 0;
  bool empty = true;                // nothing to launch (Ts == 0)
  // fast_v4: launch with programmatic dependent launch where the device has it (CUDA sm_90+;
  // the hip backend decides, gpu_compat.h rk_pdl_supported; the kernel waits for its
  // predecessor before its first memory access, so this is correct after any kernel).
  bool pdl = false;
  std::string variant;
};

inline constexpr uint32_t rk_block_threads = 128;      // general path
inline constexpr uint32_t rk_max_block_threads = 256;  // __launch_bounds__ of the kernel
inline constexpr int64_t rk_max_grid_y = 65535;
inline constexpr int64_t rk_max_grid_x = 2147483647;

inline int32_t rk_dtype_of(ropekv::dtype t, const char* arg) {
  switch (t) {
    case ropekv::dtype::f32: return rk_f32;
    case ropekv::dtype::f16: return rk_f16;
    case ropekv::dtype::bf16: return rk_bf16;
    case ropekv::dtype::fp8_e4m3fn: return rk_e4m3fn;
    case ropekv::dtype::fp8_e4m3fnuz: return rk_e4m3fnuz;
    case ropekv::dtype::fp8_e5m2: return rk_e5m2;
    case ropekv::dtype::fp8_e5m2fnuz: return rk_e5m2fnuz;
    default:
      throw ropekv::arg_error(arg, "a float dtype", ropekv::dtype_name(t));
  }
}

// Heads per block: enough work for one block of rk_block_threads threads (about two units per
// thread), so that 1 token x 128 heads still gives many blocks. The performance rounds (docs/perf.md) tune this.
inline int64_t rk_heads_per_block(int64_t heads, int64_t dn, int64_t dr, int vec) {
  const int64_t units_per_head = (dn + vec - 1) / vec + dr / 2;
  int64_t hpb = (2 * static_cast<int64_t>(rk_block_threads)) / (units_per_head > 0 ? units_per_head : 1);
  if (hpb < 1) hpb = 1;
  if (hpb > heads) hpb = heads;
  // keep grid.y within its limit
  if ((heads + hpb - 1) / hpb > rk_max_grid_y) hpb = (heads + rk_max_grid_y - 1) / rk_max_grid_y;
  return hpb;
}

// Decode outputs (core/SPEC.md): the general body (rk_fused_body) and fast_v4 (16-byte rows:
// rk_v4_decode_refusal) write them.
inline bool rk_has_decode_outputs(const rk_params& p) {
  return p.decode_q_pe_out != nullptr || p.q_nope_zeros_out != nullptr || p.k_pe_out != nullptr;
}

inline std::string rk_cos_sin_refusal(const rk_params& p) {
  const int64_t tab4 = 4 * rk_size_bytes(p.table_dtype);
  if (!rk_aligned(p.cos, tab4) || !rk_aligned(p.sin, tab4) || p.cos_s0 % 4 != 0 || p.sin_s0 % 4 != 0)
    return "cos/sin rows not aligned to 4 values";
  return {};
}

// "" when the decode outputs (if any) suit fast_v4's stores (kernel.h rk_v4_zero_row,
// rk_store_q_rope_unit): 16-byte rows, base and outer strides (16-bit dtypes: multiples of 8).
inline std::string rk_v4_decode_refusal(const rk_params& p) {
  if (p.decode_q_pe_out != nullptr &&
      (!rk_aligned(p.decode_q_pe_out, 16) || p.dec_q_pe_s0 % 8 != 0 || p.dec_q_pe_s1 % 8 != 0))
    return "decode_q_pe_out rows not 16-byte aligned";
  if (p.q_nope_zeros_out != nullptr &&
      (!rk_aligned(p.q_nope_zeros_out, 16) || p.zeros_s0 % 8 != 0 || p.zeros_s1 % 8 != 0))
    return "q_nope_zeros_out rows not 16-byte aligned";
  if (p.k_pe_out != nullptr && (!rk_aligned(p.k_pe_out, 16) || p.k_pe_out_s0 % 8 != 0))
    return "k_pe_out rows not 16-byte aligned";
  return {};
}

// "" when fast_v4 (kernel.h rk_fast4_body) may run on these params, else why not. Anything it
// refuses runs the general body (rk_fused_body).
inline std::string rk_v4_refusal(const rk_params& p) {
  const rk_variant_override& ov = rk_variant_overrides();
  if (ov.force_general) return "forced general";
  if (p.kv_heads != 1) return "kv heads > 1";
  if (p.inplace_q || p.inplace_k) return "in-place rope";
  // 16-bit q and q_out of one dtype, kv the same or the other 16-bit dtype
  if (p.q_dtype != rk_bf16 && p.q_dtype != rk_f16) return "q dtype not f16/bf16";
  if (p.q_out_dtype != p.q_dtype) return "q_out dtype differs from q";
  if (p.k_dtype != rk_bf16 && p.k_dtype != rk_f16) return "kv dtype not f16/bf16";
  if (p.cache.dtype != p.k_dtype && !rk_is_fp8(p.cache.dtype)) return "cache dtype neither kv's nor fp8";
  if (p.dn % 8 != 0) return "Dn not a multiple of 8";
  if (p.dr % (p.neox ? 16 : 8) != 0) return "Dr not a multiple of 8 (gptj) / 16 (neox)";
  if (p.dn > (int64_t{1} << 16) || p.dr > (int64_t{1} << 16)) return "row widths beyond 2^16";
  // a table dtype it specialises, and 16-byte q rows: base and both outer strides (2-byte
  // elements: strides multiple of 8)
  if (p.table_dtype != rk_bf16 && p.table_dtype != rk_f16 && p.table_dtype != rk_f32)
    return "table dtype";
  if (!p.skip_q_nope && (!rk_aligned(p.q_nope, 16) || p.q_nope_s0 % 8 != 0 || p.q_nope_s1 % 8 != 0))
    return "q_nope rows not 16-byte aligned";
  if (!rk_aligned(p.q_pe, 16) || p.q_pe_s0 % 8 != 0 || p.q_pe_s1 % 8 != 0)
    return "q_pe rows not 16-byte aligned";
  if (!rk_aligned(p.q_out, 16) || p.q_out_s0 % 8 != 0 || p.q_out_s1 % 8 != 0)
    return "q_out rows not 16-byte aligned";
  if (!rk_aligned(p.kv_c, 16) || p.kv_c_s0 % 8 != 0) return "kv_c rows not 16-byte aligned";
  if (!rk_aligned(p.k_pe, 16) || p.k_pe_s0 % 8 != 0) return "k_pe rows not 16-byte aligned";
  // cache entries: 8 elements = 16 bytes (16-bit) or 8 bytes (fp8), base and both strides
  if (p.ds_mla) {
    // fp8_ds_mla: 656-byte records, stored in pieces of their alignment (rk_v4_ds_mla_row)
    if (p.dn != 512 || p.dr != 64) return "fp8_ds_mla entry not 512 + 64";
    if (p.cache.num_slots > 0 && !rk_aligned(p.cache.entry(p.cache.nope, 0), 4))
      return "fp8_ds_mla entries not 4-byte aligned";
  } else {
    const int64_t c8 = 8 * rk_size_bytes(p.cache.dtype);
    // (and the addresses the kernel's own rk_paged_cache::entry forms: under ROPEKV_MUTATION 1
    // they are misaligned, so fast_v4 is refused and the general path carries the planted bug)
    for (const rk_paged_part* part : {&p.cache.nope, &p.cache.rope})
      if (!rk_aligned(part->base, c8) || part->block_stride_elems % 8 != 0 || part->entry_stride_elems % 8 != 0 ||
          part->tile_stride_elems % 8 != 0 ||
          (p.cache.num_slots > 0 && !rk_aligned(p.cache.entry(*part, 0), c8)))
        return "cache entries not aligned to 8 elements";
  }
  std::string why = rk_cos_sin_refusal(p);
  if (!why.empty()) return why;
  const int64_t units = p.dr / (p.neox ? 16 : 8);
  const int64_t token_chunks = p.heads * ((p.skip_q_nope ? 0 : p.dn / 8) + units) + p.dn / 8 + units;
  if (token_chunks > (int64_t{1} << 30)) return "chunks per token beyond 2^30";
  why = rk_v4_decode_refusal(p);
  if (!why.empty()) return why;
  if (units > 32) return "more than 32 rope units per row";
  if (p.tq * (p.heads + 4) >= (int64_t{1} << 31)) return "Tq x (H + 4) beyond 2^31";
  if (p.ts >= (int64_t{1} << 28)) return "Ts beyond 2^28";
  return {};
}

// The q rows' shape of a fast_v4 launch, its kernels' template parameter R (kernel_fast.h
// rk_fast4_body): 0 zero-copy rows (rk_v4_q_rope_rows), 2 two copy-mode rows per group
// (rk_v4_q_row_pair), 1 one (rk_v4_q_row).
inline int rk_v4_q_shape(const rk_params& p) {
  return p.skip_q_nope ? 0 : p.v4_q_pairs ? 2 : 1;
}

// f(std::integral_constant<int, R>{}) for the q rows' shape R = rk_v4_q_shape(p): the one switch
// by which hip_backend and the sim pick their fast_v4 kernel's R.
template <class F>
decltype(auto) rk_v4_visit_q_shape(const rk_params& p, F&& f) {
  switch (rk_v4_q_shape(p)) {
    case 0: return f(std::integral_constant<int, 0>{});
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    default: throw ropekv::error("rk_v4_visit_q_shape: no q row shape " + std::to_string(rk_v4_q_shape(p)));
  }
}

// Host half of rk_div_u32: the multiplier and shift for a divisor d >= 1.
inline void rk_div_magic(uint32_t d, uint32_t* magic, uint32_t* shift) {
  if (d == 0) throw ropekv::error("rk_div_magic: divisor 0");
  uint32_t s = 0;
  while ((uint64_t{1} << s) < d) ++s;
  *shift = s;
  *magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - d)) / d + 1);
}

// "" when the kernel covers these (already validated) args, else "not supported: <why>".
inline std::string rk_unsupported_reason(const ropekv::op_args& a) {
  const ropekv::op_sizes s = ropekv::sizes_of(a);
  if (s.ts > rk_max_grid_x) return "not supported: Ts > 2^31 - 1 (grid.x limit)";
  if (s.dr / 2 > (int64_t{1} << 40) || s.dn > (int64_t{1} << 40))
    return "not supported: row widths beyond 2^40 elements";
  return {};
}

// fast_v4's compile-time instantiations (kernel.h rk_v4_spec): q (= kv) bf16|f16 x cache {the
// same dtype, e4m3fn, e4m3fnuz, e5m2, e5m2fnuz} x {gptj, neox} x table {q's dtype, f32}: 40.
// Everything else fast_v4 accepts (kv dtype != q dtype, an f16 table with bf16 q, ...) runs the
// generic instantiation rk_v4_generic (dtypes read at run time), as does
// rk_variant_overrides().v4_generic.
// Layout fp8_ds_mla (the cache "dtype" e4m3fn: its nope codes) with decode outputs runs the
// generic one too (fewer instantiations: kernel.h rk_v4_ds_mla_row, D = 3).
inline bool rk_v4_specialised(const rk_params& p) {
  return !rk_variant_overrides().v4_generic && p.k_dtype == p.q_dtype && !(p.ds_mla && rk_has_decode_outputs(p)) &&
         (p.q_dtype == rk_bf16 || p.q_dtype == rk_f16) &&
         (p.cache.dtype == p.q_dtype || rk_is_fp8(p.cache.dtype)) &&
         (p.table_dtype == p.q_dtype || p.table_dtype == rk_f32);
}

template <int32_t Q, int32_t NEOX, int32_t C, class F>
void rk_v4_visit_table(const rk_params& p, F&& f) {
  if (p.table_dtype == Q) return f(rk_v4_spec<Q, C, NEOX, Q>{});
  if (p.table_dtype == rk_f32) return f(rk_v4_spec<Q, C, NEOX, rk_f32>{});
  throw ropekv::error("rk_v4_visit: table dtype " + std::to_string(p.table_dtype) + " not specialised");
}
// Calls f(S{}) once, S = the instantiation for p among those with q dtype Q and style NEOX
// (p specialised, its q dtype Q and style NEOX: rk_v4_visit_q_style decided).
template <int32_t Q, int32_t NEOX, class F>
void rk_v4_visit_cache(const rk_params& p, F&& f) {
  if (p.cache.dtype == Q) return rk_v4_visit_table<Q, NEOX, Q>(p, f);
  switch (p.cache.dtype) {
    case rk_e4m3fn: return rk_v4_visit_table<Q, NEOX, rk_e4m3fn>(p, f);
    case rk_e4m3fnuz: return rk_v4_visit_table<Q, NEOX, rk_e4m3fnuz>(p, f);
    case rk_e5m2: return rk_v4_visit_table<Q, NEOX, rk_e5m2>(p, f);
    case rk_e5m2fnuz: return rk_v4_visit_table<Q, NEOX, rk_e5m2fnuz>(p, f);
    default:
      throw ropekv::error("rk_v4_visit: cache dtype " + std::to_string(p.cache.dtype) + " not specialised");
  }
}
// Calls f(Q, NEOX) once, as std::integral_constant<int32_t, ...> values: the q dtype and style
// of a specialised p (the first two levels of rk_v4_visit; the sim compiles each (Q, NEOX)
// quarter of the instantiations in its own translation unit).
template <class F>
void rk_v4_visit_q_style(const rk_params& p, F&& f) {
  using bf16 = std::integral_constant<int32_t, rk_bf16>;
  using f16 = std::integral_constant<int32_t, rk_f16>;
  using gptj = std::integral_constant<int32_t, 0>;
  using neox = std::integral_constant<int32_t, 1>;
  switch (p.q_dtype) {
    case rk_bf16: return p.neox ? f(bf16{}, neox{}) : f(bf16{}, gptj{});
    case rk_f16: return p.neox ? f(f16{}, neox{}) : f(f16{}, gptj{});
    default:
      throw ropekv::error("rk_v4_visit: q dtype " + std::to_string(p.q_dtype) + " not specialised");
  }
}
// Calls f(S{}) once, S = the fast_v4 instantiation for p (dispatch once, on the host).
template <class F>
void rk_v4_visit(const rk_params& p, F&& f) {
  if (!rk_v4_specialised(p)) return f(rk_v4_generic{});
  rk_v4_visit_q_style(p, [&](auto q, auto neox) {
    rk_v4_visit_cache<decltype(q)::value, decltype(neox)::value>(p, f);
  });
}

inline const char* rk_dtype_short(int32_t t) {
  switch (t) {
    case rk_f32: return "f32";
    case rk_f16: return "f16";
    case rk_bf16: return "bf16";
    case rk_e4m3fn: return "e4m3fn";
    case rk_e4m3fnuz: return "e4m3fnuz";
    case rk_e5m2: return "e5m2";
    case rk_e5m2fnuz: return "e5m2fnuz";
    default: throw ropekv::error("rk_dtype_short: unknown kernel dtype " + std::to_string(t));
  }
}
// "bf16/e4m3fn/gptj/f32" for a specialised fast_v4 launch, "generic" otherwise.
inline std::string rk_v4_spec_name(const rk_params& p) {
  if (!rk_v4_specialised(p)) return "generic";
  return std::string(rk_dtype_short(p.q_dtype)) + "/" + rk_dtype_short(p.cache.dtype) + "/" +
         (p.neox ? "neox" : "gptj") + "/" + rk_dtype_short(p.table_dtype);
}

// Builds the launch for validated args (views may be host or device memory).
inline rk_launch rk_make_launch(const ropekv::op_args& a) {
  using ropekv::dtype;
  const ropekv::op_sizes s = ropekv::sizes_of(a);
  rk_launch l;
  rk_params& p = l.params;
  p.tq = s.tq; p.ts = s.ts; p.tk = s.tk; p.heads = s.heads; p.dn = s.dn; p.dr = s.dr;
  p.table_rows = s.table_rows;
  p.q_dtype = rk_dtype_of(a.q_nope.type, "q_nope");
  p.k_dtype = rk_dtype_of(a.kv_c.type, "kv_c");
  p.q_nope = static_cast<const char*>(a.q_nope.data);
  p.q_nope_s0 = a.q_nope.strides_elems[0]; p.q_nope_s1 = a.q_nope.strides_elems[1];
  p.q_pe = static_cast<char*>(a.q_pe.data);
  p.q_pe_s0 = a.q_pe.strides_elems[0]; p.q_pe_s1 = a.q_pe.strides_elems[1];
  p.kv_c = static_cast<const char*>(a.kv_c.data);
  p.kv_c_s0 = a.kv_c.strides_elems[0];
  p.k_pe = static_cast<char*>(a.k_pe.data);
  p.k_pe_s0 = a.k_pe.strides_elems[0];
  // kv heads: [Tk, KH, D] rows (rank 3) and [num_blocks, KH, block_size, D] caches (rank 4)
  p.kv_heads = s.kv_heads;
  p.kv_c_s1 = a.kv_c.rank == 3 ? a.kv_c.strides_elems[1] : 0;
  p.k_pe_s1 = a.k_pe.rank == 3 ? a.k_pe.strides_elems[1] : 0;
  p.positions = static_cast<const char*>(a.positions.data);
  p.positions_s0 = a.positions.strides_elems[0];
  p.positions_i64 = a.positions.type == dtype::i64;
  p.slots = static_cast<const char*>(a.slot_mapping.data);
  p.slots_s0 = a.slot_mapping.strides_elems[0];
  p.slots_i64 = a.slot_mapping.type == dtype::i64;
  if (a.table() == ropekv::table_kind::one) {
    p.table_dtype = rk_dtype_of(a.cos_sin.type, "cos_sin");
    const int64_t sz = rk_size_bytes(p.table_dtype);
    p.cos = static_cast<const char*>(a.cos_sin.data);
    p.sin = p.cos + (s.dr / 2) * sz;
    p.cos_s0 = p.sin_s0 = a.cos_sin.strides_elems[0];
  } else {
    p.table_dtype = rk_dtype_of(a.cos.type, "cos");
    p.cos = static_cast<const char*>(a.cos.data);
    p.sin = static_cast<const char*>(a.sin.data);
    p.cos_s0 = a.cos.strides_elems[0];
    p.sin_s0 = a.sin.strides_elems[0];
  }
  p.q_out = static_cast<char*>(a.q_out.data);
  p.q_out_s0 = a.q_out.strides_elems[0]; p.q_out_s1 = a.q_out.strides_elems[1];
  p.q_out_dtype = rk_dtype_of(a.q_out.type, "q_out");
  // cache parts
  rk_paged_cache& c = p.cache;
  c.block_size = s.block_size;
  // A rank-4 cache [num_blocks, KH, block_size, D]: entry dimension 2, head dimension 1.
  auto head_stride = [](const ropekv::tensor_view& v) { return v.rank == 4 ? v.strides_elems[1] : int64_t{0}; };
  auto entry_stride = [](const ropekv::tensor_view& v) { return v.strides_elems[v.rank == 4 ? 2 : 1]; };
  c.num_slots = s.num_blocks * s.block_size;
  // rows: feature d at d (kernel.h rk_paged_part)
  c.run_shift = 62;
  c.run_stride_elems = 0;
  c.run_mask = ~int64_t{0};
  c.keep_l2 = 0;
  switch (a.options.layout) {
    case ropekv::cache_layout::joint: {
      c.dtype = rk_dtype_of(a.cache.type, "cache");
      const int64_t sz = rk_size_bytes(c.dtype);
      char* base = static_cast<char*>(a.cache.data);
      const bool nope_first = a.options.order == ropekv::row_order::nope_first;
      const int64_t bst = a.cache.strides_elems[0], est = entry_stride(a.cache), hst = head_stride(a.cache);
      c.nope = {base + (nope_first ? 0 : s.dr) * sz, bst, est, 16 * est, hst};
      c.rope = {base + (nope_first ? s.dn : 0) * sz, bst, est, 16 * est, hst};
      break;
    }
    case ropekv::cache_layout::split: {
      c.dtype = rk_dtype_of(a.ckv_cache.type, "ckv_cache");
      const int64_t nest = entry_stride(a.ckv_cache), rest = entry_stride(a.kpe_cache);
      c.nope = {static_cast<char*>(a.ckv_cache.data), a.ckv_cache.strides_elems[0], nest, 16 * nest,
                head_stride(a.ckv_cache)};
      c.rope = {static_cast<char*>(a.kpe_cache.data), a.kpe_cache.strides_elems[0], rest, 16 * rest,
                head_stride(a.kpe_cache)};
      break;
    }
    case ropekv::cache_layout::fp8_ds_mla: {
      // core/SPEC.md "The fp8_ds_mla layout": u8 entries, addressed as bytes (e4m3fn elements);
      // kernel.h rk_write_ds_mla_entry places the parts inside an entry.
      c.dtype = rk_e4m3fn;
      char* base = static_cast<char*>(a.cache.data);
      const int64_t bst = a.cache.strides_elems[0], est = a.cache.strides_elems[1];
      c.nope = {base, bst, est, 16 * est, 0};
      c.rope = c.nope;
      p.ds_mla = 1;
      p.ds_pow2 = a.options.tile_scale == ropekv::ds_scale::pow2;
      break;
    }
    case ropekv::cache_layout::shuffled: {
      // core/SPEC.md "The shuffled layout": a block = all nope parts, then all rope parts;
      // a part's 16-entry tile = its runs of W features, entry by entry.
      c.dtype = rk_dtype_of(a.cache.type, "cache");
      const int64_t sz = rk_size_bytes(c.dtype), w = 16 / sz;
      char* base = static_cast<char*>(a.cache.data);
      const int64_t bst = a.cache.strides_elems[0];
      const int64_t hst = head_stride(a.cache);  // one (block, head) pair: the tiled run of a block
      c.nope = {base, bst, w, 16 * s.dn, hst};
      c.rope = {base + s.block_size * s.dn * sz, bst, w, 16 * s.dr, hst};
      c.run_shift = 0;
      while ((int64_t{1} << c.run_shift) < w) ++c.run_shift;
      c.run_stride_elems = 16 * w;
      c.run_mask = w - 1;
      // A 16-byte run is half of a 32-byte sector (quarter for f32) whose other half belongs
      // to another, often random, slot: keep the sector in L2 until it arrives
      // (bench/micro/shuffled_stores.cu: 110.4 -> 92.1 us at 8192 x 16, random slots).
      c.keep_l2 = 1;
      break;
    }
    default:
      throw ropekv::error("rk_make_launch: bad cache_layout " + std::to_string(static_cast<int>(a.options.layout)));
  }
  if (rk_variant_overrides().cache_keep_l2 >= 0) c.keep_l2 = rk_variant_overrides().cache_keep_l2;
  p.neox = a.options.style == ropekv::rope_style::neox;
  p.reciprocal = a.options.scale == ropekv::scale_conv::reciprocal;
  p.pad_q_computed = a.options.padding == ropekv::pad_q::computed;
  p.pos_clamp = a.options.positions == ropekv::pos_oob::clamp;
  p.inplace_q = a.options.inplace_q;
  p.inplace_k = a.options.inplace_k;
  p.k_scale = a.k_scale;
  p.q_scale = a.q_scale;
  p.k_inv_scale = 1.0f / a.k_scale;  // fp32(1 / scale), IEEE division, once
  p.q_inv_scale = 1.0f / a.q_scale;
  p.k_mul = p.reciprocal || rk_exact_inverse(a.k_scale);
  p.q_mul = p.reciprocal || rk_exact_inverse(a.q_scale);
  // Scales as tensors: the kernel reads them at run time (rk_k_scale, rk_q_scale); the float
  // fields above are then unused.
  p.k_scale_ptr = a.k_scale_tensor.present() ? static_cast<const float*>(a.k_scale_tensor.data) : nullptr;
  p.q_scale_ptr = a.q_scale_tensor.present() ? static_cast<const float*>(a.q_scale_tensor.data) : nullptr;
  // Decode outputs: absent ones stay nullptr (rk_params is value-initialised).
  if (a.decode_q_pe_out.present()) {
    p.decode_q_pe_out = static_cast<char*>(a.decode_q_pe_out.data);
    p.dec_q_pe_s0 = a.decode_q_pe_out.strides_elems[0];
    p.dec_q_pe_s1 = a.decode_q_pe_out.strides_elems[1];
  }
  if (a.q_nope_zeros_out.present()) {
    p.q_nope_zeros_out = static_cast<char*>(a.q_nope_zeros_out.data);
    p.zeros_s0 = a.q_nope_zeros_out.strides_elems[0];
    p.zeros_s1 = a.q_nope_zeros_out.strides_elems[1];
  }
  if (a.k_pe_out.present()) {
    p.k_pe_out = static_cast<char*>(a.k_pe_out.data);
    p.k_pe_out_s0 = a.k_pe_out.strides_elems[0];
    p.k_pe_out_s1 = a.k_pe_out.rank == 3 ? a.k_pe_out.strides_elems[1] : 0;
  }
  p.num_decode = ropekv::num_decode_tokens(a);
  const rk_variant_override& ov = rk_variant_overrides();
  // Zero-copy concat (core/SPEC.md): q_nope is exactly the first Dn columns of q_out.
  p.skip_q_nope = !ov.no_zero_copy && s.tq > 0 && a.q_nope.data == a.q_out.data &&
                  a.q_nope.type == a.q_out.type &&
                  a.q_nope.strides_elems[0] == a.q_out.strides_elems[0] &&
                  a.q_nope.strides_elems[1] == a.q_out.strides_elems[1];
  l.empty = s.ts == 0;
  // slot -> (block, entry) by multiply-high when every slot fits in 32 bits (kernel.h entry())
  c.slots_u32 = c.num_slots < (int64_t{1} << 32) && c.block_size >= 1;
  if (c.slots_u32) rk_div_magic(static_cast<uint32_t>(c.block_size), &c.bs_magic, &c.bs_shift);
  if (rk_v4_refusal(p).empty()) {
    // fast_v4: one 32-thread group per row (kernel.h rk_fast4_body).
    const int32_t units = static_cast<int32_t>(s.dr / (p.neox ? 16 : 8));
    p.v4_nope_chunks = static_cast<int32_t>(s.dn / 8);
    p.v4_units = units;
    // A cache entry's nope part: one group (two chunks per lane at Dn = 512). (Two or four
    // groups were measured slower at 512 x 16 and 8192 x 16 with an fp8 cache on the H200 once
    // the fp8 codes came two per instruction; docs/perf.md.)
    int32_t kvs = 0;
    if (ov.v4_kv_split > 0) {
      while ((int64_t{1} << (kvs + 1)) <= std::min<int64_t>(ov.v4_kv_split, 4)) ++kvs;
    }
    // fp8 entry: its rope units in a group of their own (their chain of rotation and 8 fp8
    // conversions per lane does not wait behind a nope chunk's conversions)
    p.v4_kv_rope_group = ov.v4_kv_rope_group >= 0 ? (ov.v4_kv_rope_group != 0) : rk_is_fp8(p.cache.dtype);
    if (p.ds_mla) {
      // fp8_ds_mla (kernel.h rk_v4_ds_mla_row): 2^kvs groups for the nope tiles (one unless
      // `kvs=N` asks for more), one for the rope; entry stores as wide as every entry address allows
      p.v4_kv_rope_group = 1;
      const int64_t bst = p.cache.nope.block_stride_elems, est = p.cache.nope.entry_stride_elems;
      p.v4_ds_align = 16;
      while (p.v4_ds_align > 4 && (!rk_aligned(p.cache.nope.base, p.v4_ds_align) || bst % p.v4_ds_align != 0 ||
                                   est % p.v4_ds_align != 0))
        p.v4_ds_align /= 2;
    }
    p.v4_kv_split_log2 = kvs;
    int32_t ql = 5;  // lanes per q row: 32, or with zero-copy the smallest power of two >= units
    if (p.skip_q_nope) {
      ql = 0;
      while ((1 << ql) < units) ++ql;
    }
    p.v4_q_lanes_log2 = ql;
    // Two q rows per group (rk_v4_q_row_pair; copy mode, 2 units <= 32) from 8192 q rows on:
    // the per-row index work and the position -> cos/sin chain paid once per two rows. H200,
    // hot: 128 x 128 8.8 -> 7.5 us, 4096 x 128 316 -> 292 us, 8192 x 16 86 -> 80 us; slower at
    // 4096 rows and fewer (1 x 128 1.74 -> 1.95 us, kimi-k2-tp8 x 512 3.55 -> 3.9 us: half the
    // groups, fewer SMs busy). `qp=0|1` forces it off or on (where it applies).
    const bool pairs_ok = ql == 5 && 2 * units <= 32 && s.heads >= 2;
    p.v4_q_pairs = pairs_ok && (ov.v4_q_pairs >= 0 ? ov.v4_q_pairs == 1 : s.tq * s.heads >= 8192);
    // decode outputs: the kernel instantiations that write them (rk_fast4_kernel<S, R, 1>)
    p.v4_decode = rk_has_decode_outputs(p) ? 1 : 0;
    // Zero-copy: several rows per lane (rk_v4_q_rope_rows), the most (4 gptj, 2 neox: two
    // 16-byte loads per row already) that keep >= 4096 q groups; fewer groups left SMs idle (H100
    // at f03067f: 256 x 128 4.2 us with 2 rows (4096 groups) vs 4.9 with 4 (2048); 1024 x 128 17.7
    // vs 22 us with 4 rows vs 1; deepseek-v3-tp8 x 1024 3.5 us with 1 row vs 4.1 with 4).
    // `zcr=N` forces N (1..4, where zero-copy applies).
    p.v4_zc_rows = 1;
    if (p.skip_q_nope) {
      const int64_t per_pass = int64_t{1} << (5 - ql);
      int32_t rows = p.neox ? 2 : rk_v4_zc_rows_max;
      while (rows > 1 && s.tq * ((s.heads + per_pass * rows - 1) / (per_pass * rows)) < 4096) rows /= 2;
      p.v4_zc_rows = ov.v4_zc_rows > 0 ? std::min<int32_t>(ov.v4_zc_rows, rk_v4_zc_rows_max) : rows;
    }
    const int64_t rows_per_group = p.v4_q_pairs ? 2 : (int64_t{1} << (5 - ql)) * p.v4_zc_rows;
    p.v4_q_groups_per_token = static_cast<int32_t>((s.heads + rows_per_group - 1) / rows_per_group);
    const int64_t kv_groups = (int64_t{1} << kvs) + p.v4_kv_rope_group;
    const int64_t groups_per_token = p.v4_q_groups_per_token + kv_groups;
    p.v4_q_token_groups = s.tq * groups_per_token;
    rk_div_magic(static_cast<uint32_t>(groups_per_token), &p.v4_gpt_magic, &p.v4_gpt_shift);
    const int64_t groups = p.v4_q_token_groups + (s.ts - s.tq) * kv_groups;
    // Groups per block: 4 (128 threads; H200 measurements at 0b77660+1: 2-4 beat 8 at the
    // decode sizes, docs/perf.md) when there are enough groups for 132 SMs, 2 for small
    // problems so that they spread over more SMs (1 x 128: 130 groups, 65 blocks; 2 per block
    // measured 0.03-0.06 us faster than 1 there in three H200 runs).
    // One-row groups from 2 x 132 x 8 groups on (32 x 128, kimi-k2-tp8 x 512: 4160-5120
    // groups): 8 per block, 1.5% faster than 4 there in three H200 runs (3.39-3.41 vs
    // 3.42-3.47 us at 32 x 128); with two-row groups 8 was slower (8192 x 16: 84 vs 80 us).
    int64_t wpb = !p.v4_q_pairs && groups >= 2 * 132 * 8 ? 8 : 4;
    while (wpb > 2 && groups / wpb < 132) wpb /= 2;
    if (ov.v4_groups_per_block > 0) wpb = std::min<int64_t>(ov.v4_groups_per_block, rk_max_block_threads / 32);
    while (wpb < 8 && (groups + wpb - 1) / wpb > rk_max_grid_x) wpb *= 2;
    l.kernel = rk_kernel::fast4;
    l.pdl = !ov.no_pdl;
    l.block_threads = static_cast<uint32_t>(32 * wpb);
    l.grid_x = static_cast<uint32_t>(std::max<int64_t>((groups + wpb - 1) / wpb, 1));
    l.grid_y = 1;
    l.variant = "fast_v4(wpb" + std::to_string(wpb) + ",kvs" + std::to_string(1 << kvs) +
                (p.v4_kv_rope_group ? "+r" : "") + (p.v4_q_pairs ? "+qp" : "") + "," + rk_v4_spec_name(p) + ")";
    if (p.skip_q_nope) l.variant += "+zero_copy" + (p.v4_zc_rows > 1 ? "(rows" + std::to_string(p.v4_zc_rows) + ")" : std::string());
    if (rk_has_decode_outputs(p)) l.variant += "+decode";
    if (p.ds_mla) l.variant += "+ds_mla(st" + std::to_string(p.v4_ds_align) + ")";
    return l;
  }
  // the general body (rk_fused_body, rk_general_q): everything fast_v4 refuses
  const int vec = rk_vec_elems(p.q_dtype, p.q_out_dtype);
  l.grid_x = static_cast<uint32_t>(s.ts);
  p.heads_per_block = rk_heads_per_block(s.heads, s.dn, s.dr, vec);
  if (ov.heads_per_block > 0) p.heads_per_block = ov.heads_per_block < s.heads ? ov.heads_per_block : s.heads;
  if ((s.heads + p.heads_per_block - 1) / p.heads_per_block > rk_max_grid_y)
    p.heads_per_block = (s.heads + rk_max_grid_y - 1) / rk_max_grid_y;
  l.block_threads = rk_block_threads;
  l.variant = "fused_v1(vec" + std::to_string(vec) + ",hpb" + std::to_string(p.heads_per_block) +
              ",threads" + std::to_string(rk_block_threads) + ")";
  if (p.skip_q_nope) l.variant += "+zero_copy";
  if (rk_has_decode_outputs(p)) l.variant += "+decode";
  if (p.ds_mla) l.variant += "+ds_mla";
  l.grid_y = static_cast<uint32_t>((s.heads + p.heads_per_block - 1) / p.heads_per_block);
  return l;
}

}  // namespace ropekv_gpu
