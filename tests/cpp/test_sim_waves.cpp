// The sim with 32- and 64-lane wavefronts (ROPEKV_SIM_WAVE, sim_backend.h sim_thread_at): the
// threads of each block wave by wave, each wave's lanes reversed. On AMD a 64-lane wave holds two
// of fast_v4's 32-lane groups; the kernel exchanges nothing between lanes, so the bytes written
// must not depend on which lanes run together or in which order. Every case below runs in order,
// in 32-lane and in 64-lane waves, and the three runs must agree bit for bit (and with the
// reference).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/sim/sim_backend.h"
#include "core/case_data.h"
#include "core/compare.h"
#include "core/error.h"
#include "core/problem.h"

using namespace ropekv;

namespace {

// ROPEKV_SIM_WAVE for the lifetime of the object (the sim reads it when it is made).
struct wave_env {
  explicit wave_env(const char* value) {
    const char* old = std::getenv("ROPEKV_SIM_WAVE");
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv("ROPEKV_SIM_WAVE", value, 1);
  }
  ~wave_env() {
    if (had_) ::setenv("ROPEKV_SIM_WAVE", old_.c_str(), 1);
    else ::unsetenv("ROPEKV_SIM_WAVE");
  }
  bool had_ = false;
  std::string old_;
};

std::unique_ptr<backend> sim_with_waves(const char* lanes) {
  wave_env e(lanes);
  return make_sim_backend();
}

std::vector<uint8_t> all_bytes(case_data& c) {
  std::vector<uint8_t> out;
  for (auto& [name, b] : c.buffers) out.insert(out.end(), b.raw(), b.raw() + b.raw_size_bytes());
  return out;
}

}  // namespace

TEST_CASE("sim waves: each order is a permutation of the block's threads, and the orders differ") {
  for (uint32_t n : {32u, 64u, 96u, 128u, 256u, 1u, 40u}) {
    std::vector<std::vector<uint32_t>> orders;
    for (uint32_t w : {0u, 32u, 64u}) {
      std::vector<uint32_t> run;
      const uint32_t slots = w == 0 ? n : (n + w - 1) / w * w;
      for (uint32_t k = 0; k < slots; ++k) {
        const uint32_t th = sim_thread_at(k, n, w);
        if (th < n) run.push_back(th);
      }
      CHECK(run.size() == n);
      CHECK(std::set<uint32_t>(run.begin(), run.end()).size() == n);
      orders.push_back(run);
    }
    if (n > 1) CHECK(orders[0] != orders[1]);
    if (n > 32) CHECK(orders[1] != orders[2]);  // at 64, the two 32-lane groups of a wave swap
  }
  // a wave's lanes from the last to the first: 64-lane waves over a 256-thread block
  CHECK(sim_thread_at(0, 256, 64) == 63);
  CHECK(sim_thread_at(63, 256, 64) == 0);
  CHECK(sim_thread_at(64, 256, 64) == 127);
  CHECK(sim_thread_at(0, 32, 64) == 32);  // past a 32-thread block: skipped
  CHECK(sim_thread_at(32, 32, 64) == 31);
}

TEST_CASE("sim waves: ROPEKV_SIM_WAVE other than 0, 32 or 64 is an error naming it") {
  wave_env e("48");
  try {
    make_sim_backend();
    FAIL("ROPEKV_SIM_WAVE=48 accepted");
  } catch (const arg_error& err) {
    CHECK(err.arg() == "ROPEKV_SIM_WAVE");
  }
}

TEST_CASE("sim waves: in order, in 32-lane and in 64-lane waves, every kernel writes the same bytes") {
  auto cpu = make_cpu_backend();
  auto in_order = sim_with_waves("0");
  auto wave32 = sim_with_waves("32");
  auto wave64 = sim_with_waves("64");
  CHECK(wave32->device_description().find("32-lane waves") != std::string::npos);
  CHECK(wave64->device_description().find("64-lane waves") != std::string::npos);
  CHECK(in_order->device_description().find("-lane waves") == std::string::npos);
  std::set<std::string> variants;
  std::vector<problem> problems;
  for (uint64_t i = 0; i < 48; ++i) {
    const problem p = random_problem(6464, i, 40);
    problems.push_back(i % 3 == 0 ? p : coerce_aligned16(p));  // two thirds in fast_v4's domain
  }
  // the decode shape in both q row forms, zero-copy rows per lane, fp8_ds_mla, kv heads
  for (const char* r : {"tq=1 ts=1 tk=1 h=128 dn=512 dr=64 p=4096 bs=64 nb=1 seed=2",
                        "tq=3 ts=3 tk=3 h=128 dn=512 dr=64 p=4096 bs=64 nb=1 zero_copy=1 seed=3",
                        "tq=2 ts=2 tk=2 h=16 dn=512 dr=64 p=4096 bs=64 nb=1 style=neox zero_copy=1 seed=4",
                        "tq=4 ts=4 tk=4 h=16 dn=512 dr=64 p=512 bs=16 nb=1 layout=fp8_ds_mla cache=u8 seed=5",
                        "tq=3 ts=4 tk=4 h=8 kh=2 dn=64 dr=16 p=64 bs=16 nb=1 seed=6"})
    problems.push_back(parse_problem(r));
  for (const problem& p : problems) {
    INFO(p.to_repro());
    case_data initial = make_case(p);
    if (!in_order->unsupported_reason(initial.args).empty()) continue;
    case_data ref = initial.clone(), a = initial.clone(), b = initial.clone(), c = initial.clone();
    cpu->run_host(ref.args, ref.regions());
    in_order->run_host(a.args, a.regions());
    wave32->run_host(b.args, b.regions());
    wave64->run_host(c.args, c.regions());
    variants.insert(in_order->last_variant().substr(0, 7));
    CHECK(all_bytes(a) == all_bytes(b));
    CHECK(all_bytes(a) == all_bytes(c));
    const case_report r = compare_runs(initial, ref, c, compare_options{});
    INFO(format_case_report(r, true));
    CHECK(r.outcome == case_outcome::passed);
  }
  CHECK(variants.count("fast_v4") == 1);   // both kernel bodies ran
  CHECK(variants.count("fused_v") == 1);
}
