// Comparison of two runs of the same case (core/SPEC.md "Numerics"): region by region, with
// the exact rule for data movement, untouched bytes, guards and inputs, and the ULP rule plus
// fp32-evaluation allowance for rope elements. Used by `ropekv fuzz` and `ropekv golden check`.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/case_data.h"
#include "core/numerics.h"
#include "core/op.h"

namespace ropekv {

struct compare_options {
  int64_t max_ulp = 1;          // rope elements: pass when ulp distance <= max_ulp ...
  bool strict = false;          // ... or within max_ulp * ulp(ref) + allowance (none if strict)
  bool bitwise = false;         // rope elements too must be bit-identical (sim vs GPU faithfulness)
  int64_t max_listed = 8;       // mismatches listed per region
  // Rope elements pass within this model's bound (core/SPEC.md "Numerics models").
  numerics_model numerics = numerics_model::fp32;
  // Rope regions say which models their values match bit for bit and which bounds they meet:
  // always when set, else every rope region of a case with a failing rope region (compared
  // twice then: the emulation of every model costs more than the comparison).
  bool identify_always = false;
};

// ULP histogram buckets: 0, 1, 2, 3-4, 5-8, ..., 513-1024, >1024, NaN-mismatch (NaN vs number,
// inf vs anything else, or, in a byte region, a differing byte).
inline constexpr int ulp_bucket_count = 14;
const char* ulp_bucket_label(int bucket);  // "0", "1", "2", "3-4", ..., ">1024", "nan"
int ulp_bucket_of(int64_t ulp_distance);

enum class region_rule : uint8_t {
  exact,  // element bits must be identical (data movement: nope parts)
  rope,   // ULP rule + allowance (core/SPEC.md)
  bytes,  // raw bytes must equal the initial bytes (untouched, inputs, guards)
};
const char* region_rule_name(region_rule r);

struct mismatch {
  std::string where;        // named coordinates: "token=3 head=7 dim=540" / "block=2 entry=5 feature=12 (slot 133, token 4)" / "byte=1234"
  std::string run;          // which run holds the bad value: "b" (the tested one) or "a"
  double expected = 0, got = 0;
  uint64_t expected_bits = 0, got_bits = 0;
  int64_t ulp = 0;          // ulp_distance_nan for NaN/inf mismatch or a byte region
  double allowance = 0;     // fp32-evaluation allowance of this element (rope regions)
};

// compare_options from the user's flags (CLI and Python alike); an error names the flag as the
// caller spells it ("--max-ulp" / "max_ulp", "--numerics" / "numerics").
compare_options make_compare_options(int64_t max_ulp, bool strict, bool bitwise, std::string_view numerics,
                                     bool identify_always, const char* max_ulp_arg, const char* numerics_arg);

// One numerics model against the values of a rope region.
struct numerics_check {
  numerics_model model = numerics_model::fp32;
  dtype operand = dtype::f32;  // the model's operand dtype T for this region's dtypes
  int64_t differ = 0;    // elements whose bits differ from the model's emulation (NaN == NaN)
  int64_t outside = 0;   // elements outside the model's bound (from the reference value)
  int64_t max_ulp_to_model = 0;  // largest ULP distance to the emulation (ulp_distance_nan: NaN)
};

struct region_report {
  std::string name;         // "q_out.nope", "q_out.rope", "cache.rope", "cache.untouched", ...
  region_rule rule = region_rule::exact;
  std::string dtype_name;   // element dtype ("u8" for byte regions)
  int64_t compared = 0;     // elements (bytes for byte regions)
  int64_t mismatches = 0;
  int64_t max_ulp = 0;      // over compared elements; ulp_distance_nan if any NaN mismatch
  int64_t needed_allowance = 0;  // rope elements that passed only thanks to the allowance
  std::array<int64_t, ulp_bucket_count> histogram{};
  std::vector<mismatch> first;   // the first compare_options::max_listed mismatches
  // Elements of a region that must be written which hold poison / zero in both runs.
  int64_t poison_both = 0, zero_both = 0, zero_inputs = 0;
  bool mistrusted = false;
  std::string mistrust_reason;
  // Rope regions that were identified: one entry per model, in all_numerics_models order.
  std::vector<numerics_check> numerics;
};
// "exactly operand-products; within operand-products, operand-dtype; outside fp32 (311 of 2048)"
std::string numerics_summary(const region_report& r);
// "fp32", or the model with its operand dtype: "operand-products[bf16]".
std::string numerics_check_name(const numerics_check& c);
// The region's identity in one phrase, fp32 first: "exactly fp32"; "within fp32" (plus
// ", exactly operand-products[f32]" when another model matches bit for bit: an fp32 kernel that
// rounds R(x)*S to f32 before its fma); else "exactly <model>" or "within <tightest model>";
// else "outside every model"; "" if not identified.
std::string numerics_identity(const region_report& r);

enum class case_outcome : uint8_t { passed, failed, errored, skipped, mistrusted };
const char* outcome_name(case_outcome o);  // "PASSED", "FAILED", ...

struct case_report {
  std::string repro;
  case_outcome outcome = case_outcome::passed;
  std::string message;      // errored: what the backend threw; skipped: the reason; failed: a summary
  std::vector<region_report> regions;
  // What format_case_report calls the two runs' values ("reference" / "yours" for golden compare).
  std::string expected_label = "expected", got_label = "got";
};

// Compares run `b` (the tested backend's) against run `a` (the reference's). `initial` is the
// case before either run (poisoned outputs, inputs): untouched bytes, inputs and guards of both
// runs must equal it; in-place q_pe / k_pe and written outputs are compared between a and b.
// All three must come from make_case of the same problem (same buffer sizes).
// Outcome: failed if any region has a mismatch, else mistrusted if a written region is >= 90%
// poison in both runs, or >= 90% zero in both while < 90% of its inputs are zero, else passed.
case_report compare_runs(const case_data& initial, const case_data& a, const case_data& b,
                         const compare_options& opt);

// Operands of one rope element: the output is x*c + partner*s (partner = R(x): -b for the first
// element of a pair, a for the second). Read from host views (before any in-place write).
struct rope_operands {
  double x, partner, c, s;
};
// q_pe[t, h, j] and k_pe[t, j]; positions are clamped when options.positions == clamp.
rope_operands q_rope_operands(const op_args& args, int64_t t, int64_t h, int64_t j);
rope_operands k_rope_operands(const op_args& args, int64_t t, int64_t j);

// The element of model arithmetic an output of dtype `out` holds (core/numerics.h).
rope_element rope_element_of(const op_args& args, const rope_operands& o, dtype in, dtype out,
                             float scale);

// The rope rule for one element of dtype t: true when it passes. Sets *ulp and *used_allowance.
bool rope_element_passes(dtype t, uint32_t ref_bits, uint32_t got_bits, double allowance,
                         const compare_options& opt, int64_t* ulp, bool* used_allowance);

// One line per region with a problem, plus a header line: what `fuzz` and `golden check` print.
std::string format_case_report(const case_report& r, bool verbose);

}  // namespace ropekv
