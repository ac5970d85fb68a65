// Exhaustive check, on an NVIDIA GPU of compute 8.9+, that fp8_encode.h's pair encoder
// rk_encode_fp8x2_sat<C> (the hardware cvt.rn.satfinite.{e4m3,e5m2}x2.f32 there) gives the same
// codes as kernel.h's readable definition rk_encode_narrow(v, rk_format_of(C), true), for every
// f32 bit pattern in the low byte and, in the high byte, the pattern with its sign flipped.
// Build: nvcc -std=c++17 -O3 -arch=sm_90a --fmad=false -I. bench/h200_fp8x2_check.cu -o fp8x2_check
// Prints one line per format; exits 1 on any mismatch.
#include <cstdio>

#include "backends/hip/kernel.h"

using namespace ropekv_gpu;

template <int32_t C>
__global__ void check_kernel(unsigned long long* bad, unsigned int* first) {
  const rk_format f = rk_format_of(C);
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < (1ull << 32);
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t b = static_cast<uint32_t>(i);
    const float lo = __uint_as_float(b), hi = __uint_as_float(b ^ 0x80000000u);
    const uint32_t got = rk_encode_fp8x2_sat<C>(lo, hi);
    const uint32_t want = rk_encode_narrow(lo, f, true) | (rk_encode_narrow(hi, f, true) << 8);
    if (got != want) {
      if (atomicAdd(bad, 1ull) == 0) *first = b;
    }
  }
}

template <int32_t C>
int run(const char* name) {
  unsigned long long* bad;
  unsigned int* first;
  cudaMalloc(&bad, sizeof(*bad));
  cudaMalloc(&first, sizeof(*first));
  cudaMemset(bad, 0, sizeof(*bad));
  cudaMemset(first, 0, sizeof(*first));
  check_kernel<C><<<132 * 16, 256>>>(bad, first);
  unsigned long long h_bad = 0;
  unsigned int h_first = 0;
  const cudaError_t e = cudaDeviceSynchronize();
  cudaMemcpy(&h_bad, bad, sizeof(h_bad), cudaMemcpyDeviceToHost);
  cudaMemcpy(&h_first, first, sizeof(h_first), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    std::printf("%s: CUDA error %s\n", name, cudaGetErrorString(e));
    return 1;
  }
  std::printf("%s: all 2^32 f32 patterns (pairs v, -v): %llu mismatches%s", name, h_bad, h_bad ? "" : "\n");
  if (h_bad) std::printf(", first at f32 bits 0x%08x\n", h_first);
  return h_bad != 0;
}

int main() {
  int rc = run<rk_e4m3fn>("e4m3fn");
  rc |= run<rk_e5m2>("e5m2");
  rc |= run<rk_e4m3fnuz>("e4m3fnuz (software path)");
  rc |= run<rk_e5m2fnuz>("e5m2fnuz (software path)");
  return rc;
}
