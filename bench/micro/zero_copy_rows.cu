// Access-pattern microbenchmark for zero-copy mode on NVIDIA: what moving the rope part of each q
// row costs when it lands in q_out's rows (128 bytes at byte 1024 of every 1152-byte row, as
// deepseek-v3 x 4096 tokens x 128 heads in bf16 does), against the same bytes moved contiguously.
// No arithmetic: an upper bound for the op's q traffic in that mode. Not part of the build:
//   nvcc -O3 -std=c++17 -arch=sm_90a -o zero_copy_rows bench/micro/zero_copy_rows.cu
// Prints one line per variant: microseconds per call (median of 7 events around 20 calls) and
// GB/s counting bytes read + written (128 + 128 per row).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

constexpr int64_t rows = 4096LL * 128, piece_bytes = 128, out_row_bytes = 1152, out_offset = 1024;
constexpr int lanes_per_row = piece_bytes / 16;

// U rows per 8-lane group: every load of the U rows is issued before the first store.
// STRIDED: the piece goes to row r's bytes [1024, 1152) of q_out; else to r * 128 (contiguous).
template <int U, bool STRIDED, bool STREAM>
__global__ void __launch_bounds__(256) rows_kernel(const uint4* __restrict__ src, char* __restrict__ dst) {
  const int64_t lane = threadIdx.x % lanes_per_row;
  const int64_t group = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / lanes_per_row;
  const int64_t groups = int64_t(gridDim.x) * blockDim.x / lanes_per_row;
  for (int64_t r0 = group * U; r0 < rows; r0 += groups * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = src[(r0 + u) * lanes_per_row + lane];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t r = r0 + u;
      char* p = STRIDED ? dst + r * out_row_bytes + out_offset + lane * 16 : dst + r * piece_bytes + lane * 16;
      if (STREAM) __stcs(reinterpret_cast<uint4*>(p), v[u]);
      else *reinterpret_cast<uint4*>(p) = v[u];
    }
  }
}

template <class F>
float median_us(F launch) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 5; ++i) launch();
  std::vector<float> us;
  for (int rep = 0; rep < 7; ++rep) {
    cudaEventRecord(a);
    for (int i = 0; i < 20; ++i) launch();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    us.push_back(ms * 1000.0f / 20);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

template <int U, bool STRIDED, bool STREAM>
void run(const char* name, const uint4* src, char* dst, int blocks_per_sm, int sms) {
  const int blocks = blocks_per_sm * sms;
  const float us = median_us([&] { rows_kernel<U, STRIDED, STREAM><<<blocks, 256>>>(src, dst); });
  const double bytes = 2.0 * rows * piece_bytes;
  std::printf("%-28s U=%d blocks/SM=%-3d %9.2f us %8.1f GB/s\n", name, U, blocks_per_sm, us, bytes / (us * 1e-6) / 1e9);
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  uint4* src = nullptr;
  char* dst = nullptr;
  cudaMalloc(&src, rows * piece_bytes);
  cudaMalloc(&dst, rows * out_row_bytes);
  cudaMemset(src, 0x3c, rows * piece_bytes);
  cudaMemset(dst, 0x7f, rows * out_row_bytes);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device %s, %d SMs; %lld rows of %lld bytes\n", prop.name, sms, (long long)rows, (long long)piece_bytes);
  for (int bps : {8, 32}) {
    run<1, false, false>("contiguous", src, dst, bps, sms);
    run<4, false, false>("contiguous", src, dst, bps, sms);
    run<1, true, false>("strided", src, dst, bps, sms);
    run<2, true, false>("strided", src, dst, bps, sms);
    run<4, true, false>("strided", src, dst, bps, sms);
    run<4, true, true>("strided, streaming stores", src, dst, bps, sms);
  }
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("error: %s\n", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}
