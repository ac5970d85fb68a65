// The fuzz engine catches deliberately broken backends within 200 cases,
// shrinks each failure, and the shrunk repro replays the failure (in-process and via the CLI).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

#include "backends/cpu/cpu_backend.h"
#include "core/convert.h"
#include "core/problem.h"
#include "tools/backends_registry.h"
#include "tools/cli.h"
#include "harness/fuzz.h"

namespace ropekv {
namespace {

int64_t read_slot(const tensor_view& v, int64_t t) {
  uint64_t bits = load_bits(v.type, static_cast<const uint8_t*>(v.data) +
                                        t * v.strides_elems[0] * static_cast<int64_t>(dtype_size_bytes(v.type)));
  return v.type == dtype::i32 ? static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(bits)))
                              : static_cast<int64_t>(bits);
}

// The reference with a bug planted around it.
class broken_backend : public backend {
 public:
  explicit broken_backend(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::string unsupported_reason(const op_args& args) const override {
    return ref_->unsupported_reason(args);
  }

 protected:
  std::unique_ptr<backend> ref_ = make_cpu_backend();
  std::string name_;
};

// Off by one in the cache address: token t goes to entry slot+1 (when that entry is free).
class entry_plus_one : public broken_backend {
 public:
  entry_plus_one() : broken_backend("broken-entry") {}
  void run_host(const op_args& args, const std::vector<memory_region>& regions) override {
    const int64_t ts = args.slot_mapping.shape[0];
    const tensor_view& c = args.cache.present() ? args.cache : args.ckv_cache;
    const int64_t capacity = c.shape[0] * c.shape[1];
    std::set<int64_t> used;
    std::vector<int64_t> slots(static_cast<size_t>(ts));
    for (int64_t t = 0; t < ts; ++t) used.insert(slots[t] = read_slot(args.slot_mapping, t));
    for (auto& s : slots) {
      if (s >= 0 && s + 1 < capacity && !used.count(s + 1)) s = s + 1;
    }
    op_args bad = args;
    bad.slot_mapping = make_view(dtype::i64, slots.data(), {ts});
    ref_->run_host(bad, regions);
  }
};

// Rope outputs of q_out rounded by truncation (toward zero) instead of to nearest even.
class rope_truncation : public broken_backend {
 public:
  rope_truncation() : broken_backend("broken-trunc") {}
  void run_host(const op_args& args, const std::vector<memory_region>& regions) override {
    const int64_t tq = args.q_nope.shape[0], heads = args.q_nope.shape[1];
    const int64_t dn = args.q_nope.shape[2], dr = args.q_pe.shape[2];
    const dtype out_t = args.q_out.type;
    std::vector<uint32_t> bits(static_cast<size_t>(tq * heads * dr));
    for (int64_t t = 0; t < tq; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = 0; j < dr; ++j) {
          rope_operands o = q_rope_operands(args, t, h, j);
          double v = o.x * o.c + o.partner * o.s;
          if (dtype_is_fp8(out_t)) {
            const float qs = q_scale_of(args);  // the tensor's value with scales=tensor
            v = args.options.scale == scale_conv::divide ? v / qs
                                                         : v * static_cast<double>(1.0f / qs);
          }
          uint32_t b = encode_from_f64(out_t, v, dtype_is_fp8(out_t) ? overflow_mode::saturate : overflow_mode::ieee);
          double back = decode_to_f64(out_t, b);
          if (std::isfinite(back) && std::fabs(back) > std::fabs(v)) {  // rounded away from zero
            const int bits_n = static_cast<int>(8 * dtype_size_bytes(out_t));
            const uint32_t sign = 1u << (bits_n - 1);
            uint32_t mag = b & (sign - 1);
            b = mag > 1 ? (b & sign) | (mag - 1) : 0;  // one step toward zero (never -0 / fnuz NaN)
          }
          bits[(t * heads + h) * dr + j] = b;
        }
      }
    }
    ref_->run_host(args, regions);
    for (int64_t t = 0; t < tq; ++t) {
      if (args.options.padding == pad_q::skipped && read_slot(args.slot_mapping, t) < 0) continue;
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = 0; j < dr; ++j) {
          int64_t off = t * args.q_out.strides_elems[0] + h * args.q_out.strides_elems[1] + dn + j;
          store_bits(out_t, static_cast<uint8_t*>(args.q_out.data) + off * static_cast<int64_t>(dtype_size_bytes(out_t)),
                     bits[(t * heads + h) * dr + j]);
        }
      }
    }
  }
};

