// The kernel's paged-cache address arithmetic: rk_paged_part / rk_paged_cache (slot -> entry ->
// feature for every layout, and the cache's stores), the multiply-high division they use
// (rk_div_u32, also fast_v4's group split) and the fp8_ds_mla record offsets. The reference
// addresses the cache independently (core/cache_map.h). Part of kernel.h.
#pragma once
#include <cstdint>

#include "backends/hip/gpu_compat.h"
#include "backends/hip/kernel_dtype.h"

namespace ropekv_gpu {

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

// Layout fp8_ds_mla, the kernel's own constants: bytes of an entry's nope part (512 e4m3fn
// values, 4 tiles of 128), then 4 f32 tile scales, then 64 rope values in k's 16-bit dtype.
constexpr int64_t rk_ds_tile = 128, rk_ds_tiles = 4, rk_ds_scales_at = 512, rk_ds_rope_at = 528;

}  // namespace ropekv_gpu
