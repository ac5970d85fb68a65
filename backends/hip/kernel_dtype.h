// The kernel's float formats (rk_dtype: its own numbering, not core's dtype) and the planted-bug
// switch ROPEKV_MUTATION (kernel.h lists the mutations). Device code that compiles three ways
// (gpu_compat.h: hipcc, nvcc, host C++ for the sim); no core/ include. Part of kernel.h.
#pragma once
#include <cstdint>

#include "backends/hip/fp8_encode.h"
#include "backends/hip/gpu_compat.h"

#ifndef ROPEKV_MUTATION
#define ROPEKV_MUTATION 0
#endif

namespace ropekv_gpu {

// Float formats the kernel reads or writes. Its own numbering: not core's dtype.
enum rk_dtype : int32_t {  // fp8 codes equal fp8_encode.h's rk_fp8_* (static_assert below)
  rk_f32 = 0,
  rk_f16 = 1,
  rk_bf16 = 2,
  rk_e4m3fn = 3,
  rk_e4m3fnuz = 4,
  rk_e5m2 = 5,
  rk_e5m2fnuz = 6,
};

static_assert(rk_e4m3fn == rk_fp8_e4m3fn && rk_e4m3fnuz == rk_fp8_e4m3fnuz && rk_e5m2 == rk_fp8_e5m2 &&
                  rk_e5m2fnuz == rk_fp8_e5m2fnuz,
              "kernel.h and fp8_encode.h number the fp8 formats alike");

ROPEKV_HOST_DEVICE int rk_size_bytes(int32_t t) {
  return t == rk_f32 ? 4 : (t == rk_f16 || t == rk_bf16) ? 2 : 1;
}
ROPEKV_HOST_DEVICE bool rk_is_fp8(int32_t t) { return t >= rk_e4m3fn; }

}  // namespace ropekv_gpu
