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

}  // namespace ropekv
