// The sim's grid loops (internal to backends/sim): the kernel entries as types, the pins, the
// OpenMP grid loop and its FMA copy, the fast_v4 launch of an instantiation S. Included
// by sim_backend.cpp and by the translation units that compile the specialised instantiations.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backends/hip/kernel.h"
#include "backends/hip/launch_plan.h"
#include "backends/sim/sim_backend.h"
#include "core/error.h"

#ifndef ROPEKV_SIM
#error "backends/sim must be compiled with ROPEKV_SIM defined"
#endif

// x86-64 without -mfma: a second copy of the grid loop for CPUs with FMA (sim_blocks_fma).
// Sanitizer builds (ROPEKV_SIM_NO_FMA_CLONE) keep one copy: half the compile time there.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__FMA__) && !defined(ROPEKV_SIM_NO_FMA_CLONE)
#define ROPEKV_SIM_FMA_CLONE 1
#else
#define ROPEKV_SIM_FMA_CLONE 0
#endif

// 1: fast launches run the dtype-specialised instantiation the GPU would launch; 0: the generic
// one (the same body, dtypes read at run time), which sanitizer builds use (CMakeLists.txt).
#ifndef ROPEKV_SIM_SPECIALISED
#define ROPEKV_SIM_SPECIALISED 1
#endif

