// Host side shared by both builds of the plugin (plugin_gpu.cu for the GPU, plugin_emulated.cpp
// for the host): which cases the kernel covers, and the ABI's tensors turned into the kernel's
// arguments. Plain C++; only ropekv/plugin.h from ropekv.
#pragma once

#include <cstdint>
#include <cstdio>

#include "mla_kernel.cuh"
#include "ropekv/plugin.h"

inline void mla_say(char* buf, size_t size, const char* text) {
  if (size) std::snprintf(buf, size, "%s", text);
}

inline bool mla_is_float_input(int32_t code) {
  return code == ROPEKV_DTYPE_F32 || code == ROPEKV_DTYPE_F16 || code == ROPEKV_DTYPE_BF16;
}

// 1 when the kernel covers the case, else 0 with "not supported: ..." in `why`. `device`: the
// memory this build's kernel reads (ROPEKV_DEVICE_GPU or ROPEKV_DEVICE_HOST); a tensor elsewhere
// would crash it, so it is refused here rather than dereferenced.
inline int mla_supports(const ropekv_plugin_args* a, int32_t device, char* why, size_t why_size) {
  // option codes this kernel knows (a newer ropekv may add codes: refuse them, never guess)
  if ((a->rope_style != ROPEKV_ROPE_GPTJ && a->rope_style != ROPEKV_ROPE_NEOX) ||
      (a->table_kind != ROPEKV_TABLE_ONE && a->table_kind != ROPEKV_TABLE_TWO) ||
      (a->row_order != ROPEKV_ORDER_NOPE_FIRST && a->row_order != ROPEKV_ORDER_ROPE_FIRST) ||
      (a->pad_q != ROPEKV_PAD_Q_COMPUTED && a->pad_q != ROPEKV_PAD_Q_SKIPPED) ||
      (a->pos_oob != ROPEKV_POS_OOB_ERROR && a->pos_oob != ROPEKV_POS_OOB_CLAMP)) {
    mla_say(why, why_size, "not supported: an option code this plugin does not know");
    return 0;
  }
  if (a->cache_layout != ROPEKV_LAYOUT_JOINT && a->cache_layout != ROPEKV_LAYOUT_SPLIT) {
    mla_say(why, why_size, a->cache_layout == ROPEKV_LAYOUT_SHUFFLED ? "not supported: the shuffled cache layout"
                                                                     : "not supported: a cache layout this plugin does not know");
    return 0;
  }
  if (!mla_is_float_input(a->q_nope.dtype) || !mla_is_float_input(a->kv_c.dtype)) {
    mla_say(why, why_size, "not supported: inputs other than f32, f16, bf16");
    return 0;
  }
  if (a->table_kind == ROPEKV_TABLE_ONE ? !mla_is_float_input(a->cos_sin.dtype) : !mla_is_float_input(a->cos.dtype)) {
    mla_say(why, why_size, "not supported: a table other than f32, f16, bf16");
    return 0;
  }
  if (!mla_is_float_input(a->q_out.dtype)) {
    mla_say(why, why_size, "not supported: fp8 q_out");
    return 0;
  }
  const ropekv_tensor& cache = a->cache_layout == ROPEKV_LAYOUT_JOINT ? a->cache : a->ckv_cache;
  if (!mla_is_float_input(cache.dtype)) {
    mla_say(why, why_size, "not supported: fp8 cache");
    return 0;
  }
  // one block per slot-mapped token: the grid's x dimension holds at most 2^31 - 1 blocks
  if (a->slot_mapping.sizes[0] > INT32_MAX) {
    mla_say(why, why_size, "not supported: more than 2^31 - 1 slot-mapped tokens (one block per token)");
    return 0;
  }
  const ropekv_tensor* all[] = {&a->q_nope, &a->q_pe,    &a->kv_c, &a->k_pe, &a->positions,
                                &a->slot_mapping, &a->cos_sin, &a->cos, &a->sin, &a->q_out,
                                &a->cache,  &a->ckv_cache, &a->kpe_cache};
  for (const ropekv_tensor* t : all) {
    if (t->data && t->device != device) {
      mla_say(why, why_size, device == ROPEKV_DEVICE_GPU ? "not supported: host tensors (this plugin runs on the GPU)"
                                                         : "not supported: GPU tensors (this plugin runs on the host)");
      return 0;
    }
  }
  return 1;
}

// The kernel's view of one ABI tensor, `offset` elements in (a column offset).
inline mla_view mla_view_of(const ropekv_tensor& t, int64_t offset) {
  mla_view v{};
  v.data = t.data;
  v.dtype = t.dtype;
  v.offset = offset;
  for (int d = 0; d < 3; ++d) v.stride[d] = d < t.rank ? t.strides[d] : 0;
  return v;
}

// The kernel's arguments for a case that mla_supports admitted.
inline mla_params mla_make_params(const ropekv_plugin_args& a) {
  mla_params p{};
  p.tq = a.q_out.sizes[0];           // q_out [Tq, H, Dn + Dr]
  p.heads = a.q_out.sizes[1];
  p.ts = a.slot_mapping.sizes[0];    // slot_mapping [Ts]
  p.dn = a.q_nope.sizes[2];          // q_nope [Tq, H, Dn]
  p.dr = a.q_pe.sizes[2];            // q_pe [Tq, H, Dr]
  const int64_t half = p.dr / 2;
  const bool joint = a.cache_layout == ROPEKV_LAYOUT_JOINT;
  const bool nope_first = a.row_order == ROPEKV_ORDER_NOPE_FIRST;
  p.block_size = (joint ? a.cache : a.ckv_cache).sizes[1];  // [num_blocks, block_size, ...]
  p.q_nope = mla_view_of(a.q_nope, 0);
  p.q_pe = mla_view_of(a.q_pe, 0);
  p.kv_c = mla_view_of(a.kv_c, 0);
  p.k_pe = mla_view_of(a.k_pe, 0);
  p.positions = mla_view_of(a.positions, 0);
  p.slot_mapping = mla_view_of(a.slot_mapping, 0);
  if (a.table_kind == ROPEKV_TABLE_ONE) {  // cos_sin [P, Dr]: row p = Dr/2 cos, then Dr/2 sin
    p.table_rows = a.cos_sin.sizes[0];
    p.cos = mla_view_of(a.cos_sin, 0);
    p.sin = mla_view_of(a.cos_sin, half);
  } else {  // cos [P, Dr/2] and sin [P, Dr/2], each with its own row stride
    p.table_rows = a.cos.sizes[0];
    p.cos = mla_view_of(a.cos, 0);
    p.sin = mla_view_of(a.sin, 0);
  }
  p.q_out = mla_view_of(a.q_out, 0);
  if (joint) {  // one entry [Dn + Dr]: nope_first = [nope | rope], rope_first = [rope | nope]
    p.nope_cache = mla_view_of(a.cache, nope_first ? 0 : p.dr);
    p.rope_cache = mla_view_of(a.cache, nope_first ? p.dn : 0);
  } else {  // split: ckv_cache [.., Dn] and kpe_cache [.., Dr]
    p.nope_cache = mla_view_of(a.ckv_cache, 0);
    p.rope_cache = mla_view_of(a.kpe_cache, 0);
  }
  p.rope_style = a.rope_style;
  p.pad_q = a.pad_q;
  p.pos_oob = a.pos_oob;
  p.inplace_q = a.inplace_q;
  p.inplace_k = a.inplace_k;
  return p;
}
