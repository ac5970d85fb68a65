// One case in memory: host buffers (with guards) built from a problem, the op_args views into
// them, inputs filled from the counter-based RNG, outputs and caches poisoned.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/op.h"
#include "core/problem.h"
#include "core/tensor.h"

namespace ropekv {

// Buffer names, in a fixed order; each owns one host_buffer. With kv_storage::fused, "kv"
// holds both kv_c and k_pe; with table one "cos_sin", with table two "cos" and "sin"; with
// layout joint "cache", with split "ckv_cache" and "kpe_cache"; with scales=tensor "k_scale" and
// "q_scale" ([1] f32 each; the args' float scales are then NaN, never to be read).
struct case_data {
  problem prob;
  std::map<std::string, host_buffer> buffers;
  op_args args;  // views into buffers

  case_data() = default;
  case_data(case_data&&) = default;
  case_data& operator=(case_data&&) = default;
  case_data(const case_data&) = delete;  // views point into buffers: copy with clone()
  case_data& operator=(const case_data&) = delete;

  // Every buffer as a region (guards included), for backend::run_host.
  std::vector<memory_region> regions();
  // A deep copy (same bytes, views rebased into the copy).
  case_data clone() const;
};

// Builds the case: allocates, fills inputs deterministically from prob.seed, poisons q_out and
// the cache(s). Throws arg_error if the problem is inconsistent.
case_data make_case(const problem& prob);

}  // namespace ropekv
