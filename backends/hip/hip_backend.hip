// GPU backend implementation, HIP source. nvcc compiles it through hip_backend.cu, hipcc
// directly (-x hip). Only HIP runtime names mapped in gpu_compat.h may be used here.
#include "backends/hip/gpu_compat.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backends/hip/hip_backend.h"
#include "backends/hip/kernel.h"
#include "backends/hip/launch_plan.h"
#include "core/error.h"
#include "core/validate.h"

namespace ropekv_gpu {

__global__ void __launch_bounds__(rk_max_block_threads) rk_fused_kernel(rk_params p) {
  rk_fused_body(p);
}
// The plan asks for programmatic dependent launch (fast_v4); the device decides whether it has it.
inline bool rk_launch_uses_pdl(const rk_launch& l) { return l.pdl && rk_pdl_supported(); }

// One kernel per fast_v4 instantiation (launch_plan.h rk_v4_visit picks it on the host).
// With programmatic dependent launch (launch_plan.h rk_launch::pdl): let the next kernel start
// early, and wait for the previous one before touching memory.
// fp8-cache gptj instantiations: at most 48 registers (5 blocks of 256), as the 16-bit ones
// need by themselves (45): their natural 54 would cost every q row of the grid a tenth of its
// occupancy for the conversions of the few cache rows (H200 measurements, docs/perf.md). At 48,
// bf16 q with an e4m3fn / e5m2 cache does not spill; f16 q and the fnuz caches spill 8-32 bytes.
// fp8_ds_mla instantiations (D & 2): at most 64 registers (4 blocks of 256) for the tile amax.
// Zero-copy kernels (R = 0), gptj: at most 64 registers (4 blocks of 256); their rows hold up to
// four q_pe units per lane (rk_v4_q_rope_rows).
// (A cap of 40 registers, 6 blocks, measured 7-16% slower at the large zero-copy cases on the
// H100: bench/results/h100-2026-12-07-zero-copy-rows1.)
template <class S, int R, int D>
inline constexpr int rk_fast4_min_blocks_for =
    (D & 2) ? 4 : R == 0 ? (S::neox == 0 ? 4 : 1) : (S::cache >= rk_e4m3fn && S::neox == 0) ? (R == 2 ? 4 : 5) : 1;
// R: the q rows' shape (launch_plan.h rk_v4_q_shape: 1 or 2 copy-mode rows per group, 0
// zero-copy rows); D: bit 0 with decode outputs
// (rk_params::v4_decode; the D = 0 kernels are the code without them, register for register),
// bit 1 for fp8_ds_mla entries (rk_params::ds_mla).
// The template-id is parenthesised: hipcc's __launch_bounds__ is a two-parameter macro, and its
// comma would split it.
template <class S, int R, int D>
__global__ void __launch_bounds__(rk_max_block_threads, (rk_fast4_min_blocks_for<S, R, D>)) rk_fast4_kernel(rk_params p) {
  rk_pdl_trigger();
  rk_pdl_wait();
  rk_fast4_body<S, R, D>(p);
}

// The fast_v4 kernel of instantiation S and D for p: R by the q rows' shape (rk_v4_visit_q_shape).
template <class S, int D>
void (*rk_fast4_pick_shape(const rk_params& p))(rk_params) {
  return rk_v4_visit_q_shape(p, [](auto r) -> void (*)(rk_params) { return rk_fast4_kernel<S, decltype(r)::value, D>; });
}

// The fast_v4 kernel of instantiation S for p: R by the q rows' shape, D by v4_decode and
// ds_mla. fp8_ds_mla kernels exist for the instantiations launch_plan.h picks for that layout
// only (cache e4m3fn, or generic: rk_v4_specialised).
template <class S>
void (*rk_fast4_pick(const rk_params& p))(rk_params) {
  const bool dec = p.v4_decode != 0;
  if constexpr (S::cache == rk_e4m3fn || S::cache < 0) {
    if (p.ds_mla) {
      if constexpr (S::cache < 0) {
        if (dec) return rk_fast4_pick_shape<S, 3>(p);
      }
      if (!dec) return rk_fast4_pick_shape<S, 2>(p);
    }
  }
  if (p.ds_mla)
    throw ropekv::error("rk_fast4_pick: no fp8_ds_mla kernel for instantiation " + rk_v4_spec_name(p));
  return dec ? rk_fast4_pick_shape<S, 1>(p) : rk_fast4_pick_shape<S, 0>(p);
}

}  // namespace ropekv_gpu

