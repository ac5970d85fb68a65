// `ropekv fuzz --profile aligned16` (the fast-path profile): coerce_aligned16 keeps the problem's
// other choices and lands in the GPU fast paths' domain (checked against launch_plan.h's own
// eligibility, rk_v4_refusal), the campaign passes ref vs sim with fast_v4 taking most cases,
// shrinking stays inside the profile, and shards / merge / replay commands carry the profile.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "backends/hip/variant.h"
#include "backends/sim/sim_backend.h"
#include "core/case_data.h"
#include "core/error.h"
#include "core/problem.h"
#include "tools/backends_registry.h"
#include "tools/cli.h"
#include "harness/fuzz.h"

#ifndef ROPEKV_SIM
#define ROPEKV_SIM 1
#endif
#include "backends/hip/kernel.h"
#include "backends/hip/launch_plan.h"

namespace ropekv {
namespace {

// The reference, then the lowest bit of q_out's first byte flipped (q_out[0, 0, 0] of a
// nope-first row: a bit-exact region), so every case with Tq >= 1 FAILS.
class q_out_bit_flip : public backend {
 public:
  std::string name() const override { return "broken-qbit"; }
  std::string unsupported_reason(const op_args& args) const override { return ref_->unsupported_reason(args); }
  void run_host(const op_args& args, const std::vector<memory_region>& regions) override {
    ref_->run_host(args, regions);
    if (args.q_out.shape[0] > 0) *static_cast<uint8_t*>(args.q_out.data) ^= 1u;
  }

