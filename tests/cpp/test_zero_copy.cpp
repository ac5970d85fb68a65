// Zero-copy concat as a problem key (core/SPEC.md "Zero-copy concat", repro key zero_copy): the
// repro string, the generator and --pin, the case (q_nope is q_out's first Dn columns, no buffer
// of its own), golden files, and every backend against the reference on such cases.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "tests/cpp/parse_error.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/sim/sim_backend.h"
#include "core/case_data.h"
#include "core/compare.h"
#include "core/error.h"
#include "core/golden.h"
#include "core/problem.h"

using namespace ropekv;

namespace {

// The bytes of every element of a rank-3 view, in logical order.
std::vector<uint8_t> logical_bytes(const tensor_view& v) {
  REQUIRE(v.rank == 3);
  std::vector<uint8_t> out;
  const int64_t esz = static_cast<int64_t>(dtype_size_bytes(v.type));
  for (int64_t i = 0; i < v.shape[0]; ++i)
    for (int64_t j = 0; j < v.shape[1]; ++j)
      for (int64_t k = 0; k < v.shape[2]; ++k) {
        const int64_t off = i * v.strides_elems[0] + j * v.strides_elems[1] + k * v.strides_elems[2];
        const uint8_t* p = static_cast<const uint8_t*>(v.data) + off * esz;
        out.insert(out.end(), p, p + esz);
      }
  return out;
}

std::string temp_file(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("ropekv-zc-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

}  // namespace

TEST_CASE("zero_copy key: prints, parses back, and needs q_out in q's dtype") {
  const problem p = parse_problem("tq=3 ts=3 tk=3 h=4 dn=16 dr=8 p=32 bs=4 nb=1 in=f16 qo=f16 zero_copy=1");
  CHECK(p.zero_copy);
  CHECK(p.to_repro().find(" zero_copy=1 ") != std::string::npos);
  CHECK(parse_problem(p.to_repro()) == p);
  problem q = p;
  q.zero_copy = false;
  CHECK(q != p);
  std::string message;
  CHECK(parse_error_arg("in=bf16 qo=f32 zero_copy=1", &message) == "qo");
  CHECK(message.find("expected bf16") != std::string::npos);
  CHECK(parse_error_arg("zero_copy=2") == "zero_copy");
  CHECK(parse_error_arg("in=bf16 qo=f32 zero_copy=0") == "");
}

TEST_CASE("zero_copy key: drawn by the generator, set by --pin, turned off by a pin that rules it out") {
  const int n = 2000;
  int drawn = 0;
  for (int i = 0; i < n; ++i) {
    const problem p = random_problem(77, static_cast<uint64_t>(i), 64);
    if (!p.zero_copy) continue;
    ++drawn;
    CHECK(p.q_out_dtype == p.in_dtype);
    CHECK(coerce_aligned16(p).zero_copy);  // the aligned16 profile keeps it (q_out = q's dtype)
  }
  CHECK(drawn > n / 12);
  CHECK(drawn < n / 4);
  for (uint64_t i = 0; i < 300; ++i) {
    const problem r = random_problem(9, i, 64);
    const problem p = pin_problem(r, "zero_copy=1");
    REQUIRE(p.zero_copy);
    REQUIRE(p.q_out_dtype == p.in_dtype);
    // qo pinned to another dtype: a drawn zero-copy case copies instead
    const problem c = pin_problem(pin_problem(r, "zero_copy=1"), "qo=fp8_e4m3fn");
    REQUIRE_FALSE(c.zero_copy);
    // both pinned, in free: in takes the pinned 16-bit qo
    const problem b = pin_problem(r, "zero_copy=1 qo=f16");
    REQUIRE(b.zero_copy);
    REQUIRE(b.in_dtype == dtype::f16);
  }
  CHECK_THROWS_AS(pin_problem(random_problem(9, 0, 64), "zero_copy=1 in=bf16 qo=f32"), arg_error);
}

TEST_CASE("zero_copy key: the case has q_nope in q_out, with the values the copy case has in its q_nope") {
  for (const char* base : {"tq=3 ts=4 tk=5 h=4 dn=24 dr=8 p=32 bs=4 nb=2 seed=3",
                           "tq=2 ts=2 tk=2 h=3 dn=16 dr=16 p=32 bs=2 nb=1 in=f32 qo=f32 q_layout=head_major row_pad=5 seed=4",
                           "tq=0 ts=1 tk=1 h=2 dn=8 dr=4 p=8 bs=1 nb=1 seed=5"}) {
    INFO(base);
    const problem copy_p = parse_problem(base);
    const problem zc_p = parse_problem(std::string(base) + " zero_copy=1");
    case_data copy = make_case(copy_p);
    case_data zc = make_case(zc_p);
    CHECK(copy.buffers.count("q_nope") == 1);
    CHECK(zc.buffers.count("q_nope") == 0);
    CHECK(zc.args.q_nope.data == zc.args.q_out.data);
    CHECK(zc.args.q_nope.strides_elems[0] == zc.args.q_out.strides_elems[0]);
    CHECK(zc.args.q_nope.strides_elems[1] == zc.args.q_out.strides_elems[1]);
    CHECK(logical_bytes(zc.args.q_nope) == logical_bytes(copy.args.q_nope));
    CHECK(logical_bytes(zc.args.q_pe) == logical_bytes(copy.args.q_pe));
    // apply_zero_copy turns the copy case into the same case, byte for byte
    apply_zero_copy(copy);
    CHECK(copy.prob == zc_p);
    CHECK(copy.buffers.count("q_nope") == 0);
    CHECK(logical_bytes(copy.args.q_out) == logical_bytes(zc.args.q_out));
    // clones keep it
    const case_data c = zc.clone();
    CHECK(c.args.q_nope.data == c.args.q_out.data);
    const case_data o = zc.clone_outputs();
    CHECK(o.args.q_nope.data == o.args.q_out.data);
  }
}

TEST_CASE("zero_copy key: golden files round-trip, and a file whose q_nope disagrees with q_out is refused") {
  const problem p = parse_problem("tq=3 ts=3 tk=4 h=2 dn=16 dr=8 p=32 bs=4 nb=1 pad_slots=1 pad_q=skipped zero_copy=1 seed=8");
  case_data before = make_case(p);
  case_data after = before.clone();
  make_cpu_backend()->run_host(after.args, after.regions());
  const std::string path = temp_file("zc.safetensors");
  write_golden(path, before, after);
  const golden_case g = load_golden_case(path);
  CHECK(g.initial.prob == p);
  CHECK(g.initial.args.q_nope.data == g.initial.args.q_out.data);
  CHECK(logical_bytes(g.initial.args.q_out) == logical_bytes(before.args.q_out));
  CHECK(logical_bytes(g.expected.args.q_out) == logical_bytes(after.args.q_out));
  // the same file with one q_nope value changed: q_out.initial no longer holds q_nope
  golden_file f = read_golden(path);
  f.tensors.at("q_nope").bytes[0] ^= 0x40;
  const std::string bad = temp_file("zc-bad.safetensors");
  write_golden(bad, f, golden_write_options{});
  try {
    load_golden_case(bad);
    FAIL("a zero-copy file whose q_nope and q_out.initial disagree loaded");
  } catch (const arg_error& e) {
    CHECK(std::string(e.what()).find("q_out.initial") != std::string::npos);
  }
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

TEST_CASE("zero_copy key: the sim (both kernel bodies) matches the reference on drawn zero-copy cases") {
  auto cpu = make_cpu_backend();
  auto sim = make_sim_backend();
  int cases = 0, fast = 0;
  for (uint64_t i = 0; i < 160; ++i) {
    problem p = pin_problem(random_problem(2612, i, 24), "zero_copy=1");
    if (i % 2 == 0) p = coerce_aligned16(p);  // half in the fast kernel's domain
    INFO(p.to_repro());
    case_data initial = make_case(p);
    case_data ref = initial.clone();
    case_data got = initial.clone();
    cpu->run_host(ref.args, ref.regions());
    if (!sim->unsupported_reason(got.args).empty()) continue;
    sim->run_host(got.args, got.regions());
    const case_report r = compare_runs(initial, ref, got, compare_options{});
    INFO(format_case_report(r, true));
    CHECK(r.outcome == case_outcome::passed);
    ++cases;
    if (sim->last_variant().find("zero_copy") != std::string::npos) ++fast;
  }
  CHECK(cases > 140);
  CHECK(fast > 10);  // fast_v4's zero-copy path ran
}
