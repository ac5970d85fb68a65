// Validation of one call against core/SPEC.md. Every rule of the "Errors" section is checked
// here, before any backend writes a byte. Throws arg_error naming the argument.
#pragma once
#include "core/op.h"

namespace ropekv {

// Checks shapes, dtypes, strides, overlaps, scales. Reads positions and slot_mapping values
// (they must be in host memory: views with on_device == false) unless `check_values` is false.
void validate(const op_args& args, bool check_values = true);

}  // namespace ropekv
