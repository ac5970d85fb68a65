// Device-only compile check of the kernel bodies (no runtime, no host code): the gfx942 target,
// built with clang-19 and the gfx942 shim (backends/hip/gfx942_shim, see docs/gpu.md).
#include "backends/hip/kernel.h"

namespace ropekv_gpu {
__global__ void __launch_bounds__(128) rk_fused_kernel_check(rk_params p) { rk_fused_body(p); }
__global__ void __launch_bounds__(256) rk_fast4_kernel_check(rk_params p) {
  rk_fast4_body<rk_v4_generic>(p);
}
// one specialised fast_v4 instantiation (the MI300 decode case: bf16 q, e4m3fnuz cache, gptj)
__global__ void __launch_bounds__(256) rk_fast4_spec_kernel_check(rk_params p) {
  rk_fast4_body<rk_v4_spec<rk_bf16, rk_e4m3fnuz, 0, rk_bf16>>(p);
}
}  // namespace ropekv_gpu
