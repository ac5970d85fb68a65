#include "harness/fuzz.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include "core/case_data.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/op.h"
#include "harness/golden_io.h"
#include "harness/isolate.h"

namespace ropekv {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

std::string quote_single(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// The kernel family of a variant string: "fast_v4(wpb4,...)+pdl" -> "fast_v4".
std::string variant_family(const std::string& v) {
  size_t end = v.find_first_of("(+");
  return end == std::string::npos ? v : v.substr(0, end);
}

}  // namespace

const char* fuzz_profile_name(fuzz_profile p) {
  switch (p) {
    case fuzz_profile::any: return "any";
    case fuzz_profile::aligned16: return "aligned16";
    default: throw error(fmt::format("fuzz_profile_name: bad profile {}", static_cast<int>(p)));
  }
}

fuzz_profile parse_fuzz_profile(const std::string& text) {
  for (fuzz_profile p : {fuzz_profile::any, fuzz_profile::aligned16})
    if (text == fuzz_profile_name(p)) return p;
  throw arg_error("--profile", "one of any, aligned16", "'" + text + "'");
}

namespace {

problem apply_profile(fuzz_profile profile, const problem& p) {
  switch (profile) {
    case fuzz_profile::any: return p;
    case fuzz_profile::aligned16: return coerce_aligned16(p);
    default: throw error(fmt::format("apply_profile: bad profile {}", static_cast<int>(profile)));
  }
}

}  // namespace

problem profile_problem(fuzz_profile profile, uint64_t seed, uint64_t case_index, int64_t max_tokens,
                        const std::string& pins) {
  problem p = apply_profile(profile, random_problem(seed, case_index, max_tokens));
  return pins.empty() ? p : pin_problem(p, pins);
}

case_record run_case(const problem& prob, backend& a, backend& b, const compare_options& cmp,
                     case_data* out_initial, case_data* out_a, case_data* out_b) {
  case_record rec;
  rec.report.repro = prob.to_repro();
  case_data init;
  try {
    init = make_case(prob);
  } catch (const std::exception& e) {
    rec.report.outcome = case_outcome::errored;
    rec.report.message = std::string("building the case: ") + e.what();
    return rec;
  }
  for (backend* be : {&a, &b}) {
    std::string why;
    try {
      why = be->unsupported_reason(init.args);
    } catch (const std::exception& e) {
      why = std::string("unsupported_reason threw: ") + e.what();
    }
    if (!why.empty()) {
      rec.report.outcome = case_outcome::skipped;
      rec.report.message = be->name() + ": " + why;
      return rec;
    }
  }
  case_data ra = init.clone();
  case_data rb = init.clone();
  for (auto [be, run, label] : {std::tuple<backend*, case_data*, const char*>{&a, &ra, "a"},
                                std::tuple<backend*, case_data*, const char*>{&b, &rb, "b"}}) {
    auto t0 = clock_type::now();
    try {
      be->set_case_repro(rec.report.repro);
      be->run_host(run->args, run->regions());
    } catch (const unsupported_error& e) {
      rec.report.outcome = case_outcome::skipped;
      rec.report.message = be->name() + ": " + e.what();
      return rec;
    } catch (const std::exception& e) {
      rec.report.outcome = case_outcome::errored;
      rec.report.message = fmt::format("backend {} ({}) threw: {}", label, be->name(), e.what());
      return rec;
    }
    if (run == &rb) {
      rec.seconds_b = seconds_since(t0);
      rec.variant_b = be->last_variant();
    }
  }
  rec.report = compare_runs(init, ra, rb, cmp);
  if (out_initial) *out_initial = std::move(init);
  if (out_a) *out_a = std::move(ra);
  if (out_b) *out_b = std::move(rb);
  return rec;
}

case_report compare_with_reference(const case_data& initial, const case_data& got, backend& ref,
                                   const compare_options& cmp) {
  case_data ra = initial.clone();
  ref.run_host(ra.args, ra.regions());
  return compare_runs(initial, ra, got, cmp);
}

namespace {

// Whether `cand` is larger than `cur` in any size the shrinker reduces. Accepting such a
// candidate would let two edits undo each other (tq 0 -> 1 -> 0 ...) until the time is up.
bool grows(const problem& cand, const problem& cur) {
  return cand.tq > cur.tq || cand.ts > cur.ts || cand.tk > cur.tk || cand.heads > cur.heads ||
         cand.num_blocks > cur.num_blocks || cand.block_size > cur.block_size ||
         cand.table_rows > cur.table_rows || cand.pad_slots > cur.pad_slots || cand.dn > cur.dn ||
         cand.dr > cur.dr || cand.row_pad_elems > cur.row_pad_elems ||
         cand.entry_pad_elems > cur.entry_pad_elems || cand.block_pad_elems > cur.block_pad_elems ||
         cand.table_pad_elems > cur.table_pad_elems;
}

}  // namespace

problem shrink_problem(const problem& start, case_outcome outcome, backend& a, backend& b,
                       const compare_options& cmp, double time_limit_s, int64_t* steps,
                       int64_t* tries, fuzz_profile profile, const std::string& pins) {
  auto t0 = clock_type::now();
  problem cur = start;
  *steps = 0;
  *tries = 0;
  auto halve = [](int64_t v) { return v / 2; };
  // Candidate edits, each applied to the current problem; sizes first (biggest win first).
  std::vector<std::function<void(problem&)>> edits;
  auto set_tk = [](problem& p, int64_t v) {
    p.tk = std::max<int64_t>(v, 0);
    p.ts = std::min(p.ts, p.tk);
    p.tq = std::min(p.tq, p.ts);
    p.pad_slots = std::min(p.pad_slots, p.ts);
  };
  auto set_ts = [](problem& p, int64_t v) {
    p.ts = std::max<int64_t>(v, 0);
    p.tq = std::min(p.tq, p.ts);
    p.pad_slots = std::min(p.pad_slots, p.ts);
  };
  for (int k = 0; k < 3; ++k) {
    auto pick = [k, halve](int64_t v) { return k == 0 ? int64_t{1} : k == 1 ? halve(v) : v - 1; };
    edits.push_back([=](problem& p) { set_tk(p, pick(p.tk)); });
    edits.push_back([=](problem& p) { set_ts(p, pick(p.ts)); });
    edits.push_back([=](problem& p) { p.tq = std::max<int64_t>(pick(p.tq), 0); });
    edits.push_back([=](problem& p) { p.heads = std::max<int64_t>(pick(p.heads), 1); });
    edits.push_back([=](problem& p) { p.num_blocks = std::max<int64_t>(pick(p.num_blocks), 1); });
    edits.push_back([=](problem& p) { p.block_size = std::max<int64_t>(pick(p.block_size), 1); });
    edits.push_back([=](problem& p) { p.table_rows = std::max<int64_t>(pick(p.table_rows), 1); });
    edits.push_back([=](problem& p) { p.pad_slots = std::max<int64_t>(pick(p.pad_slots), 0); });
  }
  edits.push_back([](problem& p) { p.tq = 0; });
  edits.push_back([](problem& p) { p.tk = p.ts; });
  // (only ever downwards: an edit that grows a size lets the loop cycle until its time is up)
  edits.push_back([](problem& p) { p.dn = std::min<int64_t>(p.dn, 16); });
  edits.push_back([](problem& p) { p.dn = std::max<int64_t>(p.dn / 2, 1); });
  edits.push_back([](problem& p) { p.dn = 1; });
  edits.push_back([](problem& p) { p.dr = 2; });
  edits.push_back([](problem& p) { p.dr = std::max<int64_t>((p.dr / 2) & ~int64_t{1}, 2); });
  edits.push_back([](problem& p) { p.row_pad_elems = 0; });
  edits.push_back([](problem& p) { p.entry_pad_elems = 0; });
  edits.push_back([](problem& p) { p.block_pad_elems = 0; });
  edits.push_back([](problem& p) { p.table_pad_elems = 0; });
  edits.push_back([](problem& p) { p.kv_layout = kv_storage::separate; });
  edits.push_back([](problem& p) { p.q_layout = q_storage::token_major; });
  edits.push_back([](problem& p) { p.opt.inplace_q = false; });
  edits.push_back([](problem& p) { p.opt.inplace_k = false; });
  edits.push_back([](problem& p) { p.opt.layout = cache_layout::joint; });
  edits.push_back([](problem& p) { p.opt.order = row_order::nope_first; });
  edits.push_back([](problem& p) { p.table = table_kind::one; });
  edits.push_back([](problem& p) { p.pad_slots = 0; });
  edits.push_back([](problem& p) { p.opt.padding = pad_q::computed; });

  bool progress = true;
  while (progress && seconds_since(t0) < time_limit_s) {
    progress = false;
    for (const auto& edit : edits) {
      if (seconds_since(t0) >= time_limit_s) break;
      problem cand = cur;
      edit(cand);
      if (cand == cur) continue;
      try {
        check_problem(cand);
        cand = apply_profile(profile, cand);  // canonical and validated, or throws
        if (!pins.empty()) cand = pin_problem(cand, pins);
      } catch (const std::exception&) {
        continue;
      }
      if (cand == cur) continue;  // the profile undid the edit
      if (grows(cand, cur)) continue;  // e.g. "tq = 1" from tq = 0: no longer a shrink
      ++*tries;
      case_record r = run_case(cand, a, b, cmp);
      if (r.report.outcome == outcome) {
        cur = cand;
        ++*steps;
        progress = true;
      }
    }
  }
  return cur;
}

std::string replay_command(const fuzz_options& opt, const std::string& repro) {
  std::string cmd = opt.replay_prefix.empty()
                        ? fmt::format("ropekv fuzz --backends {},{}", opt.backend_a, opt.backend_b)
                        : opt.replay_prefix;
  if (opt.cmp.max_ulp != 1) cmd += fmt::format(" --max-ulp {}", opt.cmp.max_ulp);
  if (opt.cmp.strict) cmd += " --strict";
  if (opt.cmp.bitwise) cmd += " --bitwise";
  if (opt.cmp.numerics != numerics_model::fp32)
    cmd += fmt::format(" --numerics {}", numerics_model_name(opt.cmp.numerics));
  if (opt.cmp.identify_always) cmd += " --identify";
  if (opt.profile != fuzz_profile::any) cmd += fmt::format(" --profile {}", fuzz_profile_name(opt.profile));
  if (!opt.variant.empty() && opt.variant != "auto") cmd += " --variant " + quote_single(opt.variant);
  if (opt.isolate) cmd += " --isolate";
  return cmd + " --repro " + quote_single(repro);
}

std::string summary_line(const fuzz_counts& c) {
  std::string s = fmt::format("{} passed, {} failed", c.passed, c.failed + c.errored);
  if (c.skipped) s += fmt::format(", {} skipped", c.skipped);
  if (c.mistrusted) s += fmt::format(", {} mistrusted", c.mistrusted);
  return s;
}

fuzz_summary run_fuzz(const fuzz_options& opt_in, std::ostream& out, bool tty) {
  fuzz_options opt = opt_in;
  if (!opt.factory_a || !opt.factory_b)
    throw error("run_fuzz: fuzz_options needs factory_a and factory_b (tools/backends_registry.h "
                "resolves backend names)");
  if (opt.shard_count < 1 || opt.shard_index < 0 || opt.shard_index >= opt.shard_count) {
    throw arg_error("--shard", "K/N with 0 <= K < N",
                    fmt::format("{}/{}", opt.shard_index, opt.shard_count));
  }
  // the kernel variant, process-wide (hip and sim plan every launch of the campaign with it),
  // before any backend runs: a malformed request fails here
  if (!opt.variant.empty()) {
    if (!opt.apply_variant) throw error("run_fuzz: a variant is set but no apply_variant");
    opt.apply_variant(opt.variant);
  }
  if (!opt.pins.empty()) check_pins(opt.pins);
  std::unique_ptr<backend> a = opt.factory_a();
  std::unique_ptr<backend> b = opt.factory_b();
  if (opt.isolate) b = make_isolated_backend(std::move(b));
  fuzz_summary s;
  auto t0 = clock_type::now();
  auto last_plain = t0;
  bool progress_shown = false;
  auto clear_progress = [&] {
    if (tty && progress_shown) {
      out << "\r\033[K" << std::flush;
      progress_shown = false;
    }
  };
  const bool bounded = opt.repro.has_value() || opt.cases >= 0 || opt.time_limit_s > 0;
  const int64_t total = opt.repro ? 1 : opt.cases;
  if (!bounded) throw arg_error("--cases/--time", "a number of cases or a time limit", "neither");
  int64_t my_total = total < 0 ? -1
                               : (total - opt.shard_index + opt.shard_count - 1) / opt.shard_count;

  for (int64_t i = 0;; ++i) {
    if (opt.repro) {
      if (i >= 1) break;
    } else {
      if (total >= 0 && i >= total) break;
      if (opt.time_limit_s > 0 && seconds_since(t0) >= opt.time_limit_s) break;
      if (i % opt.shard_count != opt.shard_index) continue;
    }
    s.next_index = i + 1;
    const bool want_dump = !opt.dump_dir.empty();
    case_data init, ra, rb;
    problem prob;
    case_record rec;
    bool profiled = true;
    if (opt.repro) {
      prob = *opt.repro;
    } else {
      try {
        prob = profile_problem(opt.profile, opt.seed, static_cast<uint64_t>(i), opt.max_tokens,
                               opt.pins);
      } catch (const arg_error& e) {
        // the profile's coercion broke a constraint: not a case of this profile (the reason
        // names the key only, so that skip_reasons groups these cases)
        profiled = false;
        rec.report.repro = random_problem(opt.seed, static_cast<uint64_t>(i), opt.max_tokens).to_repro();
        rec.report.outcome = case_outcome::skipped;
        rec.report.message = fmt::format("profile {}: the coerced problem breaks the constraint on {}",
                                         fuzz_profile_name(opt.profile), e.arg());
      }
    }
    if (profiled) {
      rec = want_dump ? run_case(prob, *a, *b, opt.cmp, &init, &ra, &rb) : run_case(prob, *a, *b, opt.cmp);
    }
    if (!rec.variant_b.empty()) ++s.variants[variant_family(rec.variant_b)];
    for (const region_report& g : rec.report.regions)
      if (!g.numerics.empty() && opt.cmp.identify_always) ++s.numerics[g.name + ": " + numerics_identity(g)];
    rec.index = opt.repro ? -1 : i;
    rec.replay = replay_command(opt, rec.report.repro);
    ++s.cases_run;
    switch (rec.report.outcome) {
      case case_outcome::passed: ++s.counts.passed; break;
      case case_outcome::failed: ++s.counts.failed; break;
      case case_outcome::errored: ++s.counts.errored; break;
      case case_outcome::skipped:
        ++s.counts.skipped;
        ++s.skip_reasons[rec.report.message];
        break;
      case case_outcome::mistrusted: ++s.counts.mistrusted; break;
      default:
        throw error(fmt::format("fuzz: bad outcome {}", static_cast<int>(rec.report.outcome)));
    }
    const bool bad = rec.report.outcome == case_outcome::failed ||
                     rec.report.outcome == case_outcome::errored;
    if (bad && want_dump && rec.report.outcome == case_outcome::failed) {
      std::string path = fmt::format("{}/case-{:06}.safetensors", opt.dump_dir, std::max<int64_t>(rec.index, 0));
      try {
        write_failure_dump(path, init, ra, rb, opt.backend_a, opt.backend_b);
        rec.dumped_to = path;
      } catch (const std::exception& e) {
        rec.dumped_to = std::string("(dump failed: ") + e.what() + ")";
      }
    }
    if (bad && opt.shrink) {
      problem small = shrink_problem(prob, rec.report.outcome, *a, *b, opt.cmp, opt.shrink_time_s,
                                     &rec.shrink_steps, &rec.shrink_tries, opt.profile,
                                     opt.pins);
      if (small != prob) {
        rec.shrunk_repro = small.to_repro();
        rec.shrunk_replay = replay_command(opt, rec.shrunk_repro);
      }
    }
    if (opt.repro && rec.report.outcome == case_outcome::passed) {
      out << "repro case: " << format_case_report(rec.report, true) << "\n";
    }
    if (rec.report.outcome != case_outcome::passed) {
      clear_progress();
      if (rec.report.outcome != case_outcome::skipped) {
        out << (rec.index < 0 ? std::string("repro case: ") : fmt::format("case {}: ", rec.index))
            << format_case_report(rec.report, false) << "\n";
        out << "  replay: " << rec.replay << "\n";
        if (!rec.shrunk_repro.empty()) {
          out << fmt::format("  shrunk ({} steps, {} tries): ", rec.shrink_steps, rec.shrink_tries)
              << rec.shrunk_replay << "\n";
        }
        if (!rec.dumped_to.empty()) out << "  dumped: " << rec.dumped_to << "\n";
      }
      if (static_cast<int64_t>(s.notable.size()) < opt.max_reported) s.notable.push_back(std::move(rec));
    }
    if (opt.max_failures > 0 && s.counts.failed + s.counts.errored >= opt.max_failures) {
      clear_progress();
      out << fmt::format("stopping after {} failure(s) (--max-failures)\n", opt.max_failures);
      break;
    }
    // Progress.
    const double el = seconds_since(t0);
    if (tty) {
      if (el > 0.2) {
        double rate = s.cases_run / el;
        std::string eta;
        if (my_total > 0) {
          eta = fmt::format(", ETA {:.0f}s", std::max(0.0, (my_total - s.cases_run) / std::max(rate, 1e-9)));
        }
        if (opt.time_limit_s > 0) {
          double left = std::max(0.0, opt.time_limit_s - el);
          if (eta.empty() || left < (my_total - s.cases_run) / std::max(rate, 1e-9)) {
            eta = fmt::format(", ETA {:.0f}s", left);
          }
        }
        out << fmt::format("\r\033[K{} cases{}, {:.1f} cases/s, {} failed{}", s.cases_run,
                           my_total > 0 ? fmt::format("/{}", my_total) : std::string(), rate,
                           s.counts.failed + s.counts.errored, eta)
            << std::flush;
        progress_shown = true;
      }
    } else if (seconds_since(last_plain) >= 10.0) {
      last_plain = clock_type::now();
      out << fmt::format("progress: {} cases, {:.1f} cases/s, {} failed\n", s.cases_run,
                         s.cases_run / el, s.counts.failed + s.counts.errored);
    }
  }
  clear_progress();
  s.elapsed_s = seconds_since(t0);
  out << fmt::format("backends {} vs {}, seed {}{}, shard {}/{}, {} cases in {:.1f}s\n",
                     opt.backend_a, opt.backend_b, opt.seed,
                     opt.profile == fuzz_profile::any ? std::string()
                                                      : fmt::format(", profile {}", fuzz_profile_name(opt.profile)),
                     opt.shard_index, opt.shard_count, s.cases_run, s.elapsed_s);
  if (!s.variants.empty()) {
    std::string line = fmt::format("{} kernels:", opt.backend_b);
    for (const auto& [v, n] : s.variants) line += fmt::format(" {} x{}", v, n);
    out << line << "\n";
  }
  if (!s.numerics.empty()) {
    out << fmt::format("{} numerics (rope region: identity, cases):\n", opt.backend_b);
    for (const auto& [v, n] : s.numerics) out << fmt::format("  {} x{}\n", v, n);
  }
  if (s.counts.errored) out << fmt::format("{} errored (counted as failed below)\n", s.counts.errored);
  for (const auto& [why, n] : s.skip_reasons) out << fmt::format("skipped {}x: {}\n", n, why);
  if (s.counts.mistrusted) {
    out << fmt::format("{} mistrusted (a written region held poison or zeros in both runs)\n",
                       s.counts.mistrusted);
  }
  out << summary_line(s.counts) << "\n" << std::flush;
  return s;
}

// ---------------------------------------------------------------------------------- JSON

namespace {

std::string num_string(double v) { return fmt::format("{:.9g}", v); }
std::string hex_string(uint64_t v) { return fmt::format("0x{:x}", v); }

}  // namespace

nlohmann::json region_report_json(const region_report& g) {
  nlohmann::json hist = nlohmann::json::object();
  for (int k = 0; k < ulp_bucket_count; ++k) hist[ulp_bucket_label(k)] = g.histogram[k];
  nlohmann::json first = nlohmann::json::array();
  for (const mismatch& m : g.first) {
    first.push_back({{"where", m.where},
                     {"run", m.run},
                     {"expected", num_string(m.expected)},
                     {"got", num_string(m.got)},
                     {"expected_bits", hex_string(m.expected_bits)},
                     {"got_bits", hex_string(m.got_bits)},
                     {"ulp", m.ulp == ulp_distance_nan ? nlohmann::json(nullptr) : nlohmann::json(m.ulp)},
                     {"allowance", m.allowance}});
  }
  nlohmann::json numerics = nlohmann::json::array();
  for (const numerics_check& c : g.numerics) {
    numerics.push_back({{"model", numerics_model_name(c.model)},
                        {"operand_dtype", dtype_name(c.operand)},
                        {"bit_exact", c.differ == 0},
                        {"within_bound", c.outside == 0},
                        {"differ", c.differ},
                        {"outside", c.outside},
                        {"max_ulp_to_model", c.max_ulp_to_model == ulp_distance_nan ? nlohmann::json(nullptr)
                                                                                    : nlohmann::json(c.max_ulp_to_model)}});
  }
  return {{"name", g.name},
          {"rule", region_rule_name(g.rule)},
          {"dtype", g.dtype_name},
          {"compared", g.compared},
          {"mismatches", g.mismatches},
          {"max_ulp", g.max_ulp == ulp_distance_nan ? nlohmann::json(nullptr) : nlohmann::json(g.max_ulp)},
          {"needed_allowance", g.needed_allowance},
          {"histogram", hist},
          {"mistrusted", g.mistrusted},
          {"mistrust_reason", g.mistrust_reason},
          {"numerics", numerics},
          {"numerics_summary", g.numerics.empty() ? nlohmann::json(nullptr) : nlohmann::json(numerics_summary(g))},
          {"first_mismatches", first}};
}

nlohmann::json case_record_json(const case_record& r) {
  nlohmann::json regions = nlohmann::json::array();
  for (const region_report& g : r.report.regions) regions.push_back(region_report_json(g));
  auto opt_str = [](const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); };
  return {{"index", r.index},
          {"outcome", outcome_name(r.report.outcome)},
          {"repro", r.report.repro},
          {"replay", r.replay},
          {"message", r.report.message},
          {"shrunk_repro", opt_str(r.shrunk_repro)},
          {"shrunk_replay", opt_str(r.shrunk_replay)},
          {"shrink_steps", r.shrink_steps},
          {"variant", r.variant_b},
          {"seconds", r.seconds_b},
          {"dumped_to", opt_str(r.dumped_to)},
          {"regions", regions}};
}

