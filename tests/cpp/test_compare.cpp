// core/compare: the rope rule (the cancellation line), region reports, outcomes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/sim/sim_backend.h"
#include "core/case_data.h"
#include "core/compare.h"
#include "core/convert.h"
#include "core/rng.h"
#include "harness/fuzz.h"

namespace ropekv {
namespace {

uint32_t f32_bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

const region_report& region(const case_report& r, const std::string& name) {
  for (const auto& g : r.regions) {
    if (g.name == name) return g;
  }
  FAIL("no region " << name);
  return r.regions.front();
}

// A small, fully specified case: joint cache with entry/block padding, f32 q_out, bf16 cache.
problem small_problem() {
  return parse_problem(
      "tq=3 ts=3 tk=4 h=2 dn=8 dr=4 p=16 bs=4 nb=2 in=f32 table_dtype=f32 qo=f32 cache=bf16 "
      "entry_pad=2 block_pad=3 row_pad=1 rope_table=random seed=9");
}

}  // namespace

TEST_CASE("ulp buckets") {
  CHECK(ulp_bucket_of(0) == 0);
  CHECK(ulp_bucket_of(1) == 1);
  CHECK(ulp_bucket_of(2) == 2);
  CHECK(std::string(ulp_bucket_label(ulp_bucket_of(3))) == "3-4");
  CHECK(std::string(ulp_bucket_label(ulp_bucket_of(4))) == "3-4");
  CHECK(std::string(ulp_bucket_label(ulp_bucket_of(5))) == "5-8");
  CHECK(std::string(ulp_bucket_label(ulp_bucket_of(1024))) == "513-1024");
  CHECK(std::string(ulp_bucket_label(ulp_bucket_of(1025))) == ">1024");
  CHECK(std::string(ulp_bucket_label(ulp_bucket_of(ulp_distance_nan))) == "nan");
}

TEST_CASE("cancellation: an fp32 evaluation several ulp off passes by the allowance, strict fails it") {
  // Search (deterministically) for operands where x*C and R(x)*S nearly cancel, and evaluate
  // the way an fp32 kernel does: fmaf(x, C, fp32(R(x) * S)).
  bool found = false;
  for (uint64_t i = 0; i < 200000 && !found; ++i) {
    float x = static_cast<float>(rng_unit(3, 1, i) * 4 - 2);
    float c = static_cast<float>(rng_unit(3, 2, i));
    float s = static_cast<float>(rng_unit(3, 3, i));
    // partner chosen so that partner * s ~= -x * c, then perturbed by a few ulps.
    float partner = static_cast<float>(-(static_cast<double>(x) * c) / s);
    partner = std::nextafter(partner, (rng_u64(3, 4, i) & 1) ? 10.f : -10.f);
    if (!std::isfinite(partner) || std::fabs(partner) > 64) continue;
    double exact = static_cast<double>(x) * c + static_cast<double>(partner) * s;
    float ref = static_cast<float>(exact);  // one rounding of the (double-exact here) value
    float got = std::fmaf(x, c, partner * s);
    int64_t dist = ulp_distance(dtype::f32, f32_bits(ref), f32_bits(got));
    if (dist < 3 || dist == ulp_distance_nan) continue;
    found = true;
    rope_element o;  // the fp32 allowance of an f32 output
    o.x = x;
    o.partner = partner;
    o.c = c;
    o.s = s;
    o.in = o.table = o.out = dtype::f32;
    double allow = rope_model_allowance(numerics_model::fp32, o);
    compare_options opt;  // max_ulp 1
    int64_t ulp = 0;
    bool used = false;
    INFO("x=" << x << " c=" << c << " partner=" << partner << " s=" << s << " ulp=" << dist);
    CHECK(rope_element_passes(dtype::f32, f32_bits(ref), f32_bits(got), allow, opt, &ulp, &used));
    CHECK(ulp == dist);
    CHECK(used);
    compare_options strict = opt;
    strict.strict = true;
    CHECK_FALSE(rope_element_passes(dtype::f32, f32_bits(ref), f32_bits(got), allow, strict, &ulp, &used));

    // Just outside the rule: the first float beyond max_ulp * ulp(ref) + allowance fails;
    // the last float inside passes.
    double bound = ulp_at(dtype::f32, ref) + allow;
    float outside = static_cast<float>(static_cast<double>(ref) + bound);
    while (static_cast<double>(outside) - ref <= bound) outside = std::nextafter(outside, 1e30f);
    float inside = std::nextafter(outside, -1e30f);
    CHECK_FALSE(rope_element_passes(dtype::f32, f32_bits(ref), f32_bits(outside), allow, opt, &ulp, &used));
    CHECK(rope_element_passes(dtype::f32, f32_bits(ref), f32_bits(inside), allow, opt, &ulp, &used));
  }
  CHECK(found);
}

TEST_CASE("rope rule: NaN and inf") {
  compare_options opt;
  int64_t ulp;
  bool used;
  const uint32_t nan = 0x7fc00000u, inf = 0x7f800000u, one = f32_bits(1.0f);
  CHECK(rope_element_passes(dtype::f32, nan, nan, 0, opt, &ulp, &used));
  CHECK_FALSE(rope_element_passes(dtype::f32, nan, one, 1e30, opt, &ulp, &used));
  CHECK_FALSE(rope_element_passes(dtype::f32, one, nan, 1e30, opt, &ulp, &used));
  CHECK(rope_element_passes(dtype::f32, inf, inf, 0, opt, &ulp, &used));
  CHECK_FALSE(rope_element_passes(dtype::f32, inf, inf | 0x80000000u, 1e30, opt, &ulp, &used));
  CHECK_FALSE(rope_element_passes(dtype::f32, inf, f32_bits(3e38f), 1e30, opt, &ulp, &used));
}

TEST_CASE("compare_runs: identical runs pass and every byte is accounted for") {
  case_data init = make_case(small_problem());
  case_data a = init.clone(), b = init.clone();
  reference_run(a.args);
  reference_run(b.args);
  case_report r = compare_runs(init, a, b, compare_options{});
  INFO(format_case_report(r, true));
  CHECK(r.outcome == case_outcome::passed);
  CHECK(region(r, "q_out.nope").compared == 3 * 2 * 8);
  CHECK(region(r, "q_out.rope").compared == 3 * 2 * 4);
  CHECK(region(r, "cache.nope").compared == 3 * 8);
  CHECK(region(r, "cache.rope").compared == 3 * 4);
  // untouched cache bytes = all bytes - written bytes (bf16: 2 bytes per element)
  CHECK(region(r, "cache.untouched").compared ==
        2 * (static_cast<int64_t>(init.buffers.at("cache").size_bytes()) - 3 * 12 * 2));
  CHECK(region(r, "guards").compared > 0);
}

TEST_CASE("compare_runs: each kind of damage is found, named and counted") {
  case_data init = make_case(small_problem());
  case_data a = init.clone();
  reference_run(a.args);
  auto damaged = [&](const std::function<void(case_data&)>& hurt) {
    case_data b = a.clone();
    hurt(b);
    return compare_runs(init, a, b, compare_options{});
  };
  auto elem = [](tensor_view& v, std::initializer_list<int64_t> idx) {
    return static_cast<uint8_t*>(v.data) + v.offset_elems(idx) * static_cast<int64_t>(dtype_size_bytes(v.type));
  };

  SUBCASE("one nope bit") {
    case_report r = damaged([&](case_data& b) { elem(b.args.q_out, {1, 1, 3})[0] ^= 1; });
    CHECK(r.outcome == case_outcome::failed);
    const region_report& g = region(r, "q_out.nope");
    CHECK(g.mismatches == 1);
    REQUIRE(g.first.size() == 1);
    CHECK(g.first[0].where == "token=1 head=1 dim=3");
    CHECK(g.first[0].ulp == 1);
    CHECK(g.first[0].run == "b");
  }
  SUBCASE("rope 1 ulp passes, 2 ulp fails") {
    case_report r1 = damaged([&](case_data& b) {
      uint8_t* p = elem(b.args.q_out, {0, 0, 9});
      uint32_t v;
      std::memcpy(&v, p, 4);
      v += 1;
      std::memcpy(p, &v, 4);
    });
    CHECK(r1.outcome == case_outcome::passed);
    CHECK(region(r1, "q_out.rope").histogram[1] == 1);
    case_report r2 = damaged([&](case_data& b) {
      uint8_t* p = elem(b.args.q_out, {0, 0, 9});
      uint32_t v;
      std::memcpy(&v, p, 4);
      v += 40;  // far beyond the allowance of O(1) values
      std::memcpy(p, &v, 4);
    });
    CHECK(r2.outcome == case_outcome::failed);
    CHECK(region(r2, "q_out.rope").mismatches == 1);
    CHECK(region(r2, "q_out.rope").first[0].where == "token=0 head=0 dim=9");
  }
  SUBCASE("a padding byte of the cache, an input, a guard") {
    case_report r = damaged([&](case_data& b) {
      host_buffer& c = b.buffers.at("cache");
      c.data()[c.size_bytes() - 1] ^= 0xff;  // block padding at the very end: never written
      b.buffers.at("kv_c").data()[0] ^= 1;
      b.buffers.at("q_out").raw()[3] ^= 1;   // leading guard
    });
    CHECK(r.outcome == case_outcome::failed);
    CHECK(region(r, "cache.untouched").mismatches == 1);
    CHECK(region(r, "kv_c.unchanged").mismatches == 1);
    CHECK(region(r, "guards").mismatches == 1);
    CHECK(region(r, "guards").first[0].where.find("buffer=q_out") != std::string::npos);
    CHECK(region(r, "cache.nope").mismatches == 0);
  }
  SUBCASE("nothing written in either run: MISTRUSTED") {
    case_data b = init.clone();
    case_report r = compare_runs(init, init.clone(), b, compare_options{});
    CHECK(r.outcome == case_outcome::mistrusted);
    CHECK(region(r, "q_out.rope").mistrusted);
    CHECK(r.message.find("poison") != std::string::npos);
  }
}

namespace {
class throwing_backend : public backend {
 public:
  std::string name() const override { return "thrower"; }
  std::string unsupported_reason(const op_args&) const override { return ""; }
  void run_host(const op_args&, const std::vector<memory_region>&) override { throw error("launch failed"); }
};
class picky_backend : public throwing_backend {
 public:
  std::string unsupported_reason(const op_args&) const override { return "not supported: dr != 64"; }
};
}  // namespace

TEST_CASE("run_case: ERRORED and SKIPPED") {
  auto ref = make_cpu_backend();
  throwing_backend t;
  picky_backend p;
  case_record e = run_case(small_problem(), *ref, t, compare_options{});
  CHECK(e.report.outcome == case_outcome::errored);
  CHECK(e.report.message.find("launch failed") != std::string::npos);
  case_record s = run_case(small_problem(), *ref, p, compare_options{});
  CHECK(s.report.outcome == case_outcome::skipped);
  CHECK(s.report.message.find("dr != 64") != std::string::npos);
}

}  // namespace ropekv

