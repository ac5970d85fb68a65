// The simulation backend: the HIP kernel body (backends/hip/kernel.h, included unchanged)
// compiled as host C++ and run over a simulated grid. OpenMP over blocks; the threads of a
// block run one after another (the kernel uses no intra-block cooperation, so any order of its
// threads is a valid execution). Compiled with -ffp-contract=off (see CMakeLists.txt) so its
// fp32 arithmetic is the same sequence of IEEE operations the GPU executes.
#include "backends/sim/sim_backend.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backends/sim/sim_grid.h"
#include "core/error.h"
#include "core/validate.h"

namespace ropekv {
namespace {

using namespace sim_detail;

// The general kernel (rk_fused_body).
void sim_launch_fused(const ropekv_gpu::rk_launch& l, const sim_config& c) { sim_grid<sim_fused>(l, c); }

// Whether to run the FMA copy: the CPU has FMA, unless ROPEKV_SIM_FMA=0 asks for the portable
// copy (to test it on an FMA machine; both compute the same bits).
bool sim_use_fma() {
  const char* env = std::getenv("ROPEKV_SIM_FMA");
  if (env != nullptr && std::string(env) == "0") return false;
#if defined(__FMA__)
  return true;
#elif ROPEKV_SIM_FMA_CLONE
  return __builtin_cpu_supports("fma") != 0;
#else
  return false;
#endif
}

// Whether pinned loops may run: in the copy that runs by default (FMA where the build has an
// FMA clone), unless ROPEKV_SIM_PIN=0 asks for the plain loops (to test that both compute the
// same bits).
bool sim_use_pins(bool fma) {
  const char* env = std::getenv("ROPEKV_SIM_PIN");
  if (env != nullptr && std::string(env) == "0") return false;
  return fma || ROPEKV_SIM_FMA_CLONE == 0;
}

// The order of the threads of a block (sim_config::wave_lanes): ROPEKV_SIM_WAVE unset or 0 in
// order, 32 or 64 wave by wave with each wave's lanes reversed.
uint32_t sim_wave_lanes() {
  const char* env = std::getenv("ROPEKV_SIM_WAVE");
  const std::string v = env == nullptr ? "" : env;
  if (v.empty() || v == "0") return 0;
  if (v == "32") return 32;
  if (v == "64") return 64;
  throw arg_error("ROPEKV_SIM_WAVE", "0, 32 or 64 (lanes per wavefront)", "'" + v + "'");
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
    if (l.empty) return;
    switch (l.kernel) {
      case ropekv_gpu::rk_kernel::fast4:
        // the same instantiation the GPU would launch (launch_plan.h rk_v4_visit), in the
        // default copy; the portable copy of an FMA build runs the generic one (same body,
        // dtypes read at run time: the same bits, at half the compile time)
        if (ROPEKV_SIM_SPECIALISED && (config_.fma || !ROPEKV_SIM_FMA_CLONE) && ropekv_gpu::rk_v4_specialised(l.params)) {
#if ROPEKV_SIM_SPECIALISED
          ropekv_gpu::rk_v4_visit_q_style(l.params, [&](auto q, auto neox) {
            sim_launch_fast_part<decltype(q)::value, decltype(neox)::value>(l, config_);
          });
#endif
        } else {
          sim_launch_fast<ropekv_gpu::rk_v4_generic>(l, config_);
        }
        break;
      case ropekv_gpu::rk_kernel::fused:
        sim_launch_fused(l, config_);
        break;
      default:
        throw error("sim: unknown rk_kernel " + std::to_string(static_cast<int>(l.kernel)));
    }
  }
  std::string last_variant() const override { return variant_; }
  std::string device_description() const override {
    return std::string("sim: HIP kernel body on the CPU (OpenMP over blocks; fmaf: ") +
           (config_.fma ? "FMA instruction" : "libm") +
           (config_.wave_lanes ? "; threads in " + std::to_string(config_.wave_lanes) + "-lane waves, lanes reversed)" : ")");
  }

 private:
  std::string variant_;
  const sim_config config_ = [] {
    sim_config c;
    c.fma = sim_use_fma();
    c.pin = sim_use_pins(c.fma);
    c.wave_lanes = sim_wave_lanes();
    return c;
  }();
};

}  // namespace

int64_t sim_pinned_launches() { return sim_detail::g_pinned_launches.load(std::memory_order_relaxed); }

bool sim_specialised() { return ROPEKV_SIM_SPECIALISED != 0; }

std::unique_ptr<backend> make_sim_backend() { return std::make_unique<sim_backend>(); }

}  // namespace ropekv
