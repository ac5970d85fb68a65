// `ropekv`: info, run, fuzz, report merge, golden write/check/compare, bench.
#include "tools/cli.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/case_data.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/golden.h"
#include "core/memory_budget.h"
#include "core/op.h"
#include "core/presets.h"
#include "core/problem.h"
#include "tools/backends_registry.h"
#include "tools/bench.h"
#include "tools/fuzz_jobs.h"
#include "harness/fuzz.h"
#include "harness/golden_io.h"
#include "harness/progress.h"

namespace ropekv {

namespace {
// Digits only; true and the value (leading zeros dropped) when it fits in uint64.
bool decimal_digits(const std::string& text, uint64_t* value) {
  if (text.empty() || text.size() > 20) return false;
  uint64_t v = 0;
  for (char ch : text) {
    if (ch < '0' || ch > '9') return false;
    const uint64_t d = static_cast<uint64_t>(ch - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *value = v;
  return true;
}
}  // namespace

int64_t parse_decimal(const std::string& text, int64_t lo, int64_t hi, const std::string& arg) {
  uint64_t v = 0;
  if (!decimal_digits(text, &v) || v > static_cast<uint64_t>(INT64_MAX) || static_cast<int64_t>(v) < lo ||
      static_cast<int64_t>(v) > hi)
    throw arg_error(arg, fmt::format("a decimal integer in {}..{}", lo, hi), "'" + text + "'");
  return static_cast<int64_t>(v);
}

int64_t parse_memory_size(const std::string& text, const std::string& arg) {
  const auto bad = [&]() {
    return arg_error(arg,
                     "a size like 512MiB, 41.2GiB or 1000000 (bytes): decimal digits, an optional fraction and "
                     "unit (B, kB, KiB, MB, MiB, GB, GiB, TB, TiB), 1 byte .. 2^62 bytes",
                     "'" + text + "'");
  };
  size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  uint64_t whole = 0, frac = 0, frac_scale = 1;
  if (!decimal_digits(text.substr(0, i), &whole)) throw bad();
  if (i < text.size() && text[i] == '.') {
    const size_t start = ++i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    if (i == start || i - start > 18 || !decimal_digits(text.substr(start, i - start), &frac)) throw bad();
    for (size_t k = start; k < i; ++k) frac_scale *= 10;
  }
  static const std::pair<const char*, uint64_t> units[] = {
      {"", 1},           {"B", 1},           {"kB", 1000},          {"KiB", 1024},
      {"MB", 1000000},   {"MiB", 1u << 20},  {"GB", 1000000000},    {"GiB", uint64_t{1} << 30},
      {"TB", uint64_t{1000000000000}}, {"TiB", uint64_t{1} << 40}};
  const std::string unit = text.substr(i);
  const auto* u = std::find_if(std::begin(units), std::end(units), [&](const auto& x) { return unit == x.first; });
  if (u == std::end(units)) throw bad();
  // 128-bit: no digits and unit can wrap (a limit of 2^62 bytes is refused, not wrapped)
  const unsigned __int128 bytes = static_cast<unsigned __int128>(whole) * u->second +
                                  static_cast<unsigned __int128>(frac) * u->second / frac_scale;
  if (bytes < 1 || bytes > (static_cast<unsigned __int128>(1) << 62)) throw bad();
  return static_cast<int64_t>(bytes);
}

memory_limit memory_limit_of(const std::string& text) {
  if (text == "auto") return default_memory_limit();
  return memory_limit{parse_memory_size(text, "--max-memory"), "--max-memory"};
}

void add_max_memory_option(CLI::App* cmd, std::string& text) {
  cmd->add_option("--max-memory", text,
                  "Refuse a case whose buffers (with the copies this command keeps) need more than SIZE "
                  "(512MiB, 41.2GiB, bytes), checked before anything is allocated; auto: 80% of the "
                  "available memory (and of a cgroup's limit)")
      ->type_name("SIZE")
      ->capture_default_str();
}

CLI::Validator decimal_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        uint64_t v = 0;
        if (!decimal_digits(text, &v) || v > static_cast<uint64_t>(INT64_MAX) || static_cast<int64_t>(v) < lo ||
            static_cast<int64_t>(v) > hi)
          return fmt::format("expected a decimal integer in {}..{}, got '{}'", lo, hi, text);
        text = std::to_string(v);
        return {};
      },
      "", "decimal");
}

CLI::Validator decimal_u64() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        if (!decimal_digits(text, &v))
          return fmt::format("expected a decimal integer in 0..{}, got '{}'", UINT64_MAX, text);
        text = std::to_string(v);
        return {};
      },
      "", "decimal_u64");
}

const CLI::Validator non_empty(
    [](std::string& text) -> std::string { return text.empty() ? "expected a non-empty value, got ''" : ""; },
    "", "non_empty");

std::vector<std::string> split_list(const std::string& text, char sep, const char* arg) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(sep, start);
    std::string item = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (item.empty())
      throw arg_error(arg, fmt::format("a '{}'-separated list of non-empty items", sep), "'" + text + "'");
    out.push_back(std::move(item));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

double parse_duration_s(const std::string& text, const char* arg) {
  if (text.empty()) throw arg_error(arg, "a duration like 60s, 5m, 1h or 90", "''");
  double mult = 1;
  std::string num = text;
  switch (text.back()) {
    case 's': mult = 1; num.pop_back(); break;
    case 'm': mult = 60; num.pop_back(); break;
    case 'h': mult = 3600; num.pop_back(); break;
    default: break;
  }
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(num, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != num.size() || num.empty() || !(v > 0) || !std::isfinite(v * mult)) {  // inf, 1e308h
    throw arg_error(arg, "a positive duration like 60s, 5m, 1h or 90", "'" + text + "'");
  }
  return v * mult;
}

namespace {

// A shard number: decimal digits, at most 2^20 (no campaign has more shards).
int64_t parse_count(const std::string& s, const char* arg, const std::string& text) {
  uint64_t v = 0;
  if (!decimal_digits(s, &v) || v > (uint64_t{1} << 20))
    throw arg_error(arg, "K/N or auto/N with 0 <= K < N <= 1048576", "'" + text + "'");
  return static_cast<int64_t>(v);
}

}  // namespace

