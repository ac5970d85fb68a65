#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace ropekv {
// Runs the CLI; returns the process exit code (0 ok, 1 test failure, 2 bad usage/input).
int cli_main(int argc, char** argv);
// Same, from a vector of arguments (argv[0] excluded), for in-process tests.
int cli_main(const std::vector<std::string>& args);
// Same, printing to the given streams (never a terminal: no progress line).
int cli_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// Parses "60s", "5m", "1h", "90" (seconds) -> seconds; throws arg_error naming `arg`.
double parse_duration_s(const std::string& text, const char* arg);
// Parses "K/N" or "auto/N" (SLURM_ARRAY_TASK_ID minus SLURM_ARRAY_TASK_MIN, or
// JOB_COMPLETION_INDEX); throws arg_error("--shard", ...).
void parse_shard(const std::string& text, int64_t* index, int64_t* count);
}  // namespace ropekv
