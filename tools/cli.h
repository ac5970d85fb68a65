#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
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

// Integer options take plain decimal digits in [lo, hi] only. (CLI11 alone reads "010" as octal,
// "0x10" as hex, "-1" into an unsigned option as its maximum, and clamps a seed of 26 digits.)
// The validator also strips leading zeros, so that CLI11's conversion reads the decimal value.
CLI::Validator decimal_in(int64_t lo, int64_t hi);
CLI::Validator decimal_u64();
// A text option that, when given, must not be empty (`--json ''` is a mistake, not "no report").
extern const CLI::Validator non_empty;
// Parses TEXT as a decimal integer in [lo, hi] (digits only, no sign, no exponent); arg_error
// naming `arg` (e.g. "--case") otherwise.
int64_t parse_decimal(const std::string& text, int64_t lo, int64_t hi, const std::string& arg);
// Parses a memory size (`--max-memory`): decimal digits, an optional fraction and unit (B, kB,
// KiB, MB, MiB, GB, GiB, TB, TiB), e.g. 512MiB, 41.2GiB, 1000000; 1 byte .. 2^62 bytes, rounded
// down to whole bytes. arg_error naming `arg` otherwise (no sign, exponent or hex).
int64_t parse_memory_size(const std::string& text, const std::string& arg);
// The limit of `--max-memory TEXT`: "auto" is default_memory_limit() (core/memory_budget.h: 80% of
// the memory available), anything else parse_memory_size.
struct memory_limit;
memory_limit memory_limit_of(const std::string& text);
// Adds `--max-memory SIZE` (default auto) bound to `text` to a command that builds cases.
void add_max_memory_option(CLI::App* cmd, std::string& text);
// "a,b,c" -> {a, b, c} (sep ','; '+' for variant parts); an empty item or an empty list is an
// arg_error naming `arg`.
std::vector<std::string> split_list(const std::string& text, char sep, const char* arg);
}  // namespace ropekv