void parse_shard(const std::string& text, int64_t* index, int64_t* count) {
  auto slash = text.find('/');
  if (slash == std::string::npos) throw arg_error("--shard", "K/N or auto/N with 0 <= K < N", "'" + text + "'");
  std::string k = text.substr(0, slash), n = text.substr(slash + 1);
  *count = parse_count(n, "--shard", text);
  if (k == "auto") {
    const char* slurm = std::getenv("SLURM_ARRAY_TASK_ID");
    const char* k8s = std::getenv("JOB_COMPLETION_INDEX");
    if (slurm) {
      *index = parse_count(slurm, "--shard", std::string("SLURM_ARRAY_TASK_ID=") + slurm);
      if (const char* lo = std::getenv("SLURM_ARRAY_TASK_MIN")) {
        *index -= parse_count(lo, "--shard", std::string("SLURM_ARRAY_TASK_MIN=") + lo);
      }
    } else if (k8s) {
      *index = parse_count(k8s, "--shard", std::string("JOB_COMPLETION_INDEX=") + k8s);
    } else {
      throw arg_error("--shard", "SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX set for auto/N",
                      "neither is set");
    }
  } else {
    *index = parse_count(k, "--shard", text);
  }
  if (*count < 1 || *index >= *count) {
    throw arg_error("--shard", "K/N or auto/N with 0 <= K < N", fmt::format("{}/{}", *index, *count));
  }
}

namespace {

const char* const main_footer = R"(Examples:
  ropekv info                                   what is compiled in, which devices are seen
  ropekv run --preset deepseek-v3 --tokens 32   run the reference once, print what it wrote
  ropekv fuzz --backends ref,sim --time 60s     differential fuzzing, shrunk repro per failure
  ropekv fuzz --backends ref,sim --repro 'tq=3 ts=3 tk=3 h=1 ...'    replay one case
  ropekv golden write --preset kimi-k2 --tokens 4 --out kimi.safetensors
  ropekv golden check kimi.safetensors --backend sim

Exit codes: 0 ok, 1 test failures (FAILED or ERRORED cases), 2 bad usage or input.
The op contract: core/SPEC.md. Reading a report: docs/fuzz.md.)";

const char* const fuzz_footer = R"(Each case i is random_problem(seed, i): inputs, strides, layouts and options all derive
from (seed, i), so a printed repro replays the case exactly. A failing case is shrunk
(fewer tokens, heads, blocks; smaller dn/dr; no padding) and the shrunk repro printed.
--profile aligned16 draws coerce_aligned16(random_problem(seed, i)) instead (the GPU fast
paths' domain; shrinking stays in it); the "kernels:" line counts which kernel B ran.
The last stdout line is always "N passed, N failed" (", N skipped" when any).

Examples:
  ropekv fuzz --backends ref,sim --cases 2000 --seed 7
  ropekv fuzz --backends ref,hip --profile aligned16 --cases 10000 --max-tokens 64
  ropekv fuzz --time 10m --max-tokens 64 --json report.json --dump failures/
  ropekv fuzz --shard auto/16 --cases 100000 --json shard-$SLURM_ARRAY_TASK_ID.json
  ropekv report merge shard-*.json --json all.json
  ropekv fuzz --backends ref,hip --max-ulp 0 --strict --repro 'tq=1 ts=1 tk=1 h=8'
  ropekv fuzz --backends ref,hip --numerics operand-products --cases 1000
  ropekv fuzz --backends ref,sim --identify --cases 200

Rope elements pass when ulp <= --max-ulp, else when |got - ref| <= max_ulp * ulp(ref)
+ 2^-22 * (|x*C| + |R(x)*S|) / scale (the fp32 allowance; --strict drops it). Every
other byte (nope parts, untouched cache, padding, guards, inputs) must be bit-exact.
--numerics names the rope arithmetic the kernel claims and uses that model's bound:
fp32 (default), operand-products (each R(x)*S rounded to the operand dtype, then one fma
rounded to it: AITER's Triton op), operand-dtype (the whole rope in the input dtype: vLLM's
model-dtype rope). A failing rope region says which models its values match bit for bit
("numerics: exactly operand-products; ...") and which bounds they meet (core/SPEC.md).)";

const char* const golden_footer = R"(Examples:
  ropekv golden write --preset deepseek-v3 --tokens 8 --out dsv3.safetensors
  ropekv golden write --preset deepseek-v3 --tokens 8 --table-rows 0 --out dsv3-full.safetensors
  ropekv golden write --repro 'tq=2 ts=3 tk=3 h=4 cache=fp8_e4m3fn' --out case.safetensors
  ropekv golden write --random 12 --seed 3 --max-tokens 16 --out goldens/
  ropekv golden write --preset kimi-k2 --format npy --out kimi_case/
  ropekv golden write --repro 'tq=4 ts=4 tk=4 h=16 p=4096' --inputs my_inputs.safetensors --out mine.safetensors
  ropekv golden check dsv3.safetensors --backend sim
  ropekv golden check kimi_case/ --backend ref
  ropekv golden compare dsv3.safetensors --got my_outputs.safetensors
  ropekv golden compare dsv3.safetensors --got my_outputs_npy/ --max-ulp 2 --json rec.json
--table-rows: a preset's cos/sin table keeps rows 0..N-1 (positions drawn below N); 0: the
preset's full table. A file leaves out what its `derived` metadata rebuilds exactly (outputs'
poisoned *.initial, q_out's nope columns when they are q_nope's bytes); golden check/compare
and ropekv.golden.load rebuild them, --store-all writes every tensor. --inputs / --got: safetensors (any writer, no metadata needed) or a
folder of NAME.npy, tensors by their golden names without suffix (q_out, cache, ...).
File format: docs/golden-format.md.)";

// An error message as one printable line: newlines become spaces; other control bytes and
// bytes that are not valid UTF-8 (a binary file's bytes quoted by a parser) become \xNN.
std::string one_line(const std::string& msg) {
  std::string out;
  const auto* b = reinterpret_cast<const unsigned char*>(msg.data());
  const size_t n = msg.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool valid = len > 0 && i + len <= n && !(len == 2 && c < 0xc2);
    for (size_t k = 1; valid && k < len; ++k) valid = (b[i + k] & 0xc0) == 0x80;
    if (!valid) {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    } else if (c == '\n' || c == '\r' || c == '\t') {
      out += ' ';
      ++i;
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    } else {
      out.append(msg, i, len);
      i += len;
    }
  }
  return out;
}

