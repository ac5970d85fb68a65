// `ropekv bench`: timing of a backend on model-sized cases, bytes moved, bandwidth
// against a copy measured in the same run, JSON report. Wired into the CLI by cli.cpp:
//   bench_opts bo;  CLI::App* bench = add_bench_command(app, bo);  ...  if (*bench) return run_bench(bo, st.out, st.err);
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/case_data.h"
#include "core/op.h"

namespace CLI {
class App;
}

namespace ropekv {

struct bench_opts {
  bool force = false;  // --json may replace an existing file
  std::string backend;                 // "" = hip when compiled in and a GPU is visible, else ref
  std::vector<std::string> cases;      // PRESET:TOKENS; empty = the default list for the backend
  std::vector<std::string> repros;     // cases as repro strings; alone (no `cases`), the only ones
  std::string caches = "bf16,fp8_e4m3fn";  // cache dtypes for the preset cases
  std::string layouts = "joint";          // cache layouts for the preset cases (joint, split, shuffled, fp8_ds_mla)
  std::string scales = "host";            // how the preset cases pass k_scale / q_scale (host, tensor)
  int64_t decode_tokens = -1;             // --decode N: preset cases pass all three decode outputs, N = min(N, Tq); -1: none
  std::string modes = "copy,zero_copy";    // copy: q_nope separate; zero_copy: q_nope inside q_out
  std::string variants = "auto";       // comma list; each '+'-joined: auto|v4|v4generic|general|nozc|hpb=N|gpb=N|... (tools/bench.cpp)
  bool cold = false;                   // GPU: rotate input sets larger than L2
  int64_t calls_per_graph = 20;        // GPU: op launches per graph replay
  int64_t copy_mb = 1024;              // size of the reference copy (MiB)
  int threads = 2;                     // CPU backends and the memcpy: OpenMP threads
  double budget_s = 0.4;               // time budget per measurement
  std::string json;                    // write the JSON report here
  std::string max_memory = "auto";     // --max-memory: each case's budget (tools/cli.h memory_limit_of)
  bool verify = false;                 // --verify: each (case, mode, variant) once against the reference first
};

// Applies one kernel-variant request ("auto", "general", "gpb=8+qp=1", ...; the `--variant` syntax of
// bench and fuzz) to the process-wide kernel overrides (backends/hip/variant.h), which the hip
// and sim backends read when they plan a launch. arg_error("--variant", ...) when malformed.
void set_kernel_variant(const std::string& request);

// Adds the `bench` subcommand with its options bound to `o`; returns it (cli.cpp dispatches).
CLI::App* add_bench_command(CLI::App& app, bench_opts& o);
// Runs the benchmark; prints the table to `out`. Returns 0, or throws ropekv::error / arg_error.
int run_bench(const bench_opts& o, std::ostream& out, std::ostream& err);

// Bytes the op must move for these (host) args: every input element read once, every output
// element written once (q_nope, q_pe, kv_c, k_pe, positions of used tokens, slots, one cos/sin
// row per distinct position, q_out rows, cache entries, in-place rows). Zero-copy concat
// (q_nope.data == q_out.data) reads no q_nope and writes only the rope part of q_out.
struct bench_bytes {
  int64_t read = 0, written = 0;
  int64_t total() const { return read + written; }
};
bench_bytes count_bytes(const op_args& host_args);


}  // namespace ropekv
