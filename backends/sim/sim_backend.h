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

}  // namespace ropekv
