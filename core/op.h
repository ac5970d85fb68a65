// The op's arguments and options, as core/SPEC.md defines them. Backend-agnostic.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "core/tensor.h"

namespace ropekv {

inline constexpr int contract_version = 1;

// Each option enum lists its names once; to_string / parse_enum derive from the list.
#define ROPEKV_ENUM(type_name, ...)                                              \
  enum class type_name : uint8_t { __VA_ARGS__ };                               \
  template <>                                                                    \
  struct enum_names<type_name> {                                                 \
    static constexpr std::string_view list = #__VA_ARGS__;                       \
  };

template <typename E>
struct enum_names;

ROPEKV_ENUM(rope_style, gptj, neox)
ROPEKV_ENUM(table_kind, one, two)                 // one [P, Dr] cos|sin table, or cos and sin [P, Dr/2]
// shuffled: AITER's 16-token tiles; fp8_ds_mla: vLLM's DeepSeek V3.2 sparse-attention entries
// (u8 cache, 656 bytes per entry: fp8 nope tiles, their f32 scales, 16-bit rope; core/SPEC.md)
ROPEKV_ENUM(cache_layout, joint, split, shuffled, fp8_ds_mla)
ROPEKV_ENUM(row_order, nope_first, rope_first)    // joint layout only (shuffled: nope first)
ROPEKV_ENUM(scale_conv, divide, reciprocal)
ROPEKV_ENUM(pad_q, computed, skipped)
ROPEKV_ENUM(pos_oob, error, clamp)
ROPEKV_ENUM(ds_scale, amax, pow2)                 // layout fp8_ds_mla: a tile's scale (core/SPEC.md)

// Name of enum value v (e.g. "gptj").
template <typename E>
std::string_view to_string(E v);
// Parses a name; throws arg_error naming `arg_name` and listing the valid names.
template <typename E>
E parse_enum(std::string_view text, const char* arg_name);

struct op_options {
  rope_style style = rope_style::gptj;
  cache_layout layout = cache_layout::joint;
  row_order order = row_order::nope_first;
  scale_conv scale = scale_conv::divide;
  pad_q padding = pad_q::computed;
  pos_oob positions = pos_oob::error;
  ds_scale tile_scale = ds_scale::amax;  // read by layout fp8_ds_mla only
  bool inplace_q = false;  // write rope(q_pe) back into q_pe
  bool inplace_k = false;  // write rope(k_pe) back into k_pe
};

// Every tensor of one call. Optional tensors are empty views (tensor_view::present() false).
// All views are in one memory space (all host or all device).
struct op_args {
  tensor_view q_nope;        // [Tq, H, Dn]        f32|f16|bf16
  tensor_view q_pe;          // [Tq, H, Dr]        same dtype as q_nope
  tensor_view kv_c;          // [Tk, Dn] or [Tk, KH, Dn]  f32|f16|bf16 (rank 2: KH = 1)
  tensor_view k_pe;          // [Tk, Dr] or [Tk, KH, Dr]  same dtype and rank as kv_c
  tensor_view positions;     // [Tk]               i32|i64
  tensor_view slot_mapping;  // [Ts]               i32|i64
  tensor_view cos_sin;       // [P, Dr]            table one: Dr/2 cos then Dr/2 sin
  tensor_view cos;           // [P, Dr/2]          table two
  tensor_view sin;           // [P, Dr/2]          table two
  tensor_view q_out;         // [Tq, H, Dn + Dr]   f32|f16|bf16|fp8*
  // Caches: rank 3 [num_blocks, block_size, D] (KH = 1), or rank 4 [num_blocks, KH, block_size, D]
  // (AITER's order; block, head and entry strides free, so vLLM's [nb, bs, KH, D] is a view).
  tensor_view cache;         // [num_blocks, (KH,) block_size, Dn + Dr]  layout joint or shuffled
                             // [num_blocks, block_size, 656] u8    layout fp8_ds_mla (KH = 1 only)
  tensor_view ckv_cache;     // [num_blocks, (KH,) block_size, Dn]       layout split
  tensor_view kpe_cache;     // [num_blocks, (KH,) block_size, Dr]       layout split
  tensor_view k_scale_tensor;  // [1]             f32, optional: k_scale read at run time (core/SPEC.md)
  tensor_view q_scale_tensor;  // [1]             f32, optional: q_scale read at run time
  // Decode outputs (core/SPEC.md "Decode outputs"), each optional; N = num_decode_toks <= Tq
  tensor_view decode_q_pe_out;   // [N, H, Dr]     q_pe's dtype: rope(q_pe) of rows t < N, unscaled
  tensor_view k_pe_out;          // [Tk, (KH,) Dr] k_pe's dtype and rank: rope(k_pe) of rows with a slot >= 0
  tensor_view q_nope_zeros_out;  // [N, H, Dn]     q_nope's dtype: zeros in rows t < N
  float k_scale = 1.0f;        // read only when k_scale_tensor is absent
  float q_scale = 1.0f;        // read only when q_scale_tensor is absent
  op_options options;

