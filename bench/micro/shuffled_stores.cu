// Store-pattern microbenchmark for layout shuffled (core/SPEC.md) on NVIDIA: what a token's
// cache entry costs when its 16-byte runs land 256 bytes apart (shuffled, bf16) instead of in one
// 1152-byte row (joint), beside the q traffic of deepseek-v3-tp8 (16 heads x 576 bf16 per token,
// copied), with random or consecutive slots, and with L2 cache hints on the stores. Not part of
// the build: nvcc -O3 -arch=sm_90a -o shuffled_stores bench/micro/shuffled_stores.cu
// Prints one line per variant: microseconds per call (median of 50, events around 20 calls).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr int tokens = 8192, heads = 16, row_bytes = 576 * 2, bs = 64, chunks = row_bytes / 16;
constexpr int nope_chunks = 64;  // 512 bf16 / 8

enum class layout : int { joint = 0, shuffled = 1 };

__device__ __forceinline__ void store16(char* p, uint4 v, int hint, uint64_t pol) {
  if (hint) {
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w), "l"(pol)
                 : "memory");
  } else {
    *reinterpret_cast<uint4*>(p) = v;
  }
}

// One 32-thread group per token: its q rows copied (16 x 1152 bytes), then its cache entry.
__global__ void op(const char* q_in, char* q_out, const char* kv, char* cache, const int* slots, int lay,
                   int cache_hint, int q_hint) {
  const int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (t >= tokens) return;
  uint64_t keep = 0, drop = 0;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(drop));
  const size_t q0 = static_cast<size_t>(t) * heads * row_bytes;
  for (int c = lane; c < heads * chunks; c += 32) {
    const uint4 v = *reinterpret_cast<const uint4*>(q_in + q0 + c * 16);
    store16(q_out + q0 + c * 16, v, q_hint, drop);
  }
  const int s = slots[t], b = s / bs, e = s % bs;
  for (int j = lane; j < chunks; j += 32) {
    const uint4 v = *reinterpret_cast<const uint4*>(kv + static_cast<size_t>(t) * row_bytes + j * 16);
    size_t off;
    if (lay == 0) {
      off = static_cast<size_t>(s) * row_bytes + j * 16;
    } else if (j < nope_chunks) {  // nope run j of entry e: (e/16)*16*Dn + j*16*W + (e%16)*W, W = 8
      off = static_cast<size_t>(b) * bs * row_bytes + ((e / 16) * 16 * 512 + j * 128 + (e % 16) * 8) * 2;
    } else {                       // rope run j - 64, after the block's bs * Dn nope elements
      off = static_cast<size_t>(b) * bs * row_bytes +
            (bs * 512 + (e / 16) * 16 * 64 + (j - nope_chunks) * 128 + (e % 16) * 8) * 2;
    }
    store16(cache + off, v, cache_hint, keep);
  }
}

}  // namespace

int main() {
  const size_t q_bytes = static_cast<size_t>(tokens) * heads * row_bytes;
  const size_t kv_bytes = static_cast<size_t>(tokens) * row_bytes;
  const int slots_n = tokens + bs;  // capacity: whole blocks
  char *q_in, *q_out, *kv, *cache;
  int* slots;
  cudaMalloc(&q_in, q_bytes);
  cudaMalloc(&q_out, q_bytes);
  cudaMalloc(&kv, kv_bytes);
  cudaMalloc(&cache, static_cast<size_t>(slots_n) * row_bytes);
  cudaMalloc(&slots, tokens * sizeof(int));
  cudaMemset(q_in, 1, q_bytes);
  cudaMemset(kv, 2, kv_bytes);
  std::vector<int> consecutive(tokens), random(slots_n);
  std::iota(consecutive.begin(), consecutive.end(), 0);
  std::iota(random.begin(), random.end(), 0);
  std::shuffle(random.begin(), random.end(), std::mt19937(7));
  random.resize(tokens);
  struct variant { const char* name; int lay; bool random_slots; int cache_hint, q_hint; };
  const variant vs[] = {
      {"joint, random slots", 0, true, 0, 0},
      {"joint, consecutive slots", 0, false, 0, 0},
      {"shuffled, random slots", 1, true, 0, 0},
      {"shuffled, consecutive slots", 1, false, 0, 0},
      {"shuffled, random slots, cache evict_last", 1, true, 1, 0},
      {"shuffled, random slots, cache evict_last + q evict_first", 1, true, 1, 1},
      {"joint, random slots, q evict_first", 0, true, 0, 1},
  };
  cudaEvent_t a, z;
  cudaEventCreate(&a);
  cudaEventCreate(&z);
  const int groups_per_block = 4, grid = (tokens + groups_per_block - 1) / groups_per_block;
  for (const variant& v : vs) {
    cudaMemcpy(slots, (v.random_slots ? random : consecutive).data(), tokens * sizeof(int), cudaMemcpyHostToDevice);
    std::vector<float> us;
    for (int rep = 0; rep < 55; ++rep) {
      cudaEventRecord(a);
      for (int k = 0; k < 20; ++k) op<<<grid, 32 * groups_per_block>>>(q_in, q_out, kv, cache, slots, v.lay, v.cache_hint, v.q_hint);
      cudaEventRecord(z);
      cudaEventSynchronize(z);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, z);
      if (rep >= 5) us.push_back(ms * 1000.0f / 20);
    }
    std::sort(us.begin(), us.end());
    std::printf("%-58s %8.2f us  (%.0f GB/s of q + kv + cache traffic)\n", v.name, us[us.size() / 2],
                (2.0 * q_bytes + 2.0 * kv_bytes) / (us[us.size() / 2] * 1e3));
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}