// Forgets the last slot-mapped token (and its q row when Tq == Ts).
class skip_last_token : public broken_backend {
 public:
  skip_last_token() : broken_backend("broken-skip") {}
  void run_host(const op_args& args, const std::vector<memory_region>& regions) override {
    op_args bad = args;
    const int64_t ts = args.slot_mapping.shape[0];
    if (ts > 0) {
      bad.slot_mapping.shape[0] = ts - 1;
      if (args.q_nope.shape[0] == ts) {
        for (tensor_view* v : {&bad.q_nope, &bad.q_pe, &bad.q_out}) v->shape[0] = ts - 1;
      }
    }
    ref_->run_host(bad, regions);
  }
};

template <typename B>
backend_factory factory_of() {
  return [] { return std::unique_ptr<backend>(new B()); };
}

struct planted {
  const char* name;
  backend_factory factory;
  int64_t max_ulp;
};

}  // namespace

TEST_CASE("fuzz catches each planted bug within 200 cases, shrinks it, and the repro replays") {
  // Truncation is at most 1 ulp from round-to-nearest: the default --max-ulp 1 admits it by
  // design, so that bug is hunted with --max-ulp 0 (below we also show that ulp 1 passes it).
  const planted bugs[] = {{"broken-entry", factory_of<entry_plus_one>(), 1},
                          {"broken-trunc", factory_of<rope_truncation>(), 0},
                          {"broken-skip", factory_of<skip_last_token>(), 1}};
  for (const planted& bug : bugs) {
    CAPTURE(bug.name);
    fuzz_options opt;
    opt.backend_a = "ref";
    opt.backend_b = bug.name;
    opt.factory_a = [] { return make_cpu_backend(); };
    opt.factory_b = bug.factory;
    opt.seed = 4;
    opt.cases = 200;
    opt.max_tokens = 16;
    opt.cmp.max_ulp = bug.max_ulp;
    opt.max_failures = 1;
    opt.shrink_time_s = 4;
    std::ostringstream out;
    fuzz_summary s = run_fuzz(with_registry(opt), out, false);
    INFO(out.str());
    if (std::getenv("ROPEKV_TEST_VERBOSE")) MESSAGE(out.str());
    REQUIRE(s.counts.failed == 1);
    CHECK(s.counts.errored == 0);
    CHECK(s.cases_run <= 200);
    REQUIRE(!s.notable.empty());
    const case_record& rec = s.notable.back();
    CHECK(rec.report.outcome == case_outcome::failed);
    REQUIRE(!rec.shrunk_repro.empty());
    CHECK(out.str().find("shrunk") != std::string::npos);
    CHECK(out.str().find(rec.shrunk_replay) != std::string::npos);
    const std::string last_line = out.str().substr(out.str().rfind('\n', out.str().size() - 2) + 1);
    CHECK(last_line.find(" passed, 1 failed") != std::string::npos);

    problem original = parse_problem(rec.report.repro);
    problem shrunk = parse_problem(rec.shrunk_repro);
    CHECK(shrunk.tk * shrunk.heads * (shrunk.dn + shrunk.dr) <=
          original.tk * original.heads * (original.dn + original.dr));
    CHECK(shrunk != original);

    // The shrunk repro replays the failure in-process ...
    auto a = make_cpu_backend();
    auto b = bug.factory();
    case_record replay = run_case(shrunk, *a, *b, opt.cmp);
    CHECK(replay.report.outcome == case_outcome::failed);
    // ... and through the CLI (a test-only registration makes the name resolvable).
    register_test_backend(bug.name, bug.factory);
    std::ostringstream cli_out, cli_err;
    std::vector<std::string> args = {"fuzz", "--backends", std::string("ref,") + bug.name,
                                     "--max-ulp", std::to_string(bug.max_ulp), "--no-shrink",
                                     "--repro", rec.shrunk_repro};
    int rc = cli_main(args, cli_out, cli_err);
    unregister_test_backend(bug.name);
    INFO(cli_out.str(), cli_err.str());
    CHECK(rc == 1);
    CHECK(cli_out.str().find("FAILED") != std::string::npos);
    CHECK(cli_out.str().find("0 passed, 1 failed") != std::string::npos);
  }
}