  table_kind table() const { return cos_sin.present() ? table_kind::one : table_kind::two; }
};

// Every tensor of a call by its name in golden files and the Python package (q_nope, q_pe, kv_c,
// k_pe, positions, slot_mapping, cos_sin, cos, sin, q_out, cache, ckv_cache, kpe_cache, k_scale,
// q_scale, decode_q_pe_out, k_pe_out, q_nope_zeros_out), in that order; absent ones included
// (tensor_view::present() false).
inline constexpr int op_tensor_count = 18;
std::array<std::pair<const char*, const tensor_view*>, op_tensor_count> named_tensors(const op_args& a);

// Sizes read off the views (after validation they are consistent).
struct op_sizes {
  int64_t tq, ts, tk, heads, dn, dr, table_rows, num_blocks, block_size;
  int64_t kv_heads;  // KH: kv_c.shape[1] when kv_c has rank 3, else 1
};
op_sizes sizes_of(const op_args& args);

// kv heads (core/SPEC.md): kv_c, k_pe and k_pe_out are [Tk, D] (KH = 1) or [Tk, KH, D]; the
// caches [num_blocks, block_size, D] (KH = 1) or [num_blocks, KH, block_size, D]. Views of either
// rank read through these: the head dimension's stride (0 without one) and the entry dimension.
inline int64_t kv_head_count(const tensor_view& kv_c) {
  return kv_c.present() && kv_c.rank == 3 ? kv_c.shape[1] : 1;
}
inline int64_t k_row_head_stride(const tensor_view& v) { return v.rank == 3 ? v.strides_elems[1] : 0; }
inline int cache_entry_dim(const tensor_view& c) { return c.rank == 4 ? 2 : 1; }
inline int64_t cache_head_stride(const tensor_view& c) { return c.rank == 4 ? c.strides_elems[1] : 0; }

// The scale a host-side computation uses: the tensor's value when the scale is a tensor (then it
// must be in host memory: arg_error naming it otherwise), else the float.
float k_scale_of(const op_args& args);
float q_scale_of(const op_args& args);

// N of the decode outputs: rows of decode_q_pe_out, else of q_nope_zeros_out; 0 when neither
// is given (validate checks that both agree and that N <= Tq).
inline int64_t num_decode_tokens(const op_args& a) {
  if (a.decode_q_pe_out.present() && a.decode_q_pe_out.rank > 0) return a.decode_q_pe_out.shape[0];
  if (a.q_nope_zeros_out.present() && a.q_nope_zeros_out.rank > 0) return a.q_nope_zeros_out.shape[0];
  return 0;
}
inline bool has_decode_outputs(const op_args& a) {
  return a.decode_q_pe_out.present() || a.k_pe_out.present() || a.q_nope_zeros_out.present();
}

// Whether the layout keeps both parts in the one tensor `cache` (joint, shuffled) rather than
// in ckv_cache and kpe_cache (split).
inline bool single_cache_tensor(cache_layout l) { return l != cache_layout::split; }

// Layout shuffled: elements per contiguous run of one entry's features (16 bytes of the cache
// dtype: 4 for f32, 8 for f16/bf16, 16 for fp8) and tokens per tile.
inline constexpr int64_t shuffled_tile_tokens = 16;
inline int64_t shuffled_run_elems(int64_t elem_bytes) { return 16 / elem_bytes; }

// Layout fp8_ds_mla (core/SPEC.md "The fp8_ds_mla layout"): one cache entry is 656 bytes (u8
// elements): Dn = 512 fp8_e4m3fn values in 4 tiles of 128, then the 4 tiles' f32 scales, then
// Dr = 64 rope values in the input dtype (16-bit). Host-side constants (the reference and the
// comparison); the GPU kernel keeps its own.
inline constexpr int64_t ds_mla_dn = 512, ds_mla_dr = 64;
inline constexpr int64_t ds_mla_tile_elems = 128;                            // nope values per scale
inline constexpr int64_t ds_mla_tiles = ds_mla_dn / ds_mla_tile_elems;       // 4
inline constexpr int64_t ds_mla_scales_offset_bytes = ds_mla_dn;             // 512
inline constexpr int64_t ds_mla_rope_offset_bytes = ds_mla_dn + 4 * ds_mla_tiles;  // 528
inline constexpr int64_t ds_mla_entry_bytes = ds_mla_rope_offset_bytes + 2 * ds_mla_dr;  // 656
inline constexpr double ds_mla_fp8_max = 448.0;  // e4m3fn's largest finite value
// Elements of one cache row of a single-tensor layout: Dn + Dr, or 656 bytes for fp8_ds_mla.
inline int64_t cache_row_elems(cache_layout l, int64_t dn, int64_t dr) {
  return l == cache_layout::fp8_ds_mla ? ds_mla_entry_bytes : dn + dr;
}

}  // namespace ropekv
