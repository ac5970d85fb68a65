// Device-side timing for `ropekv bench`. Host-only header: no GPU types leak to
// tools/. Implemented in hip_bench.hip (nvcc: hip_bench.cu), compiled with the hip backend.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/op.h"

namespace ropekv {

struct gpu_bench_options {
  int64_t calls_per_graph = 20;  // op launches captured back to back in one graph
  int64_t min_replays = 20;      // graph replays timed (one event pair each) ...
  int64_t max_replays = 200;     // ... more while the time budget lasts
  double budget_s = 0.4;         // per timing, after warm-up
  bool cold = false;             // rotate input sets whose total exceeds 3x L2
};

struct gpu_timing {
  double us_median = 0, us_min = 0, us_max = 0;  // per op call
  int64_t calls_per_graph = 0, replays = 0;
  int64_t input_sets = 1;  // > 1 with cold
  int64_t set_bytes = 0;   // device bytes of one input set (every region)
  std::string variant;     // kernel variant that ran (hip_variant)
};

// Mirrors the case (its regions, every view inside one of them) into device memory (one
// allocation per input set, each region at the same address modulo 256 as on the host),
// captures `calls_per_graph` launches of hip_launch into a graph (cold: launch i uses set
// i % sets) and times graph replays with events. Throws ropekv::error on a device error.
gpu_timing hip_bench_op(const op_args& host_args, const std::vector<memory_region>& regions,
                        const gpu_bench_options& options);

struct gpu_copy_timing {
  double us_median = 0;
  double gbps = 0;           // (read + write bytes) / time
  int64_t bytes = 0;         // one copy's size (each of read and write)
};
// Device-to-device copy of `bytes` (hipMemcpyAsync launched eagerly, events around each call:
// the copy a framework's copy_ makes), median of `replays`.
gpu_copy_timing hip_bench_copy(int64_t bytes, int64_t replays);
// The same copy done by a kernel: 16-byte vector loads/stores; 1 per thread in a grid-stride
// loop, or 4 per thread in one pass of 16 KiB blocks.
gpu_copy_timing hip_bench_copy_kernel(int64_t bytes, int64_t replays, int vectors_per_thread);

struct gpu_device_info {
  std::string name;
  int sm_count = 0;
  int driver_version = 0, runtime_version = 0;
  int64_t l2_bytes = 0, memory_bytes = 0;
  int cc_major = 0, cc_minor = 0;
};
gpu_device_info hip_device_info();

}  // namespace ropekv