TEST_CASE("truncated rope rounding is inside --max-ulp 1 by design") {
  auto a = make_cpu_backend();
  rope_truncation b;
  compare_options cmp;  // max_ulp 1
  int failed = 0;
  for (uint64_t i = 0; i < 20; ++i) {
    problem p = random_problem(4, i, 8);
    case_record r = run_case(p, *a, b, cmp);
    failed += r.report.outcome == case_outcome::failed;
  }
  CHECK(failed == 0);
}

TEST_CASE("ref vs ref and ref vs sim pass a short campaign") {
  for (const char* other : {"ref", "sim"}) {
    fuzz_options opt;
    opt.backend_a = "ref";
    opt.backend_b = other;
    opt.seed = 11;
    opt.cases = 25;
    opt.max_tokens = 16;
    std::ostringstream out;
    fuzz_summary s = run_fuzz(with_registry(opt), out, false);
    INFO(out.str());
    CHECK(s.counts.failed == 0);
    CHECK(s.counts.errored == 0);
    CHECK(s.counts.total() == 25);
    CHECK(s.counts.passed + s.counts.skipped + s.counts.mistrusted == 25);
    CHECK(s.counts.passed >= 18);
  }
}

TEST_CASE("shards partition the case stream; merge equals the unsharded run") {
  auto run = [](int64_t k, int64_t n) {
    fuzz_options opt;
    opt.backend_a = "ref";
    opt.backend_b = "broken-skip";
    opt.factory_b = factory_of<skip_last_token>();
    opt.seed = 5;
    opt.cases = 16;
    opt.max_tokens = 8;
    opt.shrink = false;
    opt.shard_index = k;
    opt.shard_count = n;
    std::ostringstream out;
    return fuzz_report_json(opt, run_fuzz(with_registry(opt), out, false));
  };
  nlohmann::json whole = run(0, 1);
  nlohmann::json merged = merge_reports({run(1, 2), run(0, 2)});
  fuzz_counts cw = counts_of_report(whole), cm = counts_of_report(merged);
  CHECK(cw.failed > 0);
  CHECK(cw.passed == cm.passed);
  CHECK(cw.failed == cm.failed);
  CHECK(cw.errored == cm.errored);
  CHECK(cw.skipped == cm.skipped);
  CHECK(cw.total() == 16);
  REQUIRE(whole["cases"].size() == merged["cases"].size());
  for (size_t i = 0; i < whole["cases"].size(); ++i) {
    CHECK(whole["cases"][i]["index"] == merged["cases"][i]["index"]);
    CHECK(whole["cases"][i]["repro"] == merged["cases"][i]["repro"]);
  }
  CHECK(merged["shards"].size() == 2);
  CHECK(merged["interrupted"] == false);
  // The same shard twice is refused.
  nlohmann::json s0 = run(0, 2);
  CHECK_THROWS_AS(merge_reports({s0, s0}), arg_error);
}