struct cli_state {
  std::ostream& out;
  std::ostream& err;
  bool tty;
};

int cmd_info(cli_state& st) {
  st.out << fmt::format("ropekv {} (commit {})\n", ROPEKV_VERSION, ROPEKV_GIT_COMMIT);
  st.out << fmt::format("contract version: {} (core/SPEC.md)\n", contract_version);
  std::vector<std::string> names = compiled_backend_names();
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  st.out << "backends compiled in: " << list << "\n";
  st.out << "devices seen:\n";
  for (const auto& n : names) {
    std::string desc;
    try {
      desc = find_backend(n)()->device_description();
    } catch (const std::exception& e) {
      desc = std::string("unavailable: ") + e.what();
    }
    st.out << fmt::format("  {:<5} {}\n", n, desc.empty() ? "(host)" : desc);
  }
  return 0;
}

problem problem_from(const std::string& preset, int64_t tokens, const std::string& repro, uint64_t seed,
                     const char* cmd) {
  if (!preset.empty() && !repro.empty()) throw arg_error(cmd, "one of --preset or --repro", "both");
  if (!repro.empty()) return parse_problem(repro);
  if (preset.empty()) throw arg_error(cmd, "--preset NAME or --repro '...'", "neither");
  problem p = preset_problem(preset, tokens, seed);
  check_problem(p);
  return p;
}

struct run_opts {
  std::string preset, repro, backend = "ref", max_memory = "auto";
  int64_t tokens = 32;
  uint64_t seed = 1;
};

int cmd_run(cli_state& st, const run_opts& o) {
  problem p = problem_from(o.preset, o.tokens, o.repro, o.seed, "run");
  check_memory(case_memory_need(p, memory_use::run), memory_limit_of(o.max_memory), "raise --max-memory or use fewer tokens");
  std::string bname = canonical_backend_name(o.backend);
  std::unique_ptr<backend> be = find_backend(bname)();
  case_data c = make_case(p);
  std::string why = be->unsupported_reason(c.args);
  if (!why.empty()) throw arg_error("--backend", "a backend that supports this case", bname + ": " + why);
  auto t0 = std::chrono::steady_clock::now();
  be->run_host(c.args, c.regions());
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // What the op wrote, from the problem's own counts (core/SPEC.md "Outputs").
  int64_t pads = p.pad_slots, written_slots = p.ts - pads;
  int64_t q_rows = p.tq;
  if (p.opt.padding == pad_q::skipped) {
    // Padding tokens with t < Tq keep their q_out row.
    const tensor_view& sm = c.args.slot_mapping;
    q_rows = 0;
    for (int64_t t = 0; t < p.tq; ++t) {
      int64_t s = sm.type == dtype::i32 ? static_cast<const int32_t*>(sm.data)[t * sm.strides_elems[0]]
                                        : static_cast<const int64_t*>(sm.data)[t * sm.strides_elems[0]];
      if (s >= 0) ++q_rows;
    }
  }
  int64_t row = p.dn + p.dr;
  int64_t q_bytes = q_rows * p.heads * row * static_cast<int64_t>(dtype_size_bytes(p.q_out_dtype));
  int64_t cache_bytes = written_slots * cache_row_elems(p.opt.layout, p.dn, p.dr) *
                        static_cast<int64_t>(dtype_size_bytes(p.cache_dtype));
  st.out << fmt::format("ropekv run: backend {}{}\n", bname,
                        o.preset.empty() ? std::string() : ", preset " + o.preset);
  st.out << fmt::format("  tokens: Tq={} Ts={} Tk={} ({} padding slots), heads {}, dn {}, dr {}\n", p.tq,
                        p.ts, p.tk, pads, p.heads, p.dn, p.dr);
  st.out << fmt::format("  q_out written: {} rows x {} heads, {} bytes ({})\n", q_rows, p.heads, q_bytes,
                        dtype_name(p.q_out_dtype));
  st.out << fmt::format("  cache written: {} entries, {} bytes ({}, layout {}, {} blocks of {})\n",
                        written_slots, cache_bytes, dtype_name(p.cache_dtype), to_string(p.opt.layout),
                        p.num_blocks, p.block_size);
  st.out << fmt::format("  time: {:.3f} ms (one call, host clock{})\n", ms,
                        be->last_variant().empty() ? std::string() : ", variant " + be->last_variant());
  st.out << fmt::format("  repro: ropekv run --backend {} --repro '{}'\n", bname, p.to_repro());
  return 0;
}

// SIGINT / SIGTERM. While a fuzz campaign runs, the first one stops it between two cases (the
// report written so far is then kept, marked "interrupted"); otherwise, or on a second signal,
// the temporary file being written is removed and the process ends by the signal, so that no
// target is ever left half-written (the old file stays until a complete new one is renamed over it).
volatile std::sig_atomic_t stop_signal = 0;
volatile std::sig_atomic_t stop_between_cases = 0;

