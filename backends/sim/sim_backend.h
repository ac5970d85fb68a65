// The GPU kernels of backends/hip compiled as host C++ and run over a simulated grid.
#pragma once
#include <memory>

#include "core/backend.h"

namespace ropekv {

std::unique_ptr<backend> make_sim_backend();

}  // namespace ropekv
