#include "harness/fuzz.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "core/case_data.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/memory_budget.h"
#include "core/op.h"
#include "harness/golden_io.h"
#include "harness/isolate.h"
#include "harness/progress.h"

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
  // Memory: the runs share the initial case's inputs (each input's checksum is checked after
  // each run) and own their outputs; the initial poisoned outputs are dropped unless the caller
  // keeps the initial case (--dump), their pattern being known.
  if (!out_initial) init.drop_poison_outputs();  // first: the runs then make theirs anew
  case_data ra = init.clone_outputs();
  case_data rb = init.clone_outputs();
  std::map<std::string, uint64_t> sums;
  for (const auto& [name, buf] : init.buffers)
    if (ra.buffers.at(name).shares_memory_with(buf)) sums[name] = buffer_checksum(buf);
  // A run that wrote into a shared input keeps what it wrote; the initial case and the other run
  // get the inputs as made again (a failing case only: the comparison then says where).
  auto unshare_changed = [&](case_data& culprit, case_data& other) {
    std::vector<std::string> changed;
    for (const auto& [name, sum] : sums)
      if (culprit.buffers.at(name).shares_memory_with(init.buffers.at(name)) &&
          buffer_checksum(init.buffers.at(name)) != sum)
        changed.push_back(name);
    if (changed.empty()) return;
    case_data fresh = make_case(prob);
    for (const std::string& name : changed) {
      host_buffer pristine = std::move(fresh.buffers.at(name));
      if (other.buffers.at(name).shares_memory_with(init.buffers.at(name))) other.replace_buffer(name, pristine.share());
      init.replace_buffer(name, std::move(pristine));
    }
  };
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
    unshare_changed(*run, run == &ra ? rb : ra);
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
                       int64_t* tries, fuzz_profile profile, const std::string& pins,
                       const shrink_progress_fn& on_try) {
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
  edits.push_back([](problem& p) { p.zero_copy = false; });
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
      if (on_try) on_try(cur, *steps, *tries);
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

fuzz_summary run_fuzz(const fuzz_options& opt_in, std::ostream& out, bool tty, std::ostream* progress) {
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
  progress_ticker ticker;  // the plain progress lines (cases, shrinking)
  std::ostream& progress_out = progress != nullptr ? *progress : out;
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
    if (opt.stop_requested && opt.stop_requested()) {
      s.interrupted = true;
      break;
    }
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
    if (profiled && !opt.repro && opt.max_memory_bytes < INT64_MAX) {
      // a drawn case over the memory limit is skipped (the reason names the limit only, so that
      // skip_reasons groups these cases); a replayed one is refused before the campaign
      const memory_need need = case_memory_need(prob, memory_use::fuzz);
      if (need.total_bytes > opt.max_memory_bytes) {
        profiled = false;
        rec.report.repro = prob.to_repro();
        rec.report.outcome = case_outcome::skipped;
        rec.report.message = fmt::format("the case needs more memory than {} ({})",
                                          human_bytes(static_cast<uint64_t>(opt.max_memory_bytes)),
                                          opt.max_memory_source.empty() ? "--max-memory" : opt.max_memory_source);
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
      clear_progress();  // the shrinking lines may go to the same terminal
      const auto shrink_t0 = clock_type::now();
      const std::string what = opt.repro ? std::string("the repro case") : fmt::format("case {}", i);
      const shrink_progress_fn on_try = [&](const problem& cur, int64_t steps, int64_t tries) {
        if (!ticker.due()) return;
        progress_out << fmt::format("shrinking {}: step {}, try {}, tokens {} (Tq {}, Ts {}), {} heads, dn {}, dr {}, "
                                    "{:.0f}s of {:.0f}s\n",
                                    what, steps, tries + 1, cur.tk, cur.tq, cur.ts, cur.heads, cur.dn, cur.dr,
                                    seconds_since(shrink_t0), opt.shrink_time_s)
                     << std::flush;
      };
      problem small = shrink_problem(prob, rec.report.outcome, *a, *b, opt.cmp, opt.shrink_time_s,
                                     &rec.shrink_steps, &rec.shrink_tries, opt.profile,
                                     opt.pins, on_try);
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
    } else if (ticker.due()) {
      progress_out << fmt::format("progress: {} cases, {:.1f} cases/s, {} failed\n", s.cases_run,
                                  s.cases_run / el, s.counts.failed + s.counts.errored)
                   << std::flush;
    }
  }
  clear_progress();
  s.elapsed_s = seconds_since(t0);
  out << fmt::format("backends {} vs {}, seed {}{}, shard {}/{}, {} cases in {:.1f}s\n",
                     opt.backend_a, opt.backend_b, opt.seed,
                     opt.profile == fuzz_profile::any ? std::string()
                                                      : fmt::format(", profile {}", fuzz_profile_name(opt.profile)),
                     opt.shard_index, opt.shard_count, s.cases_run, s.elapsed_s);
  if (s.interrupted) out << fmt::format("interrupted after {} cases: the campaign did not finish\n", s.cases_run);
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
            {"max_failures", opt.max_failures},
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
          {"summary", summary_line(s.counts)},
          {"interrupted", s.interrupted}};
}
// ---------------------------------------------------------------------------------- merge

