// Host-side cache address arithmetic of core/SPEC.md, in one place: where slot s, feature d of
// the nope part and of the rope part live, for both layouts and both row orders. Used by the
// reference (backends/cpu) and by the comparison code. The GPU kernels (backends/hip) carry
// their own arithmetic: the two are checked against each other and must not share code.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "core/op.h"

namespace ropekv {

struct paged_cache_map {
  // Which tensor of op_args a part lives in.
  enum class part_tensor : uint8_t { cache, ckv_cache, kpe_cache };

  cache_layout layout = cache_layout::joint;
  row_order order = row_order::nope_first;
  int64_t num_blocks = 0, block_size = 1;
  int64_t kv_heads = 1;  // KH: the cache's head dimension (rank 4), else 1
  int64_t dn = 0, dr = 0;
  // Strides in elements of the cache dtype: [block, head, entry] of the nope tensor and of the
  // rope tensor (for joint both are the cache's strides; head stride 0 for a rank-3 cache).
  int64_t nope_block_stride = 0, nope_head_stride = 0, nope_entry_stride = 0;
  int64_t rope_block_stride = 0, rope_head_stride = 0, rope_entry_stride = 0;
  // Offset of feature 0 of the part inside its row (joint: depends on the order; split: 0;
  // shuffled: the rope part starts block_size * dn elements into its (block, head) run).
  int64_t nope_feature0 = 0, rope_feature0 = 0;
  // Layout shuffled (core/SPEC.md): features come in runs of run_elems, tokens in tiles of
  // shuffled_tile_tokens; 0 for the row layouts (a part's features are contiguous).
  int64_t run_elems = 0;

  // Builds the map from the args' cache views (layout per args.options.layout). The shapes
  // must be valid (validate() first); the strides are read from the views. A cache of rank 4 is
  // [num_blocks, KH, block_size, D]; rank 3 is [num_blocks, block_size, D] (KH = 1).
  static paged_cache_map from_args(const op_args& args) {
    paged_cache_map m;
    m.layout = args.options.layout;
    m.order = args.options.order;
    m.dr = args.q_pe.rank == 3 ? args.q_pe.shape[2] : 0;
    const tensor_view& c = single_cache_tensor(m.layout) ? args.cache : args.ckv_cache;
    const int e = cache_entry_dim(c);  // the entry dimension: 1 (rank 3) or 2 (rank 4)
    m.num_blocks = c.shape[0];
    m.block_size = c.shape[e];
    m.kv_heads = c.rank == 4 ? c.shape[1] : 1;
    const int64_t width = c.shape[e + 1];
    if (m.layout == cache_layout::fp8_ds_mla) {
      // u8 entries: nope bytes at [0, 512), rope at byte ds_mla_rope_offset_bytes (16-bit
      // values: use entry_offset_bytes, not rope_offset_elems, for them)
      m.dn = ds_mla_dn;
      m.nope_block_stride = m.rope_block_stride = c.strides_elems[0];
      m.nope_head_stride = m.rope_head_stride = cache_head_stride(c);
      m.nope_entry_stride = m.rope_entry_stride = c.strides_elems[e];
      m.nope_feature0 = 0;
      m.rope_feature0 = ds_mla_rope_offset_bytes;
    } else if (m.layout == cache_layout::shuffled) {
      m.dn = width - m.dr;
      m.nope_block_stride = m.rope_block_stride = c.strides_elems[0];
      m.nope_head_stride = m.rope_head_stride = cache_head_stride(c);
      m.run_elems = shuffled_run_elems(static_cast<int64_t>(dtype_size_bytes(c.type)));
      m.nope_feature0 = 0;
      m.rope_feature0 = m.block_size * m.dn;
    } else if (m.layout == cache_layout::joint) {
      m.dn = width - m.dr;
      m.nope_block_stride = m.rope_block_stride = c.strides_elems[0];
      m.nope_head_stride = m.rope_head_stride = cache_head_stride(c);
      m.nope_entry_stride = m.rope_entry_stride = c.strides_elems[e];
      if (m.order == row_order::nope_first) {
        m.nope_feature0 = 0;
        m.rope_feature0 = m.dn;
      } else {
        m.rope_feature0 = 0;
        m.nope_feature0 = m.dr;
      }
    } else {
      const tensor_view& r = args.kpe_cache;
      m.dn = width;
      m.nope_block_stride = c.strides_elems[0];
      m.nope_head_stride = cache_head_stride(c);
      m.nope_entry_stride = c.strides_elems[e];
      m.rope_block_stride = r.strides_elems[0];
      m.rope_head_stride = cache_head_stride(r);
      m.rope_entry_stride = r.strides_elems[cache_entry_dim(r)];
    }
    return m;
  }

