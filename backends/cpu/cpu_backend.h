// The reference backend: Eigen + OpenMP, plain and obviously right. Implements core/SPEC.md
// literally; it is the oracle every other backend is judged by and the source of golden data.
#pragma once
#include <cstdint>
#include <memory>

#include "core/backend.h"

namespace ropekv {

std::unique_ptr<backend> make_cpu_backend();

// Runs the reference on host views (validates first; a failed call writes nothing).
void reference_run(const op_args& args);

// Rounds v once into float dtype t (nearest even; saturating for fp8, ieee otherwise), as the
// reference rounds rope values: through core's encode_row_from_f64, which must equal
// encode_from_f64. Exposed so tests can check it against encode_from_f64.
uint32_t reference_round_f64(dtype t, double v);

}  // namespace ropekv