namespace {

constexpr int64_t int64_max = std::numeric_limits<int64_t>::max();
const char* const count_keys[] = {"passed", "failed", "errored", "skipped", "mistrusted"};
const char* const outcome_names[] = {"PASSED", "FAILED", "ERRORED", "SKIPPED", "MISTRUSTED"};

// A JSON value in a message: scalars as JSON text (at most 80 bytes), containers by their kind.
std::string brief(const nlohmann::json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return fmt::format("an array of {}", v.size());
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Checks and sums for one report; every error names the report.
struct report_checker {
  const std::string& name;

  [[noreturn]] void fail(const std::string& expected, const std::string& got) const {
    throw arg_error(name, expected, got);
  }
  const nlohmann::json& member(const nlohmann::json& obj, const std::string& where, const char* key) const {
    if (!obj.is_object()) fail(where + ": an object", brief(obj));
    auto it = obj.find(key);
    if (it == obj.end()) fail(fmt::format("{}{}{} present", where, where.empty() ? "" : ".", key), "none");
    return *it;
  }
  // An integer in lo..2^63-1 (a JSON float such as 1e300 or 3.0 is not one).
  int64_t integer(const nlohmann::json& v, const std::string& field, int64_t lo = 0) const {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u <= static_cast<uint64_t>(int64_max) && static_cast<int64_t>(u) >= lo) return static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      const int64_t x = v.get<int64_t>();
      if (x >= lo) return x;
    }
    fail(fmt::format("{}: an integer in {}..{}", field, lo, int64_max), brief(v));
  }
  int64_t add(int64_t a, int64_t b, const std::string& what) const {
    int64_t r = 0;
    if (__builtin_add_overflow(a, b, &r)) fail(what + " within 64-bit integers", "a sum beyond 2^63-1");
    return r;
  }
  int64_t mul(int64_t a, int64_t b, const std::string& what) const {
    int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) fail(what + " within 64-bit integers", "a product beyond 2^63-1");
    return r;
  }
  // A string -> count object (skip_reasons, variants, numerics) added into `into`.
  int64_t add_tally(const nlohmann::json& obj, const std::string& field, std::map<std::string, int64_t>& into) const {
    if (!obj.is_object()) fail(field + ": an object", brief(obj));
    int64_t sum = 0;
    for (const auto& [key, n] : obj.items()) {
      const int64_t k = integer(n, fmt::format("{}[{}]", field, brief(nlohmann::json(key))));
      sum = add(sum, k, "the sum of " + field);
      into[key] = k;
    }
    return sum;
  }
};

