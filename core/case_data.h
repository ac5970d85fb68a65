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
  // A copy for one run of the case: the buffers the op writes (is_output_buffer) are deep copies,
  // every other buffer shares this case's memory (host_buffer::share). An output this case
  // dropped (drop_poison_outputs) is made anew, poisoned and guarded as make_case makes it.
  case_data clone_outputs() const;
  // Frees the output buffers that only the op writes (q_out, caches, decode outputs; not in-place
  // q_pe / k_pe) while they hold exactly make_case's poison and guard pattern; compare_runs then
  // checks their untouched bytes against that pattern. Returns the names dropped.
  std::vector<std::string> drop_poison_outputs();
  std::map<std::string, size_t> dropped;  // name -> size_bytes of each dropped output buffer
  // Puts `b` (same sizes) in the place of buffer `name`; the views into it move with it.
  void replace_buffer(const std::string& name, host_buffer b);
};

// A 64-bit checksum of a buffer's raw bytes (guards included): shared inputs are checked after
// each run (a backend that writes into its inputs changes it).
uint64_t buffer_checksum(const host_buffer& b);

// One buffer make_case allocates: its name, its data bytes and the bytes its allocation takes
// (data, guards and alignment slack: host_buffer::allocation_bytes).
struct case_buffer_size {
  std::string name;
  int64_t data_bytes = 0;
  int64_t alloc_bytes = 0;
  bool output = false;  // is_output_buffer
};
// Every buffer make_case(prob) allocates, in buffer-name order, from the problem alone (nothing
// is allocated). Saturating arithmetic: a size past INT64_MAX stays INT64_MAX, never wraps.
std::vector<case_buffer_size> case_buffer_sizes(const problem& prob);
// Whether buffer `name` is written by the op: q_out, the cache(s), the decode outputs, and q_pe /
// k_pe (kv when fused) when rope is in place.
bool is_output_buffer(const problem& prob, const std::string& name);

// Builds the case: allocates, fills inputs deterministically from prob.seed, poisons q_out and
// the cache(s). Throws arg_error if the problem is inconsistent, ropekv::error naming the buffer
// when an allocation fails.
case_data make_case(const problem& prob);

// Turns a case into zero-copy concat (core/SPEC.md, repro key zero_copy): copies q_nope's rows
// into the first Dn columns of q_out, sets prob.zero_copy, drops the q_nope buffer and points
// args.q_nope at q_out (as make_case does for such a problem). Needs q_out's dtype == q_nope's
// (arg_error). Nothing to do for a zero-copy case.
void apply_zero_copy(case_data& c);

}  // namespace ropekv