namespace ropekv {
namespace {

void check(hipError_t e, const char* what) {
  if (e != hipSuccess) throw error(std::string("hip: ") + what + ": " + hipGetErrorString(e));
}

// The device copy of a case: one allocation, grown on demand and kept between calls.
class hip_device_mirror final : public device_mirror {
 public:
  ~hip_device_mirror() override {
    if (device_buffer_ != nullptr) (void)hipFree(device_buffer_);
  }
  std::string unavailable_reason() const override { return hip_unavailable_reason(); }
  void run(const op_args& host_args, const std::vector<memory_region>& regions,
           const std::function<void(const op_args& device_args, void* stream)>& launch) override {
    // Lay the regions out in one device allocation, each at the same address modulo 256 as on
    // the host, so the kernel sees the same alignment (and takes the same vector paths).
    std::vector<size_t> offsets(regions.size());
    size_t total = 0;
    for (size_t i = 0; i < regions.size(); ++i) {
      const size_t host_mod = reinterpret_cast<uintptr_t>(regions[i].base) % 256;
      total = (total + 255) / 256 * 256 + host_mod;
      offsets[i] = total;
      total += regions[i].size_bytes;
    }
    if (total > capacity_bytes_) {
      const size_t grown = std::max(total, capacity_bytes_ * 2);
      if (device_buffer_ != nullptr) check(hipFree(device_buffer_), "hipFree");
      device_buffer_ = nullptr;
      capacity_bytes_ = 0;
      check(hipMalloc(&device_buffer_, grown), "hipMalloc");
      capacity_bytes_ = grown;
    }
    char* dev = static_cast<char*>(device_buffer_);
    for (size_t i = 0; i < regions.size(); ++i)
      check(hipMemcpy(dev + offsets[i], regions[i].base, regions[i].size_bytes, hipMemcpyHostToDevice),
            "hipMemcpy to device");
    launch(rebase_to_device(host_args, regions, offsets, dev), /*stream=*/nullptr);
    check(hipDeviceSynchronize(), "kernel execution");
    for (size_t i = 0; i < regions.size(); ++i)
      check(hipMemcpy(regions[i].base, dev + offsets[i], regions[i].size_bytes, hipMemcpyDeviceToHost),
            "hipMemcpy to host");
  }

 private:
  void* device_buffer_ = nullptr;  // cached mirror of the regions, grown on demand
  size_t capacity_bytes_ = 0;
};

class hip_backend final : public backend {
 public:
  std::string name() const override { return "hip"; }
  std::string unsupported_reason(const op_args& args) const override {
    const std::string no_gpu = hip_unavailable_reason();
    if (!no_gpu.empty()) return "not supported: " + no_gpu;
    return ropekv_gpu::rk_unsupported_reason(args);
  }
  void run_host(const op_args& args, const std::vector<memory_region>& regions) override {
    validate(args, /*check_values=*/true);
    const std::string why = unsupported_reason(args);
    if (!why.empty()) throw unsupported_error(why);
    mirror_.run(args, regions, [this](const op_args& d, void* stream) {
      variant_ = hip_variant(d);
      hip_launch(d, stream);
    });
  }
  std::string last_variant() const override { return variant_; }
  std::string device_description() const override {
    int dev = 0, driver = 0, runtime = 0;
    hipDeviceProp_t prop;
    std::memset(&prop, 0, sizeof(prop));
    if (hipGetDevice(&dev) != hipSuccess || hipGetDeviceProperties(&prop, dev) != hipSuccess)
      return "hip: no device";
    (void)hipDriverGetVersion(&driver);
    (void)hipRuntimeGetVersion(&runtime);
    return std::string(prop.name) + ", " + std::to_string(prop.multiProcessorCount) +
           " SMs/CUs, driver " + std::to_string(driver) + ", runtime " + std::to_string(runtime);
  }

