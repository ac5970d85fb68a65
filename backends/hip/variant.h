// Kernel-variant overrides for benchmarking and testing: plain C++, no GPU header,
// so tools/ can set them. launch_plan.h reads them when it builds a launch (hip and sim alike).
// Defaults (all zero) = the plan's own choice.
#pragma once
#include <cstdint>
#include <string>

namespace ropekv_gpu {

struct rk_variant_override {
  int32_t force_general = 0;     // 1: never take fast_v4 (the general body for everything)
  int64_t heads_per_block = 0;   // > 0: this many heads per block (the general body)
  int32_t no_zero_copy = 0;      // 1: copy q_nope onto q_out even when it is q_out itself
  int32_t v4_generic = 0;        // 1: fast_v4 runs its generic instantiation (no dtype templates)
  int64_t v4_groups_per_block = 0;  // > 0: fast_v4 32-thread groups per block (<= 8)
  int64_t v4_kv_split = 0;       // > 0: fast_v4 groups per cache entry (1, 2 or 4)
  int32_t no_pdl = 0;            // 1: launch fast_v4 without programmatic dependent launch
  int32_t v4_kv_rope_group = -1;  // >= 0: fast_v4 cache rope units in a group of their own (1) or not
  int32_t v4_q_pairs = -1;        // >= 0: fast_v4 copy-mode q groups hold two rows (1) or one
  int32_t v4_zc_rows = 0;         // > 0: fast_v4 zero-copy q rows per lane (1..4)
  int32_t cache_keep_l2 = -1;     // >= 0: fast cache stores with an L2 evict_last hint (1) or plain (0)
};

// The process-wide override (not thread-safe to change while launches are being planned).
inline rk_variant_override& rk_variant_overrides() {
  static rk_variant_override v;
  return v;
}

}  // namespace ropekv_gpu