struct shard_entry {
  int64_t index = 0, count = 1, cases_run = 0, next_case = 0;
  bool stopped_early = false;  // cases_run below the shard's share of config.cases
  int64_t listed = 0;          // cases the report lists for this shard
};

// What the reports checked so far hold.
struct merge_state {
  const std::vector<std::string>& names;
  const nlohmann::json* first = nullptr;      // report 1
  int64_t shard_count = 0;                    // N of report 1's shards
  std::map<int64_t, std::string> shard_in;    // shard index -> the report holding it
  std::map<int64_t, std::string> listed_in;   // listed case index -> the report listing it
};

// The first config key whose value differs, as "config.KEY X (as in FIRST)" / "Y".
void check_same_config(const nlohmann::json& config, const nlohmann::json& first, const report_checker& ck,
                       const std::string& first_name) {
  if (config == first) return;
  if (!config.is_object() || !first.is_object()) ck.fail("config: an object", brief(config));
  std::set<std::string> keys;
  for (const auto& [k, v] : first.items()) keys.insert(k);
  for (const auto& [k, v] : config.items()) keys.insert(k);
  for (const std::string& k : keys) {
    const bool in_a = first.contains(k), in_b = config.contains(k);
    if (in_a && in_b && first.at(k) == config.at(k)) continue;
    ck.fail(fmt::format("config.{} {} (as in {}: shards of one campaign)", k, in_a ? brief(first.at(k)) : "absent",
                        first_name),
            in_b ? brief(config.at(k)) : "absent");
  }
}

// What merge_reports takes from one checked report.
struct checked_report {
  fuzz_counts counts;
  std::vector<shard_entry> shards;
  bool interrupted = false;
  std::map<std::string, int64_t> skips, variants, numerics;
};

// The shard's share of a stream of `cases` cases: the number of i in [0, cases) with i % n == k.
int64_t shard_share(int64_t cases, int64_t k, int64_t n) { return cases > k ? (cases - k - 1) / n + 1 : 0; }