namespace {

// A campaign of the broken-skip backend (FAILED cases among passed and skipped ones).
nlohmann::json skip_campaign(int64_t k, int64_t n, int64_t cases, int64_t max_failures = 0, int64_t max_reported = 50) {
  fuzz_options opt;
  opt.backend_a = "ref";
  opt.backend_b = "broken-skip";
  opt.factory_b = factory_of<skip_last_token>();
  opt.seed = 5;
  opt.cases = cases;
  opt.max_tokens = 8;
  opt.shrink = false;
  opt.shard_index = k;
  opt.shard_count = n;
  opt.max_failures = max_failures;
  opt.max_reported = max_reported;
  std::ostringstream out;
  return fuzz_report_json(opt, run_fuzz(with_registry(opt), out, false));
}

// The arg_error merge_reports throws, as "<arg>: expected <e>, got <g>" ("" when it merges).
std::string merge_error(const std::vector<nlohmann::json>& reports, const merge_options& opt = {}) {
  try {
    merge_reports(reports, opt);
  } catch (const arg_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("merge_reports refuses what no campaign writes, naming the report") {
  const nlohmann::json s0 = skip_campaign(0, 2, 16), s1 = skip_campaign(1, 2, 16);
  REQUIRE(counts_of_report(s0).failed > 0);
  REQUIRE(counts_of_report(s1).failed > 0);
  REQUIRE(merge_error({s0, s1}).empty());
  merge_options named;
  named.names = {"a.json", "b.json"};

  SUBCASE("shards: all of 0..N-1, each once, of one count") {
    const nlohmann::json q0 = skip_campaign(0, 4, 16), q1 = skip_campaign(1, 4, 16), q3 = skip_campaign(3, 4, 16);
    merge_options three;
    three.names = {"q0", "q1", "q3"};
    CHECK(merge_error({q0, q1, q3}, three) == "q0, q1, q3: expected shards 0..3 of 4, got 0, 1, 3 (missing 2)");
    CHECK(merge_error({s0}, named) == "a.json: expected shards 0..1 of 2, got 0 (missing 1)");
    CHECK(merge_error({s0, q1}, named) == "b.json: expected shards of 2 (as in a.json), got shard 1/4");
    CHECK(merge_error({s0, s0}, named) == "b.json: expected each shard of 2 once, got shard 0/2 twice (also in a.json)");
  }
  SUBCASE("counts: non-negative integers that add up, in 64 bits") {
    nlohmann::json bad = s1;
    bad["counts"]["failed"] = -1;
    CHECK(merge_error({s0, bad}, named) ==
          "b.json: expected counts.failed: an integer in 0..9223372036854775807, got -1");
    bad["counts"]["failed"] = 1e300;
    CHECK(merge_error({s0, bad}, named) ==
          "b.json: expected counts.failed: an integer in 0..9223372036854775807, got 1e+300");
    bad["counts"]["failed"] = 2.0;
    CHECK(merge_error({s0, bad}, named).find("got 2.0") != std::string::npos);
    bad = s1;
    bad["counts"]["passed"] = INT64_MAX;
    CHECK(merge_error({s0, bad}, named).find("b.json: expected counts whose sum (counts.total) is within 64-bit "
                                             "integers, got a sum beyond 2^63-1") == 0);
    bad = s1;
    bad["counts"]["total"] = bad["counts"]["total"].get<int64_t>() + 1;
    CHECK(merge_error({s0, bad}, named).find("b.json: expected counts.total ") == 0);
    // the largest campaign two shards can hold: next_case stays within int64, the total is 2^63-1
    nlohmann::json big0 = s0, big1 = s1;
    for (nlohmann::json* r : {&big0, &big1}) {
      const int64_t k = (*r)["shards"][0]["index"].get<int64_t>(), run = (int64_t{1} << 62) - k;
      (*r)["config"]["cases"] = nullptr;
      (*r)["config"]["time_limit_s"] = 60.0;
      (*r)["shards"][0]["cases_run"] = run;
      (*r)["shards"][0]["next_case"] = (run - 1) * 2 + k + 1;
      (*r)["counts"] = {{"passed", run}, {"failed", 0}, {"errored", 0}, {"skipped", 0}, {"mistrusted", 0}, {"total", run}};
      (*r)["cases"] = nlohmann::json::array();
      (*r)["skip_reasons"] = nlohmann::json::object();
      (*r)["variants"] = nlohmann::json::object();
    }
    CHECK(merge_reports({big0, big1})["summary"] == "9223372036854775807 passed, 0 failed");
    // one case more on shard 1: its next_case would be 2^63
    big1["shards"][0]["cases_run"] = int64_t{1} << 62;
    big1["counts"]["passed"] = int64_t{1} << 62;
    big1["counts"]["total"] = int64_t{1} << 62;
    CHECK(merge_error({big0, big1}, named).find("b.json: expected shards[0].next_case within 64-bit integers") == 0);
    // tallies that overflow only when summed
    big0["numerics"] = {{"q_out.rope: exactly fp32", INT64_MAX}};
    big1 = s1;
    big1["config"] = big0["config"];
    big1["numerics"] = {{"q_out.rope: exactly fp32", 1}};
    CHECK(merge_error({big0, big1}, named) ==
          "b.json: expected the merged numerics within 64-bit integers, got a sum beyond 2^63-1");
  }
  SUBCASE("shards ran what the campaign gives them") {
    nlohmann::json bad = s1;
    bad["shards"][0]["cases_run"] = 7;  // shard 1/2 of 16 cases runs 8
    bad["shards"][0]["next_case"] = 14;
    bad["counts"]["passed"] = bad["counts"]["passed"].get<int64_t>() - 1;
    bad["counts"]["total"] = 7;
    const std::string e = merge_error({s0, bad}, named);
    CHECK(e.find("b.json: expected shards[0].cases_run 8 (the share of shard 1/2 in config.cases 16") == 0);
    bad = s1;
    bad["shards"][0]["next_case"] = 15;
    CHECK(merge_error({s0, bad}, named) == "b.json: expected shards[0].next_case 16 (after 8 case(s) of shard 1/2), got 15");
  }
  SUBCASE("listed cases: on their shard, once, as many as counted") {
    nlohmann::json bad = s1;
    REQUIRE(!bad["cases"].empty());
    bad["cases"][0]["index"] = 0;  // case 0 runs on shard 0
    CHECK(merge_error({s0, bad}, named).find("b.json: expected cases[0].index on the report's shards 1 of 2") == 0);
    bad = s1;
    bad["cases"].push_back(bad["cases"][0]);
    CHECK(merge_error({s0, bad}, named).find(" twice") != std::string::npos);
    bad = s1;
    bad["counts"]["passed"] = bad["counts"]["passed"].get<int64_t>() + bad["counts"]["failed"].get<int64_t>();
    bad["counts"]["failed"] = 0;  // the listed FAILED cases, uncounted
    CHECK(merge_error({s0, bad}, named).find("b.json: expected at most 0 listed FAILED cases (counts.failed)") == 0);
    bad = s1;
    bad["cases"].erase(bad["cases"].begin());  // under the cap every non-passed case is listed
    CHECK(merge_error({s0, bad}, named).find("listed") != std::string::npos);
  }
  SUBCASE("a shard at the cap lists fewer cases than it counts; beyond the cap is refused") {
    const nlohmann::json c0 = skip_campaign(0, 2, 16, 0, 2), c1 = skip_campaign(1, 2, 16, 0, 2);
    REQUIRE(c0["cases"].size() == 2);
    merge_options cap;
    cap.max_reported = 2;
    CHECK(merge_error({c0, c1}, cap).empty());
    CHECK(merge_error({s0, s1}, cap).find("expected at most 2 listed cases of shard 0/2") != std::string::npos);
  }
  SUBCASE("interrupted reports only with allow_interrupted; the merge is marked") {
    nlohmann::json cut = s1;
    cut["interrupted"] = true;
    CHECK(merge_error({s0, cut}, named).find("b.json: expected a complete campaign") == 0);
    merge_options allow = named;
    allow.allow_interrupted = true;
    CHECK(merge_reports({s0, cut}, allow)["interrupted"] == true);
    cut["interrupted"] = "yes";
    CHECK(merge_error({s0, cut}, allow) == "b.json: expected interrupted: true or false, got \"yes\"");
  }
  SUBCASE("configs and contract versions of one campaign") {
    nlohmann::json other = s1;
    other["config"]["seed"] = 6;
    CHECK(merge_error({s0, other}, named) == "b.json: expected config.seed 5 (as in a.json: shards of one campaign), got 6");
    other = s1;
    other["contract_version"] = other["contract_version"].get<int64_t>() + 1;
    CHECK(merge_error({s0, other}, named).find("b.json: expected contract_version ") == 0);
  }
}

TEST_CASE("merge_reports: --max-failures shards stop early and merge; a shard cut short does not") {
  const nlohmann::json s0 = skip_campaign(0, 2, 40, 1), s1 = skip_campaign(1, 2, 40, 1);
  const fuzz_counts c0 = counts_of_report(s0), c1 = counts_of_report(s1);
  REQUIRE(c0.failed == 1);
  REQUIRE(c1.failed == 1);
  REQUIRE(c0.total() < 20);  // each shard stopped at its first failure
  REQUIRE(s0["config"]["max_failures"] == 1);
  const nlohmann::json merged = merge_reports({s0, s1});
  CHECK(merged["counts"]["failed"] == 2);
  // the same shard stopped one case earlier (before its failure) is refused
  nlohmann::json cut = s0;
  const int64_t run = c0.total() - 1;
  cut["shards"][0]["cases_run"] = run;
  cut["shards"][0]["next_case"] = run > 0 ? (run - 1) * 2 + 1 : 0;
  cut["counts"] = {{"passed", run}, {"failed", 0}, {"errored", 0}, {"skipped", 0}, {"mistrusted", 0}, {"total", run}};
  cut["cases"] = nlohmann::json::array();
  cut["skip_reasons"] = nlohmann::json::object();
  cut["variants"] = nlohmann::json::object();
  CHECK(merge_error({cut, s1}).find("report 1: expected at least 1 FAILED/ERRORED cases") == 0);
  // a time-bounded campaign's shards may stop anywhere
  nlohmann::json timed0 = cut, timed1 = s1;
  for (nlohmann::json* r : {&timed0, &timed1}) (*r)["config"]["time_limit_s"] = 5.0;
  CHECK(merge_error({timed0, timed1}).empty());
}

}  // namespace ropekv

#include <filesystem>
#include <unistd.h>

#include "core/golden.h"
#include "harness/golden_io.h"

namespace ropekv {
TEST_CASE("--dump writes a failing case as a readable golden file with both outputs") {
  auto dir = std::filesystem::temp_directory_path() / ("ropekv_test_dump_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  fuzz_options opt;
  opt.backend_a = "ref";
  opt.backend_b = "broken-entry";
  opt.factory_b = factory_of<entry_plus_one>();
  opt.seed = 4;
  opt.cases = 50;
  opt.max_tokens = 8;
  opt.max_failures = 1;
  opt.shrink = false;
  opt.dump_dir = dir.string();
  std::ostringstream out;
  fuzz_summary s = run_fuzz(with_registry(opt), out, false);
  REQUIRE(s.counts.failed == 1);
  const std::string path = s.notable.back().dumped_to;
  INFO(out.str());
  REQUIRE(std::filesystem::exists(path));
  REQUIRE(std::filesystem::exists(got_dump_path(path)));
  golden_file fa = read_golden(path);
  golden_file fb = read_golden(got_dump_path(path));
  CHECK(fa.metadata.at("backend_b") == "broken-entry");
  CHECK(fa.metadata.at("expected_from") == "ref");
  CHECK(fb.metadata.at("expected_from") == "broken-entry");
  CHECK(fa.prob == fb.prob);
  const std::string cache = fa.tensors.count("cache.expected") ? "cache" : "ckv_cache";
  CHECK(fa.tensors.at(cache + ".initial").bytes == fb.tensors.at(cache + ".initial").bytes);
  CHECK(fa.tensors.at(cache + ".expected").bytes != fb.tensors.at(cache + ".expected").bytes);
  std::filesystem::remove_all(dir);
}
}  // namespace ropekv