nlohmann::json fuzz_report_json(const fuzz_options& opt, const fuzz_summary& s) {
  nlohmann::json cases = nlohmann::json::array();
  for (const case_record& r : s.notable) cases.push_back(case_record_json(r));
  nlohmann::json skips = nlohmann::json::object();
  for (const auto& [why, n] : s.skip_reasons) skips[why] = n;
  nlohmann::json variants = nlohmann::json::object();
  for (const auto& [v, n] : s.variants) variants[v] = n;
  nlohmann::json numerics = nlohmann::json::object();
  for (const auto& [v, n] : s.numerics) numerics[v] = n;
  return {{"format", "ropekv-fuzz-report"},
          {"schema_version", 1},
          {"ropekv_version", ROPEKV_VERSION},
          {"ropekv_commit", ROPEKV_GIT_COMMIT},
          {"contract_version", contract_version},
          {"config",
           {{"backends", {opt.backend_a, opt.backend_b}},
            {"seed", opt.seed},
            {"cases", opt.cases >= 0 ? nlohmann::json(opt.cases) : nlohmann::json(nullptr)},
            {"time_limit_s", opt.time_limit_s},
            {"max_tokens", opt.max_tokens},
            {"profile", fuzz_profile_name(opt.profile)},
            {"variant", opt.variant.empty() ? std::string("auto") : opt.variant},
            {"pins", opt.pins},
            {"max_ulp", opt.cmp.max_ulp},
            {"strict", opt.cmp.strict},
            {"bitwise", opt.cmp.bitwise},
            {"numerics", numerics_model_name(opt.cmp.numerics)},
            {"identify", opt.cmp.identify_always},
            {"repro", opt.repro ? nlohmann::json(opt.repro->to_repro()) : nlohmann::json(nullptr)}}},
          {"shards",
           {{{"index", opt.shard_index},
             {"count", opt.shard_count},
             {"cases_run", s.cases_run},
             {"next_case", s.next_index},
             {"elapsed_s", s.elapsed_s}}}},
          {"counts",
           {{"passed", s.counts.passed},
            {"failed", s.counts.failed},
            {"errored", s.counts.errored},
            {"skipped", s.counts.skipped},
            {"mistrusted", s.counts.mistrusted},
            {"total", s.counts.total()}}},
          {"skip_reasons", skips},
          {"variants", variants},
          {"numerics", numerics},
          {"cases", cases},
          {"summary", summary_line(s.counts)}};
}

