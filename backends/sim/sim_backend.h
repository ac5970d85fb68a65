// The GPU kernels of backends/hip compiled as host C++ and run over a simulated grid.
#pragma once
#include <cstdint>
#include <memory>

#include "core/backend.h"

namespace ropekv {

std::unique_ptr<backend> make_sim_backend();

// How many launches in this process ran a pinned grid loop (sim_backend.cpp: launch parameters
// held as compile-time constants); for tests.
int64_t sim_pinned_launches();

// Whether this build runs fast_v4 in the dtype-specialised instantiations the GPU
// launches (launch_plan.h rk_v4_visit); false in sanitizer builds, which run every fast launch
// in the generic instantiation (the same body with its dtypes read at run time; see
// backends/sim/CMakeLists.txt).
bool sim_specialised();

// The sim's thread order within a block (ROPEKV_SIM_WAVE): the k-th thread run of a block of n
// threads. wave_lanes 0: thread k; 32 or 64 (NVIDIA's and AMD's wavefront widths): wave by
// wave, each wave's lanes from the last to the first (at 64 the two 32-lane groups of a wave
// also swap). n when k names a lane past the block's end (a partial last wave: skipped). The
// kernel has no cooperation between threads, so every order must write the same bytes.
// (wave_lanes a power of two: reversing each wave is k ^ (wave_lanes - 1), no division.)
inline uint32_t sim_thread_at(uint32_t k, uint32_t n, uint32_t wave_lanes) {
  const uint32_t th = wave_lanes == 0 ? k : k ^ (wave_lanes - 1);
  return th < n ? th : n;
}

}  // namespace ropekv
