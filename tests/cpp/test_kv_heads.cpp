// kv heads (core/SPEC.md "kv heads"): KH > 1 kv heads, AITER's form. Repro key kh, the
// generator and --pin, the reference (each head written as a one-head call would write it), the
// sim (the kernel's general body) against the reference on every layout that takes heads, and
// validation of the cache's head / entry strides.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "tests/cpp/parse_error.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/sim/sim_backend.h"
#include "core/cache_map.h"
#include "core/case_data.h"
#include "core/compare.h"
#include "core/error.h"
#include "core/problem.h"
#include "core/validate.h"

using namespace ropekv;

namespace {

std::vector<std::vector<uint8_t>> bytes_of(case_data& c) {
  std::vector<std::vector<uint8_t>> out;
  for (auto& [name, b] : c.buffers) out.emplace_back(b.raw(), b.raw() + b.raw_size_bytes());
  return out;
}

}  // namespace

TEST_CASE("kv heads: repro key kh prints, parses back, names itself in errors") {
  const problem p = parse_problem("h=16 kh=4 tq=3 ts=3 tk=4 dn=64 p=64 bs=16 nb=2");
  CHECK(p.kv_heads == 4);
  CHECK(p.to_repro().find(" h=16 kh=4 dn=64 ") != std::string::npos);
  CHECK(parse_problem(p.to_repro()) == p);
  CHECK(parse_problem("").kv_heads == 1);
  CHECK(parse_error_arg("h=16 kh=3") == "kh");   // not a divisor of h
  CHECK(parse_error_arg("h=16 kh=0") == "kh");
  CHECK(parse_error_arg("h=16 kh=-2") == "kh");
  CHECK(parse_error_arg("h=16 kh=4 layout=fp8_ds_mla cache=u8") == "kh");  // one head per entry
}

TEST_CASE("kv heads: the generator draws KH > 1 now and then, --pin kh fits h") {
  int with_heads = 0;
  std::set<int64_t> values;
  const int n = 3000;
  for (int i = 0; i < n; ++i) {
    const problem p = random_problem(2026, static_cast<uint64_t>(i), 4096);
    CHECK(p.heads % p.kv_heads == 0);
    if (p.kv_heads > 1) {
      ++with_heads;
      values.insert(p.kv_heads);
      CHECK(p.opt.layout != cache_layout::fp8_ds_mla);
      CHECK(p.kv_heads <= 16);
    }
    // the aligned16 profile keeps one head (no fast path takes more)
    CHECK(coerce_aligned16(p).kv_heads == 1);
  }
  CHECK(with_heads > n / 20);
  CHECK(with_heads < n / 5);
  CHECK(values.size() >= 4);
  for (uint64_t i = 0; i < 300; ++i) {
    const problem r = random_problem(9, i, 64);
    const problem p = pin_problem(r, "kh=2");
    REQUIRE(p.kv_heads == 2);
    REQUIRE(p.heads % 2 == 0);
    REQUIRE(p.opt.layout != cache_layout::fp8_ds_mla);  // a drawn fp8_ds_mla case takes joint
    if (r.heads % 2 == 0) REQUIRE(p.heads == r.heads);
    const problem q = pin_problem(pin_problem(r, "kh=4"), "h=6");  // h pinned: kh becomes gcd(6, 4)
    REQUIRE(q.kv_heads == 2);
  }
  CHECK_THROWS_AS(pin_problem(random_problem(9, 0, 64), "kh=4 h=6"), arg_error);
}

TEST_CASE("kv heads: the reference writes each head as a one-head call on that head's views would") {
  for (const char* repro :
       {"tq=3 ts=4 tk=5 h=8 kh=2 dn=24 dr=16 p=64 bs=4 nb=3 inplace_k=1 dec_out=k seed=4",     // heads outer
        "tq=3 ts=4 tk=5 h=8 kh=4 dn=24 dr=16 p=64 bs=4 nb=3 inplace_k=1 dec_out=k seed=6",     // heads inner (vLLM)
        "tq=2 ts=5 tk=5 h=6 kh=3 dn=32 dr=8 p=64 bs=3 nb=4 layout=split entry_pad=3 block_pad=5 cache=fp8_e4m3fn "
        "k_scale=0.37 pad_slots=1 seed=7",
        "tq=2 ts=3 tk=4 h=4 kh=4 dn=64 dr=16 p=64 bs=16 nb=2 layout=shuffled block_pad=8 order=nope_first seed=8",
        "tq=2 ts=3 tk=4 h=4 kh=2 dn=16 dr=8 p=64 bs=5 nb=2 order=rope_first kv_layout=fused row_pad=3 seed=10"}) {
    INFO(repro);
    const problem p = parse_problem(repro);
    case_data initial = make_case(p);
    case_data whole = initial.clone();
    reference_run(whole.args);
    // head by head: the call restricted to head k (rank-2 k rows, rank-3 caches), KH = 1 each
    case_data heads = initial.clone();
    for (int64_t k = 0; k < p.kv_heads; ++k) {
      const op_args one = kv_head_args(heads.args, k);
      CHECK(sizes_of(one).kv_heads == 1);
      reference_run(one);
    }
    CHECK(bytes_of(whole) == bytes_of(heads));
    // and every head got its entry: the cache holds no poison at a written slot of any head
    CHECK(whole.args.kv_c.rank == 3);
    CHECK(compare_runs(initial, whole, heads, compare_options{}).outcome == case_outcome::passed);
  }
}

