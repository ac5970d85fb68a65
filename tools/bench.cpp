// `ropekv bench`. See tools/bench.h and docs/perf.md.
#include "tools/bench.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "backends/hip/variant.h"
#include "core/compare.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/memory_budget.h"
#include "core/presets.h"
#include "core/problem.h"
#include "harness/fuzz.h"
#include "harness/progress.h"
#include "tools/backends_registry.h"
#include "tools/cli.h"
#if defined(ROPEKV_HAVE_HIP)
#include "backends/hip/hip_backend.h"
#include "backends/hip/hip_bench.h"
#endif

namespace ropekv {
namespace {

int64_t index_at(const tensor_view& v, int64_t i) {
  const char* p = static_cast<const char*>(v.data) + i * v.strides_elems[0] * static_cast<int64_t>(dtype_size_bytes(v.type));
  const uint64_t bits = load_bits(v.type, p);
  switch (v.type) {
    case dtype::i32: return static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(bits)));
    case dtype::i64: return static_cast<int64_t>(bits);
    default: throw arg_error("index tensor", "i32 or i64", dtype_name(v.type));
  }
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}


struct bench_case {
  std::string name;
  problem prob;
};

std::vector<std::string> default_cases(bool gpu) {
  if (gpu) {
    return {"deepseek-v3:1",    "deepseek-v3:32",   "deepseek-v3:128",       "deepseek-v3-tp8:512",
            "kimi-k2-tp8:512",  "deepseek-v3:1024", "deepseek-v3:4096",      "deepseek-v3-tp8:8192"};
  }
  return {"deepseek-v3:1", "deepseek-v3:32", "deepseek-v3:128", "deepseek-v3-tp8:512",
          "kimi-k2-tp8:512", "deepseek-v3-tp8:4096"};
}

std::vector<bench_case> build_cases(const bench_opts& o, bool gpu) {
  std::vector<bench_case> out;
  // no --case: the default cases, unless --repro names the cases to time
  const std::vector<std::string> names =
      !o.cases.empty() ? o.cases : o.repros.empty() ? default_cases(gpu) : std::vector<std::string>{};
  const std::vector<std::string> caches = split_list(o.caches, ',', "--cache");
  if (caches.empty()) throw arg_error("--cache", "a comma list of cache dtypes", o.caches);
  const std::vector<std::string> layouts = split_list(o.layouts, ',', "--layout");
  if (layouts.empty()) throw arg_error("--layout", "a comma list of cache layouts", o.layouts);
  for (const std::string& l : layouts) (void)parse_enum<cache_layout>(l, "--layout");
  const std::vector<std::string> scales = split_list(o.scales, ',', "--scales");
  if (scales.empty()) throw arg_error("--scales", "a comma list of host, tensor", o.scales);
  for (const std::string& sc : scales) (void)parse_enum<scale_storage>(sc, "--scales");
  for (const std::string& n : names) {
    const auto colon = n.find(':');
    if (colon == std::string::npos) throw arg_error("--case", "PRESET:TOKENS", "'" + n + "'");
    // TOKENS: decimal digits (no "1e9", which would read as 1)
    const int64_t tokens = parse_decimal(n.substr(colon + 1), 1, int64_t{1} << 24, "--case " + n + ": TOKENS");
    for (const std::string& l : layouts) {
      for (const std::string& sc : scales) {
        const bool ds_mla = parse_enum<cache_layout>(l, "--layout") == cache_layout::fp8_ds_mla;
        for (const std::string& c : caches) {
          problem p = preset_problem(n.substr(0, colon), tokens);
          p.cache_dtype = parse_dtype(c, "--cache");
          if (!dtype_is_float(p.cache_dtype)) throw arg_error("--cache", "a float dtype", c);
          p.opt.layout = parse_enum<cache_layout>(l, "--layout");
          // fp8_ds_mla fixes its cache (u8 entries of fp8 tiles, scales, 16-bit rope): one case
          // per preset, whatever --cache lists
          if (ds_mla && &c != &caches.front()) continue;
          if (ds_mla) p.cache_dtype = dtype::u8;
          p.scales = parse_enum<scale_storage>(sc, "--scales");
          if (o.decode_tokens >= 0) {  // core/SPEC.md "Decode outputs": all three, N <= Tq
            p.dec_q_pe = p.dec_zeros = p.dec_k_pe = true;
            p.dec_tokens = std::min(o.decode_tokens, p.tq);
          }
          check_problem(p);
          const std::string layout_tag = layouts.size() == 1 && l == "joint" ? "" : " layout=" + l;
          const std::string scales_tag = scales.size() == 1 && sc == "host" ? "" : " scales=" + sc;
          const std::string decode_tag = o.decode_tokens >= 0 ? fmt::format(" decode={}", p.dec_tokens) : "";
          out.push_back({fmt::format("{}:{} cache={}{}{}{}", n.substr(0, colon), tokens, ds_mla ? "u8" : c, layout_tag, scales_tag,
                                     decode_tag),
                         p});
        }
      }
    }
  }
  // one repro: "repro"; several: "repro1", "repro2", ... in the order given
  for (size_t i = 0; i < o.repros.size(); ++i)
    out.push_back({o.repros.size() == 1 ? std::string("repro") : fmt::format("repro{}", i + 1), parse_problem(o.repros[i])});
  return out;
}

