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
  int64_t dn = 0, dr = 0;
  // Strides in elements of the cache dtype: [block, entry] of the nope tensor and of the rope
  // tensor (for joint both are the cache's strides).
  int64_t nope_block_stride = 0, nope_entry_stride = 0;
  int64_t rope_block_stride = 0, rope_entry_stride = 0;
  // Offset of feature 0 of the part inside its row (joint: depends on the order; split: 0;
  // shuffled: the rope part starts block_size * dn elements into its block).
  int64_t nope_feature0 = 0, rope_feature0 = 0;
  // Layout shuffled (core/SPEC.md): features come in runs of run_elems, tokens in tiles of
  // shuffled_tile_tokens; 0 for the row layouts (a part's features are contiguous).
  int64_t run_elems = 0;

  // Builds the map from the args' cache views (layout per args.options.layout). The shapes
  // must be valid (validate() first); the strides are read from the views.
  static paged_cache_map from_args(const op_args& args) {
    paged_cache_map m;
    m.layout = args.options.layout;
    m.order = args.options.order;
    m.dr = args.q_pe.rank == 3 ? args.q_pe.shape[2] : 0;
    if (m.layout == cache_layout::fp8_ds_mla) {
      // u8 entries: nope bytes at [0, 512), rope at byte ds_mla_rope_offset_bytes (16-bit
      // values: use entry_offset_bytes, not rope_offset_elems, for them)
      const tensor_view& c = args.cache;
      m.num_blocks = c.shape[0];
      m.block_size = c.shape[1];
      m.dn = ds_mla_dn;
      m.nope_block_stride = m.rope_block_stride = c.strides_elems[0];
      m.nope_entry_stride = m.rope_entry_stride = c.strides_elems[1];
      m.nope_feature0 = 0;
      m.rope_feature0 = ds_mla_rope_offset_bytes;
    } else if (m.layout == cache_layout::shuffled) {
      const tensor_view& c = args.cache;
      m.num_blocks = c.shape[0];
      m.block_size = c.shape[1];
      m.dn = c.shape[2] - m.dr;
      m.nope_block_stride = m.rope_block_stride = c.strides_elems[0];
      m.run_elems = shuffled_run_elems(static_cast<int64_t>(dtype_size_bytes(c.type)));
      m.nope_feature0 = 0;
      m.rope_feature0 = m.block_size * m.dn;
    } else if (m.layout == cache_layout::joint) {
      const tensor_view& c = args.cache;
      m.num_blocks = c.shape[0];
      m.block_size = c.shape[1];
      m.dn = c.shape[2] - m.dr;
      m.nope_block_stride = m.rope_block_stride = c.strides_elems[0];
      m.nope_entry_stride = m.rope_entry_stride = c.strides_elems[1];
      if (m.order == row_order::nope_first) {
        m.nope_feature0 = 0;
        m.rope_feature0 = m.dn;
      } else {
        m.rope_feature0 = 0;
        m.nope_feature0 = m.dr;
      }
    } else {
      const tensor_view& n = args.ckv_cache;
      const tensor_view& r = args.kpe_cache;
      m.num_blocks = n.shape[0];
      m.block_size = n.shape[1];
      m.dn = n.shape[2];
      m.nope_block_stride = n.strides_elems[0];
      m.nope_entry_stride = n.strides_elems[1];
      m.rope_block_stride = r.strides_elems[0];
      m.rope_entry_stride = r.strides_elems[1];
    }
    return m;
  }

  int64_t capacity_slots() const { return num_blocks * block_size; }

  // Layout fp8_ds_mla: byte offset of slot s's 656-byte entry (nope byte d at + d, tile k's
  // scale at + ds_mla_scales_offset_bytes + 4 k, rope value d at + ds_mla_rope_offset_bytes + 2 d).
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
  // d of slot s's nope part (d < dn) and rope part (d < dr). s in [0, capacity_slots()).
  int64_t nope_offset_elems(int64_t slot, int64_t d) const {
    return part_offset(slot, d, nope_block_stride, nope_entry_stride, nope_feature0, dn);
  }
  int64_t rope_offset_elems(int64_t slot, int64_t d) const {
    return part_offset(slot, d, rope_block_stride, rope_entry_stride, rope_feature0, dr);
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