 private:
  hip_device_mirror mirror_;
  std::string variant_;
};

}  // namespace

op_args rebase_to_device(const op_args& host_args, const std::vector<memory_region>& regions,
                         const std::vector<size_t>& offsets, char* dev) {
  op_args d = host_args;
  auto rebase = [&](tensor_view& v, const char* name) {
    if (!v.present()) return;
    if (v.numel() == 0) {  // never dereferenced; its pointer may lie past an empty buffer
      v.data = dev;
      v.on_device = true;
      return;
    }
    const char* p = static_cast<const char*>(v.data);
    for (size_t i = 0; i < regions.size(); ++i) {
      const char* b = static_cast<const char*>(regions[i].base);
      if (p >= b && p < b + regions[i].size_bytes) {
        v.data = dev + offsets[i] + (p - b);
        v.on_device = true;
        return;
      }
    }
    throw arg_error(name, "a view inside one of the memory regions", "a pointer outside them");
  };
  for (const auto& [name, view] : named_tensors(d)) rebase(*const_cast<tensor_view*>(view), name);
  return d;
}

std::string hip_unavailable_reason() {
  int count = 0;
  const hipError_t e = hipGetDeviceCount(&count);
  if (e != hipSuccess) return std::string("hip: ") + hipGetErrorString(e);
  if (count == 0) return "hip: no GPU visible";
  return {};
}

std::unique_ptr<backend> make_hip_backend() {
  return std::make_unique<hip_backend>();
}

std::unique_ptr<device_mirror> make_hip_device_mirror() {
  return std::make_unique<hip_device_mirror>();
}

std::string hip_variant(const op_args& args) {
  const ropekv_gpu::rk_launch l = ropekv_gpu::rk_make_launch(args);
  std::string v = l.variant;
  if (ropekv_gpu::rk_launch_uses_pdl(l)) v += "+pdl";
#if ROPEKV_MUTATION != 0
  v += "+mutation" + std::to_string(ROPEKV_MUTATION);
#endif
  return v;
}

void hip_launch(const op_args& device_args, void* stream) {
  validate(device_args, /*check_values=*/false);
  const std::string why = ropekv_gpu::rk_unsupported_reason(device_args);
  if (!why.empty()) throw unsupported_error(why);
  ropekv_gpu::rk_launch l = ropekv_gpu::rk_make_launch(device_args);
  if (l.empty) return;
  l.pdl = ropekv_gpu::rk_launch_uses_pdl(l);
  const dim3 grid(l.grid_x, l.grid_y, 1);
  const dim3 block(l.block_threads, 1, 1);
  const hipStream_t s = static_cast<hipStream_t>(stream);
  if (l.kernel == ropekv_gpu::rk_kernel::fast4) {
    ropekv_gpu::rk_v4_visit(l.params, [&](auto spec) {
      using S = decltype(spec);
      void (*const kernel)(ropekv_gpu::rk_params) = ropekv_gpu::rk_fast4_pick<S>(l.params);
      check(rk_launch_kernel(kernel, grid, block, s, l.pdl, l.params), "kernel launch");
    });
  } else {
    ropekv_gpu::rk_fused_kernel<<<grid, block, 0, s>>>(l.params);
  }
  check(hipGetLastError(), "kernel launch");
}

}  // namespace ropekv
