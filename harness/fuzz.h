// The differential engine behind `ropekv fuzz`, `ropekv golden check` and the Python package's
// `ropekv.fuzz`: runs one problem on two backends from identical poisoned inputs, compares
// (core/compare.h), shrinks failures, and produces the JSON report (docs/report-schema.json).
// It knows the backend interface only: the caller hands it factories (tools/backends_registry.h
// resolves the CLI's names; the Python package wraps a user's callable).
#pragma once
#include <cstdint>
#include <map>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/backend.h"
#include "core/compare.h"
#include "core/problem.h"

namespace ropekv {

// Which random problems the campaign draws (`--profile`): `any` is random_problem(seed, i), the
// whole option space; `aligned16` is coerce_aligned16(random_problem(seed, i)), the domain of
// the GPU fast paths (16-bit q/kv, same-dtype q_out, 16-byte aligned rows, no in-place rope).
enum class fuzz_profile : uint8_t { any, aligned16 };
const char* fuzz_profile_name(fuzz_profile p);
// Parses a --profile value; throws arg_error("--profile", "one of any, aligned16", got).
fuzz_profile parse_fuzz_profile(const std::string& text);

// Case i of a campaign of this profile. Throws arg_error when the profile's coercion of
// random_problem(seed, i) breaks a problem constraint (run_fuzz counts the case as SKIPPED).
// `pins` (`--pin`, "key=value ..." in repro syntax, "" for none) then override those keys of the
// drawn problem (pin_problem, core/problem.h) after the profile's coercion.
problem profile_problem(fuzz_profile profile, uint64_t seed, uint64_t case_index, int64_t max_tokens,
                        const std::string& pins = "");

struct fuzz_options {
  std::string backend_a = "ref";       // the reference side (its name in reports)
  std::string backend_b = "sim";       // the backend under test
  backend_factory factory_a, factory_b;  // required (run_fuzz throws when empty)
  uint64_t seed = 1;
  int64_t cases = -1;                  // total case stream length; -1: bounded by time only
  double time_limit_s = 0;             // 0: none
  int64_t max_tokens = 256;
  fuzz_profile profile = fuzz_profile::any;  // the random stream; shrinking stays in the profile
  compare_options cmp;
  std::optional<problem> repro;        // replay exactly this problem (one case)
  int64_t shard_index = 0, shard_count = 1;  // case i runs on shard i % shard_count
  std::string dump_dir;                // write each failure as a golden case here
  bool shrink = true;
  double shrink_time_s = 30;           // per failing case
  int64_t max_reported = 50;           // non-passed cases kept in the report (counts are exact)
  int64_t max_failures = 0;            // stop after this many FAILED/ERRORED cases (0: never)
  std::string variant;                 // kernel variant (`--variant`): run_fuzz applies it
                                       // through apply_variant; "" leaves the process's overrides
                                       // as they are. In replay lines and the report's config.
  std::function<void(const std::string&)> apply_variant;  // required when variant is set
  std::string pins;                    // `--pin`: keys every drawn problem keeps (repro syntax)
  bool isolate = false;                // `--isolate`: backend b runs in a forked child per call
                                       // (harness/isolate.h); a crash is an ERRORED case
  std::function<bool()> stop_requested;  // asked before each case: true stops the campaign
                                         // (SIGINT/SIGTERM in the CLI); the summary and report
                                         // then say "interrupted"
  int64_t max_memory_bytes = INT64_MAX;  // `--max-memory`: a drawn case whose budget
  std::string max_memory_source;         // (core/memory_budget.h) exceeds it is SKIPPED
  std::string replay_prefix;           // replay lines start with this instead of
                                       // "ropekv fuzz --backends A,B" (e.g. the Python CLI's)
};

struct case_record {
  int64_t index = -1;                  // case index in the stream; -1 for a --repro replay
  case_report report;
  std::string replay;                  // `ropekv fuzz --backends A,B --repro '...'`
  std::string shrunk_repro, shrunk_replay;
  int64_t shrink_steps = 0, shrink_tries = 0;
  std::string variant_b;
  double seconds_b = 0;
  std::string dumped_to;
};

struct fuzz_counts {
  int64_t passed = 0, failed = 0, errored = 0, skipped = 0, mistrusted = 0;
  int64_t total() const { return passed + failed + errored + skipped + mistrusted; }
};

struct fuzz_summary {
  fuzz_counts counts;
  std::vector<case_record> notable;            // non-passed cases (up to max_reported)
  std::map<std::string, int64_t> skip_reasons;
  std::map<std::string, int64_t> variants;     // backend b's kernel family ("fast_v4", ...) -> cases it ran
  // identified rope regions (cmp.identify_always, `--identify`): numerics_identity -> regions
  std::map<std::string, int64_t> numerics;
  int64_t cases_run = 0;
  int64_t next_index = 0;                      // first case index not looked at
  double elapsed_s = 0;
  bool interrupted = false;                    // stopped by stop_requested before its end
};

// Runs `prob` on backends a and b (each on its own clone of the poisoned case) and compares.
// Never throws for a backend failure (ERRORED) or an unsupported case (SKIPPED). When out_a /
// out_b are given they receive the runs (for --dump).
case_record run_case(const problem& prob, backend& a, backend& b, const compare_options& cmp,
                     case_data* out_initial = nullptr, case_data* out_a = nullptr,
                     case_data* out_b = nullptr);

// Compares `got` (a clone of `initial` into which a kernel that ran elsewhere wrote its outputs)
// with what `ref` writes from `initial`: the report of run_case with run b supplied. Throws what
// ref throws (arg_error for args it rejects).
case_report compare_with_reference(const case_data& initial, const case_data& got, backend& ref,
                                   const compare_options& cmp);

// Greedy shrinking: tries smaller / simpler variants of `prob` (fewer tokens, heads, blocks,
// smaller dn/dr, no padding, separate kv, token-major q, ...) and keeps each that still ends
// with the same outcome (FAILED or ERRORED). Returns the smallest found. Under a profile other
// than `any` every candidate is re-coerced into the profile (a candidate the coercion rejects is
// not tried), so the shrunk case is still one the profile draws. `on_try`, when set, is called
// before each candidate runs with the smallest problem so far and the steps and tries so far
// (run_fuzz prints its progress lines from it).
using shrink_progress_fn = std::function<void(const problem& current, int64_t steps, int64_t tries)>;
problem shrink_problem(const problem& prob, case_outcome outcome, backend& a, backend& b,
                       const compare_options& cmp, double time_limit_s, int64_t* steps,
                       int64_t* tries, fuzz_profile profile = fuzz_profile::any,
                       const std::string& pins = "", const shrink_progress_fn& on_try = nullptr);

// `ropekv fuzz --backends A,B [--max-ulp N] [--strict] [--numerics M] [--profile P] --repro '<repro>'` (the
// repro replays exactly; --profile only keeps a shrink of the replay inside the profile)
std::string replay_command(const fuzz_options& opt, const std::string& repro);

// Runs the campaign. Prints failure reports to `out` and ends with the closing line
// "N passed, N failed[, N skipped][, N mistrusted]". Progress: an updating line on `out` when
// `tty`; otherwise a "progress: ..." line per interval (harness/progress.h), and while a failure
// is shrunk a "shrinking case N: ..." line per interval, both to `progress` (the CLI: stderr),
// or to `out` when it is null.
fuzz_summary run_fuzz(const fuzz_options& opt, std::ostream& out, bool tty, std::ostream* progress = nullptr);

// The closing line.
std::string summary_line(const fuzz_counts& c);

// JSON report (docs/report-schema.json).
nlohmann::json fuzz_report_json(const fuzz_options& opt, const fuzz_summary& s);
nlohmann::json case_record_json(const case_record& r);
// One region of a case report (the report's `regions` items); also the Python package's.
nlohmann::json region_report_json(const region_report& g);

struct merge_options {
  // Each report's name in error messages (its file); "report N" (1-based) where absent.
  std::vector<std::string> names;
  // Reports marked "interrupted": true (a campaign stopped by a signal) are refused unless set;
  // the merged report is then marked interrupted too.
  bool allow_interrupted = false;
  // The cap on listed cases per shard the reports were written with (fuzz_options::max_reported).
  int64_t max_reported = fuzz_options{}.max_reported;
};

// The merge of the shard reports of one campaign. Every report is checked first, and anything
// that no run of the campaign can have written is an arg_error naming the report:
// - not a fuzz report, a config or contract_version unlike the first report's, "interrupted"
//   (unless allow_interrupted);
// - counts that are not integers in 0..2^63-1, a total that is not their sum (sums are 64-bit
//   checked: an overflow is an error), a total unlike the sum of the shards' cases_run;
// - shard entries: next_case not the one after cases_run cases of the shard (case i runs on shard
//   i % N); with a fixed case count, cases_run unlike the shard's share of it, unless the campaign
//   could stop early (a time limit; interrupted; config.max_failures, whose shards stop at exactly
//   that many FAILED/ERRORED cases);
// - listed cases (`cases`): an index not on one of the report's shards or below its next_case, a
//   case listed twice, a passed case, more than max_reported per shard, more cases of an outcome
//   than its count, or (when no shard reached the cap, so every non-passed case is listed) fewer;
// - skip_reasons not summing to counts.skipped;
// and then together: shards of different counts N, a shard twice, or shards 0..N-1 not all there.
// The merged report has the first report's config, the shards sorted by index, the cases sorted by
// index, summed counts, skip_reasons, variants and numerics, and "interrupted" (any report's).
nlohmann::json merge_reports(const std::vector<nlohmann::json>& reports, const merge_options& opt = {});
// A report's counts, checked as merge_reports checks them (arg_error naming `name`).
fuzz_counts counts_of_report(const nlohmann::json& report, const std::string& name = "report");

}  // namespace ropekv