// The CPU copy reference: the fastest copy this machine gives in this run, with the current
// OpenMP thread count (each thread copies its contiguous share), GB/s counting read + write.
// Two methods: std::memcpy (glibc picks its own loop by size) and core's copy_bytes_stream
// (64-byte streaming stores where the CPU has AVX-512, else 16-byte; the stores the reference
// itself uses). Each is measured before and after the op timings (measure(), called twice);
// each measurement is the median of its repetitions, and the denominator is the largest
// median (a faster denominator makes the % of copy smaller: the honest direction). On this
// project's 2-core VM the same 1 GiB memcpy measured 52-54 GB/s in some runs and 71-73 GB/s
// in others minutes apart (same binary, same buffer alignment: the host's state, not the
// copy), and the streaming copy 5-15% above memcpy in both states; see docs/perf.md.
struct cpu_copy_meter {
  struct method {
    const char* kind;
    void (*copy)(const char* src, char* dst, int64_t bytes);
  };
  static void with_memcpy(const char* src, char* dst, int64_t bytes) {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  static void with_streaming_stores(const char* src, char* dst, int64_t bytes) {
    copy_bytes_stream(src, dst, bytes);
    stream_store_fence();
  }
  static constexpr method methods[2] = {
      {"std::memcpy", with_memcpy},
      {"streaming-store copy (core copy_bytes_stream: 64-byte non-temporal stores with AVX-512)",
       with_streaming_stores}};

  int64_t bytes;
  std::unique_ptr<char[]> src, dst;  // 64-byte aligned views below
  char* src64 = nullptr;
  char* dst64 = nullptr;
  double best_gbps = 0;
  std::string best_kind;
  nlohmann::json runs = nlohmann::json::array();

  explicit cpu_copy_meter(int64_t b) : bytes(b), src(new char[static_cast<size_t>(b) + 64]), dst(new char[static_cast<size_t>(b) + 64]) {
    src64 = src.get() + ((64 - (reinterpret_cast<uintptr_t>(src.get()) & 63u)) & 63u);
    dst64 = dst.get() + ((64 - (reinterpret_cast<uintptr_t>(dst.get()) & 63u)) & 63u);
    // first touch by the threads that copy each share (pages of a share stay with its thread)
#pragma omp parallel
    {
      const int64_t n = omp_get_num_threads(), i = omp_get_thread_num();
      const int64_t lo = bytes * i / n, hi = bytes * (i + 1) / n;
      std::memset(src64 + lo, 1, static_cast<size_t>(hi - lo));
      std::memset(dst64 + lo, 0, static_cast<size_t>(hi - lo));
    }
  }

  void once(const method& m) {
#pragma omp parallel
    {
      const int64_t n = omp_get_num_threads(), i = omp_get_thread_num();
      const int64_t lo = bytes * i / n, hi = bytes * (i + 1) / n;
      m.copy(src64 + lo, dst64 + lo, hi - lo);
    }
  }

  // Every method, budget_s each: a warm-up, then 5..50 repetitions; keeps the best median.
  void measure(const char* phase, double budget_s) {
    for (const method& m : methods) {
      once(m);
      std::vector<double> s;
      const auto t0 = std::chrono::steady_clock::now();
      while (s.size() < 5 || (s.size() < 50 && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < budget_s)) {
        const auto a = std::chrono::steady_clock::now();
        once(m);
        s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
      }
      const double gbps = 2.0 * static_cast<double>(bytes) / median_of(s) / 1e9;
      const double gbps_best_rep = 2.0 * static_cast<double>(bytes) / *std::min_element(s.begin(), s.end()) / 1e9;
      runs.push_back({{"kind", m.kind}, {"phase", phase}, {"reps", s.size()}, {"gbps_median", gbps},
                      {"gbps_best_rep", gbps_best_rep}});
      if (gbps > best_gbps) {
        best_gbps = gbps;
        best_kind = m.kind;
      }
    }
  }
};

struct timing {
  double us_median = 0, us_min = 0, us_max = 0;
  int64_t calls_per_graph = 1, replays = 0, input_sets = 1;
  std::string variant;
};

timing time_cpu(backend& be, case_data& c, double budget_s) {
  std::vector<memory_region> regions = c.regions();
  be.run_host(c.args, regions);  // warm-up (and first-touch)
  std::vector<double> us;
  const auto t0 = std::chrono::steady_clock::now();
  while (us.size() < 3 || (us.size() < 100 && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < budget_s)) {
    const auto a = std::chrono::steady_clock::now();
    be.run_host(c.args, regions);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  timing t;
  t.us_median = median_of(us);
  t.us_min = *std::min_element(us.begin(), us.end());
  t.us_max = *std::max_element(us.begin(), us.end());
  t.replays = static_cast<int64_t>(us.size());
  t.variant = be.last_variant();
  return t;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buf;
}

}  // namespace

bench_bytes count_bytes(const op_args& a) {
  const op_sizes s = sizes_of(a);
  const bool zero_copy = a.q_nope.data != nullptr && a.q_nope.data == a.q_out.data;
  const int64_t in_q = static_cast<int64_t>(dtype_size_bytes(a.q_nope.type)), in_k = static_cast<int64_t>(dtype_size_bytes(a.kv_c.type));
  const int64_t out_q = static_cast<int64_t>(dtype_size_bytes(a.q_out.type));
  const bool joint = single_cache_tensor(a.options.layout);
  const int64_t cache_sz = static_cast<int64_t>(dtype_size_bytes(joint ? a.cache.type : a.ckv_cache.type));
  const tensor_view& table = a.table() == table_kind::one ? a.cos_sin : a.cos;
  const int64_t tab_sz = static_cast<int64_t>(dtype_size_bytes(table.type));
  const int64_t num_slots = s.num_blocks * s.block_size;
  int64_t q_rows = 0, k_rows = 0, used = 0;
  std::set<int64_t> positions;
  for (int64_t t = 0; t < s.ts; ++t) {
    const int64_t slot = index_at(a.slot_mapping, t);
    const bool k = slot >= 0 && slot < num_slots;
    const bool q = t < s.tq && (slot >= 0 || a.options.padding == pad_q::computed);
    if (!k && !q) continue;
    ++used;
    k_rows += k;
    q_rows += q;
    int64_t p = index_at(a.positions, t);
    p = std::min(std::max<int64_t>(p, 0), s.table_rows - 1);
    positions.insert(p);
  }
  bench_bytes b;
  b.read += s.ts * static_cast<int64_t>(dtype_size_bytes(a.slot_mapping.type)) + used * static_cast<int64_t>(dtype_size_bytes(a.positions.type));
  b.read += static_cast<int64_t>(positions.size()) * s.dr * tab_sz;
  b.read += q_rows * s.heads * ((zero_copy ? 0 : s.dn) + s.dr) * in_q;
  b.read += k_rows * (s.dn + s.dr) * in_k;
  b.written += q_rows * s.heads * ((zero_copy ? 0 : s.dn) + s.dr) * out_q;
  b.written += k_rows * (a.options.layout == cache_layout::fp8_ds_mla ? ds_mla_entry_bytes : (s.dn + s.dr) * cache_sz);
  if (a.options.inplace_q) b.written += q_rows * s.heads * s.dr * in_q;
  if (a.options.inplace_k) b.written += k_rows * s.dr * in_k;
  return b;
}

// Applies one variant request (bench.h) ("auto", "general", "gpb=8+kvs=2", ...) to the kernel overrides.
void set_kernel_variant(const std::string& request) {
  ropekv_gpu::rk_variant_override ov;
  for (const std::string& part : split_list(request, '+', "--variant")) {
    if (part == "auto") continue;
    if (part == "general") { ov.force_general = 1; continue; }
    if (part == "v4") continue;                    // = auto: fast_v4 where eligible
    if (part == "v4generic") { ov.v4_generic = 1; continue; }  // fast_v4 without dtype templates
    if (part == "nozc") { ov.no_zero_copy = 1; continue; }
    if (part == "nopdl") { ov.no_pdl = 1; continue; }  // fast_v4 without programmatic dependent launch
    const auto eq = part.find('=');
    if (eq != std::string::npos) {
      const std::string key = part.substr(0, eq);
      const int64_t value = parse_decimal(part.substr(eq + 1), 0, 1 << 20, "--variant " + part);
      if (key == "kvr" && (value == 0 || value == 1)) { ov.v4_kv_rope_group = static_cast<int32_t>(value); continue; }
      if (key == "qp" && (value == 0 || value == 1)) { ov.v4_q_pairs = static_cast<int32_t>(value); continue; }
      if (key == "l2keep" && (value == 0 || value == 1)) { ov.cache_keep_l2 = static_cast<int32_t>(value); continue; }
      if (value < 1) throw arg_error("--variant", "a value >= 1", part);
      if (key == "hpb") { ov.heads_per_block = value; continue; }
      if (key == "gpb") { ov.v4_groups_per_block = value; continue; }
      if (key == "kvs") { ov.v4_kv_split = value; continue; }
      if (key == "zcr" && value <= 4) { ov.v4_zc_rows = static_cast<int32_t>(value); continue; }
    }
    throw arg_error("--variant", "auto, v4, v4generic, general, nozc, nopdl, hpb=N, gpb=N, kvs=N, kvr=0|1, qp=0|1, zcr=1..4, l2keep=0|1 joined by '+'", part);
  }
  ropekv_gpu::rk_variant_overrides() = ov;
}

namespace {
// The kernel variant `request` for one scope: the process-wide overrides go back to the plan's
// own choice when it ends, also when a backend throws.
struct kernel_variant_scope {
  explicit kernel_variant_scope(const std::string& request) { set_kernel_variant(request); }
  ~kernel_variant_scope() { ropekv_gpu::rk_variant_overrides() = {}; }
  kernel_variant_scope(const kernel_variant_scope&) = delete;
  kernel_variant_scope& operator=(const kernel_variant_scope&) = delete;
};

// bench --verify: `c` (never run) once on `be` with kernel variant `variant`, and on the
// reference, each on its own copy (a zero-copy case stays one: clone()); compared as fuzz compares.
case_report verify_against_reference(backend& be, backend& ref, const case_data& c, const std::string& variant) {
  case_data got = c.clone();
  {
    const kernel_variant_scope scope(variant);
    be.run_host(got.args, got.regions());
  }
  return compare_with_reference(c, got, ref, compare_options{});
}
}  // namespace

CLI::App* add_bench_command(CLI::App& app, bench_opts& o) {
  CLI::App* b = app.add_subcommand("bench", "Timing: us per call, bytes moved, GB/s and % of a copy measured in the same run");
  b->add_option("--backend", o.backend, "hip, sim or ref (alias cpu); default hip when compiled in and a GPU is visible, else ref")
      ->check(non_empty);
  b->add_option("--case", o.cases, "PRESET:TOKENS (repeatable); default: the decode and large model cases for the backend (none when --repro is given)");
  b->add_option("--repro", o.repros, "Time this case (a repro string; repeatable; rows repro1, repro2, ... when several). Without --case only the repros run; with it, both")->check(non_empty);
  b->add_option("--cache", o.caches, "Cache dtypes for the preset cases, comma list")->capture_default_str();
  b->add_option("--layout", o.layouts, "Cache layouts for the preset cases, comma list: joint, split, shuffled, fp8_ds_mla (a u8 cache whatever --cache says)")->capture_default_str();
  b->add_option("--scales", o.scales, "How the preset cases pass k_scale / q_scale, comma list: host (floats), tensor ([1] f32 tensors the kernel reads at run time)")->capture_default_str();
  b->add_option("--decode", o.decode_tokens,
                "Preset cases pass the three decode outputs (decode_q_pe_out, k_pe_out, q_nope_zeros_out) with N "
                "decode tokens (N capped at the case's Tq; at most 2^24); without it none")
      ->transform(decimal_in(0, int64_t{1} << 24));
  b->add_option("--mode", o.modes, "copy (q_nope separate), zero_copy (q_nope = first Dn columns of q_out), comma list; a --repro with zero_copy=1 runs in zero_copy mode only")->capture_default_str();
  b->add_option("--variant", o.variants, "Kernel variants, comma list; each auto|v4|v4generic|general|nozc|nopdl|hpb=N|gpb=N|kvs=N|kvr=0|1|qp=0|1|zcr=1..4|l2keep=0|1 joined by '+' (auto = v4 where eligible, its dtype-specialised instantiation, else the general body; v4 = auto; v4generic = v4 without dtype templates; general = the general body for every case; hpb = the general body's heads per block, gpb = v4 32-thread groups per block (1..8), kvs = v4 groups per cache entry's nope part (1, 2, 4), kvr = v4 cache rope units in their own group (default: fp8 caches), qp = v4 two q rows per group (default from 8192 q rows on), zcr = v4 zero-copy q rows per lane (1..4; default the most, up to 4 gptj or 2 neox, that keeps 4096 q groups), l2keep = fast cache stores with an L2 evict_last hint (default: the shuffled layout; CUDA sm_80+ only); nopdl = v4 without programmatic dependent launch (CUDA sm_90+ only; the default there))")->capture_default_str();
  b->add_flag("--cold", o.cold, "GPU: rotate input sets whose total exceeds 3x L2 (default: hot buffers)");
  b->add_option("--calls-per-graph", o.calls_per_graph, "GPU: op launches per graph replay")
      ->transform(decimal_in(1, 1000))
      ->capture_default_str();
  b->add_option("--copy-mb", o.copy_mb, "Size of the reference copy in MiB (at most 65536)")
      ->transform(decimal_in(1, 65536))
      ->capture_default_str();
  b->add_option("--threads", o.threads, "CPU backends and memcpy: OpenMP threads (at most 1024)")
      ->transform(decimal_in(1, 1024))
      ->capture_default_str();
  // a number (run_bench then requires it finite and >= 0); CLI11 alone reads '' as 0
  const CLI::Validator seconds(
      [](std::string& text) -> std::string {
        const char* b = text.c_str();
        char* end = nullptr;
        (void)std::strtod(b, &end);
        const bool number = !text.empty() && end == b + text.size() && text.find_first_of(" \t\n") == std::string::npos;
        return number ? "" : "expected a finite number of seconds >= 0, got '" + text + "'";
      },
      "", "seconds");
  b->add_option("--budget", o.budget_s, "Seconds per measurement (after warm-up)")->check(seconds)->capture_default_str();
  b->add_option("--json", o.json, "Write every number as JSON here")->check(non_empty);
  add_max_memory_option(b, o.max_memory);
  b->add_flag("--verify", o.verify,
              "Before timing each case, mode and variant: run it once on the backend and on the reference and compare "
              "(as fuzz does: bytes where data moves, ULP bounds where rope arithmetic happens); a mismatch prints "
              "its report and a replay line, and the command exits 1 after the table");
  b->add_flag("--force", o.force, "--json may replace an existing file");
  b->footer("Examples:\n  ropekv bench                                  # hip if available, else ref\n"
            "  ropekv bench --backend sim --case deepseek-v3:32 --cache bf16\n"
            "  ropekv bench --variant auto,general --json out.json\n"
            "  ropekv bench --cold --mode copy --case deepseek-v3:128\n"
            "  ropekv bench --mode zero_copy --case deepseek-v3:4096 --verify   # check, then time");
  return b;
}

int run_bench(const bench_opts& o, std::ostream& out, std::ostream& err) {
  std::string bname = o.backend;
  if (bname.empty()) {
#if defined(ROPEKV_HAVE_HIP)
    bname = hip_unavailable_reason().empty() ? "hip" : "ref";
#else
    bname = "ref";
#endif
  }
  bname = canonical_backend_name(bname);
  const bool gpu = bname == "hip";
  if (o.threads < 1 || o.threads > 1024) throw arg_error("--threads", "1..1024", std::to_string(o.threads));
  if (o.calls_per_graph < 1 || o.calls_per_graph > 1000) throw arg_error("--calls-per-graph", "1..1000", std::to_string(o.calls_per_graph));
  if (o.copy_mb < 1 || o.copy_mb > 65536) throw arg_error("--copy-mb", "1..65536", std::to_string(o.copy_mb));
  if (!std::isfinite(o.budget_s) || !(o.budget_s >= 0))  // a NaN or inf budget: null in the JSON
    throw arg_error("--budget", "a finite number of seconds >= 0", fmt::format("{}", o.budget_s));
  if (o.cold && !gpu) throw arg_error("--cold", "the hip backend", bname);
  if (!o.json.empty()) {  // before the measurements, not after
    check_writable_path(o.json, "--json");
    check_new_output(o.json, o.force, "--json");
  }
  const std::vector<std::string> modes = split_list(o.modes, ',', "--mode");
  for (const std::string& m : modes) {
    if (m != "copy" && m != "zero_copy") throw arg_error("--mode", "copy or zero_copy", m);
  }
  const std::vector<std::string> variants = split_list(o.variants, ',', "--variant");
  if (variants.empty()) throw arg_error("--variant", "at least one variant", o.variants);
  for (const std::string& v : variants) set_kernel_variant(v);  // parse all before running anything
  ropekv_gpu::rk_variant_overrides() = {};
  const std::vector<bench_case> cases = build_cases(o, gpu);  // every case checked before any timing
  const memory_limit mem = memory_limit_of(o.max_memory);
  for (const bench_case& bc : cases)  // each case's budget, before any is built
    check_memory(case_memory_need(bc.prob, o.verify ? memory_use::bench_verify : memory_use::bench), mem,
                 "raise --max-memory or bench fewer tokens");
  // Progress on stderr, a line per interval (harness/progress.h): what is being measured, k of n.
  progress_ticker ticker;
  // zero-copy needs one dtype (q_nope lives in q_out): other cases skip that mode; a repro with
  // zero_copy=1 is zero-copy already, so it skips copy mode
  const auto mode_applies = [](const bench_case& bc, const std::string& mode) {
    if (mode == "copy") return !bc.prob.zero_copy;
    return bc.prob.q_out_dtype == bc.prob.in_dtype;
  };
  int64_t measurements = 0, measured = 0;
  for (const bench_case& bc : cases)
    for (const std::string& mode : modes)
      if (mode_applies(bc, mode)) measurements += static_cast<int64_t>(variants.size());
  const auto progress = [&](const std::string& what) {
    if (ticker.due()) err << "bench: " << what << "\n" << std::flush;
  };
  omp_set_num_threads(o.threads);

  nlohmann::json j;
  j["tool"] = "ropekv bench";
  j["version"] = ROPEKV_VERSION;
  j["commit"] = ROPEKV_GIT_COMMIT;
  j["date_utc"] = utc_now();
  j["backend"] = bname;
  j["options"] = {{"cold", o.cold},          {"calls_per_graph", o.calls_per_graph},
                  {"threads", o.threads},    {"modes", o.modes},
                  {"variants", o.variants},  {"caches", o.caches}, {"layouts", o.layouts}, {"scales", o.scales}, {"decode_tokens", o.decode_tokens},
                  {"budget_s", o.budget_s},  {"copy_mb", o.copy_mb}};
  std::unique_ptr<backend> be = find_backend(bname)();
  std::unique_ptr<backend> ref = o.verify ? find_backend("ref")() : nullptr;
  int64_t verify_failures = 0;
  j["device_description"] = be->device_description();

  // The copy reference, measured in the same run.
  const int64_t copy_bytes = o.copy_mb << 20;
  double copy_gbps = 0;
  std::unique_ptr<cpu_copy_meter> cpu_copy;  // CPU backends
  if (gpu) {
#if defined(ROPEKV_HAVE_HIP)
    const std::string why = hip_unavailable_reason();
    if (!why.empty()) throw error("bench: " + why);
    const gpu_device_info d = hip_device_info();
    j["device"] = {{"name", d.name}, {"sm_count", d.sm_count}, {"driver_version", d.driver_version},
                   {"runtime_version", d.runtime_version}, {"l2_bytes", d.l2_bytes},
                   {"memory_bytes", d.memory_bytes}, {"compute_capability", fmt::format("{}.{}", d.cc_major, d.cc_minor)}};
    // Three copies of the same size; the fastest is the denominator (an honest, hard floor).
    const gpu_copy_timing c = hip_bench_copy(copy_bytes, 20);
    const gpu_copy_timing k = hip_bench_copy_kernel(copy_bytes, 20, 1);
    const gpu_copy_timing k4 = hip_bench_copy_kernel(copy_bytes, 20, 4);
    const std::pair<const char*, const gpu_copy_timing*> copies[] = {
        {"device-to-device hipMemcpyAsync, eager (events around each call)", &c},
        {"16-byte vector copy kernel in a graph", &k},
        {"16-byte vector copy kernel, one pass, 4 loads in flight per thread, in a graph", &k4}};
    const auto& [best_kind, best] = *std::max_element(
        std::begin(copies), std::end(copies), [](const auto& x, const auto& y) { return x.second->gbps < y.second->gbps; });
    copy_gbps = best->gbps;
    j["copy"] = {{"kind", best_kind},
                 {"bytes_each_way", copy_bytes},
                 {"us_median", best->us_median},
                 {"gbps_read_plus_write", copy_gbps},
                 {"memcpy", {{"us_median", c.us_median}, {"gbps_read_plus_write", c.gbps}}},
                 {"kernel", {{"us_median", k.us_median}, {"gbps_read_plus_write", k.gbps}}},
                 {"kernel_x4", {{"us_median", k4.us_median}, {"gbps_read_plus_write", k4.gbps}}}};
    out << fmt::format("copy references: hipMemcpyAsync D2D {:.1f} GB/s, 16-byte copy kernel {:.1f} GB/s, "
                       "x4 in flight {:.1f} GB/s (using the fastest)\n",
                       c.gbps, k.gbps, k4.gbps);
#endif
  } else {
    progress(fmt::format("measuring the copy reference ({} MiB, before the op timings)", o.copy_mb));
    cpu_copy = std::make_unique<cpu_copy_meter>(copy_bytes);
    cpu_copy->measure("before", o.budget_s);  // and again after the op timings, below
    copy_gbps = cpu_copy->best_gbps;
  }
  out << fmt::format("ropekv bench: backend {} ({}), copy {:.1f} GB/s (read + write, {} MiB)\n", bname,
                     be->device_description(), copy_gbps, o.copy_mb);

  nlohmann::json results = nlohmann::json::array();
  std::vector<std::string> rows;
  const auto row_text = [](const nlohmann::json& r) {
    return fmt::format("{:<36} {:<9} {:<8} {:<34} {:>10.2f} {:>9.2f} {:>9.2f} {:>8.1f} {:>6.1f}",
                       r["case"].get<std::string>(), r["mode"].get<std::string>(),
                       r["variant_request"].get<std::string>(), r["variant"].get<std::string>(),
                       r["us_median"].get<double>(), r["bytes_total"].get<double>() / 1e6,
                       r["floor_us"].get<double>(), r["gbps"].get<double>(), r["pct_of_copy"].get<double>());
  };
  for (const bench_case& bc : cases) {
    progress(fmt::format("preparing {} ({} of {} measurements done)", bc.name, measured, measurements));
    case_data base = make_case(bc.prob);
    for (const std::string& mode : modes) {
      if (!mode_applies(bc, mode)) continue;
      const bool zc = mode == "zero_copy";
      case_data c = base.clone();
      if (zc) apply_zero_copy(c);
      const case_data initial = o.verify ? c.clone() : case_data{};  // c before any run (--verify)
      const bench_bytes bytes = count_bytes(c.args);
      for (const std::string& v : variants) {
        ++measured;
        std::string verified = "not run";
        if (o.verify) {
          progress(fmt::format("verifying {} of {}: {}, mode {}, variant {}", measured, measurements, bc.name, mode, v));
          const case_report r = verify_against_reference(*be, *ref, initial, v);
          verified = r.outcome == case_outcome::passed ? "passed" : "failed";
          if (r.outcome != case_outcome::passed) {
            ++verify_failures;
            out << "FAILED verification: " << bc.name << ", mode " << mode << ", variant " << v << "\n"
                << format_case_report(r, true) << "\n"
                << fmt::format("  replay: ropekv bench --backend {} --repro '{}' --mode {} --variant {} --verify\n",
                               bname, bc.prob.to_repro(), mode, v);
          }
        }
        progress(fmt::format("measuring {} of {}: {}, mode {}, variant {}", measured, measurements, bc.name, mode, v));
        timing t;
        {
          const kernel_variant_scope scope(v);
          if (gpu) {
#if defined(ROPEKV_HAVE_HIP)
            gpu_bench_options go;
            go.calls_per_graph = o.calls_per_graph;
            go.cold = o.cold;
            go.budget_s = o.budget_s;
            const gpu_timing g = hip_bench_op(c.args, c.regions(), go);
            t.us_median = g.us_median; t.us_min = g.us_min; t.us_max = g.us_max;
            t.calls_per_graph = g.calls_per_graph; t.replays = g.replays; t.input_sets = g.input_sets;
            t.variant = g.variant;
#endif
          } else {
            t = time_cpu(*be, c, o.budget_s);
          }
        }
        const double gbps = static_cast<double>(bytes.total()) / (t.us_median * 1e-6) / 1e9;
        const double floor_us = static_cast<double>(bytes.total()) / (copy_gbps * 1e9) * 1e6;
        const double pct = 100.0 * gbps / copy_gbps;
        const op_sizes s = sizes_of(c.args);
        results.push_back({{"case", bc.name}, {"repro", bc.prob.to_repro()}, {"mode", mode},
                           {"variant_request", v}, {"variant", t.variant},
                           {"tokens", s.ts}, {"heads", s.heads}, {"cache_dtype", dtype_name(bc.prob.cache_dtype)},
                           {"us_median", t.us_median}, {"us_min", t.us_min}, {"us_max", t.us_max},
                           {"bytes_read", bytes.read}, {"bytes_written", bytes.written},
                           {"bytes_total", bytes.total()}, {"gbps", gbps}, {"pct_of_copy", pct},
                           {"floor_us", floor_us}, {"calls_per_graph", t.calls_per_graph},
                           {"replays", t.replays}, {"input_sets", t.input_sets}, {"cold", o.cold},
                           {"verified", verified}});
        rows.push_back(row_text(results.back()));
      }
    }
  }
  if (cpu_copy) {  // the copies again, after the op timings; the denominator is the best median
    progress(fmt::format("measuring the copy reference ({} MiB, after the op timings)", o.copy_mb));
    cpu_copy->measure("after", o.budget_s);
    copy_gbps = cpu_copy->best_gbps;
    rows.clear();
    for (nlohmann::json& r : results) {
      r["floor_us"] = r["bytes_total"].get<double>() / (copy_gbps * 1e9) * 1e6;
      r["pct_of_copy"] = 100.0 * r["gbps"].get<double>() / copy_gbps;
      rows.push_back(row_text(r));
    }
    j["copy"] = {{"kind", fmt::format("{}, {} OpenMP threads", cpu_copy->best_kind, o.threads)},
                 {"bytes_each_way", copy_bytes},
                 {"gbps_read_plus_write", copy_gbps},
                 {"rule", "largest median over the methods, measured before and after the op timings"},
                 {"runs", cpu_copy->runs}};
    for (const nlohmann::json& m : cpu_copy->runs) {
      out << fmt::format("copy reference ({}): {} {:.1f} GB/s\n", m["phase"].get<std::string>(),
                         m["kind"].get<std::string>(), m["gbps_median"].get<double>());
    }
    out << fmt::format("copy reference used: {:.1f} GB/s ({})\n", copy_gbps, cpu_copy->best_kind);
  }
  j["results"] = results;
  if (!o.json.empty()) write_file_atomic(o.json, {j.dump(2) + "\n"}, "--json");
  out << fmt::format("{:<36} {:<9} {:<8} {:<34} {:>10} {:>9} {:>9} {:>8} {:>6}\n", "case", "mode", "request",
                     "variant", "us/call", "MB", "floor_us", "GB/s", "%copy");
  for (const std::string& r : rows) out << r << "\n";
  if (o.verify) {
    out << fmt::format("verification against the reference: {} passed, {} failed\n", measurements - verify_failures,
                       verify_failures);
  }
  return verify_failures > 0 ? 1 : 0;
}

}  // namespace ropekv
