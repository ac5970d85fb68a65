// The simulation backend: the HIP kernel body (backends/hip/kernel.h, included unchanged)
// compiled as host C++ and run over a simulated grid. OpenMP over blocks; the threads of a
// block run one after another (the kernel uses no intra-block cooperation, so any order of its
// threads is a valid execution). Compiled with -ffp-contract=off (see CMakeLists.txt) so its
// fp32 arithmetic is the same sequence of IEEE operations the GPU executes.
#include "backends/sim/sim_backend.h"

#include <cstdint>
#include <string>

#include "backends/hip/kernel.h"
#include "backends/hip/launch_plan.h"
#include "core/validate.h"

#ifndef ROPEKV_SIM
#error "backends/sim must be compiled with ROPEKV_SIM defined"
#endif

namespace ropekv {
namespace {

template <class S>
void sim_launch(const ropekv_gpu::rk_launch& l) {
  if (l.empty) return;
  const int64_t blocks = static_cast<int64_t>(l.grid_x) * l.grid_y;
  const ropekv_gpu::rk_params params = l.params;
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t b = 0; b < blocks; ++b) {
    gridDim = {l.grid_x, l.grid_y, 1};
    blockDim = {l.block_threads, 1, 1};
    blockIdx = {static_cast<uint32_t>(b % l.grid_x), static_cast<uint32_t>(b / l.grid_x), 0};
    for (uint32_t th = 0; th < l.block_threads; ++th) {
      threadIdx = {th, 0, 0};
      if (l.kernel == ropekv_gpu::rk_kernel::fast4) {
        ropekv_gpu::rk_fast4_body<S>(params);
      } else if (l.kernel == ropekv_gpu::rk_kernel::fast3) {
        ropekv_gpu::rk_fast3_body<S>(params);
      } else {
        ropekv_gpu::rk_fused_body(params);
      }
    }
  }
}

class sim_backend final : public backend {
 public:
  std::string name() const override { return "sim"; }
  std::string unsupported_reason(const op_args& args) const override {
    return ropekv_gpu::rk_unsupported_reason(args);
  }
  void run_host(const op_args& args, const std::vector<memory_region>& /*regions*/) override {
    validate(args, /*check_values=*/true);
    const std::string why = ropekv_gpu::rk_unsupported_reason(args);
    if (!why.empty()) throw unsupported_error(why);
    const ropekv_gpu::rk_launch l = ropekv_gpu::rk_make_launch(args);
    variant_ = l.variant;
#if ROPEKV_MUTATION != 0
    variant_ += "+mutation" + std::to_string(ROPEKV_MUTATION);
#endif
    if (l.kernel == ropekv_gpu::rk_kernel::fast3 || l.kernel == ropekv_gpu::rk_kernel::fast4) {
      // the same instantiation the GPU would launch (launch_plan.h rk_v3_visit)
      ropekv_gpu::rk_v3_visit(l.params, [&](auto spec) { sim_launch<decltype(spec)>(l); });
    } else {
      sim_launch<ropekv_gpu::rk_v3_generic>(l);
    }
  }
  std::string last_variant() const override { return variant_; }
  std::string device_description() const override {
    return "sim: HIP kernel body on the CPU (OpenMP over blocks)";
  }

 private:
  std::string variant_;
};

}  // namespace

std::unique_ptr<backend> make_sim_backend() { return std::make_unique<sim_backend>(); }

}  // namespace ropekv
