// The differential engine behind `ropekv fuzz` and `ropekv golden check`: runs one problem on
// two backends from identical poisoned inputs, compares (core/compare.h), shrinks failures,
// and produces the JSON report (docs/report-schema.json).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/backend.h"
#include "core/compare.h"
#include "core/problem.h"

namespace ropekv {

struct fuzz_options {
  std::string backend_a = "ref";       // the reference side
  std::string backend_b = "sim";       // the backend under test
  backend_factory factory_a, factory_b;  // when empty, resolved from the names (tools registry)
  uint64_t seed = 1;
  int64_t cases = -1;                  // total case stream length; -1: bounded by time only
  double time_limit_s = 0;             // 0: none
  int64_t max_tokens = 256;
  compare_options cmp;
  std::optional<problem> repro;        // replay exactly this problem (one case)
  int64_t shard_index = 0, shard_count = 1;  // case i runs on shard i % shard_count
  std::string dump_dir;                // write each failure as a golden case here
  bool shrink = true;
  double shrink_time_s = 30;           // per failing case
  int64_t max_reported = 50;           // non-passed cases kept in the report (counts are exact)
  int64_t max_failures = 0;            // stop after this many FAILED/ERRORED cases (0: never)
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
  int64_t cases_run = 0;
  int64_t next_index = 0;                      // first case index not looked at
  double elapsed_s = 0;
};

// Runs `prob` on backends a and b (each on its own clone of the poisoned case) and compares.
// Never throws for a backend failure (ERRORED) or an unsupported case (SKIPPED). When out_a /
// out_b are given they receive the runs (for --dump).
case_record run_case(const problem& prob, backend& a, backend& b, const compare_options& cmp,
                     case_data* out_initial = nullptr, case_data* out_a = nullptr,
                     case_data* out_b = nullptr);

// Greedy shrinking: tries smaller / simpler variants of `prob` (fewer tokens, heads, blocks,
// smaller dn/dr, no padding, separate kv, token-major q, ...) and keeps each that still ends
// with the same outcome (FAILED or ERRORED). Returns the smallest found.
problem shrink_problem(const problem& prob, case_outcome outcome, backend& a, backend& b,
                       const compare_options& cmp, double time_limit_s, int64_t* steps,
                       int64_t* tries);

// `ropekv fuzz --backends A,B [--max-ulp N] [--strict] --repro '<repro>'`
std::string replay_command(const fuzz_options& opt, const std::string& repro);

// Runs the campaign. Prints failure reports and progress to `out` (an updating line when `tty`)
// and ends with the closing line "N passed, N failed[, N skipped][, N mistrusted]".
fuzz_summary run_fuzz(const fuzz_options& opt, std::ostream& out, bool tty);

// The closing line.
std::string summary_line(const fuzz_counts& c);

// JSON report (docs/report-schema.json) and the merge of shard reports. merge throws arg_error
// when the reports are of different campaigns or a shard appears twice.
nlohmann::json fuzz_report_json(const fuzz_options& opt, const fuzz_summary& s);
nlohmann::json case_record_json(const case_record& r);
nlohmann::json merge_reports(const std::vector<nlohmann::json>& reports);
fuzz_counts counts_of_report(const nlohmann::json& report);

}  // namespace ropekv