extern "C" void on_stop_signal(int sig) {
  if (stop_between_cases && stop_signal == 0) {
    stop_signal = sig;
    return;
  }
  remove_pending_temp_file();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

struct fuzz_cli_opts {
  bool force = false;
  std::string backends, time, repro, dump, json, shard;
  int64_t cases = -1;
  uint64_t seed = 1;
  int64_t max_tokens = 256;
  std::string profile = "any";
  int64_t max_ulp = 1;
  int64_t max_failures = 0;
  bool strict = false, bitwise = false, no_shrink = false;
  std::string numerics = "fp32";
  bool identify = false;
  bool isolate = false;
  std::string shrink_time = "30s";
  std::string variant = "auto";
  std::string pin;
  std::string jobs;  // --jobs N: N local worker processes (cmd_fuzz_jobs)
  std::string max_memory = "auto";
};

// The report, atomically (core/file_io.h): a full disk or a signal never leaves half a report,
// and a failed write is an error (exit 2), never a silent exit 0.
void write_json(const std::string& path, const nlohmann::json& j, const char* arg = "--json") {
  const std::string text = j.dump(2) + "\n";
  write_file_atomic(path, {text}, arg);
}

// A report file: a regular file of at most 64 MiB, JSON nested at most 64 deep.
nlohmann::json read_json(const std::string& path) {
  const std::string text = read_small_file(path, static_cast<uint64_t>(max_report_bytes), "", report_file_messages());
  constexpr int max_depth = 64;
  const nlohmann::json::parser_callback_t not_too_deep = [&](int depth, nlohmann::json::parse_event_t,
                                                             nlohmann::json&) {
    if (depth > max_depth) throw arg_error(path, fmt::format("JSON nested at most {} deep", max_depth), "deeper");
    return true;
  };
  try {
    return nlohmann::json::parse(text, not_too_deep);
  } catch (const arg_error&) {
    throw;
  } catch (const std::exception& e) {
    throw arg_error(path, "valid JSON", e.what());
  }
}

// The campaign's options from the command line, every option checked (the report paths too,
// creating nothing): what both a campaign in this process (cmd_fuzz) and `fuzz --jobs` (before
// any worker starts) go through, so that both refuse the same command lines with the same messages.
fuzz_options fuzz_options_from(const fuzz_cli_opts& o) {
  fuzz_options f;
  std::vector<std::string> names = o.backends.empty()
                                       ? std::vector<std::string>{"ref", default_other_backend()}
                                       : split_list(o.backends, ',', "--backends");
  if (names.size() != 2) throw arg_error("--backends", "two names A,B (e.g. ref,sim)", "'" + o.backends + "'");
  f.backend_a = canonical_backend_name(names[0]);
  f.backend_b = canonical_backend_name(names[1]);
  f.seed = o.seed;
  if (o.max_tokens < 1 || o.max_tokens > 4096) {
    throw arg_error("--max-tokens", "1..4096", std::to_string(o.max_tokens));
  }
  f.max_tokens = o.max_tokens;
  f.profile = parse_fuzz_profile(o.profile);
  f.cmp = make_compare_options(o.max_ulp, o.strict, o.bitwise, o.numerics, o.identify, "--max-ulp",
                               "--numerics");
  f.shrink = !o.no_shrink;
  f.shrink_time_s = parse_duration_s(o.shrink_time, "--shrink-time");
  const memory_limit mem = memory_limit_of(o.max_memory);
  f.max_memory_bytes = mem.bytes;
  f.max_memory_source = mem.source;
  if (!o.repro.empty()) {
    f.repro = parse_problem(o.repro);
    // a replayed case is refused up front (a drawn case over the limit is SKIPPED)
    check_memory(case_memory_need(*f.repro, memory_use::fuzz), mem, "raise --max-memory or replay a smaller case");
  }
  if (o.cases < -1) throw arg_error("--cases", ">= 0", std::to_string(o.cases));
  f.cases = o.cases;
  if (!o.time.empty()) f.time_limit_s = parse_duration_s(o.time, "--time");
  if (f.cases < 0 && f.time_limit_s == 0) f.cases = 1000;
  if (!o.shard.empty()) parse_shard(o.shard, &f.shard_index, &f.shard_count);
  f.dump_dir = o.dump;
  if (o.max_failures < 0) throw arg_error("--max-failures", ">= 0", std::to_string(o.max_failures));
  f.max_failures = o.max_failures;
  // fail before the campaign, not after it, and create nothing yet
  if (!o.json.empty()) {
    check_writable_path(o.json, "--json");
    check_new_output(o.json, o.force, "--json");
  }
  if (!o.dump.empty()) check_writable_folder(o.dump, "--dump");
  f.variant = o.variant;
  f.pins = o.pin;
  if (!f.pins.empty()) check_pins(f.pins);
  f.isolate = o.isolate;
  progress_interval_s();  // a malformed ROPEKV_PROGRESS_INTERVAL is an error before the campaign
  return with_registry(f);
}

// Sets a flag for the lifetime of the object (clears it however the scope ends).
class flag_scope {
 public:
  explicit flag_scope(volatile std::sig_atomic_t& flag) : flag_(flag) { flag_ = 1; }
  ~flag_scope() { flag_ = 0; }
  flag_scope(const flag_scope&) = delete;
  flag_scope& operator=(const flag_scope&) = delete;

 private:
  volatile std::sig_atomic_t& flag_;
};

int cmd_fuzz(cli_state& st, const fuzz_cli_opts& o) {
  fuzz_options f = fuzz_options_from(o);
  f.stop_requested = [] { return stop_signal != 0; };
  fuzz_summary s;
  {
    // a signal stops the campaign between two cases, and the report is still written; after
    // that (or an error) a signal removes the temporary file and ends the process
    const flag_scope stopping_between_cases(stop_between_cases);
    s = run_fuzz(f, st.out, st.tty, &st.err);
    if (!o.json.empty()) write_json(o.json, fuzz_report_json(f, s));
  }
  if (s.interrupted) {
    const int sig = stop_signal;
    st.out << fmt::format("stopped by {}{}\n", signal_name(sig),
                          o.json.empty() ? std::string()
                                         : ": the report of the cases run is in " + o.json + ", marked interrupted");
    return 128 + sig;
  }
  return (s.counts.failed + s.counts.errored) > 0 ? 1 : 0;
}

// The failures of a merged report with their replay lines, then the closing line; the exit code.
int print_merged_report(cli_state& st, const nlohmann::json& merged) {
  const fuzz_counts c = counts_of_report(merged, "the merged report");
  for (const auto& cs : merged.at("cases")) {
    if (cs.at("outcome") == "SKIPPED") continue;
    st.out << fmt::format("case {}: {} {}\n", cs.at("index").get<int64_t>(), cs.at("outcome").get<std::string>(),
                          cs.at("message").get<std::string>());
    st.out << "  replay: " << cs.at("replay").get<std::string>() << "\n";
    if (cs.contains("shrunk_replay") && cs.at("shrunk_replay").is_string())
      st.out << "  shrunk: " << cs.at("shrunk_replay").get<std::string>() << "\n";
  }
  if (merged.value("interrupted", false)) st.out << "interrupted: the campaign was stopped before its end\n";
  if (c.errored) st.out << fmt::format("{} errored (counted as failed below)\n", c.errored);
  st.out << summary_line(c) << "\n";
  return (c.failed + c.errored) > 0 ? 1 : 0;
}

int cmd_report_merge(cli_state& st, const std::vector<std::string>& files, const std::string& json,
                     bool allow_interrupted, bool force) {
  if (!json.empty()) {
    check_writable_path(json, "--json");
    check_new_output(json, force, "--json");
  }
  std::vector<nlohmann::json> reports;
  for (const auto& f : files) reports.push_back(read_json(f));
  merge_options mo;
  mo.names = files;
  mo.allow_interrupted = allow_interrupted;
  nlohmann::json merged = merge_reports(reports, mo);
  if (!json.empty()) write_json(json, merged);
  st.out << fmt::format("merged {} report(s), {} shard(s)\n", reports.size(), merged.at("shards").size());
  return print_merged_report(st, merged);
}

// Set by cli_main(argc, argv): this process is the ropekv executable, which `fuzz --jobs` re-runs.
bool running_as_executable = false;

// `fuzz --jobs N`: shards 0..N-1 of the campaign in N worker processes, their reports merged.
int cmd_fuzz_jobs(cli_state& st, const fuzz_cli_opts& o, const std::vector<std::string>& args) {
  if (!o.shard.empty()) throw arg_error("--jobs", "no --shard with it (the workers run shards 0..N-1)", "--jobs and --shard");
  if (!o.repro.empty()) throw arg_error("--jobs", "no --repro with it (a replay is one case)", "--jobs and --repro");
  const int64_t jobs = parse_decimal(o.jobs, 1, 4 * online_cpus(), "--jobs");
  if (!running_as_executable) {
    throw arg_error("--jobs", "the ropekv executable (the workers are copies of it)", "an in-process call");
  }
  fuzz_options_from(o);  // what cmd_fuzz checks before its campaign, checked before any worker starts

  const temp_folder folder("ropekv-jobs");
  const workers_run run = run_workers(without_options(args, {"--jobs", "--json"}), jobs, folder.path(), st.out, st.err);
  merge_options mo;
  mo.allow_interrupted = run.signal != 0;  // the workers stopped early because we were stopped
  std::vector<nlohmann::json> reports;
  try {
    for (int64_t i = run.first_failed < 0 ? 0 : run.first_failed; i < jobs; ++i) {
      const worker_end& w = run.workers[static_cast<size_t>(i)];
      const std::string name = fmt::format("worker {} (shard {}/{})", i, i, jobs);
      const std::string path = worker_report_path(folder.path(), i);
      if (!w.finished() && !(run.signal != 0 && std::filesystem::is_regular_file(path))) {
        throw arg_error("--jobs", "every worker to end with its report (exit code 0 or 1)",
                        fmt::format("{}: {}{}", name, describe_wait_status(w.status),
                                    w.last_error.empty() ? "" : "; its last error line: " + w.last_error));
      }
      try {
        reports.push_back(read_json(path));
      } catch (const arg_error& e) {
        throw arg_error(name, "its report", e.what());
      }
      mo.names.push_back(name);
    }
  } catch (const arg_error& e) {
    if (run.signal == 0) throw;
    st.out << std::flush;
    st.err << "ropekv: error: " << one_line(e.what()) << fmt::format(" (the campaign was interrupted by signal {})", run.signal)
           << "\n";
    return 128 + run.signal;
  }
  nlohmann::json merged = merge_reports(reports, mo);
  if (!o.json.empty()) write_json(o.json, merged);
  st.out << fmt::format("fuzz --jobs {}: shards 0..{} of {} merged\n", jobs, jobs - 1, jobs);
  const int rc = print_merged_report(st, merged);
  return run.signal != 0 ? 128 + run.signal : rc;
}

struct golden_write_opts {
  bool force = false;
  std::string preset, repro, out, format = "safetensors", inputs;
  int64_t table_rows = 2048;
  bool store_all = false;
  int64_t tokens = 4;
  int64_t random = 0;
  uint64_t seed = 1;
  int64_t max_tokens = 16;
  std::string pin;  // --random: keys every case takes (repro syntax, as fuzz --pin)
  std::string max_memory = "auto";
};

void write_one_golden(const problem& p, const std::string& path, const golden_write_opts& o) {
  std::unique_ptr<backend> ref = find_backend("ref")();
  write_reference_golden(path, o.format, make_case(p), *ref, golden_write_options{o.store_all});
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

int cmd_golden_write(cli_state& st, const golden_write_opts& o) {
  if (o.format != "safetensors" && o.format != "npy") {
    throw arg_error("--format", "safetensors or npy", "'" + o.format + "'");
  }
  int sources = !o.preset.empty() + !o.repro.empty() + (o.random > 0);
  if (sources != 1) throw arg_error("golden write", "exactly one of --preset, --repro, --random N", fmt::format("{} given", sources));
  if (!o.pin.empty() && o.random == 0) throw arg_error("--pin", "--random N with it", "--pin alone");
  // an existing file or a folder with files in it is replaced only when asked, and checked before
  // the reference runs
  check_new_output(o.out, o.force, "--out");
  const memory_limit mem = memory_limit_of(o.max_memory);
  const char* const smaller = "raise --max-memory or use fewer tokens";
  if (o.random > 0) {
    if (!o.pin.empty()) check_pins(o.pin);
    auto case_i = [&](int64_t i) {
      problem p = random_problem(o.seed, static_cast<uint64_t>(i), o.max_tokens);
      return o.pin.empty() ? p : pin_problem(p, o.pin);
    };
    // every case checked before the folder is made
    for (int64_t i = 0; i < o.random; ++i) check_memory(case_memory_need(case_i(i), memory_use::golden_write), mem, smaller);
    std::filesystem::create_directories(o.out);
    for (int64_t i = 0; i < o.random; ++i) {
      const problem p = case_i(i);
      std::string path = fmt::format("{}/case-{:04}{}", o.out, i, o.format == "npy" ? "" : ".safetensors");
      write_one_golden(p, path, o);
      st.out << fmt::format("wrote {}: {}\n", path, p.to_repro());
    }
    return 0;
  }
  problem p = problem_from(o.preset, o.tokens, o.repro, o.seed, "golden write");
  if (o.table_rows < 0) throw arg_error("--table-rows", ">= 0 (0: the preset's full table)", std::to_string(o.table_rows));
  if (!o.preset.empty() && o.table_rows > 0 && o.table_rows < p.table_rows) {
    // rows 0..N-1 of the preset's table are the preset's own values; positions are drawn below N
    p.table_rows = o.table_rows;
    check_problem(p);
  }
  check_memory(case_memory_need(p, memory_use::golden_write), mem, smaller);
  if (o.inputs.empty()) {
    write_one_golden(p, o.out, o);
  } else {
    std::vector<std::string> ignored;
    const case_data before = case_with_inputs(p, read_tensor_file(o.inputs), &ignored);
    if (!ignored.empty()) st.out << "ignored: " << joined(ignored) << "\n";
    std::unique_ptr<backend> ref = find_backend("ref")();
    write_reference_golden(o.out, o.format, before, *ref, golden_write_options{o.store_all});
  }
  st.out << fmt::format("wrote {}: {}\n", o.out, p.to_repro());
  return 0;
}

int print_case_outcome(cli_state& st, const case_record& rec, const std::string& json, const nlohmann::json& extra) {
  st.out << format_case_report(rec.report, true) << "\n";
  fuzz_counts c;
  switch (rec.report.outcome) {
    case case_outcome::passed: c.passed = 1; break;
    case case_outcome::failed: c.failed = 1; break;
    case case_outcome::errored: c.errored = 1; break;
    case case_outcome::skipped: c.skipped = 1; break;
    case case_outcome::mistrusted: c.mistrusted = 1; break;
    default: throw error("golden: bad outcome");
  }
  if (c.failed + c.errored > 0 && !rec.replay.empty()) st.out << "  replay: " << rec.replay << "\n";
  if (!json.empty()) {
    nlohmann::json j = case_record_json(rec);
    for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
    write_json(json, j);
  }
  st.out << summary_line(c) << "\n";
  return (c.failed + c.errored) > 0 ? 1 : 0;
}

// The comparison flags of golden check / compare. Every rope region is identified.
struct golden_cmp_opts {
  int64_t max_ulp = 1;
  bool strict = false;
  bool force = false;  // --json may replace an existing file
  void check_json(const std::string& json) const {
    if (json.empty()) return;
    check_writable_path(json, "--json");
    check_new_output(json, force, "--json");
  }
  std::string numerics = "fp32";
  std::string max_memory = "auto";
  compare_options options() const {
    return make_compare_options(max_ulp, strict, false, numerics, true, "--max-ulp", "--numerics");
  }
  std::string replay_flags() const {  // the non-default ones
    std::string f;
    if (max_ulp != 1) f += fmt::format(" --max-ulp {}", max_ulp);
    if (strict) f += " --strict";
    if (numerics != "fp32") f += " --numerics " + numerics;
    return f;
  }
  void add_to(CLI::App* cmd) {
    cmd->add_flag("--force", force, "--json may replace an existing file");
    cmd->add_option("--max-ulp", max_ulp, "Rope ULP tolerance")->transform(decimal_in(0, int64_t{1} << 32))->capture_default_str();
    cmd->add_flag("--strict", strict, "Drop the rope allowance of the numerics model");
    cmd->add_option("--numerics", numerics,
                    "Rope arithmetic the outputs claim: fp32, operand-products, operand-dtype (core/SPEC.md); "
                    "every rope region says which models it matches bit for bit")
        ->capture_default_str();
    add_max_memory_option(cmd, max_memory);
  }
};

// The budget of a golden file's case, from its header alone (before any tensor is read); a header
// that cannot be read is left to the reader, which names what is wrong.
void check_golden_memory(const std::string& file, memory_use use, const std::string& max_memory) {
  const memory_limit mem = memory_limit_of(max_memory);
  problem p;
  int64_t data_bytes = 0;
  if (!peek_golden_problem(file, &p, &data_bytes)) return;
  check_memory(case_memory_need(p, use, data_bytes), mem, "raise --max-memory or check a smaller file");
}

int cmd_golden_compare(cli_state& st, const std::string& file, const std::string& got,
                       const golden_cmp_opts& o, const std::string& json) {
  o.check_json(json);
  check_golden_memory(file, memory_use::golden_check, o.max_memory);
  golden_compare_result r = compare_golden_outputs(file, got, o.options());
  r.rec.replay = fmt::format("ropekv golden compare {} --got {}{}", file, got, o.replay_flags());
  if (!r.ignored.empty()) st.out << "ignored: " << joined(r.ignored) << "\n";
  return print_case_outcome(st, r.rec, json, {{"file", file}, {"got", got}, {"ignored", r.ignored}});
}

int cmd_golden_check(cli_state& st, const std::string& file, const std::string& backend_name,
                     const golden_cmp_opts& o, const std::string& json) {
  o.check_json(json);
  check_golden_memory(file, memory_use::golden_check, o.max_memory);
  std::string bname = canonical_backend_name(backend_name);
  std::unique_ptr<backend> be = find_backend(bname)();
  case_record rec = check_golden_file(file, *be, o.options());
  rec.replay = fmt::format("ropekv golden check {} --backend {}{}", file, bname, o.replay_flags());
  return print_case_outcome(st, rec, json, {{"file", file}, {"backend", bname}});
}

// CLI11 files an unknown subcommand name among the extras and then reports only "A subcommand
// is required". After a failed parse: the deepest subcommand parsed that has subcommands of its
// own, none of them chosen, and a leftover word: that word is an unknown subcommand. "" otherwise.
std::string unknown_subcommand_message(CLI::App& app) {
  CLI::App* level = &app;
  std::string where;
  while (!level->get_subcommands().empty()) {
    level = level->get_subcommands().front();
    where += level->get_name() + " ";
  }
  const std::vector<CLI::App*> known = level->get_subcommands([](CLI::App*) { return true; });
  if (known.empty()) return "";
  for (const std::string& word : level->remaining()) {
    if (word.empty() || word[0] == '-') continue;
    std::string names;
    for (const CLI::App* k : known) names += (names.empty() ? "" : ", ") + k->get_name();
    return fmt::format("unknown {}subcommand '{}' (expected one of: {})", where, word, names);
  }
  for (const std::string& word : level->remaining()) {
    if (!word.empty() && word[0] == '-') return fmt::format("unknown {}option '{}'", where, word);
  }
  return "";
}

int run_cli(const std::vector<std::string>& args, cli_state& st) {
  CLI::App app{"ropekv: the fused MLA op (RoPE + paged KV-cache write + q concat), its CPU reference,\n"
               "differential fuzzing of GPU kernels against it, and golden data.",
               "ropekv"};
  app.footer(main_footer);
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(ROPEKV_VERSION) + " (commit " + ROPEKV_GIT_COMMIT + ")");

  auto* info = app.add_subcommand("info", "Version, commit, contract version, backends compiled in, devices");

  run_opts ro;
  auto* run = app.add_subcommand("run", "Build one case and run one backend once; print what it wrote");
  run->add_option("--preset", ro.preset, "Model preset: deepseek-v3, deepseek-v3-tp8, kimi-k2, kimi-k2-tp8, deepseek-v2-lite")->check(non_empty);
  run->add_option("--tokens", ro.tokens, "Decode tokens (Tq = Ts = Tk)")->transform(decimal_in(1, int64_t{1} << 24))->capture_default_str();
  run->add_option("--repro", ro.repro, "A repro string (docs/golden-format.md), instead of --preset")->check(non_empty);
  run->add_option("--backend", ro.backend, "ref (alias cpu), sim, or hip when compiled in")->capture_default_str();
  run->add_option("--seed", ro.seed, "Data seed for --preset")->transform(decimal_u64())->capture_default_str();
  add_max_memory_option(run, ro.max_memory);
  run->footer("Examples:\n  ropekv run --preset deepseek-v3 --tokens 32\n  ropekv run --preset kimi-k2 --tokens 256 --backend sim\n"
              "  ropekv run --repro 'tq=4 ts=4 tk=4 h=16 cache=fp8_e4m3fn k_scale=0.5'");

  fuzz_cli_opts fo;
  auto* fuzz = app.add_subcommand("fuzz", "Differential fuzzing: two backends on the same random cases");
  fuzz->add_option("--backends", fo.backends, "A,B: reference and tested backend (default: ref and the best other compiled in, hip > sim)")->check(non_empty);
  fuzz->add_option("--cases", fo.cases, "Number of cases in the stream (default 1000 unless --time)")->transform(decimal_in(1, int64_t{1} << 40));
  fuzz->add_option("--time", fo.time, "Stop after this long: 60s, 10m, 1h")->check(non_empty);
  fuzz->add_option("--seed", fo.seed, "Campaign seed; case i is random_problem(seed, i)")->transform(decimal_u64())->capture_default_str();
  fuzz->add_option("--max-tokens", fo.max_tokens, "Upper bound on Tq/Ts/Tk of random cases (<= 4096)")->transform(decimal_in(1, 4096))->capture_default_str();
  fuzz->add_option("--profile", fo.profile,
                   "any: every option; aligned16: 16-bit q/kv, 16-byte aligned rows, no in-place rope (exercise the GPU fast paths)")
      ->capture_default_str();
  fuzz->add_option("--max-ulp", fo.max_ulp, "Rope elements: ULP tolerance")->transform(decimal_in(0, int64_t{1} << 32))->capture_default_str();
  fuzz->add_flag("--strict", fo.strict, "Drop the fp32-evaluation allowance of the rope rule");
  fuzz->add_flag("--bitwise", fo.bitwise,
                 "Every element bit-identical, rope parts too (e.g. sim vs hip: the simulation's faithfulness)");
  fuzz->add_option("--numerics", fo.numerics,
                   "Rope arithmetic the tested kernel claims: fp32, operand-products, operand-dtype (its bound judges rope elements)")
      ->capture_default_str();
  fuzz->add_flag("--identify", fo.identify,
                 "Identify every case's rope arithmetic (not only a failing one's) and count it: "
                 "\"q_out.rope: exactly fp32 x1990\"");
  fuzz->add_option("--repro", fo.repro, "Replay exactly this case (a repro string)")->check(non_empty);
  fuzz->add_option("--max-failures", fo.max_failures, "Stop after this many FAILED/ERRORED cases (0: never)")->transform(decimal_in(0, int64_t{1} << 40))->capture_default_str();
  fuzz->add_flag("--no-shrink", fo.no_shrink, "Do not shrink failing cases");
  fuzz->add_flag("--isolate", fo.isolate,
                 "Run the tested backend in a forked child per call: a crash (e.g. a plugin's SIGSEGV) is an ERRORED case with its repro, the campaign goes on");
  fuzz->add_option("--shrink-time", fo.shrink_time, "Time budget for shrinking one failure")->capture_default_str();
  fuzz->add_option("--dump", fo.dump, "Write each failure as a golden-format file into this folder")->check(non_empty);
  fuzz->add_option("--json", fo.json, "Write the JSON report (docs/report-schema.json); on SIGINT/SIGTERM the cases run so far, marked interrupted")->check(non_empty);
  fuzz->add_flag("--force", fo.force, "--json may replace an existing file");
  fuzz->add_option("--variant", fo.variant,
                   "Kernel variant for hip/sim, as in `bench --variant` (one request: e.g. qp=1, gpb=8+kvs=2, v4generic, "
                   "general); auto = the launch plan's choice")
      ->check(non_empty)
      ->capture_default_str();
  fuzz->add_option("--pin", fo.pin,
                   "Keys every random case keeps, in repro syntax (e.g. 'dn=512 dr=64 cache=fp8_e4m3fn'): "
                   "fuzz only the domain your kernel claims; the rest stays random")
      ->check(non_empty);
  fuzz->add_option("--shard", fo.shard, "K/N: run case i only when i % N == K; auto/N reads SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX")->check(non_empty);
  add_max_memory_option(fuzz, fo.max_memory);
  fuzz->add_option("--jobs", fo.jobs,
                   "N: run the campaign as N local worker processes (shards 0..N-1 of it; N up to 4 x the CPUs), "
                   "their lines prefixed [shard K/N], their reports merged (--json)")
      ->check(non_empty);
  fuzz->footer(fuzz_footer);

  auto* report = app.add_subcommand("report", "Work with JSON fuzz reports");
  report->require_subcommand(1);
  std::vector<std::string> merge_files;
  std::string merge_json;
  bool merge_allow_interrupted = false, merge_force = false;
  auto* merge = report->add_subcommand("merge", "Combine shard reports of one campaign");
  merge->add_option("reports", merge_files, "Shard reports (fuzz --json): shards 0..N-1 of one campaign, each once")
      ->required()
      ->check(non_empty);
  merge->add_option("--json", merge_json, "Write the merged report here")->check(non_empty);
  merge->add_flag("--force", merge_force, "--json may replace an existing file");
  merge->add_flag("--allow-interrupted", merge_allow_interrupted,
                  "Merge reports of a campaign stopped by a signal (marked \"interrupted\"); the merged report is "
                  "marked too");
  merge->footer("Every report is checked (docs/fuzz.md): shards 0..N-1 each once, counts that add up, listed cases "
                "on their shards.\nExample:\n  ropekv report merge shard-0.json shard-1.json --json all.json");

  auto* golden = app.add_subcommand("golden", "Write golden cases, check a backend or compare your outputs against one");
  golden->require_subcommand(1);
  golden->footer(golden_footer);
  golden_write_opts gw;
  auto* gwrite = golden->add_subcommand("write", "Run the reference and write a golden case");
  gwrite->add_option("--preset", gw.preset, "Model preset")->check(non_empty);
  gwrite->add_option("--tokens", gw.tokens, "Tokens for --preset")->transform(decimal_in(1, int64_t{1} << 24))->capture_default_str();
  gwrite->add_option("--repro", gw.repro, "A repro string")->check(non_empty);
  gwrite->add_option("--random", gw.random, "Write N random cases into the folder --out")->transform(decimal_in(1, 1000000));
  gwrite->add_option("--seed", gw.seed, "Seed for --random / --preset data")->transform(decimal_u64())->capture_default_str();
  gwrite->add_option("--max-tokens", gw.max_tokens, "Token bound for --random")->transform(decimal_in(1, 4096))->capture_default_str();
  gwrite->add_option("--pin", gw.pin, "--random: keys every case takes, e.g. 'layout=shuffled' (as fuzz --pin)")
      ->check(non_empty);
  gwrite->add_option("--out", gw.out, "Output file (folder for --format npy or --random)")->check(non_empty)->required();
  gwrite->add_option("--format", gw.format, "safetensors or npy")->capture_default_str();
  gwrite->add_flag("--force", gw.force, "Replace an existing --out (a file, or a folder whole)");
  gwrite->add_option("--inputs", gw.inputs,
                     "Your inputs (safetensors or npy folder: q_nope q_pe kv_c k_pe positions slot_mapping "
                     "cos_sin | cos sin) for the problem of --repro / --preset")
      ->check(non_empty);
  gwrite->add_option("--table-rows", gw.table_rows,
                     "--preset: keep table rows 0..N-1, positions below N (0: the full table)")
      ->transform(decimal_in(0, int64_t{1} << 26))
      ->capture_default_str();
  add_max_memory_option(gwrite, gw.max_memory);
  gwrite->add_flag("--store-all", gw.store_all,
                   "Store every tensor as itself (larger file): no poison fills or q_out nope columns "
                   "left to be rebuilt from the `derived` metadata");
  gwrite->footer(golden_footer);
  std::string gc_file, gc_backend = "ref", gc_json;
  golden_cmp_opts gc_cmp;
  auto* gcheck = golden->add_subcommand("check", "Run a backend on a golden file's inputs and compare");
  gcheck->add_option("file", gc_file, "Golden file (.safetensors, or an npy folder)")->required()->check(non_empty);
  gcheck->add_option("--backend", gc_backend, "Backend to check")->capture_default_str();
  gc_cmp.add_to(gcheck);
  gcheck->add_option("--json", gc_json, "Write the case report as JSON")->check(non_empty);
  gcheck->footer(golden_footer);
  std::string gp_file, gp_got, gp_json;
  golden_cmp_opts gp_cmp;
  auto* gcompare = golden->add_subcommand("compare", "Compare your kernel's outputs with a golden file's");
  gcompare->add_option("file", gp_file, "Golden file (.safetensors, or an npy folder)")->required()->check(non_empty);
  gcompare->add_option("--got", gp_got,
                       "Your outputs: safetensors or npy folder with q_out, cache | ckv_cache kpe_cache "
                       "(and q_pe / k_pe when in place)")->required()->check(non_empty);
  gp_cmp.add_to(gcompare);
  gcompare->add_option("--json", gp_json, "Write the case report as JSON")->check(non_empty);
  gcompare->footer(golden_footer);

  bench_opts bo;
  CLI::App* bench = add_bench_command(app, bo);

  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e, st.out, st.err);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e, st.out, st.err);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e, st.out, st.err);
  } catch (const CLI::ParseError& e) {
    std::string msg = unknown_subcommand_message(app);
    if (msg.empty()) {
      msg = one_line(e.what()) + " (see ropekv --help)";
    }
    st.err << "ropekv: error: " << msg << "\n";
    return 2;
  }

  if (*info) return cmd_info(st);
  if (*run) return cmd_run(st, ro);
  if (*fuzz) return fo.jobs.empty() ? cmd_fuzz(st, fo) : cmd_fuzz_jobs(st, fo, args);
  if (*merge) return cmd_report_merge(st, merge_files, merge_json, merge_allow_interrupted, merge_force);
  if (*gwrite) return cmd_golden_write(st, gw);
  if (*gcheck) return cmd_golden_check(st, gc_file, gc_backend, gc_cmp, gc_json);
  if (*gcompare) return cmd_golden_compare(st, gp_file, gp_got, gp_cmp, gp_json);
  if (*bench) return run_bench(bo, st.out, st.err);
  st.err << "ropekv: error: no subcommand (see ropekv --help)\n";
  return 2;
}

}  // namespace