namespace ropekv {
namespace sim_detail {

// The kernel entries, as types: Kernel::run(p) is one (block, thread) execution of the body.
template <class S, int R, int D>
struct sim_fast4 {
  static inline __attribute__((always_inline)) void run(const ropekv_gpu::rk_params& p) {
    ropekv_gpu::rk_fast4_body<S, R, D>(p);
  }
};
struct sim_fused {
  static inline __attribute__((always_inline)) void run(const ropekv_gpu::rk_params& p) {
    ropekv_gpu::rk_fused_body(p);
  }
};

// Pins: launch parameters the grid loop may hold as compile-time constants. A pin is used for a
// launch only when every field it fixes already has that value (matches); it then writes those
// same values into the loop's copy of the parameters (apply). The kernel body executes the same
// operations on the same values: the compiler only sees them as constants (fixed trip counts
// for the nope-chunk loops, no tests of flags that cannot change). pin_none fixes nothing.
// Measured (1 thread, deepseek-v3-tp8:4096 bf16 copy, medians of 15): 25.4 -> 21.0 ms.
struct pin_none {
  static bool matches(const ropekv_gpu::rk_params&) { return true; }
  static inline __attribute__((always_inline)) void apply(ropekv_gpu::rk_params&) {}
};
// The MLA shape of DeepSeek V3 and Kimi K2 (Dn 512, Dr 64) on fast_v4 in copy mode (32 lanes
// per q row), 64-bit positions and slot_mapping (vLLM's), Units rope units per row (gptj 8,
// neox 4). Pinning more fields (pad_q, the cache split) measured 10% slower: code layout.
template <int32_t Units>
struct pin_mla {
  static bool matches(const ropekv_gpu::rk_params& p) {
    return p.dn == 512 && p.dr == 64 && p.v4_nope_chunks == 64 && p.v4_units == Units &&
           p.skip_q_nope == 0 && p.v4_q_lanes_log2 == 5 && p.positions_i64 == 1 &&
           p.slots_i64 == 1;
  }
  static inline __attribute__((always_inline)) void apply(ropekv_gpu::rk_params& p) {
    p.dn = 512;
    p.dr = 64;
    p.v4_nope_chunks = 64;
    p.v4_units = Units;
    p.skip_q_nope = 0;
    p.v4_q_lanes_log2 = 5;
    p.positions_i64 = 1;
    p.slots_i64 = 1;
  }
};

// How the sim runs a launch: the FMA copy of the loops or the portable one, pinned loops allowed,
// and the order of the threads of a block. wave_lanes 0: thread 0, 1, 2, ... one after another;
// 32 or 64: wave by wave (a wavefront of that many lanes: NVIDIA's 32, AMD's 64), the lanes of
// each wave from the last to the first, so that at 64 the two 32-lane groups of a wave run in
// the other order as well. The kernel has no cooperation between threads, so every order must
// give the same bytes (ROPEKV_SIM_WAVE; tests/cpp/test_sim_waves.cpp).
struct sim_config {
  bool fma = false;
  bool pin = false;
  uint32_t wave_lanes = 0;
};

// Launches that took a pinned loop (sim_pinned_launches), counted across the translation units.
inline std::atomic<int64_t> g_pinned_launches{0};

// One OpenMP thread's share of the grid (an orphaned `omp for`: called inside the parallel
// region): every thread of each of its blocks runs the body. The index variables are
// thread_local (gpu_compat.h): blockIdx is set once per block, threadIdx once per kernel
// thread. The body is inlined into the thread loop, on a copy of the parameters that nothing
// else can reach (so the compiler need not reload its fields after every store the body makes).
template <class Kernel, class Pin>
inline __attribute__((always_inline)) void sim_blocks_impl(const ropekv_gpu::rk_launch& l, uint32_t wave_lanes) {
  ropekv_gpu::rk_params p = l.params;
  Pin::apply(p);
  const int64_t blocks = static_cast<int64_t>(l.grid_x) * l.grid_y;
  const uint32_t grid_x = l.grid_x, block_threads = l.block_threads;
  // the run order of sim_thread_at over the block's threads rounded up to whole waves (a partial
  // last wave skips the lanes past the block)
  const uint32_t slots = wave_lanes == 0 ? block_threads : (block_threads + wave_lanes - 1) & ~(wave_lanes - 1);
#pragma omp for schedule(dynamic, 16) nowait
  for (int64_t b = 0; b < blocks; ++b) {
    blockIdx = {static_cast<uint32_t>(b % grid_x), static_cast<uint32_t>(b / grid_x), 0};
    for (uint32_t k = 0; k < slots; ++k) {
      const uint32_t th = sim_thread_at(k, block_threads, wave_lanes);
      if (th >= block_threads) continue;
      threadIdx = {th, 0, 0};
      Kernel::run(p);
    }
  }
  rk_sim_store_fence();
}

template <class Kernel, class Pin>
void sim_blocks(const ropekv_gpu::rk_launch& l, uint32_t wave_lanes) {
  sim_blocks_impl<Kernel, Pin>(l, wave_lanes);
}

// The same code compiled for CPUs with an FMA unit: the kernel's fmaf (ROPEKV_FMAF, std::fmaf,
// correctly rounded everywhere) becomes one instruction instead of a libm call. Nothing else
// changes what is computed: the sim stays -ffp-contract=off, without -ffast-math, so every
// other multiply and add is still its own IEEE operation. (Built for x86-64-v3 instead: within
// noise, 21.0 vs 20.6-21.5 ms.)
#if ROPEKV_SIM_FMA_CLONE
template <class Kernel, class Pin>
__attribute__((target("fma"))) void sim_blocks_fma(const ropekv_gpu::rk_launch& l, uint32_t wave_lanes) {
  sim_blocks_impl<Kernel, Pin>(l, wave_lanes);
}
#endif

// Runs Kernel::run once per (block, thread) of the launch's grid: OpenMP over blocks, the
// threads of a block one after another (any order is valid: the kernel has no intra-block
// cooperation).
// Pinned loops exist only in the copy that runs by default (the FMA copy where there is one),
// so the portable copy (ROPEKV_SIM_FMA=0) always runs unpinned. Portable = false: no portable
// copy of this kernel is compiled (the dtype-specialised fast instantiations: where the build
// has an FMA copy, the portable copy runs the generic instantiation instead; sim_backend.cpp).
template <class Kernel, class Pin = pin_none, bool Portable = true>
void sim_grid(const ropekv_gpu::rk_launch& l, const sim_config& c) {
  const uint32_t wave = c.wave_lanes;
#if ROPEKV_SIM_FMA_CLONE
  if (!c.fma && !(Portable && std::is_same_v<Pin, pin_none>))
    throw error("sim_grid: no portable (non-FMA) copy of this loop");
#pragma omp parallel
  {
    gridDim = {l.grid_x, l.grid_y, 1};
    blockDim = {l.block_threads, 1, 1};
    if (c.fma) {
      sim_blocks_fma<Kernel, Pin>(l, wave);
    } else if constexpr (Portable && std::is_same_v<Pin, pin_none>) {
      sim_blocks<Kernel, pin_none>(l, wave);
    }
  }
#else
#pragma omp parallel
  {
    gridDim = {l.grid_x, l.grid_y, 1};
    blockDim = {l.block_threads, 1, 1};
    sim_blocks<Kernel, Pin>(l, wave);
  }
#endif
}

// fast_v4 with R q rows per group: the pinned loop where the launch matches pin_mla (specialised
// instantiations only; `pin`: pins allowed and the default copy runs), else the plain one. With
// decode outputs (D = 1, rk_params::v4_decode) the plain loop only (compile time).
template <class S, int R, int D>
void sim_launch_fast4(const ropekv_gpu::rk_launch& l, const sim_config& c) {
  if constexpr ((S::neox == 0 || S::neox == 1) && D == 0) {
    using P = pin_mla<S::neox == 1 ? 4 : 8>;
    if (c.pin && P::matches(l.params)) {
      g_pinned_launches.fetch_add(1, std::memory_order_relaxed);
      sim_grid<sim_fast4<S, R, D>, P, false>(l, c);
      return;
    }
  }
  sim_grid<sim_fast4<S, R, D>, pin_none, std::is_same_v<S, ropekv_gpu::rk_v4_generic>>(l, c);
}

// fast_v4 with D: R by the q rows' shape (launch_plan.h rk_v4_visit_q_shape, as hip_backend's
// rk_fast4_pick_shape).
template <class S, int D>
void sim_launch_fast4_shape(const ropekv_gpu::rk_launch& l, const sim_config& c) {
  ropekv_gpu::rk_v4_visit_q_shape(l.params, [&](auto r) { sim_launch_fast4<S, decltype(r)::value, D>(l, c); });
}

// fast_v4: the instantiation S the GPU would launch (launch_plan.h rk_v4_visit).
template <class S>
void sim_launch_fast(const ropekv_gpu::rk_launch& l, const sim_config& c) {
  switch (l.kernel) {
    case ropekv_gpu::rk_kernel::fast4:
      if (l.params.ds_mla) {  // fp8_ds_mla entries: the instantiations the GPU has (hip_backend rk_fast4_pick)
        if constexpr (S::cache == ropekv_gpu::rk_e4m3fn || S::cache < 0) {
          if (l.params.v4_decode && S::cache < 0) {
            sim_launch_fast4_shape<S, 3>(l, c);
            break;
          }
          if (!l.params.v4_decode) {
            sim_launch_fast4_shape<S, 2>(l, c);
            break;
          }
        }
        throw error("sim_launch_fast: no fp8_ds_mla instantiation " + ropekv_gpu::rk_v4_spec_name(l.params));
      }
      if (l.params.v4_decode) {
        sim_launch_fast4_shape<S, 1>(l, c);
      } else {
        sim_launch_fast4_shape<S, 0>(l, c);
      }
      break;
    default:
      throw error("sim_launch_fast: not a fast_v4 launch (rk_kernel " +
                  std::to_string(static_cast<int>(l.kernel)) + ")");
  }
}

// The specialised fast instantiations with q dtype Q and style NEOX (a quarter of them), each
// quarter compiled in its own translation unit (sim_fast_<q>_<style>.cpp): with all of them in
// one, the sim was the build's longest step by far.
template <int32_t Q, int32_t NEOX>
void sim_launch_fast_part(const ropekv_gpu::rk_launch& l, const sim_config& c) {
  ropekv_gpu::rk_v4_visit_cache<Q, NEOX>(l.params, [&](auto spec) { sim_launch_fast<decltype(spec)>(l, c); });
}
extern template void sim_launch_fast_part<ropekv_gpu::rk_bf16, 0>(const ropekv_gpu::rk_launch&, const sim_config&);
extern template void sim_launch_fast_part<ropekv_gpu::rk_bf16, 1>(const ropekv_gpu::rk_launch&, const sim_config&);
extern template void sim_launch_fast_part<ropekv_gpu::rk_f16, 0>(const ropekv_gpu::rk_launch&, const sim_config&);
extern template void sim_launch_fast_part<ropekv_gpu::rk_f16, 1>(const ropekv_gpu::rk_launch&, const sim_config&);

}  // namespace sim_detail
}  // namespace ropekv