  int64_t capacity_slots() const { return num_blocks * block_size; }

  // Layout fp8_ds_mla (KH = 1): byte offset of slot s's 656-byte entry (nope byte d at + d, tile
  // k's scale at + ds_mla_scales_offset_bytes + 4 k, rope value d at + ds_mla_rope_offset_bytes + 2 d).
  int64_t entry_offset_bytes(int64_t slot) const {
    return (slot / block_size) * nope_block_stride + (slot % block_size) * nope_entry_stride;
  }

  part_tensor nope_tensor() const {
    return single_cache_tensor(layout) ? part_tensor::cache : part_tensor::ckv_cache;
  }
  part_tensor rope_tensor() const {
    return single_cache_tensor(layout) ? part_tensor::cache : part_tensor::kpe_cache;
  }

  // Element offsets (relative to the data pointer of nope_tensor() / rope_tensor()) of feature
  // d of slot s's nope part (d < dn) and rope part (d < dr), kv head `head` (< kv_heads).
  // s in [0, capacity_slots()).
  int64_t nope_offset_elems(int64_t slot, int64_t head, int64_t d) const {
    return part_offset(slot, d, nope_block_stride, nope_entry_stride, nope_feature0, dn) +
           head * nope_head_stride;
  }
  int64_t rope_offset_elems(int64_t slot, int64_t head, int64_t d) const {
    return part_offset(slot, d, rope_block_stride, rope_entry_stride, rope_feature0, dr) + head * rope_head_stride;
  }

 private:
  int64_t part_offset(int64_t slot, int64_t d, int64_t block_stride, int64_t entry_stride,
                      int64_t feature0, int64_t width) const {
    const int64_t block = slot / block_size, entry = slot % block_size;
    if (run_elems == 0) return block * block_stride + entry * entry_stride + feature0 + d;
    const int64_t tile = shuffled_tile_tokens;
    return block * block_stride + feature0 + (entry / tile) * tile * width +
           (d / run_elems) * tile * run_elems + (entry % tile) * run_elems + d % run_elems;
  }
};

// The call restricted to kv head k (k < KH): kv_c, k_pe and k_pe_out as their [Tk, D] views of
// head k, the caches as their [num_blocks, block_size, D] views of head k; everything else as
// given. With KH = 1 (rank-2 rows, rank-3 caches) it is `a` itself. The comparison walks heads
// through it; the reference addresses heads through paged_cache_map above.
inline tensor_view drop_dim(const tensor_view& v, int dim, int64_t index) {
  tensor_view r = v;
  if (!v.present()) return r;
  r.data = static_cast<uint8_t*>(v.data) +
           index * v.strides_elems[dim] * static_cast<int64_t>(dtype_size_bytes(v.type));
  for (int d = dim; d + 1 < v.rank; ++d) {
    r.shape[d] = v.shape[d + 1];
    r.strides_elems[d] = v.strides_elems[d + 1];
  }
  r.rank = v.rank - 1;
  r.shape[r.rank] = 0;
  r.strides_elems[r.rank] = 0;
  return r;
}
inline op_args kv_head_args(const op_args& a, int64_t k) {
  op_args h = a;
  for (tensor_view* v : {&h.kv_c, &h.k_pe, &h.k_pe_out})
    if (v->present() && v->rank == 3) *v = drop_dim(*v, 1, k);
  for (tensor_view* v : {&h.cache, &h.ckv_cache, &h.kpe_cache})
    if (v->present() && v->rank == 4) *v = drop_dim(*v, 1, k);
  return h;
}

// The view a part lives in.
inline const tensor_view& cache_part_view(const op_args& args,
                                          paged_cache_map::part_tensor which) {
  switch (which) {
    case paged_cache_map::part_tensor::cache: return args.cache;
    case paged_cache_map::part_tensor::ckv_cache: return args.ckv_cache;
    case paged_cache_map::part_tensor::kpe_cache: return args.kpe_cache;
  }
  throw error("cache_part_view: bad part_tensor " + std::to_string(static_cast<int>(which)));
}

}  // namespace ropekv