TEST_CASE("kv heads: the sim (the kernel's general body) matches the reference on every layout") {
  auto cpu = make_cpu_backend();
  auto sim = make_sim_backend();
  int cases = 0;
  for (const char* layout : {"joint", "split", "shuffled"}) {
    for (const char* extra : {"", " cache=fp8_e4m3fn k_scale=0.5 scale_conv=reciprocal", " inplace_k=1 dec_out=qzk dec=2",
                              " in=f32 qo=f32 cache=f32 style=neox table=two", " pad_slots=2 pad_at=spread pad_q=skipped"}) {
      for (const char* heads : {"h=8 kh=2", "h=16 kh=16", "h=12 kh=3"}) {
        for (uint64_t seed : {1, 2, 3, 6}) {  // bit 1 of the seed: vLLM's memory order (joint, split)
          std::string repro = std::string("tq=4 ts=6 tk=7 dn=64 dr=16 p=128 bs=16 nb=3 ") + heads + " layout=" + layout +
                              extra + " seed=" + std::to_string(seed);
          if (std::string(layout) != "shuffled") repro += " entry_pad=2 block_pad=7";
          INFO(repro);
          const problem p = parse_problem(repro);
          case_data initial = make_case(p);
          case_data ref = initial.clone();
          case_data got = initial.clone();
          cpu->run_host(ref.args, ref.regions());
          REQUIRE(sim->unsupported_reason(got.args).empty());
          sim->run_host(got.args, got.regions());
          const case_report r = compare_runs(initial, ref, got, compare_options{});
          INFO(format_case_report(r, true));
          CHECK(r.outcome == case_outcome::passed);
          // KH > 1 stays on the general body (fast_v4 takes one head)
          CHECK(sim->last_variant().rfind("fused_v1", 0) == 0);
          ++cases;
        }
      }
    }
  }
  CHECK(cases == 3 * 5 * 3 * 4);
}

TEST_CASE("kv heads: a cache in vLLM's [nb, bs, KH, D] memory is a valid permuted view; overlapping heads are not") {
  const problem p = parse_problem("tq=2 ts=3 tk=3 h=4 kh=2 dn=16 dr=8 p=32 bs=4 nb=2 seed=1");  // AITER's order
  case_data c = make_case(p);
  CHECK(c.args.cache.rank == 4);
  CHECK(c.args.cache.strides_elems[1] == 4 * 24);  // head stride: a block's entries of one head
  CHECK_NOTHROW(validate(c.args));
  // the same memory read as [nb, bs, KH, D], viewed as [nb, KH, bs, D]: strides [bs*KH*D, D, KH*D, 1]
  op_args v = c.args;
  v.cache.strides_elems = {4 * 2 * 24, 24, 2 * 24, 1};
  CHECK_NOTHROW(validate(v));
  // heads one row apart but entries too: (head 1, entry 0) is (head 0, entry 1)
  v.cache.strides_elems = {4 * 2 * 24, 24, 24, 1};
  CHECK_THROWS_AS(validate(v), arg_error);
  // a rank-4 cache with one head and rank-2 k rows: KH = 1, the same as the rank-3 cache
  const problem q = parse_problem("tq=2 ts=3 tk=3 h=4 dn=16 dr=8 p=32 bs=4 nb=2 seed=1");
  case_data a = make_case(q), b = make_case(q);
  op_args r4 = b.args;
  r4.cache.rank = 4;
  r4.cache.shape = {2, 1, 4, 24};
  r4.cache.strides_elems = {4 * 24, 4 * 24, 24, 1};
  reference_run(a.args);
  reference_run(r4);
  CHECK(bytes_of(a) == bytes_of(b));
}
