// A user's CUDA kernel for the fused MLA op as a ropekv GPU plugin: ropekv hands it device
// pointers and its cudaStream_t; the kernel is queued on that stream and ropekv synchronises.
// The per-thread body is mla_kernel.cuh (shared with the host emulation, plugin_emulated.cpp);
// this file is the __global__ wrapper, the launch, and the ABI entry points.
#include <cuda_runtime.h>

#include <cstdio>

#include "mla_kernel.cuh"
#include "plugin_common.h"
#include "ropekv/plugin.h"

namespace {

// grid: Ts blocks (block t = token t); block: mla_block_dim threads striding over the token's work
__global__ void __launch_bounds__(mla_block_dim) mla_kernel(const mla_params p) {
  mla_token_thread(blockIdx.x, threadIdx.x, blockDim.x, p);
}

}  // namespace

ROPEKV_PLUGIN_EXPORT int ropekv_plugin_abi_version(void) { return ROPEKV_PLUGIN_ABI_VERSION; }

ROPEKV_PLUGIN_EXPORT int ropekv_plugin_device(void) { return ROPEKV_DEVICE_GPU; }

ROPEKV_PLUGIN_EXPORT int ropekv_plugin_supports(const ropekv_plugin_args* a, char* why, size_t why_size) {
  return mla_supports(a, ROPEKV_DEVICE_GPU, why, why_size);
}

// `stream`: the caller's cudaStream_t (NULL: the legacy default stream). Values (positions,
// slots) live on the device and are not read here: see mla_position for an out-of-range position.
ROPEKV_PLUGIN_EXPORT int ropekv_plugin_run(const ropekv_plugin_args* a, void* stream, char* msg, size_t msg_size) {
  if (!mla_supports(a, ROPEKV_DEVICE_GPU, msg, msg_size)) return ROPEKV_PLUGIN_UNSUPPORTED;
  const mla_params p = mla_make_params(*a);
  if (p.ts == 0) return ROPEKV_PLUGIN_OK;  // Ts = 0 (so Tq = 0): nothing to write; an empty grid is a launch error
  mla_kernel<<<dim3(static_cast<unsigned>(p.ts)), dim3(mla_block_dim), 0, static_cast<cudaStream_t>(stream)>>>(p);
  const cudaError_t err = cudaGetLastError();  // launch errors only; ropekv's synchronise reports faults
  if (err != cudaSuccess) {
    if (msg_size) std::snprintf(msg, msg_size, "mla_kernel launch: %s", cudaGetErrorString(err));
    return ROPEKV_PLUGIN_ERROR;
  }
  return ROPEKV_PLUGIN_OK;
}