 private:
  std::unique_ptr<backend> ref_ = make_cpu_backend();
};

bool in_aligned16(const problem& p) {
  const int64_t cache_align = p.opt.layout == cache_layout::fp8_ds_mla ? 16 : 8;  // u8 records: 16 bytes
  return (p.in_dtype == dtype::f16 || p.in_dtype == dtype::bf16) && p.q_out_dtype == p.in_dtype &&
         (p.cache_dtype == p.in_dtype || dtype_is_fp8(p.cache_dtype) || p.opt.layout == cache_layout::fp8_ds_mla) &&
         !p.opt.inplace_q && !p.opt.inplace_k && p.dn % 8 == 0 &&
         p.dr % (p.opt.style == rope_style::neox ? 16 : 8) == 0 && p.row_pad_elems % 8 == 0 &&
         p.entry_pad_elems % cache_align == 0 && p.block_pad_elems % cache_align == 0 && p.table_pad_elems % 8 == 0 &&
         p.kv_heads == 1;  // no fast path takes KH > 1
}

}  // namespace

TEST_CASE("coerce_aligned16: in the profile, idempotent, canonical, everything else kept") {
  int invalid = 0;
  const int n = 2000;
  for (int i = 0; i < n; ++i) {
    const problem p = random_problem(31, static_cast<uint64_t>(i), 64);
    problem c;
    try {
      c = coerce_aligned16(p);
    } catch (const arg_error&) {
      ++invalid;
      continue;
    }
    INFO(p.to_repro());
    INFO(c.to_repro());
    CHECK(in_aligned16(c));
    CHECK(coerce_aligned16(c) == c);
    CHECK(parse_problem(c.to_repro()) == c);
    if (in_aligned16(p)) CHECK(c == p);  // already in the profile: untouched
    // what the profile does not constrain is kept
    CHECK(c.tq == p.tq);
    CHECK(c.ts == p.ts);
    CHECK(c.tk == p.tk);
    CHECK(c.heads == p.heads);
    CHECK(c.block_size == p.block_size);
    CHECK(c.num_blocks == p.num_blocks);
    CHECK(c.table_rows == p.table_rows);
    CHECK(c.table_dtype == p.table_dtype);
    CHECK(c.pos_dtype == p.pos_dtype);
    CHECK(c.slot_dtype == p.slot_dtype);
    CHECK(c.opt.style == p.opt.style);
    CHECK(c.opt.layout == p.opt.layout);
    CHECK(c.opt.tile_scale == p.opt.tile_scale);
    CHECK(c.opt.padding == p.opt.padding);
    CHECK(c.q_layout == p.q_layout);
    CHECK(c.kv_layout == p.kv_layout);
    CHECK(c.pad_slots == p.pad_slots);
    CHECK(c.seed == p.seed);
    if (p.in_dtype != dtype::f32) CHECK(c.in_dtype == p.in_dtype);
    if (dtype_is_fp8(p.cache_dtype)) CHECK(c.cache_dtype == p.cache_dtype);
    CHECK(c.dn >= p.dn);
    CHECK(c.dn - p.dn < 8);
    CHECK(c.row_pad_elems <= p.row_pad_elems);
  }
  MESSAGE(invalid, " of ", n, " coerced problems invalid");
  CHECK(invalid <= n / 20);
  // both 16-bit dtypes are drawn for f32 inputs
  int bf16 = 0, f16 = 0;
  for (uint64_t i = 0; i < 400; ++i) {
    const problem p = random_problem(32, i, 8);
    if (p.in_dtype != dtype::f32) continue;
    const problem c = coerce_aligned16(p);
    bf16 += c.in_dtype == dtype::bf16;
    f16 += c.in_dtype == dtype::f16;
  }
  CHECK(bf16 > 10);
  CHECK(f16 > 10);
}

TEST_CASE("aligned16 problems are accepted by fast_v4's eligibility (launch_plan.h rk_v4_refusal)") {
  const int n = 300;
  int accepted = 0, accepted_any = 0;
  std::map<std::string, int> refusals;
  for (int i = 0; i < n; ++i) {
    const problem p = profile_problem(fuzz_profile::aligned16, 41, static_cast<uint64_t>(i), 16);
    const case_data c = make_case(p);
    const std::string why = ropekv_gpu::rk_v4_refusal(ropekv_gpu::rk_make_launch(c.args).params);
    if (why.empty()) ++accepted; else ++refusals[why];
    const case_data d = make_case(profile_problem(fuzz_profile::any, 41, static_cast<uint64_t>(i), 16));
    accepted_any += ropekv_gpu::rk_v4_refusal(ropekv_gpu::rk_make_launch(d.args).params).empty();
  }
  for (const auto& [why, k] : refusals) MESSAGE("refused ", k, "x: ", why);
  MESSAGE("fast_v4 accepts ", accepted, " of ", n, " aligned16 problems, ", accepted_any, " of ", n, " any problems");
  CHECK(accepted >= n * 8 / 10);
  CHECK(accepted > 4 * accepted_any);  // the point of the profile
}

TEST_CASE("fuzz --profile aligned16: ref vs sim passes, fast_v4 takes most cases, report records both") {
  fuzz_options opt;
  opt.backend_a = "ref";
  opt.backend_b = "sim";
  opt.seed = 12;
  opt.cases = 120;
  opt.max_tokens = 16;
  opt.profile = fuzz_profile::aligned16;
  std::ostringstream out;
  const fuzz_summary s = run_fuzz(with_registry(opt), out, false);
  INFO(out.str());
  CHECK(s.counts.failed == 0);
  CHECK(s.counts.errored == 0);
  CHECK(s.counts.total() == 120);
  const int64_t v4 = s.variants.count("fast_v4") ? s.variants.at("fast_v4") : 0;
  CHECK(v4 >= 120 * 8 / 10);
  CHECK(out.str().find("profile aligned16") != std::string::npos);
  CHECK(out.str().find("sim kernels: ") != std::string::npos);
  const nlohmann::json j = fuzz_report_json(opt, s);
  CHECK(j["config"]["profile"] == "aligned16");
  CHECK(j["variants"]["fast_v4"] == v4);
  // case i of the campaign is exactly coerce_aligned16(random_problem(seed, i))
  CHECK(profile_problem(fuzz_profile::aligned16, 12, 5, 16) == coerce_aligned16(random_problem(12, 5, 16)));
  CHECK(profile_problem(fuzz_profile::any, 12, 5, 16) == random_problem(12, 5, 16));
}

TEST_CASE("fuzz --profile aligned16: a failure shrinks inside the profile and replays") {
  fuzz_options opt;
  opt.backend_a = "ref";
  opt.backend_b = "broken-qbit";
  opt.factory_a = [] { return make_cpu_backend(); };
  opt.factory_b = [] { return std::unique_ptr<backend>(new q_out_bit_flip()); };
  opt.seed = 3;
  opt.cases = 60;
  opt.max_tokens = 16;
  opt.max_failures = 1;
  opt.shrink_time_s = 10;
  opt.profile = fuzz_profile::aligned16;
  std::ostringstream out;
  const fuzz_summary s = run_fuzz(with_registry(opt), out, false);
  INFO(out.str());
  REQUIRE(s.counts.failed == 1);
  const case_record& rec = s.notable.back();
  REQUIRE(!rec.shrunk_repro.empty());
  CHECK(rec.replay.find("--profile aligned16") != std::string::npos);
  CHECK(rec.shrunk_replay.find("--profile aligned16") != std::string::npos);
  const problem original = parse_problem(rec.report.repro);
  const problem shrunk = parse_problem(rec.shrunk_repro);
  CHECK(in_aligned16(original));
  CHECK(in_aligned16(shrunk));
  CHECK(coerce_aligned16(shrunk) == shrunk);
  // without the profile the dn edits reach dn=1; inside it they stop at 8
  CHECK(shrunk.dn == 8);
  CHECK(shrunk.tq == 1);
  CHECK(shrunk.heads == 1);
  // shrinking ends by running out of edits, not out of time (no edit pair undoes each other)
  CHECK(rec.shrink_steps < 100);
  // the printed shrunk replay (with --profile) fails through the CLI, unshrunk
  register_test_backend("broken-qbit", opt.factory_b);
  std::ostringstream cli_out, cli_err;
  const int rc = cli_main({"fuzz", "--backends", "ref,broken-qbit", "--profile", "aligned16", "--no-shrink",
                           "--repro", rec.shrunk_repro},
                          cli_out, cli_err);
  unregister_test_backend("broken-qbit");
  INFO(cli_out.str(), cli_err.str());
  CHECK(rc == 1);
  CHECK(cli_out.str().find("0 passed, 1 failed") != std::string::npos);
  CHECK(cli_out.str().find(rec.shrunk_repro) != std::string::npos);  // replayed as given
}

TEST_CASE("fuzz --profile: shards merge to the unsharded run; campaigns of two profiles do not merge") {
  auto run = [](fuzz_profile prof, int64_t k, int64_t n) {
    fuzz_options opt;
    opt.backend_a = "ref";
    opt.backend_b = "sim";
    opt.seed = 8;
    opt.cases = 24;
    opt.max_tokens = 8;
    opt.profile = prof;
    opt.shard_index = k;
    opt.shard_count = n;
    std::ostringstream out;
    return fuzz_report_json(opt, run_fuzz(with_registry(opt), out, false));
  };
  const nlohmann::json whole = run(fuzz_profile::aligned16, 0, 1);
  const nlohmann::json merged = merge_reports({run(fuzz_profile::aligned16, 1, 2), run(fuzz_profile::aligned16, 0, 2)});
  CHECK(merged["counts"] == whole["counts"]);
  CHECK(merged["variants"] == whole["variants"]);
  CHECK(merged["config"]["profile"] == "aligned16");
  CHECK_THROWS_AS(merge_reports({run(fuzz_profile::any, 0, 2), run(fuzz_profile::aligned16, 1, 2)}), arg_error);
}

TEST_CASE("--profile values") {
  CHECK(parse_fuzz_profile("any") == fuzz_profile::any);
  CHECK(parse_fuzz_profile("aligned16") == fuzz_profile::aligned16);
  try {
    parse_fuzz_profile("nope");
    FAIL("no throw");
  } catch (const arg_error& e) {
    CHECK(e.arg() == "--profile");
    CHECK(e.got() == "'nope'");
  }
}


// `fuzz --variant`: the bench's kernel-variant syntax, applied to the hip/sim launch plans for
// the whole campaign and carried into every replay line; a malformed request is an error.
TEST_CASE("fuzz --variant: applied to the sim's plan, in the replay line, checked") {
  struct reset_overrides {
    ~reset_overrides() { ropekv_gpu::rk_variant_overrides() = {}; }
  } reset;
  {
    std::ostringstream out, err;
    const int rc = cli_main({"fuzz", "--backends", "ref,sim", "--variant", "qp=1+bogus", "--cases", "1"}, out, err);
    CHECK(rc == 2);
    CHECK(err.str().find("--variant") != std::string::npos);
  }
  {
    // 8 q rows: below the plan's own threshold for two-row groups, so only the request turns them on
    std::ostringstream out, err;
    const int rc = cli_main({"fuzz", "--backends", "ref,sim", "--variant", "qp=1", "--repro",
                             "tq=2 ts=2 tk=2 h=4 in=bf16 qo=bf16 cache=bf16 nb=1"},
                            out, err);
    INFO(out.str(), err.str());
    CHECK(rc == 0);
    CHECK(out.str().find("1 passed, 0 failed") != std::string::npos);
    CHECK(ropekv_gpu::rk_variant_overrides().v4_q_pairs == 1);
    auto sim = make_sim_backend();
    case_data c = make_case(parse_problem("tq=2 ts=2 tk=2 h=4 in=bf16 qo=bf16 cache=bf16 nb=1"));
    sim->run_host(c.args, c.regions());
    CHECK(sim->last_variant().find("+qp") != std::string::npos);
  }
  fuzz_options opt;
  opt.backend_a = "ref";
  opt.backend_b = "broken-qbit";
  opt.factory_a = [] { return make_cpu_backend(); };
  opt.factory_b = [] { return std::unique_ptr<backend>(new q_out_bit_flip()); };
  opt.cases = 4;
  opt.max_tokens = 4;
  opt.max_failures = 1;
  opt.shrink = false;
  opt.variant = "gpb=8+qp=1";
  std::ostringstream out;
  const fuzz_summary s = run_fuzz(with_registry(opt), out, false);
  REQUIRE(s.counts.failed == 1);
  CHECK(s.notable.back().replay.find("--variant 'gpb=8+qp=1'") != std::string::npos);
}

TEST_CASE("fuzz --pin: every drawn problem keeps the pinned keys, the rest stays random") {
  const std::string pins = "dn=512 dr=64 cache=fp8_e4m3fn layout=split tq=3";
  std::map<std::string, int> heads_seen, styles_seen;
  int drawn = 0;
  for (uint64_t i = 0; i < 300; ++i) {
    problem p;
    try {
      p = profile_problem(fuzz_profile::any, 5, i, 64, pins);
    } catch (const arg_error&) {
      continue;  // a pin that suits no problem of this draw: counted SKIPPED by run_fuzz
    }
    ++drawn;
    CHECK(p.dn == 512);
    CHECK(p.dr == 64);
    CHECK(p.cache_dtype == dtype::fp8_e4m3fn);
    CHECK(p.opt.layout == cache_layout::split);
    CHECK(p.tq == 3);
    CHECK(p.ts >= 3);
    CHECK(p.tk >= p.ts);
    CHECK(parse_problem(p.to_repro()) == p);
    heads_seen[std::to_string(p.heads)]++;
    styles_seen[std::string(to_string(p.opt.style))]++;
  }
  CHECK(drawn >= 290);
  CHECK(heads_seen.size() >= 4);
  CHECK(styles_seen.size() == 2);
  // the profile's coercion and the pins together: aligned16 with a pinned f16 input
  for (uint64_t i = 0; i < 50; ++i) {
    const problem p = profile_problem(fuzz_profile::aligned16, 6, i, 32, "in=f16 qo=f16");
    CHECK(p.in_dtype == dtype::f16);
    CHECK(p.q_out_dtype == dtype::f16);
  }
  CHECK_THROWS_WITH_AS(check_pins("dn=512 bogus=1"), doctest::Contains("--pin"), arg_error);
  CHECK_THROWS_WITH_AS(check_pins("dn=x"), doctest::Contains("dn: expected a decimal integer"), arg_error);
  CHECK_THROWS_WITH_AS(check_pins("dn=8 dn=16"), doctest::Contains("twice"), arg_error);
  CHECK_THROWS_WITH_AS(check_pins("dn"), doctest::Contains("key=value"), arg_error);
  // a value its key never takes (whatever the other keys): refused here, not a campaign of SKIPPED cases
  CHECK_THROWS_WITH_AS(check_pins("h=0"), "h: expected 1 .. 65536, got 0", arg_error);
  CHECK_THROWS_WITH_AS(check_pins("dn=512 dr=7"), "dr: expected an even number, got 7", arg_error);
  CHECK_THROWS_WITH_AS(check_pins("cache=fp8_e4m3fn in=i64"), "in: expected one of f32, f16, bf16, got i64", arg_error);
  CHECK_THROWS_WITH_AS(check_pins("q_scale=-1"), "q_scale: expected a finite value > 0, got -1", arg_error);
  check_pins("layout=shuffled bs=8");  // together they suit no problem: surfaces as SKIPPED cases
  check_pins("cache=u8");              // suits the drawn fp8_ds_mla problems
  check_pins("");
}

TEST_CASE("fuzz --pin: the campaign and its shrinking stay in the pinned domain") {
  // A backend that breaks only split caches: pinned to layout=split, every case fails, and the
  // shrunk repro still has layout=split (the shrinker's "joint" edit is undone by the pin).
  fuzz_options opt;
  opt.backend_a = "ref";
  opt.backend_b = "broken-qbit";
  opt.factory_a = [] { return make_cpu_backend(); };
  opt.factory_b = [] { return std::unique_ptr<backend>(new q_out_bit_flip()); };
  opt.cases = 3;
  opt.max_tokens = 8;
  opt.max_failures = 1;
  opt.shrink_time_s = 5;
  opt.pins = "layout=split h=2";
  std::ostringstream out;
  const fuzz_summary s = run_fuzz(with_registry(opt), out, false);
  INFO(out.str());
  REQUIRE(s.counts.failed == 1);
  const case_record& r = s.notable.back();
  CHECK(parse_problem(r.report.repro).opt.layout == cache_layout::split);
  REQUIRE(!r.shrunk_repro.empty());
  const problem shrunk = parse_problem(r.shrunk_repro);
  CHECK(shrunk.opt.layout == cache_layout::split);
  CHECK(shrunk.heads == 2);
  CHECK(fuzz_report_json(opt, s).at("config").at("pins") == "layout=split h=2");
  // through the CLI: a malformed pin fails before any case runs
  std::ostringstream o2, e2;
  CHECK(cli_main({"fuzz", "--backends", "ref,sim", "--pin", "h=two", "--cases", "1"}, o2, e2) == 2);
  CHECK(e2.str().find("h: expected a decimal integer") != std::string::npos);
}

}  // namespace ropekv
