// Device-side timing for `ropekv bench`: events around graph replays of the op.
// HIP source; nvcc compiles it through hip_bench.cu. Only HIP names mapped in gpu_compat.h.
#include "backends/hip/gpu_compat.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backends/hip/hip_backend.h"
#include "backends/hip/hip_bench.h"
#include "core/error.h"

namespace ropekv {
namespace {

// 16-byte vector copy, grid-stride: a copy-kernel denominator of `ropekv bench`.
__global__ void __launch_bounds__(256) rk_copy16_kernel(const uint4* src, uint4* dst, int64_t n16) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n16; i += stride)
    dst[i] = src[i];
}
// The same copy shaped like PyTorch's vectorised elementwise copy: one pass, no grid-stride
// loop; block b copies its own contiguous 4 x 256 vectors (16 KiB), each thread four of them
// (coalesced, stride 256 vectors), all four loads in flight before its stores.
__global__ void __launch_bounds__(256) rk_copy16x4_kernel(const uint4* src, uint4* dst, int64_t n16) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * 1024 + threadIdx.x;
  uint4 v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (base + k * 256 < n16) v[k] = src[base + k * 256];
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (base + k * 256 < n16) dst[base + k * 256] = v[k];
  }
}

void bcheck(hipError_t e, const char* what) {
  if (e != hipSuccess) throw error(std::string("hip bench: ") + what + ": " + hipGetErrorString(e));
}

// Owns device allocations, a stream, events and graphs; frees them on scope exit.
struct device_scope {
  std::vector<void*> buffers;
  hipStream_t stream = nullptr;
  hipEvent_t start = nullptr, stop = nullptr;
  hipGraph_t graph = nullptr;
  hipGraphExec_t exec = nullptr;
  device_scope() {
    bcheck(hipStreamCreate(&stream), "hipStreamCreate");
    bcheck(hipEventCreate(&start), "hipEventCreate");
    bcheck(hipEventCreate(&stop), "hipEventCreate");
  }
  ~device_scope() {
    if (exec != nullptr) (void)hipGraphExecDestroy(exec);
    if (graph != nullptr) (void)hipGraphDestroy(graph);
    (void)hipEventDestroy(start);
    (void)hipEventDestroy(stop);
    (void)hipStreamDestroy(stream);
    for (void* b : buffers) (void)hipFree(b);
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    bcheck(hipMalloc(&p, bytes), "hipMalloc");
    buffers.push_back(p);
    return p;
  }
  // Times graph replays: returns per-replay milliseconds.
  std::vector<double> time_replays(int64_t min_replays, int64_t max_replays, double budget_s) {
    bcheck(hipGraphInstantiateWithFlags(&exec, graph, 0), "hipGraphInstantiate");
    for (int i = 0; i < 3; ++i) bcheck(hipGraphLaunch(exec, stream), "hipGraphLaunch (warm-up)");
    bcheck(hipStreamSynchronize(stream), "warm-up");
    std::vector<double> ms;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t r = 0; r < max_replays; ++r) {
      bcheck(hipEventRecord(start, stream), "hipEventRecord");
      bcheck(hipGraphLaunch(exec, stream), "hipGraphLaunch");
      bcheck(hipEventRecord(stop, stream), "hipEventRecord");
      bcheck(hipEventSynchronize(stop), "hipEventSynchronize");
      float e = 0;
      bcheck(hipEventElapsedTime(&e, start, stop), "hipEventElapsedTime");
      ms.push_back(e);
      const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r + 1 >= min_replays && el > budget_s) break;
    }
    return ms;
  }
};

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}


}  // namespace

gpu_device_info hip_device_info() {
  gpu_device_info info;
  int dev = 0;
  hipDeviceProp_t prop;
  std::memset(&prop, 0, sizeof(prop));
  bcheck(hipGetDevice(&dev), "hipGetDevice");
  bcheck(hipGetDeviceProperties(&prop, dev), "hipGetDeviceProperties");
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.l2_bytes = prop.l2CacheSize;
  info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  (void)hipDriverGetVersion(&info.driver_version);
  (void)hipRuntimeGetVersion(&info.runtime_version);
  return info;
}