int cli_main(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  cli_state st{out, err, false};
  try {
    return run_cli(args, st);
  } catch (const std::bad_alloc&) {  // an allocation not named where it happened
    out << std::flush;
    err << "ropekv: error: out of memory (an allocation failed): --max-memory checks a case's "
                 "buffers before they are allocated; use fewer tokens or a smaller case\n";
    return 2;
  } catch (const std::exception& e) {
    const std::string msg = one_line(e.what());
    out << std::flush;
    err << "ropekv: error: " << msg << "\n";
    return 2;
  }
}

int cli_main(const std::vector<std::string>& args) {
  cli_state st{std::cout, std::cerr, isatty(STDOUT_FILENO) == 1};
  try {
    return run_cli(args, st);
  } catch (const std::bad_alloc&) {  // an allocation not named where it happened
    std::cout << std::flush;
    std::cerr << "ropekv: error: out of memory (an allocation failed): --max-memory checks a case's "
                 "buffers before they are allocated; use fewer tokens or a smaller case\n";
    return 2;
  } catch (const std::exception& e) {
    const std::string msg = one_line(e.what());
    std::cout << std::flush;
    std::cerr << "ropekv: error: " << msg << "\n";
    return 2;
  }
}

int cli_main(int argc, char** argv) {
  install_stop_handlers();
  running_as_executable = true;
  std::vector<std::string> args(argv + 1, argv + argc);
  return cli_main(args);
}

}  // namespace ropekv
