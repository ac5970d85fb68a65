// ropekv::kernel is header-only: the GPU kernel's source (backends/hip/kernel.h and the headers it
// includes) for your own HIP or CUDA translation units. Here it is compiled as host C++ (the
// ROPEKV_SIM mode of backends/hip/gpu_compat.h), which proves the installed headers are complete.
#include "backends/hip/kernel.h"

int kernel_headers_bf16_code() { return static_cast<int>(ropekv_gpu::rk_bf16); }