gpu_timing hip_bench_op(const op_args& host_args, const std::vector<memory_region>& regions,
                        const gpu_bench_options& o) {
  if (o.calls_per_graph < 1) throw arg_error("calls_per_graph", ">= 1", std::to_string(o.calls_per_graph));
  // One set's layout: every region at the same address modulo 256 as on the host.
  std::vector<size_t> offsets(regions.size());
  size_t total = 0;
  for (size_t i = 0; i < regions.size(); ++i) {
    const size_t host_mod = reinterpret_cast<uintptr_t>(regions[i].base) % 256;
    total = (total + 255) / 256 * 256 + host_mod;
    offsets[i] = total;
    total += regions[i].size_bytes;
  }
  total = (total + 255) / 256 * 256;
  int64_t sets = 1;
  if (o.cold) {
    const gpu_device_info info = hip_device_info();
    const int64_t l2 = info.l2_bytes > 0 ? info.l2_bytes : (int64_t{60} << 20);
    sets = std::max<int64_t>(2, (3 * l2 + static_cast<int64_t>(total) - 1) / static_cast<int64_t>(total));
    size_t free_b = 0, total_b = 0;
    bcheck(hipMemGetInfo(&free_b, &total_b), "hipMemGetInfo");
    const int64_t fit = static_cast<int64_t>(free_b / 2 / total);
    sets = std::min<int64_t>({sets, fit, o.calls_per_graph, 256});
    if (sets < 2) throw error("hip bench: --cold needs two input sets in device memory; this case is too large");
  }
  device_scope ds;
  std::vector<op_args> set_args;
  for (int64_t s = 0; s < sets; ++s) {
    char* dev = static_cast<char*>(ds.alloc(total));
    for (size_t i = 0; i < regions.size(); ++i)
      bcheck(hipMemcpy(dev + offsets[i], regions[i].base, regions[i].size_bytes, hipMemcpyHostToDevice),
             "hipMemcpy to device");
    set_args.push_back(rebase_to_device(host_args, regions, offsets, dev));
  }
  gpu_timing t;
  t.variant = hip_variant(set_args[0]);
  // One eager launch first: errors surface outside capture.
  hip_launch(set_args[0], ds.stream);
  bcheck(hipStreamSynchronize(ds.stream), "first launch");
  bcheck(hipStreamBeginCapture(ds.stream, hipStreamCaptureModeThreadLocal), "hipStreamBeginCapture");
  try {
    for (int64_t i = 0; i < o.calls_per_graph; ++i) hip_launch(set_args[i % sets], ds.stream);
  } catch (...) {
    hipGraph_t g = nullptr;
    (void)hipStreamEndCapture(ds.stream, &g);
    if (g != nullptr) (void)hipGraphDestroy(g);
    throw;
  }
  bcheck(hipStreamEndCapture(ds.stream, &ds.graph), "hipStreamEndCapture");
  const std::vector<double> ms = ds.time_replays(o.min_replays, o.max_replays, o.budget_s);
  const double per = 1000.0 / static_cast<double>(o.calls_per_graph);  // ms per replay -> us per call
  t.us_median = median_of(ms) * per;
  t.us_min = *std::min_element(ms.begin(), ms.end()) * per;
  t.us_max = *std::max_element(ms.begin(), ms.end()) * per;
  t.calls_per_graph = o.calls_per_graph;
  t.replays = static_cast<int64_t>(ms.size());
  t.input_sets = sets;
  t.set_bytes = static_cast<int64_t>(total);
  return t;
}