// "0, 1, 3" with runs of three or more as "4..9".
std::string index_list(const std::vector<int64_t>& sorted) {
  std::string out;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    std::string item = j - i >= 2 ? fmt::format("{}..{}", sorted[i], sorted[j]) : std::to_string(sorted[i]);
    if (j - i == 1) item += ", " + std::to_string(sorted[j]);
    out += (out.empty() ? "" : ", ") + item;
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

checked_report check_report(const nlohmann::json& r, const report_checker& ck, const merge_options& opt,
                            merge_state& st) {
  checked_report out;
  if (!r.is_object()) ck.fail("a ropekv fuzz report (a JSON object with format ropekv-fuzz-report)", brief(r));
  if (!r.contains("format") || r.at("format") != "ropekv-fuzz-report") {
    ck.fail("a ropekv fuzz report (format ropekv-fuzz-report)",
            r.contains("format") ? "format " + brief(r.at("format")) : "no format key");
  }
  if (r.contains("interrupted")) {
    const nlohmann::json& v = r.at("interrupted");
    if (!v.is_boolean()) ck.fail("interrupted: true or false", brief(v));
    out.interrupted = v.get<bool>();
    if (out.interrupted && !opt.allow_interrupted) {
      ck.fail("a complete campaign (merge an interrupted one with --allow-interrupted)", "\"interrupted\": true");
    }
  }
  // the campaign: the first report's, and what a shard of it had to run
  const nlohmann::json& config = ck.member(r, "", "config");
  const nlohmann::json& contract = ck.member(r, "", "contract_version");
  if (st.first && st.first != &r) {
    const std::string& first_name = st.names[0];
    check_same_config(config, st.first->at("config"), ck, first_name);
    if (contract != st.first->at("contract_version")) {
      ck.fail(fmt::format("contract_version {} (as in {})", brief(st.first->at("contract_version")), first_name),
              brief(contract));
    }
  }
  if (!config.is_object()) ck.fail("config: an object", brief(config));
  const nlohmann::json& cases_v = ck.member(config, "config", "cases");
  const int64_t total_cases = cases_v.is_null() ? -1 : ck.integer(cases_v, "config.cases");
  const nlohmann::json& time_v = ck.member(config, "config", "time_limit_s");
  if (!time_v.is_number() || !std::isfinite(time_v.get<double>()) || time_v.get<double>() < 0)
    ck.fail("config.time_limit_s: seconds >= 0", brief(time_v));
  const bool timed = time_v.get<double>() > 0;
  const nlohmann::json& repro_v = ck.member(config, "config", "repro");
  if (!repro_v.is_null() && !repro_v.is_string()) ck.fail("config.repro: a string or null", brief(repro_v));
  const bool replay = repro_v.is_string();
  // absent in reports older than it: a shard that stopped early must then show a failure
  const int64_t max_failures =
      config.contains("max_failures") ? ck.integer(config.at("max_failures"), "config.max_failures") : -1;

  out.counts = counts_of_report(r, ck.name);

  const nlohmann::json& shards = ck.member(r, "", "shards");
  if (!shards.is_array() || shards.empty()) ck.fail("shards: a non-empty array", brief(shards));
  int64_t cases_run = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string at = fmt::format("shards[{}]", s);
    const nlohmann::json& sh = shards[s];
    shard_entry e;
    e.count = ck.integer(ck.member(sh, at, "count"), at + ".count", 1);
    e.index = ck.integer(ck.member(sh, at, "index"), at + ".index");
    if (e.index >= e.count) ck.fail(fmt::format("{}.index below its count {}", at, e.count), std::to_string(e.index));
    e.cases_run = ck.integer(ck.member(sh, at, "cases_run"), at + ".cases_run");
    e.next_case = ck.integer(ck.member(sh, at, "next_case"), at + ".next_case");
    const nlohmann::json& el = ck.member(sh, at, "elapsed_s");
    if (!el.is_number() || !std::isfinite(el.get<double>()) || el.get<double>() < 0)
      ck.fail(at + ".elapsed_s: seconds >= 0", brief(el));
    const std::string shard = fmt::format("shard {}/{}", e.index, e.count);
    // next_case: one past the last case the shard began (case i runs on shard i % N; a --repro
    // replay is case 0 of every shard). An interrupted shard may have begun one case it did not count.
    auto next_after = [&](int64_t run) {
      if (run == 0) return int64_t{0};
      if (replay) return run;
      return ck.add(ck.mul(run - 1, e.count, at + ".next_case"), e.index + 1, at + ".next_case");
    };
    const int64_t next = next_after(e.cases_run);
    if (replay && e.cases_run > 1) ck.fail(at + ".cases_run: 0 or 1 (config.repro: one case)", std::to_string(e.cases_run));
    const bool begun_one_more = out.interrupted && !replay && e.next_case != next &&
                                e.cases_run < int64_max && e.next_case == next_after(e.cases_run + 1);
    const bool begun_replay = out.interrupted && replay && e.next_case == e.cases_run + 1 && e.cases_run == 0;
    if (e.next_case != next && !begun_one_more && !begun_replay) {
      ck.fail(fmt::format("{}.next_case {} (after {} case(s) of {})", at, next, e.cases_run, shard),
              std::to_string(e.next_case));
    }
    if (total_cases >= 0) {
      const int64_t share = replay ? 1 : shard_share(total_cases, e.index, e.count);
      if (e.cases_run > share) {
        ck.fail(fmt::format("{}.cases_run <= {} ({} of config.cases {})", at, share, shard, total_cases),
                std::to_string(e.cases_run));
      }
      if (e.cases_run < share && !timed && !out.interrupted) {
        if (max_failures == 0) {
          ck.fail(fmt::format("{}.cases_run {} (the share of {} in config.cases {}; no time limit, no "
                              "max_failures, not interrupted)",
                              at, share, shard, total_cases),
                  std::to_string(e.cases_run));
        }
        e.stopped_early = true;
      }
    }
    cases_run = ck.add(cases_run, e.cases_run, "the sum of shards[].cases_run");
    out.shards.push_back(e);
  }
  for (const shard_entry& e : out.shards) {
    if (st.shard_count == 0) st.shard_count = e.count;
    if (e.count != st.shard_count) {
      ck.fail(fmt::format("shards of {} (as in {})", st.shard_count, st.names[0]),
              fmt::format("shard {}/{}", e.index, e.count));
    }
    auto [it, fresh] = st.shard_in.emplace(e.index, ck.name);
    if (!fresh) {
      ck.fail(fmt::format("each shard of {} once", st.shard_count),
              fmt::format("shard {}/{} twice{}", e.index, e.count,
                          it->second == ck.name ? "" : " (also in " + it->second + ")"));
    }
  }
  if (out.counts.total() != cases_run) {
    ck.fail(fmt::format("counts.total {} (the sum of shards[].cases_run)", cases_run),
            std::to_string(out.counts.total()));
  }
  const int64_t bad = ck.add(out.counts.failed, out.counts.errored, "counts.failed + counts.errored");
  const int64_t early = std::count_if(out.shards.begin(), out.shards.end(),
                                      [](const shard_entry& e) { return e.stopped_early; });
  if (max_failures > 0) {
    // a shard stops at exactly max_failures FAILED/ERRORED cases and never goes beyond
    const int64_t most = ck.mul(max_failures, static_cast<int64_t>(out.shards.size()), "config.max_failures x shards");
    if (bad > most) {
      ck.fail(fmt::format("at most {} FAILED/ERRORED cases (config.max_failures {} on {} shard(s))", most,
                          max_failures, out.shards.size()),
              std::to_string(bad));
    }
  }
  if (early > 0) {
    const int64_t least = max_failures > 0 ? ck.mul(max_failures, early, "config.max_failures x shards") : early;
    if (bad < least) {
      ck.fail(fmt::format("at least {} FAILED/ERRORED cases ({} shard(s) stopped before their share of "
                          "config.cases, which only max_failures does)",
                          least, early),
              std::to_string(bad));
    }
  }

  // listed cases: on the report's shards, once, never passed, and as many as the counts say
  const nlohmann::json& cases = ck.member(r, "", "cases");
  if (!cases.is_array()) ck.fail("cases: an array", brief(cases));
  std::map<std::string, int64_t> listed_of;
  std::map<int64_t, int64_t> outcome_of;  // listed case index -> position in cases
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::string at = fmt::format("cases[{}]", c);
    const nlohmann::json& cs = cases[c];
    const int64_t index = ck.integer(ck.member(cs, at, "index"), at + ".index", replay ? -1 : 0);
    const nlohmann::json& oc = ck.member(cs, at, "outcome");
    std::string key;
    for (size_t k = 1; k < 5; ++k)  // count_keys[0] is "passed": never listed
      if (oc == outcome_names[k]) key = count_keys[k];
    if (key.empty()) ck.fail(at + ".outcome: FAILED, ERRORED, SKIPPED or MISTRUSTED (passed cases are not listed)", brief(oc));
    for (const char* k : {"message", "replay"}) {
      const nlohmann::json& v = ck.member(cs, at, k);
      if (!v.is_string()) ck.fail(fmt::format("{}.{}: a string", at, k), brief(v));
    }
    shard_entry* home = nullptr;
    for (shard_entry& e : out.shards) {
      if (replay ? index == -1 : (index % e.count == e.index && index < e.next_case)) {
        home = &e;
        break;
      }
    }
    if (!home) {
      std::vector<int64_t> idx;
      for (const shard_entry& e : out.shards) idx.push_back(e.index);
      std::sort(idx.begin(), idx.end());
      ck.fail(replay ? at + ".index -1 (config.repro: the replayed case)"
                     : fmt::format("{}.index on the report's shards {} of {} (i % {}) and below their next_case",
                                   at, index_list(idx), out.shards[0].count, out.shards[0].count),
              std::to_string(index));
    }
    auto [it, fresh] = st.listed_in.emplace(index, ck.name);
    if (!fresh) {
      ck.fail("each case listed once",
              fmt::format("case {} twice{}", index, it->second == ck.name ? "" : " (also in " + it->second + ")"));
    }
    ++home->listed;
    ++listed_of[key];
    outcome_of[index] = static_cast<int64_t>(c);
  }
  bool complete = true;  // no shard reached the cap: every non-passed case is listed
  for (const shard_entry& e : out.shards) {
    if (e.listed > opt.max_reported) {
      ck.fail(fmt::format("at most {} listed cases of shard {}/{}", opt.max_reported, e.index, e.count),
              std::to_string(e.listed));
    }
    if (e.listed == opt.max_reported) complete = false;
  }
  const int64_t counts_of[] = {out.counts.passed, out.counts.failed, out.counts.errored, out.counts.skipped,
                               out.counts.mistrusted};
  for (size_t k = 1; k < 5; ++k) {
    const int64_t listed = listed_of[count_keys[k]];
    if (listed > counts_of[k]) {
      ck.fail(fmt::format("at most {} listed {} cases (counts.{})", counts_of[k], outcome_names[k], count_keys[k]),
              std::to_string(listed));
    }
    if (complete && listed != counts_of[k]) {
      ck.fail(fmt::format("{} listed {} cases (counts.{}; a shard lists every non-passed case up to {})",
                          counts_of[k], outcome_names[k], count_keys[k], opt.max_reported),
              std::to_string(listed));
    }
  }
  if (complete) {
    // a shard that stopped early stopped right after a FAILED/ERRORED case
    for (const shard_entry& e : out.shards) {
      if (!e.stopped_early) continue;
      const int64_t last = e.next_case - 1;
      auto it = outcome_of.find(last);
      const nlohmann::json* oc = it == outcome_of.end() ? nullptr : &cases[static_cast<size_t>(it->second)].at("outcome");
      if (!oc || (*oc != "FAILED" && *oc != "ERRORED")) {
        ck.fail(fmt::format("case {} (the last of shard {}/{}, which stopped early) listed FAILED or ERRORED", last,
                            e.index, e.count),
                oc ? brief(*oc) : "not listed");
      }
    }
  }

  const int64_t skipped = ck.add_tally(ck.member(r, "", "skip_reasons"), "skip_reasons", out.skips);
  if (skipped != out.counts.skipped) {
    ck.fail(fmt::format("skip_reasons summing to counts.skipped {}", out.counts.skipped), std::to_string(skipped));
  }
  if (r.contains("variants")) {  // absent in reports written before it existed
    const int64_t ran = ck.add_tally(r.at("variants"), "variants", out.variants);
    if (ran > out.counts.total()) {
      ck.fail(fmt::format("variants summing to at most counts.total {}", out.counts.total()), std::to_string(ran));
    }
  }
  if (r.contains("numerics")) ck.add_tally(r.at("numerics"), "numerics", out.numerics);
  return out;
}

}  // namespace