TEST_CASE("compare: bitwise mode fails a 1-ulp rope difference that the ULP rule passes") {
  using namespace ropekv;
  compare_options loose;
  compare_options bitwise;
  bitwise.bitwise = true;
  // 1.0 and the next bf16 above it: 1 ulp apart.
  const uint32_t one = 0x3f80, next = 0x3f81;
  int64_t ulp = -1;
  bool used = false;
  CHECK(rope_element_passes(dtype::bf16, one, next, 0.0, loose, &ulp, &used));
  CHECK(ulp == 1);
  problem p = parse_problem("tq=1 ts=1 tk=1 h=1 dn=4 dr=2 p=2 bs=1 nb=1 in=f32 qo=f32 cache=f32 table_dtype=f32");
  case_data a = make_case(p);
  case_data b = a.clone();
  reference_run(a.args);
  reference_run(b.args);
  // Nudge one rope element of q_out in run b by one ulp.
  auto* q = static_cast<uint32_t*>(b.args.q_out.data);
  q[4] += 1;
  const case_data initial = make_case(p);
  CHECK(compare_runs(initial, a, b, loose).outcome == case_outcome::passed);
  CHECK(compare_runs(initial, a, b, bitwise).outcome == case_outcome::failed);
}

namespace ropekv {

TEST_CASE("rope rule: the ULP distance counts representable values, also across a power of two") {
  compare_options strict;  // max_ulp 1, no allowance: the distance alone decides
  strict.strict = true;
  int64_t ulp = 0;
  bool used = false;
  const dtype t = dtype::bf16;
  auto enc = [&](double v) { return encode_from_f64(t, v, overflow_mode::ieee); };
  const uint32_t two = enc(2.0);                  // spacing above 2^-6, below 2^-7
  const uint32_t one_below = enc(2.0 - 0x1p-7);   // 1 step below
  const uint32_t two_below = enc(2.0 - 0x1p-6);   // 2 steps below: |diff| == the spacing above
  CHECK(rope_element_passes(t, two, one_below, 0, strict, &ulp, &used));
  CHECK(ulp == 1);
  CHECK_FALSE(rope_element_passes(t, two, two_below, 0, strict, &ulp, &used));
  CHECK(ulp == 2);
  CHECK_FALSE(rope_element_passes(t, two_below, two, 0, strict, &ulp, &used));  // symmetric
  CHECK(ulp == 2);
  compare_options loose;  // the allowance path uses the smaller magnitude's spacing
  CHECK_FALSE(rope_element_passes(t, two, two_below, 0, loose, &ulp, &used));
  CHECK(rope_element_passes(t, two, two_below, 0x1p-7, loose, &ulp, &used));
  CHECK(used);
}

TEST_CASE("data movement: a NaN moves as a NaN of the same sign, payload free; the reference and the sim agree") {
  for (const char* repro : {"tq=1 ts=1 tk=1 h=1 dn=4 dr=2 p=2 bs=1 nb=1 in=bf16 qo=f32 cache=bf16",
                            "tq=1 ts=1 tk=1 h=1 dn=4 dr=2 p=2 bs=1 nb=1 in=f16 qo=f32 cache=fp8_e4m3fn",
                            "tq=1 ts=1 tk=1 h=1 dn=4 dr=2 p=2 bs=1 nb=1 in=f32 qo=bf16 cache=fp8_e5m2fnuz"}) {
    INFO(repro);
    const problem p = parse_problem(repro);
    case_data init = make_case(p);
    const size_t es = dtype_size_bytes(p.in_dtype);
    const uint32_t neg = p.in_dtype == dtype::f32 ? 0xffc01234u : p.in_dtype == dtype::bf16 ? 0xffc1u : 0xfe01u;
    const uint32_t pos = neg & ~(1u << (8 * es - 1));
    store_bits(p.in_dtype, init.args.q_nope.data, neg);  // payload and sign
    store_bits(p.in_dtype, static_cast<uint8_t*>(init.args.q_nope.data) + es, pos);
    store_bits(p.in_dtype, init.args.kv_c.data, neg);
    case_data ref = init.clone(), sim = init.clone();
    make_cpu_backend()->run_host(ref.args, ref.regions());
    make_sim_backend()->run_host(sim.args, sim.regions());
    const size_t qs = dtype_size_bytes(p.q_out_dtype);
    auto q_at = [&](case_data& c, int i) {
      return static_cast<uint32_t>(load_bits(p.q_out_dtype, static_cast<uint8_t*>(c.args.q_out.data) + i * qs));
    };
    CHECK(is_nan_bits(p.q_out_dtype, q_at(ref, 0)));
    CHECK(is_nan_bits(p.q_out_dtype, q_at(ref, 1)));
    CHECK(compare_runs(init, ref, sim, compare_options{}).outcome == case_outcome::passed);
    // a NaN that lost its sign, or became a number, is a mismatch in q_out.nope
    case_data bad = ref.clone();
    const uint32_t flipped = q_at(bad, 0) ^ (1u << (8 * qs - 1));
    store_bits(p.q_out_dtype, bad.args.q_out.data, flipped);
    const case_report r = compare_runs(init, ref, bad, compare_options{});
    CHECK(r.outcome == case_outcome::failed);
    CHECK(region(r, "q_out.nope").mismatches == 1);
    store_bits(p.q_out_dtype, bad.args.q_out.data, 0);
    CHECK(region(compare_runs(init, ref, bad, compare_options{}), "q_out.nope").mismatches == 1);
  }
}

}  // namespace ropekv
