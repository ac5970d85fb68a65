// The CUDA kernel of plugin_gpu.cu built with g++ as a HOST plugin, for machines without a GPU
// (CI): the same per-thread body (mla_kernel.cuh) run in loops over the grid's blocks and each
// block's threads, in host memory. The kernel has no barrier and no thread reads what another
// writes (mla_kernel.cuh), so running the threads one after the other computes exactly what the
// GPU computes: fuzzing this library fuzzes the kernel's arithmetic, indexing and coverage.
#include <cstdint>

#include "mla_kernel.cuh"
#include "plugin_common.h"
#include "ropekv/plugin.h"

ROPEKV_PLUGIN_EXPORT int ropekv_plugin_abi_version(void) { return ROPEKV_PLUGIN_ABI_VERSION; }

ROPEKV_PLUGIN_EXPORT int ropekv_plugin_device(void) { return ROPEKV_DEVICE_HOST; }

ROPEKV_PLUGIN_EXPORT int ropekv_plugin_supports(const ropekv_plugin_args* a, char* why, size_t why_size) {
  return mla_supports(a, ROPEKV_DEVICE_HOST, why, why_size);
}

ROPEKV_PLUGIN_EXPORT int ropekv_plugin_run(const ropekv_plugin_args* a, void* stream, char* msg, size_t msg_size) {
  if (!mla_supports(a, ROPEKV_DEVICE_HOST, msg, msg_size)) return ROPEKV_PLUGIN_UNSUPPORTED;
  const mla_params p = mla_make_params(*a);
  // the launch mla_kernel<<<Ts, mla_block_dim>>>(p), one thread at a time
  for (int64_t block = 0; block < p.ts; ++block) {
    for (int64_t thread = 0; thread < mla_block_dim; ++thread) mla_token_thread(block, thread, mla_block_dim, p);
  }
  return ROPEKV_PLUGIN_OK;
}