fuzz_counts counts_of_report(const nlohmann::json& r, const std::string& name) {
  const report_checker ck{name};
  const nlohmann::json& k = ck.member(r, "", "counts");
  int64_t v[5] = {};
  int64_t sum = 0;
  for (int i = 0; i < 5; ++i) {
    v[i] = ck.integer(ck.member(k, "counts", count_keys[i]), std::string("counts.") + count_keys[i]);
    sum = ck.add(sum, v[i], "counts whose sum (counts.total) is");
  }
  const int64_t total = ck.integer(ck.member(k, "counts", "total"), "counts.total");
  if (total != sum) {
    ck.fail(fmt::format("counts.total {} (passed + failed + errored + skipped + mistrusted)", sum),
            std::to_string(total));
  }
  fuzz_counts c;
  c.passed = v[0];
  c.failed = v[1];
  c.errored = v[2];
  c.skipped = v[3];
  c.mistrusted = v[4];
  return c;
}

nlohmann::json merge_reports(const std::vector<nlohmann::json>& reports, const merge_options& opt) {
  if (reports.empty()) throw arg_error("report merge", "at least one report", "none");
  if (opt.max_reported < 0) throw arg_error("max_reported", ">= 0", std::to_string(opt.max_reported));
  std::vector<std::string> names;
  for (size_t i = 0; i < reports.size(); ++i)
    names.push_back(i < opt.names.size() ? opt.names[i] : fmt::format("report {}", i + 1));

  merge_state st{names, &reports[0], 0, {}, {}};
  int64_t sums[5] = {};
  std::map<std::string, int64_t> skips, variants, numerics;
  bool interrupted = false;
  for (size_t i = 0; i < reports.size(); ++i) {
    const report_checker ck{names[i]};
    const checked_report k = check_report(reports[i], ck, opt, st);
    const int64_t add[5] = {k.counts.passed, k.counts.failed, k.counts.errored, k.counts.skipped,
                            k.counts.mistrusted};
    int64_t total = 0;
    for (int j = 0; j < 5; ++j) {
      sums[j] = ck.add(sums[j], add[j], fmt::format("the merged counts.{}", count_keys[j]));
      total = ck.add(total, sums[j], "the merged counts.total");
    }
    for (const auto& [key, n] : k.skips) skips[key] = ck.add(skips[key], n, "the merged skip_reasons");
    for (const auto& [key, n] : k.variants) variants[key] = ck.add(variants[key], n, "the merged variants");
    for (const auto& [key, n] : k.numerics) numerics[key] = ck.add(numerics[key], n, "the merged numerics");
    interrupted = interrupted || k.interrupted;
  }
  if (static_cast<int64_t>(st.shard_in.size()) != st.shard_count) {
    std::vector<int64_t> got, missing;
    for (const auto& [index, name] : st.shard_in) got.push_back(index);
    size_t j = 0;
    for (int64_t k = 0; k < st.shard_count && missing.size() <= 64; ++k) {
      if (j < got.size() && got[j] == k) {
        ++j;
      } else {
        missing.push_back(k);
      }
    }
    std::string who;
    if (names.size() <= 3) {
      for (const std::string& n : names) who += (who.empty() ? "" : ", ") + n;
    } else {
      who = fmt::format("{}, ..., {} ({} reports)", names[0], names.back(), names.size());
    }
    if (missing.size() > 64) missing.pop_back();
    throw arg_error(who, fmt::format("shards 0..{} of {}", st.shard_count - 1, st.shard_count),
                    fmt::format("{} (missing {}{})", index_list(got), index_list(missing),
                                static_cast<int64_t>(got.size() + missing.size()) < st.shard_count ? ", ..." : ""));
  }
  fuzz_counts c;
  c.passed = sums[0];
  c.failed = sums[1];
  c.errored = sums[2];
  c.skipped = sums[3];
  c.mistrusted = sums[4];

  nlohmann::json merged = reports[0];
  nlohmann::json shards = nlohmann::json::array();
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& r : reports) {
    for (const auto& sh : r.at("shards")) shards.push_back(sh);
    for (const auto& cs : r.at("cases")) cases.push_back(cs);
  }
  std::stable_sort(shards.begin(), shards.end(), [](const nlohmann::json& x, const nlohmann::json& y) {
    return x.at("index").get<int64_t>() < y.at("index").get<int64_t>();
  });
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
  merged["interrupted"] = interrupted;
  merged["summary"] = summary_line(c);
  return merged;
}

}  // namespace ropekv
