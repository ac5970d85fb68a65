// The reference backend: Eigen + OpenMP, plain and obviously right. Implements core/SPEC.md
// literally; it is the oracle every other backend is judged by and the source of golden data.
#pragma once
#include <memory>

#include "core/backend.h"

namespace ropekv {

std::unique_ptr<backend> make_cpu_backend();

// Runs the reference on host views (validates first; a failed call writes nothing).
void reference_run(const op_args& args);

}  // namespace ropekv