namespace {

// A count read from a report (counts, skip_reasons, variants, numerics, a case's index): an
// integer 0 .. 2^40 (the bound of --cases). A float such as 1e300 is refused before any cast
// (converting it to int64 is undefined), as is 1.5 (not truncated to 1).
int64_t report_count(const nlohmann::json& v, const std::string& where) {
  const int64_t max = int64_t{1} << 40;
  const bool ok = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(max)
                                         : v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= max;
  if (!ok) throw arg_error(where, "an integer 0..1099511627776", v.dump());
  return v.get<int64_t>();
}

fuzz_counts counts_at(const nlohmann::json& r, const std::string& where) {
  fuzz_counts c;
  const auto& k = r.at("counts");
  c.passed = report_count(k.at("passed"), where + ".passed");
  c.failed = report_count(k.at("failed"), where + ".failed");
  c.errored = report_count(k.at("errored"), where + ".errored");
  c.skipped = report_count(k.at("skipped"), where + ".skipped");
  c.mistrusted = report_count(k.at("mistrusted"), where + ".mistrusted");
  return c;
}

}  // namespace

fuzz_counts counts_of_report(const nlohmann::json& r) { return counts_at(r, "counts"); }

nlohmann::json merge_reports(const std::vector<nlohmann::json>& reports) {
  if (reports.empty()) throw arg_error("report merge", "at least one report", "none");
  for (size_t i = 0; i < reports.size(); ++i) {
    const auto& r = reports[i];
    if (!r.is_object() || r.value("format", "") != "ropekv-fuzz-report") {
      throw arg_error(fmt::format("report {}", i + 1), "a ropekv fuzz report (format ropekv-fuzz-report)",
                      "something else");
    }
  }
  nlohmann::json merged = reports[0];
  const nlohmann::json& config = reports[0].at("config");
  fuzz_counts c;
  nlohmann::json shards = nlohmann::json::array();
  nlohmann::json cases = nlohmann::json::array();
  std::map<std::string, int64_t> skips, variants, numerics;
  for (size_t i = 0; i < reports.size(); ++i) {
    const auto& r = reports[i];
    if (r.at("config") != config) {
      throw arg_error(fmt::format("report {}", i + 1), "the same campaign config as report 1 (" + config.dump() + ")",
                      r.at("config").dump());
    }
    if (r.at("contract_version") != reports[0].at("contract_version")) {
      throw arg_error(fmt::format("report {}", i + 1), "the same contract_version as report 1",
                      r.at("contract_version").dump());
    }
    for (const auto& sh : r.at("shards")) {
      for (const auto& seen : shards) {
        if (seen.at("index") == sh.at("index") && seen.at("count") == sh.at("count")) {
          throw arg_error(fmt::format("report {}", i + 1), "each shard once",
                          fmt::format("shard {}/{} twice", sh.at("index").dump(), sh.at("count").dump()));
        }
      }
      shards.push_back(sh);
    }
    const std::string where = fmt::format("report {} ", i + 1);
    fuzz_counts k = counts_at(r, where + "counts");
    c.passed += k.passed;
    c.failed += k.failed;
    c.errored += k.errored;
    c.skipped += k.skipped;
    c.mistrusted += k.mistrusted;
    for (const auto& cs : r.at("cases")) {
      report_count(cs.at("index"), where + "cases[].index");  // the sort below reads it
      cases.push_back(cs);
    }
    for (const auto& [why, n] : r.at("skip_reasons").items()) skips[why] += report_count(n, where + "skip_reasons." + why);
    if (r.contains("variants"))  // absent in reports written before it existed
      for (const auto& [v, n] : r.at("variants").items()) variants[v] += report_count(n, where + "variants." + v);
    if (r.contains("numerics"))
      for (const auto& [v, n] : r.at("numerics").items()) numerics[v] += report_count(n, where + "numerics." + v);
  }
  std::stable_sort(cases.begin(), cases.end(), [](const nlohmann::json& x, const nlohmann::json& y) {
    return x.at("index").get<int64_t>() < y.at("index").get<int64_t>();
  });
  merged["shards"] = shards;
  merged["cases"] = cases;
  merged["counts"] = {{"passed", c.passed},   {"failed", c.failed},         {"errored", c.errored},
                      {"skipped", c.skipped}, {"mistrusted", c.mistrusted}, {"total", c.total()}};
  merged["skip_reasons"] = skips;
  merged["variants"] = variants;
  merged["numerics"] = numerics;
  merged["summary"] = summary_line(c);
  return merged;
}

}  // namespace ropekv