// The runtime's device-to-device copy, launched eagerly (not in a graph: a graph's memcpy node
// may run on a copy engine at a fraction of the bandwidth, which is not the copy a framework's
// copy_ gets), events around each call: two warm-up calls, then the median of `replays`.
gpu_copy_timing hip_bench_copy(int64_t bytes, int64_t replays) {
  if (bytes < 1) throw arg_error("copy bytes", ">= 1", std::to_string(bytes));
  if (replays < 1) throw arg_error("copy replays", ">= 1", std::to_string(replays));
  device_scope ds;
  void* src = ds.alloc(static_cast<size_t>(bytes));
  void* dst = ds.alloc(static_cast<size_t>(bytes));
  bcheck(hipMemset(src, 1, static_cast<size_t>(bytes)), "hipMemset");
  bcheck(hipMemset(dst, 0, static_cast<size_t>(bytes)), "hipMemset");
  bcheck(hipDeviceSynchronize(), "hipMemset");
  auto copy = [&] {
    bcheck(hipMemcpyAsync(dst, src, static_cast<size_t>(bytes), hipMemcpyDeviceToDevice, ds.stream),
           "hipMemcpyAsync");
  };
  for (int i = 0; i < 2; ++i) copy();
  bcheck(hipStreamSynchronize(ds.stream), "hipMemcpyAsync (warm-up)");
  std::vector<double> ms;
  for (int64_t r = 0; r < replays; ++r) {
    bcheck(hipEventRecord(ds.start, ds.stream), "hipEventRecord");
    copy();
    bcheck(hipEventRecord(ds.stop, ds.stream), "hipEventRecord");
    bcheck(hipEventSynchronize(ds.stop), "hipEventSynchronize");
    float e = 0;
    bcheck(hipEventElapsedTime(&e, ds.start, ds.stop), "hipEventElapsedTime");
    ms.push_back(e);
  }
  gpu_copy_timing c;
  c.bytes = bytes;
  c.us_median = median_of(ms) * 1000.0;
  c.gbps = 2.0 * static_cast<double>(bytes) / (c.us_median * 1e-6) / 1e9;
  return c;
}

gpu_copy_timing hip_bench_copy_kernel(int64_t bytes, int64_t replays, int vectors_per_thread) {
  if (vectors_per_thread != 1 && vectors_per_thread != 4)
    throw arg_error("copy vectors per thread", "1 or 4", std::to_string(vectors_per_thread));
  if (bytes < 16 || bytes % 16 != 0) throw arg_error("copy bytes", "a positive multiple of 16", std::to_string(bytes));
  device_scope ds;
  void* src = ds.alloc(static_cast<size_t>(bytes));
  void* dst = ds.alloc(static_cast<size_t>(bytes));
  bcheck(hipMemset(src, 1, static_cast<size_t>(bytes)), "hipMemset");
  bcheck(hipMemset(dst, 0, static_cast<size_t>(bytes)), "hipMemset");
  bcheck(hipDeviceSynchronize(), "hipMemset");
  int dev = 0;
  hipDeviceProp_t prop;
  std::memset(&prop, 0, sizeof(prop));
  bcheck(hipGetDevice(&dev), "hipGetDevice");
  bcheck(hipGetDeviceProperties(&prop, dev), "hipGetDeviceProperties");
  const int64_t n16 = bytes / 16;
  const int64_t blocks = std::min<int64_t>((n16 + 255) / 256, static_cast<int64_t>(prop.multiProcessorCount) * 8);
  bcheck(hipStreamBeginCapture(ds.stream, hipStreamCaptureModeThreadLocal), "hipStreamBeginCapture");
  if (vectors_per_thread == 4) {
    const int64_t blocks4 = (n16 + 1023) / 1024;  // one pass: 4 x 256 vectors per block
    if (blocks4 > 2147483647) throw arg_error("copy bytes", "<= 2^31 blocks of 16 KiB", std::to_string(bytes));
    rk_copy16x4_kernel<<<static_cast<unsigned>(blocks4), 256, 0, ds.stream>>>(static_cast<const uint4*>(src),
                                                                              static_cast<uint4*>(dst), n16);
  } else {
    rk_copy16_kernel<<<static_cast<unsigned>(blocks), 256, 0, ds.stream>>>(static_cast<const uint4*>(src),
                                                                           static_cast<uint4*>(dst), n16);
  }
  bcheck(hipGetLastError(), "copy kernel launch");
  bcheck(hipStreamEndCapture(ds.stream, &ds.graph), "hipStreamEndCapture");
  const std::vector<double> ms = ds.time_replays(replays, replays, 0.0);
  gpu_copy_timing c;
  c.bytes = bytes;
  c.us_median = median_of(ms) * 1000.0;
  c.gbps = 2.0 * static_cast<double>(bytes) / (c.us_median * 1e-6) / 1e9;
  return c;
}

}  // namespace ropekv
