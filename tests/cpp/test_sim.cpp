// The sim backend (the HIP kernel body run on the CPU) against the reference.
// Also built with each planted kernel bug (ROPEKV_SIM_MUTATIONS, scripts/sim_mutations.sh):
// the "sim" test cases below must then fail.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/sim/sim_backend.h"
#include "core/case_data.h"
#include "core/compare.h"
#include "core/convert.h"
#include "core/problem.h"
#include "core/rng.h"
#include "tools/bench.h"

// The kernel's own conversions, compiled here as host code (ROPEKV_SIM), to check them
// bit-for-bit against core's independent conversions.
#ifndef ROPEKV_SIM
#define ROPEKV_SIM 1
#endif
#include "backends/hip/kernel.h"
#include "backends/hip/launch_plan.h"

namespace {

using namespace ropekv;

struct sim_result {
  case_report report;
  std::string variant;
};

// Runs the reference and the sim on copies of the same case and compares every region.
sim_result run_and_compare(const problem& p) {
  case_data initial = make_case(p);
  case_data ref = initial.clone();
  case_data got = initial.clone();
  auto cpu = make_cpu_backend();
  auto sim = make_sim_backend();
  cpu->run_host(ref.args, ref.regions());
  REQUIRE_MESSAGE(sim->unsupported_reason(got.args) == "", p.to_repro());
  sim->run_host(got.args, got.regions());
  compare_options opt;  // max 1 ULP plus the fp32 allowance of core/SPEC.md
  return {compare_runs(initial, ref, got, opt), sim->last_variant()};
}

void check_passes(const std::string& repro) {
  const problem p = parse_problem(repro);
  const sim_result r = run_and_compare(p);
  INFO(repro);
  INFO(format_case_report(r.report, true));
  CHECK(r.report.outcome == case_outcome::passed);
  // general path (fused_v1) or the fast path (fast_v4), chosen by
  // launch_plan.h
  CHECK((r.variant.rfind("fused_v1", 0) == 0 || r.variant.rfind("fast_v4", 0) == 0));
}

int32_t kernel_dtype(dtype t) {
  switch (t) {
    case dtype::f32: return ropekv_gpu::rk_f32;
    case dtype::f16: return ropekv_gpu::rk_f16;
    case dtype::bf16: return ropekv_gpu::rk_bf16;
    case dtype::fp8_e4m3fn: return ropekv_gpu::rk_e4m3fn;
    case dtype::fp8_e4m3fnuz: return ropekv_gpu::rk_e4m3fnuz;
    case dtype::fp8_e5m2: return ropekv_gpu::rk_e5m2;
    case dtype::fp8_e5m2fnuz: return ropekv_gpu::rk_e5m2fnuz;
    default: FAIL("not a float dtype: " << dtype_name(t)); return -1;
  }
}

float f32_of(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

// Runs `fast` on the sim under the variant overrides `ov` and `general` on the general body
// (force_general; the overrides are restored after), checks the two runs bit for bit and each
// against the reference's `ref`; returns the two variant names for the caller's checks.
std::pair<std::string, std::string> run_fast_and_general(const case_data& initial, const case_data& ref,
                                                         case_data& fast, case_data& general,
                                                         const ropekv_gpu::rk_variant_override& ov) {
  struct restore {
    ropekv_gpu::rk_variant_override saved = ropekv_gpu::rk_variant_overrides();
    ~restore() { ropekv_gpu::rk_variant_overrides() = saved; }
  } restore_overrides;
  auto sim = make_sim_backend();
  ropekv_gpu::rk_variant_overrides() = ov;
  REQUIRE(sim->unsupported_reason(fast.args) == "");
  sim->run_host(fast.args, fast.regions());
  const std::string fast_variant = sim->last_variant();
  ropekv_gpu::rk_variant_overrides() = ropekv_gpu::rk_variant_override{};
  ropekv_gpu::rk_variant_overrides().force_general = 1;
  sim->run_host(general.args, general.regions());
  const std::string general_variant = sim->last_variant();
  INFO(fast_variant, " vs ", general_variant);
  for (auto& [name, buf] : fast.buffers) {
    host_buffer& b = general.buffers.at(name);
    REQUIRE(buf.raw_size_bytes() == b.raw_size_bytes());
    CHECK_MESSAGE(std::memcmp(buf.raw(), b.raw(), buf.raw_size_bytes()) == 0, name);
  }
  for (case_data* run : {&fast, &general}) {
    const case_report r = compare_runs(initial, ref, *run, compare_options{});
    INFO(format_case_report(r, true));
    CHECK(r.outcome == case_outcome::passed);
  }
  return {fast_variant, general_variant};
}

}  // namespace

TEST_CASE("kernel conversions: decode of every f16/bf16/fp8 code equals core's") {
  const dtype types[] = {dtype::f16, dtype::bf16, dtype::fp8_e4m3fn, dtype::fp8_e4m3fnuz,
                         dtype::fp8_e5m2, dtype::fp8_e5m2fnuz};
  for (dtype t : types) {
    const uint32_t n = dtype_size_bytes(t) == 2 ? 65536u : 256u;
    int64_t bad = 0;
    for (uint32_t code = 0; code < n; ++code) {
      const float k = ropekv_gpu::rk_decode(kernel_dtype(t), code);
      const float c = decode_to_f32(t, code);
      const bool same = (std::isnan(k) && std::isnan(c)) || std::memcmp(&k, &c, 4) == 0;
      if (!same && bad++ < 3) FAIL_CHECK(dtype_name(t) << " code " << code << ": kernel " << k << " core " << c);
    }
    CHECK_MESSAGE(bad == 0, dtype_name(t));
  }
}

TEST_CASE("kernel conversions: encode from f32 equals core's (ties, boundaries, random)") {
  const dtype types[] = {dtype::f16, dtype::bf16, dtype::fp8_e4m3fn, dtype::fp8_e4m3fnuz,
                         dtype::fp8_e5m2, dtype::fp8_e5m2fnuz};
  for (dtype t : types) {
    const overflow_mode mode = dtype_is_fp8(t) ? overflow_mode::saturate : overflow_mode::ieee;
    std::vector<float> values = {0.0f, -0.0f, INFINITY, -INFINITY, 1e-45f, -1e-45f, 1e38f, -3e38f};
    // every code, and the midpoints (ties) and near-midpoints between neighbouring codes
    const uint32_t n = dtype_size_bytes(t) == 2 ? 65536u : 256u;
    for (uint32_t code = 0; code + 1 < n; ++code) {
      const double a = decode_to_f64(t, code), b = decode_to_f64(t, code + 1);
      if (!std::isfinite(a) || !std::isfinite(b)) continue;
      const float mid = static_cast<float>((a + b) / 2);
      values.push_back(static_cast<float>(a));
      values.push_back(mid);
      values.push_back(std::nextafter(mid, INFINITY));
      values.push_back(std::nextafter(mid, -INFINITY));
    }
    const double maxf = float_format_of(t).max_finite;
    for (double m : {maxf, maxf * 1.03, maxf * 1.0625, maxf * 2})
      for (double s : {1.0, -1.0}) values.push_back(static_cast<float>(s * m));
    for (uint64_t i = 0; i < 200000; ++i) {
      const uint32_t bits = static_cast<uint32_t>(rng_u64(7, 99, i));
      values.push_back(f32_of(bits));
    }
    int64_t bad = 0;
    for (float v : values) {
      const uint32_t k = ropekv_gpu::rk_encode(kernel_dtype(t), v);
      const uint32_t c = encode_from_f32(t, v, mode);
      const bool same = k == c || (is_nan_bits(t, k) && is_nan_bits(t, c));
      if (!same && bad++ < 3)
        FAIL_CHECK(dtype_name(t) << " value " << v << ": kernel " << k << " core " << c);
    }
    CHECK_MESSAGE(bad == 0, dtype_name(t));
  }
}

TEST_CASE("sim vs reference: hand-picked problems covering every option") {
  const char* base = "tq=3 ts=5 tk=7 h=5 dn=40 dr=8 p=50 bs=4 nb=4 seed=11 ";
  const std::vector<std::string> cases = {
      // defaults: bf16, joint nope_first, gptj, table one
      "tq=2 ts=2 tk=2 h=4 dn=512 dr=64 p=64 bs=16 nb=1",
      std::string(base) + "style=neox",
      std::string(base) + "table=two table_pad=3",
      std::string(base) + "order=rope_first entry_pad=5 block_pad=7",
      std::string(base) + "layout=split entry_pad=3 block_pad=9",
      std::string(base) + "in=f32 qo=f32 cache=f32 table_dtype=f32",
      std::string(base) + "in=f16 qo=f16 cache=f16 table_dtype=f16",
      std::string(base) + "in=bf16 qo=f32 cache=f16 table_dtype=f32",
      // fp8 caches, both scale conventions, fp8 q_out with q_scale
      std::string(base) + "cache=fp8_e4m3fn k_scale=0.37 scale_conv=divide",
      std::string(base) + "cache=fp8_e4m3fnuz k_scale=0.37 scale_conv=reciprocal",
      std::string(base) + "cache=fp8_e5m2 k_scale=3.5 qo=fp8_e5m2fnuz q_scale=0.11",
      std::string(base) + "cache=fp8_e5m2fnuz k_scale=2 qo=fp8_e4m3fn q_scale=0.5 scale_conv=reciprocal",
      // saturation: large amplitude into fp8 with a small scale
      std::string(base) + "cache=fp8_e4m3fnuz qo=fp8_e4m3fn k_scale=0.01 q_scale=0.02 amp=300",
      // scales as [1] f32 tensors read at run time: general path (fp8 q_out), both conventions,
      // a power-of-two scale (multiplied) and others (divided); fast path (fp8 cache, bf16 q)
      std::string(base) + "cache=fp8_e4m3fn k_scale=0.37 qo=fp8_e5m2 q_scale=4 scales=tensor",
      std::string(base) + "cache=fp8_e5m2fnuz k_scale=0.37 qo=fp8_e4m3fnuz q_scale=0.3 scale_conv=reciprocal scales=tensor",
      "tq=8 ts=8 tk=8 h=16 dn=512 dr=64 p=64 bs=16 nb=1 cache=fp8_e4m3fn k_scale=0.43 scales=tensor",
      "tq=8 ts=8 tk=8 h=16 dn=512 dr=64 p=64 bs=16 nb=1 cache=fp8_e4m3fn k_scale=0.5 layout=shuffled scales=tensor",
      // padding slots, q computed or skipped; positions clamped
      std::string(base) + "pad_slots=3 pad_at=spread pad_q=computed",
      std::string(base) + "pad_slots=2 pad_at=head pad_q=skipped",
      std::string(base) + "pos_oob=clamp positions=near_end",
      // in place, i32 indices, head-major q, fused kv, odd row padding (scalar paths)
      std::string(base) + "inplace_q=1 inplace_k=1 style=neox",
      std::string(base) + "pos=i32 slot=i32",
      std::string(base) + "q_layout=head_major kv_layout=fused",
      std::string(base) + "row_pad=3 in=f16 qo=bf16",
      // widths that leave a vector tail, odd Dr/2, block size 1, one head
      "tq=4 ts=4 tk=4 h=1 dn=37 dr=6 p=9 bs=1 nb=5",
      "tq=1 ts=2 tk=3 h=3 dn=13 dr=2 p=3 bs=3 nb=1 in=f32 cache=fp8_e4m3fn k_scale=0.7",
      // Tq = Ts = 0: nothing written
      "tq=0 ts=0 tk=2 h=2 dn=16 dr=4 p=8 bs=2 nb=1",
      // a real model's shape and table
      "tq=3 ts=3 tk=3 h=16 dn=512 dr=64 p=4096 bs=64 nb=1 rope_table=deepseek-v3",
  };
  for (const std::string& c : cases) check_passes(c);
}

TEST_CASE("sim vs reference: 300 random problems") {
  int64_t failed = 0;
  for (uint64_t i = 0; i < 300; ++i) {
    const problem p = random_problem(2026, i, 16);
    const sim_result r = run_and_compare(p);
    if (r.report.outcome != case_outcome::passed && failed++ < 3) {
      FAIL_CHECK(outcome_name(r.report.outcome) << ": " << p.to_repro() << "\n"
                                                << format_case_report(r.report, true));
    }
  }
  CHECK(failed == 0);
}

// scales=tensor: the scale is the tensor's value when the op runs (the float arguments are NaN
// decoys). A case whose tensors were changed after make_case must give the bytes of the case built
// with the new values as host floats, on the reference and on the sim (fast and general paths).
TEST_CASE("scale tensors: ref and sim read the value at run time") {
  for (const char* shape : {"tq=8 ts=8 tk=8 h=16 dn=512 dr=64 p=64 bs=16 nb=1 qo=bf16",
                            "tq=3 ts=5 tk=7 h=5 dn=40 dr=8 p=50 bs=4 nb=4 qo=fp8_e4m3fn"}) {
    const std::string common = std::string(shape) + " cache=fp8_e4m3fn scale_conv=divide seed=3 ";
    const problem with_tensors = parse_problem(common + "k_scale=0.5 q_scale=0.5 scales=tensor");
    const problem with_floats = parse_problem(common + "k_scale=0.37 q_scale=3");
    for (const char* be_name : {"ref", "sim"}) {
      INFO(be_name << ": " << shape);
      auto be = std::string(be_name) == "ref" ? make_cpu_backend() : make_sim_backend();
      case_data a = make_case(with_tensors);
      const float k = 0.37f, q = 3.0f;  // not the repro's 0.5
      std::memcpy(a.args.k_scale_tensor.data, &k, sizeof k);
      std::memcpy(a.args.q_scale_tensor.data, &q, sizeof q);
      CHECK(std::isnan(a.args.k_scale));
      be->run_host(a.args, a.regions());
      case_data b = make_case(with_floats);
      be->run_host(b.args, b.regions());
      for (const char* out : {"q_out", "cache"}) {
        const host_buffer& x = a.buffers.at(out);
        const host_buffer& y = b.buffers.at(out);
        REQUIRE(x.size_bytes() == y.size_bytes());
        CHECK_MESSAGE(std::memcmp(x.data(), y.data(), x.size_bytes()) == 0, out);
      }
    }
  }
}

TEST_CASE("sim: validation runs before any write") {
  problem p = parse_problem("tq=2 ts=2 tk=2 h=2 dn=16 dr=4 p=8 bs=2 nb=2");
  case_data c = make_case(p);
  c.args.k_scale = -1.0f;  // invalid: must throw, write nothing
  case_data before = c.clone();
  auto sim = make_sim_backend();
  CHECK_THROWS_AS(sim->run_host(c.args, c.regions()), arg_error);
  for (const auto& [name, buf] : c.buffers) {
    const host_buffer& b = before.buffers.at(name);
    CHECK_MESSAGE(std::memcmp(buf.data(), b.data(), buf.size_bytes()) == 0, name);
  }
}

// The fuzz stream (`ropekv fuzz --cases 2000 --max-tokens 64`, seed 1) takes fast_v4 in only a
// few percent of its cases (in-place rope, f32/fp8 q, odd widths and paddings are frequent), so
// fast_v4 gets its own random stream: the same problems, coerced into what fast_v4 accepts
// by core's coerce_aligned16 (the `fuzz --profile aligned16` stream: 16-bit q/kv, q_out = q,
// cache = kv's dtype or fp8, widths multiples of 8/16, paddings multiples of 8, no in-place
// rope), run against the reference, once with fast_v4 (the default) and once with the general
// body (forced). Most must take the kernel under test.
TEST_CASE("fast_v4 and general-body random stream: coerced fuzz problems pass against the reference") {
  for (const std::string kernel : {"fast_v4", "fused_v1"}) {
    ropekv_gpu::rk_variant_override ov;
    ov.force_general = kernel == "fused_v1";
    const ropekv_gpu::rk_variant_override saved = ropekv_gpu::rk_variant_overrides();
    ropekv_gpu::rk_variant_overrides() = ov;
    int taken = 0, other = 0;
    const int n = 300;
    for (int i = 0; i < n; ++i) {
      problem q;
      try {
        q = coerce_aligned16(random_problem(7, static_cast<uint64_t>(i), 24));  // canonical, validated
      } catch (const std::exception&) {
        ++other;
        continue;
      }
      const std::string repro = q.to_repro();
      const sim_result r = run_and_compare(q);
      INFO(kernel, " ", repro);
      INFO(format_case_report(r.report, true));
      CHECK(r.report.outcome == case_outcome::passed);
      if (r.variant.rfind(kernel, 0) == 0) ++taken; else ++other;
    }
    ropekv_gpu::rk_variant_overrides() = saved;
    MESSAGE(kernel, " stream: ", taken, " of ", n, " cases took ", kernel);
    CHECK(taken >= n / 2);
  }
}

// The sim's pinned grid loops (sim_grid.h: fast_v4 at Dn 512 / Dr 64 with 64-bit indices,
// those launch parameters held as compile-time constants) against the plain loops
// (ROPEKV_SIM_PIN=0): every output byte identical, both pass against the reference; one q row
// per group and two (qp), gptj and neox, bf16 and fp8 caches, padding. A launch outside the
// pin (32-bit slot_mapping) must not take it.
TEST_CASE("sim: pinned grid loops write the same bytes as the plain loops") {
  // pinned loops run in the default copy (FMA on x86-64) unless ROPEKV_SIM_FMA=0 / ROPEKV_SIM_PIN=0
  const auto env_is_0 = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && std::string(v) == "0";
  };
#if defined(__x86_64__) && defined(__GNUC__)
  const bool pins_run = __builtin_cpu_supports("fma") != 0 && !env_is_0("ROPEKV_SIM_FMA") && !env_is_0("ROPEKV_SIM_PIN");
#else
  const bool pins_run = !env_is_0("ROPEKV_SIM_FMA") && !env_is_0("ROPEKV_SIM_PIN");
#endif
  const std::string base = "tq=5 ts=6 tk=7 h=16 dn=512 dr=64 p=300 bs=16 nb=2 seed=5 rope_table=deepseek-v3 ";
  struct pin_case {
    std::string repro;
    int q_pairs;  // rk_variant_override::v4_q_pairs
    bool pinned;  // expected to take the pinned loop
  };
  const std::vector<pin_case> cases = {
      {base, 0, true},
      {base, 1, true},
      {base + "style=neox", 0, true},
      {base + "style=neox", 1, true},
      {base + "cache=fp8_e4m3fn k_scale=0.37", 1, true},
      {base + "pad_slots=2 pad_at=spread pad_q=computed table_dtype=f32", 1, true},
      {base + "pad_slots=2 pad_at=head pad_q=skipped", 0, true},
      {base + "slot=i32", 1, false},
  };
  const ropekv_gpu::rk_variant_override saved = ropekv_gpu::rk_variant_overrides();
  for (const pin_case& pc : cases) {
    INFO(pc.repro, " qp=", pc.q_pairs);
    ropekv_gpu::rk_variant_override ov;
    ov.v4_q_pairs = pc.q_pairs;
    ropekv_gpu::rk_variant_overrides() = ov;
    const problem p = parse_problem(pc.repro);
    case_data initial = make_case(p);
    case_data ref = initial.clone(), pinned = initial.clone(), plain = initial.clone();
    make_cpu_backend()->run_host(ref.args, ref.regions());

    const int64_t before = sim_pinned_launches();
    auto sim = make_sim_backend();
    sim->run_host(pinned.args, pinned.regions());
    CHECK(sim->last_variant().rfind("fast_v4", 0) == 0);
    CHECK((sim->last_variant().find("+qp") != std::string::npos) == (pc.q_pairs == 1));
    CHECK(sim_pinned_launches() - before == (pc.pinned && pins_run && sim_specialised() ? 1 : 0));

    ::setenv("ROPEKV_SIM_PIN", "0", 1);
    const int64_t before_plain = sim_pinned_launches();
    make_sim_backend()->run_host(plain.args, plain.regions());
    ::unsetenv("ROPEKV_SIM_PIN");
    CHECK(sim_pinned_launches() == before_plain);

    for (const auto& [name, buf] : pinned.buffers) {
      const host_buffer& b = plain.buffers.at(name);
      CHECK_MESSAGE(std::memcmp(buf.data(), b.data(), buf.size_bytes()) == 0, name);
    }
    const case_report rep = compare_runs(initial, ref, pinned, compare_options{});
    INFO(format_case_report(rep, true));
    CHECK(rep.outcome == case_outcome::passed);
  }
  ropekv_gpu::rk_variant_overrides() = saved;
}

// Decode outputs (core/SPEC.md "Decode outputs"): the sim against the reference (rope rows by
// the rope rule, the zero buffer and every byte not written bit for bit), and within each run
// bit for bit: decode_q_pe_out rows are the in-place q_pe rows, k_pe_out rows the in-place k_pe

// The sim's two copies of its grid loops on x86-64 (sim_grid.h): the default one (FMA where the
// CPU has it) runs fast_v4 in the dtype-specialised instantiation the GPU launches,
// the portable one (ROPEKV_SIM_FMA=0) in the generic one. Same kernel body, same IEEE
// operations: every output byte identical, on launches of every specialised kind (both styles,
// both q dtypes, fp8 caches, f32 tables, fp8_ds_mla, q pairs, decode outputs, zero-copy).
TEST_CASE("sim: the portable copy (ROPEKV_SIM_FMA=0) writes the same bytes as the default copy") {
  const std::string base = "tq=5 ts=6 tk=7 h=16 dn=512 dr=64 p=300 bs=16 nb=2 seed=9 rope_table=deepseek-v3 ";
  struct copy_case {
    std::string repro;
    bool zero_copy;  // q_nope points into q_out (zero-copy rows per lane: rk_v4_q_rope_rows)
    int q_pairs;     // rk_variant_override::v4_q_pairs
  };
  const std::vector<copy_case> cases = {
      {base, false, 0},
      {base + "style=neox", false, 1},
      {base + "in=f16 qo=f16 cache=f16 style=neox table_dtype=f32", false, 0},
      {base + "cache=fp8_e4m3fn k_scale=0.37", false, 1},
      {base + "in=f16 qo=f16 cache=fp8_e5m2fnuz k_scale=0.5", false, 0},
      {base + "layout=fp8_ds_mla cache=u8", false, 0},
      {base + "layout=fp8_ds_mla cache=u8 ds_scale=pow2 style=neox", false, 1},
      {base + "dec_out=qzk dec=3", false, 1},
      {base + "cache=fp8_e4m3fn k_scale=0.37", true, 0},
      {base + "style=neox dec_out=qzk dec=2", true, 0},
  };
  const ropekv_gpu::rk_variant_override saved = ropekv_gpu::rk_variant_overrides();
  for (const copy_case& cc : cases) {
    INFO(cc.repro, " zero_copy=", cc.zero_copy, " qp=", cc.q_pairs);
    ropekv_gpu::rk_variant_override ov;
    ov.v4_q_pairs = cc.q_pairs;
    ropekv_gpu::rk_variant_overrides() = ov;
    const problem p = parse_problem(cc.repro);
    case_data initial = make_case(p);
    if (cc.zero_copy) apply_zero_copy(initial);
    case_data ref = initial.clone(), fast = initial.clone(), portable = initial.clone();
    make_cpu_backend()->run_host(ref.args, ref.regions());
    auto sim = make_sim_backend();
    sim->run_host(fast.args, fast.regions());
    CHECK(sim->last_variant().rfind("fast_v4", 0) == 0);
    CHECK((sim->last_variant().find("+zero_copy") != std::string::npos) == cc.zero_copy);
    ::setenv("ROPEKV_SIM_FMA", "0", 1);
    make_sim_backend()->run_host(portable.args, portable.regions());
    ::unsetenv("ROPEKV_SIM_FMA");
    for (const auto& [name, buf] : fast.buffers) {
      const host_buffer& b = portable.buffers.at(name);
      CHECK_MESSAGE(std::memcmp(buf.data(), b.data(), buf.size_bytes()) == 0, name);
    }
    const case_report rep = compare_runs(initial, ref, fast, compare_options{});
    INFO(format_case_report(rep, true));
    CHECK(rep.outcome == case_outcome::passed);
  }
  ropekv_gpu::rk_variant_overrides() = saved;
}
// rows (the same values, rounded the same way).
TEST_CASE("sim vs reference: decode outputs, every N, bit for bit where the contract says so") {
  const std::string common = "tq=5 ts=6 tk=8 h=3 p=50 seed=5 inplace_q=1 inplace_k=1 ";
  const std::string base = common + "dn=40 dr=8 bs=4 nb=4 ";
  std::vector<std::string> cases;
  for (const char* n : {"0", "1", "3", "5"})
    for (const char* pad : {"pad_slots=0", "pad_slots=2 pad_at=spread pad_q=skipped", "pad_slots=2 pad_q=computed"})
      cases.push_back(base + pad + " dec_out=qzk dec=" + n);
  cases.push_back(base + "dec_out=q dec=2 in=f32 qo=f32 cache=fp8_e4m3fn k_scale=0.3");
  cases.push_back(base + "dec_out=z dec=4 in=f16 qo=fp8_e5m2 q_scale=0.7 q_layout=head_major");
  cases.push_back(base + "dec_out=k layout=split row_pad=3 style=neox kv_layout=fused");
  cases.push_back(common + "dec_out=zk dec=3 layout=shuffled bs=16 nb=1 dn=48 dr=16");
  // shapes the fast paths take without decode outputs: with them the general body runs
  cases.push_back("tq=8 ts=8 tk=8 h=16 dn=512 dr=64 p=64 bs=16 nb=1 dec_out=qzk dec=3 inplace_q=1 inplace_k=1");
  cases.push_back("tq=8 ts=8 tk=8 h=16 dn=512 dr=64 p=64 bs=16 nb=1 dec_out=qzk dec=8 cache=fp8_e4m3fn k_scale=0.5");
  for (const std::string& repro : cases) {
    INFO(repro);
    const problem p = parse_problem(repro);
    case_data initial = make_case(p);
    case_data ref = initial.clone();
    case_data got = initial.clone();
    auto cpu = make_cpu_backend();
    auto sim = make_sim_backend();
    cpu->run_host(ref.args, ref.regions());
    REQUIRE(sim->unsupported_reason(got.args) == "");
    sim->run_host(got.args, got.regions());
    CHECK(sim->last_variant().find("+decode") != std::string::npos);
    const case_report r = compare_runs(initial, ref, got, compare_options{});
    INFO(format_case_report(r, true));
    CHECK(r.outcome == case_outcome::passed);
    bool saw_dec_region = false;
    for (const region_report& g : r.regions)
      if (g.name == "decode_q_pe_out" || g.name == "q_nope_zeros_out" || g.name == "k_pe_out") saw_dec_region = true;
    CHECK(saw_dec_region);
    for (case_data* run : {&ref, &got}) {
      const op_args& a = run->args;
      const int64_t n = p.dec_tokens, heads = p.heads, dr = p.dr, es = 2 * (p.in_dtype == dtype::f32 ? 2 : 1);
      for (int64_t t = 0; t < n && p.dec_q_pe; ++t) {
        for (int64_t h = 0; h < heads; ++h) {
          const uint8_t* d = static_cast<const uint8_t*>(a.decode_q_pe_out.data) +
                             (t * a.decode_q_pe_out.strides_elems[0] + h * a.decode_q_pe_out.strides_elems[1]) * es;
          const uint8_t* q = static_cast<const uint8_t*>(a.q_pe.data) +
                             (t * a.q_pe.strides_elems[0] + h * a.q_pe.strides_elems[1]) * es;
          const uint8_t* q0 = static_cast<const uint8_t*>(initial.args.q_pe.data) +
                              (t * a.q_pe.strides_elems[0] + h * a.q_pe.strides_elems[1]) * es;
          const bool computed = std::memcmp(q, q0, static_cast<size_t>(dr * es)) != 0 || p.opt.padding == pad_q::computed;
          if (computed && p.opt.inplace_q) CHECK(std::memcmp(d, q, static_cast<size_t>(dr * es)) == 0);
        }
      }
      if (p.dec_k_pe && p.opt.inplace_k) {
        for (int64_t t = 0; t < p.ts; ++t) {
          const uint8_t* ko = static_cast<const uint8_t*>(a.k_pe_out.data) + t * a.k_pe_out.strides_elems[0] * es;
          const uint8_t* k = static_cast<const uint8_t*>(a.k_pe.data) + t * a.k_pe.strides_elems[0] * es;
          const uint8_t* k0 = static_cast<const uint8_t*>(initial.args.k_pe.data) + t * a.k_pe.strides_elems[0] * es;
          if (std::memcmp(k, k0, static_cast<size_t>(dr * es)) != 0)
            CHECK(std::memcmp(ko, k, static_cast<size_t>(dr * es)) == 0);
        }
      }
    }
  }
}

// fast_v4 writes the decode outputs (kernel.h rk_v4_zero_row and the stores after a row's rope
// unit; launch_plan.h rk_v4_decode_refusal): on shapes it takes (copy and zero-copy concat, one-
// and two-row q groups with an odd H, the cache split and its rope group, each cache layout, an
// fp8 cache, neox, f16, an f32 table, head-major q, Dn = 1024, padding skipped / computed, every
// N, each output alone) the plan picks fast_v4 (+decode), and every byte of every buffer equals
// what the general body (rk_variant_override::force_general) writes; both pass the reference.
TEST_CASE("sim: fast_v4 writes the decode outputs, bit for bit the general body's") {
  const std::string base = "tq=5 ts=7 tk=8 h=5 dn=512 dr=64 p=64 bs=16 nb=1 seed=7 ";
  struct v4_case {
    std::string repro;
    bool zero_copy;
    int q_pairs;     // rk_variant_override::v4_q_pairs
    int kv_split;    // rk_variant_override::v4_kv_split (0: the plan's)
    int rope_group;  // rk_variant_override::v4_kv_rope_group (-1: the plan's)
  };
  std::vector<v4_case> cases;
  int i = 0;
  for (const char* n : {"0", "1", "3", "5"})
    for (const char* pad : {"pad_slots=0", "pad_slots=2 pad_at=spread pad_q=skipped", "pad_slots=2 pad_at=head pad_q=computed"}) {
      cases.push_back({base + pad + " dec_out=qzk dec=" + n, i % 3 == 2, i % 3 == 1 ? 1 : 0, 0, -1});
      ++i;
    }
  cases.push_back({base + "dec_out=qzk dec=4 style=neox", false, 1, 2, -1});
  cases.push_back({base + "dec_out=qzk dec=4 style=neox", true, 0, 0, -1});
  cases.push_back({base + "dec_out=qzk dec=3 cache=fp8_e4m3fn k_scale=0.37", false, 1, 0, -1});
  cases.push_back({base + "dec_out=qzk dec=3 cache=fp8_e5m2 k_scale=0.5 style=neox", false, 0, 4, 0});
  cases.push_back({base + "dec_out=qzk dec=2 layout=split", false, 0, 0, 1});
  cases.push_back({base + "dec_out=qzk dec=5 layout=shuffled pad_slots=1", true, 0, 2, -1});
  cases.push_back({base + "dec_out=qzk dec=5 layout=shuffled cache=fp8_e4m3fnuz k_scale=2", false, 1, 0, -1});
  cases.push_back({base + "dec_out=qzk dec=3 in=f16 qo=f16 cache=f16 table_dtype=f32", false, 1, 0, -1});
  cases.push_back({base + "dec_out=qzk dec=3 q_layout=head_major row_pad=8", false, 0, 0, -1});
  cases.push_back({base + "dec_out=q dec=4", false, 1, 0, -1});
  cases.push_back({base + "dec_out=z dec=2", true, 0, 0, -1});
  cases.push_back({base + "dec_out=k pad_slots=2 pad_at=spread", false, 0, 2, 1});
  cases.push_back({"tq=3 ts=4 tk=4 h=3 dn=1024 dr=32 p=16 bs=16 nb=1 seed=3 dec_out=qzk dec=2", false, 1, 0, -1});
  cases.push_back({"tq=3 ts=4 tk=4 h=3 dn=1024 dr=32 p=16 bs=16 nb=1 seed=3 dec_out=qzk dec=3", true, 0, 0, -1});
  cases.push_back({"tq=4 ts=4 tk=4 h=9 dn=64 dr=16 p=16 bs=4 nb=2 seed=4 dec_out=qzk dec=3 style=neox", true, 0, 0, -1});
  for (const v4_case& vc : cases) {
    INFO(vc.repro, " zero_copy=", vc.zero_copy, " qp=", vc.q_pairs, " kvs=", vc.kv_split, " r=", vc.rope_group);
    const problem p = parse_problem(vc.repro);
    case_data initial = make_case(p);
    if (vc.zero_copy) apply_zero_copy(initial);
    case_data ref = initial.clone(), fast = initial.clone(), general = initial.clone();
    make_cpu_backend()->run_host(ref.args, ref.regions());

    ropekv_gpu::rk_variant_override ov;
    ov.v4_q_pairs = vc.q_pairs;
    ov.v4_kv_split = vc.kv_split;
    ov.v4_kv_rope_group = vc.rope_group;
    const auto [v4, gen] = run_fast_and_general(initial, ref, fast, general, ov);
    INFO(v4, " vs ", gen);
    CHECK(v4.rfind("fast_v4", 0) == 0);
    CHECK(v4.find("+decode") != std::string::npos);
    CHECK((v4.find("+zero_copy") != std::string::npos) == vc.zero_copy);
    CHECK((v4.find("+qp") != std::string::npos) == (vc.q_pairs == 1 && !vc.zero_copy));
    CHECK(gen.rfind("fused_v1", 0) == 0);
    CHECK(gen.find("+decode") != std::string::npos);
  }
}

// A decode output in rows fast_v4 cannot store 16 bytes at a time keeps the case off fast_v4
// (the general body writes it).
TEST_CASE("launch plan: decode outputs on fast_v4 need 16-byte rows") {
  const problem p = parse_problem("tq=4 ts=4 tk=4 h=4 dn=512 dr=64 p=16 bs=16 nb=1 seed=2 dec_out=qzk dec=2");
  const case_data c = make_case(p);
  ropekv_gpu::rk_params q = ropekv_gpu::rk_make_launch(c.args).params;
  CHECK(ropekv_gpu::rk_v4_refusal(q) == "");
  CHECK(q.v4_decode == 1);  // the instantiations that write them (kernel.h rk_fast4_body<S, R, 1>)
  const case_data none = make_case(parse_problem("tq=4 ts=4 tk=4 h=4 dn=512 dr=64 p=16 bs=16 nb=1 seed=2"));
  const ropekv_gpu::rk_launch plain = ropekv_gpu::rk_make_launch(none.args);
  CHECK(plain.variant.rfind("fast_v4", 0) == 0);
  CHECK(plain.variant.find("+decode") == std::string::npos);
  CHECK(plain.params.v4_decode == 0);
  ropekv_gpu::rk_params bad = q;
  bad.dec_q_pe_s1 += 4;
  CHECK(ropekv_gpu::rk_v4_refusal(bad) == "decode_q_pe_out rows not 16-byte aligned");
  bad = q;
  bad.q_nope_zeros_out += 2;
  CHECK(ropekv_gpu::rk_v4_refusal(bad) == "q_nope_zeros_out rows not 16-byte aligned");
  bad = q;
  bad.k_pe_out_s0 += 1;
  CHECK(ropekv_gpu::rk_v4_refusal(bad) == "k_pe_out rows not 16-byte aligned");
  const problem odd = parse_problem("tq=4 ts=4 tk=4 h=4 dn=512 dr=64 p=16 bs=16 nb=1 seed=2 dec_out=k row_pad=3");
  const case_data d = make_case(odd);
  const ropekv_gpu::rk_launch l = ropekv_gpu::rk_make_launch(d.args);
  CHECK(l.variant.rfind("fused_v1", 0) == 0);
  CHECK(l.variant.find("+decode") != std::string::npos);
}

// The comparison sees what a kernel with AITER's decode-row bug (rows of the wrong q token), a
// -0 in the zero buffer, or a k_pe_out row of a padding token would write.
TEST_CASE("decode outputs: the comparison catches wrong rows, a non-zero zero buffer, a stray k_pe_out row") {
  const problem p = parse_problem("tq=5 ts=6 tk=8 h=3 dn=40 dr=8 p=50 bs=4 nb=4 seed=5 pad_slots=2 pad_at=head "
                                  "pad_q=computed dec_out=qzk dec=3");
  case_data initial = make_case(p);
  case_data ref = initial.clone();
  make_cpu_backend()->run_host(ref.args, ref.regions());
  auto region_fails = [&](const std::function<void(case_data&)>& damage, const std::string& region) {
    case_data bad = ref.clone();
    damage(bad);
    const case_report r = compare_runs(initial, ref, bad, compare_options{});
    bool hit = false;
    for (const region_report& g : r.regions) hit = hit || (g.name == region && g.mismatches > 0);
    INFO(format_case_report(r, true));
    CHECK(r.outcome == case_outcome::failed);
    CHECK_MESSAGE(hit, region);
  };
  const int64_t es = 2;  // bf16
  region_fails([&](case_data& c) {  // row 0 from token 2 (Tq - N = 2 rows off, as AITER's)
    const tensor_view& d = c.args.decode_q_pe_out;
    uint8_t* base = static_cast<uint8_t*>(d.data);
    std::memcpy(base, base + 2 * d.strides_elems[0] * es, static_cast<size_t>(p.dr * es));
  }, "decode_q_pe_out");
  region_fails([&](case_data& c) {  // -0 (0x8000) in the zero buffer
    static_cast<uint8_t*>(c.args.q_nope_zeros_out.data)[1] = 0x80;
  }, "q_nope_zeros_out");
  region_fails([&](case_data& c) {  // token 0 (slot -1) gets a k_pe_out row
    std::memset(c.args.k_pe_out.data, 0, static_cast<size_t>(p.dr * es));
  }, "k_pe_out.untouched");
  region_fails([&](case_data& c) {  // a non-zero byte in row t = 2 < N of the zero buffer
    std::memset(static_cast<uint8_t*>(c.args.q_nope_zeros_out.data) + 2 * c.args.q_nope_zeros_out.strides_elems[0] * es + 0, 1, 2);
  }, "q_nope_zeros_out");
}

// Layout fp8_ds_mla (core/SPEC.md): fast_v4 writes the 656-byte entries (rk_v4_ds_mla_row), or
// the general body where the plan refuses fast_v4 (in-place rope, an fp8 q_out); variant tag
// '+ds_mla'. Nope bytes and scales equal the reference's bit for bit, both tile scale rules,
// every option the layout allows.
TEST_CASE("sim vs reference: layout fp8_ds_mla, both tile scale rules") {
  const std::string base = "tq=6 ts=7 tk=8 h=4 dn=512 dr=64 p=64 layout=fp8_ds_mla cache=u8 ";
  for (const char* rule : {"amax", "pow2"}) {
    for (const char* extra : {"bs=16 nb=2", "bs=16 nb=2 in=f16 qo=f16 table_dtype=f32 style=neox",
                              "bs=16 nb=2 pad_slots=3 pad_at=spread pad_q=skipped",
                              "bs=16 nb=2 entry_pad=4 block_pad=20 inplace_k=1 inplace_q=1 kv_layout=fused",
                              "bs=16 nb=2 amp=300 q_layout=head_major",
                              "bs=16 nb=2 amp=0.5 dec_out=qzk dec=2 scales=tensor qo=fp8_e4m3fn q_scale=0.3",
                              "bs=1 nb=9 pos=i32 slot=i32"}) {
      const std::string repro = base + "ds_scale=" + rule + " " + extra;
      INFO(repro);
      const problem p = parse_problem(repro);
      const sim_result r = run_and_compare(p);
      INFO(format_case_report(r.report, true));
      CHECK(r.report.outcome == case_outcome::passed);
      CHECK(r.variant.find("+ds_mla") != std::string::npos);
      const bool general = std::string(extra).find("inplace") != std::string::npos ||
                           std::string(extra).find("qo=fp8") != std::string::npos;
      CHECK(r.variant.rfind(general ? "fused_v1" : "fast_v4", 0) == 0);
      bool scales = false;
      for (const region_report& g : r.report.regions)
        if (g.name == "cache.scales") scales = g.compared == 4 * (p.ts - p.pad_slots) && g.mismatches == 0;
      CHECK(scales);
    }
  }
}

TEST_CASE("fp8_ds_mla: the comparison catches a wrong scale, a wrong nope byte, a rope byte off, a stray byte") {
  const problem p = parse_problem("tq=3 ts=4 tk=4 h=2 dn=512 dr=64 p=50 bs=4 nb=2 seed=8 layout=fp8_ds_mla cache=u8 "
                                  "ds_scale=pow2 entry_pad=4");
  case_data initial = make_case(p);
  case_data ref = initial.clone();
  make_cpu_backend()->run_host(ref.args, ref.regions());
  const std::vector<int64_t> slots = read_indices(ref.args.slot_mapping, p.ts);
  auto entry_of = [&](case_data& c, int64_t slot) {
    const tensor_view& v = c.args.cache;
    return static_cast<uint8_t*>(v.data) + (slot / p.block_size) * v.strides_elems[0] + (slot % p.block_size) * v.strides_elems[1];
  };
  auto region_fails = [&](const std::function<void(case_data&)>& damage, const std::string& region) {
    case_data bad = ref.clone();
    damage(bad);
    const case_report r = compare_runs(initial, ref, bad, compare_options{});
    bool hit = false;
    for (const region_report& g : r.regions) hit = hit || (g.name == region && g.mismatches > 0);
    INFO(format_case_report(r, true));
    CHECK(r.outcome == case_outcome::failed);
    CHECK_MESSAGE(hit, region);
  };
  region_fails([&](case_data& c) {  // tile 2's scale doubled or halved (the exponent's low bit)
    entry_of(c, slots[1])[512 + 4 * 2 + 2] ^= 0x80;
  }, "cache.scales");
  region_fails([&](case_data& c) { entry_of(c, slots[0])[300] ^= 0x01; }, "cache.nope");
  region_fails([&](case_data& c) { entry_of(c, slots[2])[528 + 2 * 5 + 1] ^= 0x04; }, "cache.rope");
  region_fails([&](case_data& c) { entry_of(c, slots[0])[656] = 0x5a; }, "cache.untouched");  // entry padding
}

// fp8_ds_mla on fast_v4 (kernel.h rk_v4_ds_mla_row: each lane takes its tile's amax itself)
// writes the general body's bytes, for every entry store width (16, 8, 4 bytes: the alignment
// of the entry addresses), both scale rules, both 16-bit inputs, with tiles holding NaN, +-inf,
// zeros of both signs, subnormals and the largest finite values, and the decode outputs.
TEST_CASE("sim: fp8_ds_mla on fast_v4, bit for bit the general body's, special values in every tile rule") {
  struct special {
    int64_t t, d;       // kv_c[t, d]
    uint16_t bf16, f16; // the value's bits in either input dtype
  };
  // token 0: NaNs among ordinary values in tile 0 (skipped by the amax), a NaN alone in tile 1;
  // token 1: +inf in tile 1, -inf in tile 2; token 2: tile 0 all +-0, tile 3 subnormals only;
  // token 3: the largest finite value and its negative in tile 2
  std::vector<special> specials = {{0, 3, 0x7fc0, 0x7e00}, {0, 77, 0xffc1, 0xfe01}, {0, 130, 0x7fc0, 0x7e00},
                                   {1, 200, 0x7f80, 0x7c00}, {1, 300, 0xff80, 0xfc00},
                                   {3, 260, 0x7f7f, 0x7bff}, {3, 383, 0xff7f, 0xfbff}};
  for (int64_t d = 0; d < 128; ++d) specials.push_back({2, d, uint16_t(d & 1 ? 0x8000 : 0x0000), uint16_t(d & 1 ? 0x8000 : 0)});
  for (int64_t d = 384; d < 512; ++d) specials.push_back({2, d, uint16_t(1 + (d & 7)), uint16_t(1 + (d & 7))});
  const std::string base = "tq=3 ts=5 tk=6 h=3 dn=512 dr=64 p=32 bs=4 nb=3 layout=fp8_ds_mla cache=u8 seed=11 ";
  struct ds_case {
    std::string extra;
    int store_bytes;  // the entry stores fast_v4 must pick
  };
  const std::vector<ds_case> cases = {
      {"entry_pad=0 block_pad=0", 16},
      {"entry_pad=16 block_pad=32 style=neox", 16},
      {"entry_pad=8 block_pad=0", 8},
      {"entry_pad=0 block_pad=24 in=f16 qo=f16", 8},
      {"entry_pad=4 block_pad=4 table_dtype=f32", 4},
      {"entry_pad=12 block_pad=0 style=neox in=f16 qo=f16", 4},
      {"entry_pad=0 block_pad=0 pad_slots=2 pad_at=spread pad_q=skipped", 16},
      {"entry_pad=0 block_pad=0 dec_out=qzk dec=2", 16},
      {"entry_pad=4 block_pad=0 dec_out=k style=neox", 4},
  };
  for (const char* rule : {"amax", "pow2"}) {
    for (const ds_case& dc : cases) {
      for (const int32_t groups : {1, 2, 4}) {  // the entry's nope part over 1, 2 or 4 groups (kvs=N)
        const std::string repro = base + "ds_scale=" + rule + " " + dc.extra;
        INFO(repro, " kvs=", groups);
        const problem p = parse_problem(repro);
        case_data initial = make_case(p);
        const bool bf16 = p.in_dtype == dtype::bf16;
        for (const special& sp : specials) {
          char* row = static_cast<char*>(initial.args.kv_c.data) + sp.t * initial.args.kv_c.strides_elems[0] * 2;
          const uint16_t bits = bf16 ? sp.bf16 : sp.f16;
          std::memcpy(row + sp.d * 2, &bits, 2);
        }
        case_data ref = initial.clone(), fast = initial.clone(), general = initial.clone();
        make_cpu_backend()->run_host(ref.args, ref.regions());
        ropekv_gpu::rk_variant_override ov;
        ov.v4_kv_split = groups;
        const auto [v4, gen] = run_fast_and_general(initial, ref, fast, general, ov);
        INFO(v4, " vs ", gen);
        CHECK(v4.rfind("fast_v4", 0) == 0);
        CHECK(v4.find(",kvs" + std::to_string(groups) + "+r,") != std::string::npos);
        CHECK(v4.find("+ds_mla(st" + std::to_string(dc.store_bytes) + ")") != std::string::npos);
        CHECK(gen.rfind("fused_v1", 0) == 0);
      }
    }
  }
}

// The plan's zero-copy rows per lane: the most (4 gptj, 2 neox) that keep >= 4096 q groups
// (a group: 32 lanes, 8 per row at Dr = 64 gptj, 4 neox).
TEST_CASE("fast_v4 zero-copy: rows per lane by the number of q groups") {
  struct want_rows {
    const char* repro;
    int32_t rows;
  };
  const want_rows cases[] = {
      {"tq=1 ts=1 tk=1 h=128 dn=8 dr=64 in=bf16 qo=bf16 cache=bf16 nb=1", 1},
      {"tq=256 ts=256 tk=256 h=128 dn=8 dr=64 in=bf16 qo=bf16 cache=bf16 nb=4", 2},     // 4096 groups of 2
      {"tq=1024 ts=1024 tk=1024 h=128 dn=8 dr=64 in=bf16 qo=bf16 cache=bf16 nb=16", 4}, // 8192 groups of 4
      {"tq=1000 ts=1000 tk=1000 h=16 dn=8 dr=64 in=bf16 qo=bf16 cache=bf16 nb=16", 1},
      {"tq=2048 ts=2048 tk=2048 h=16 dn=8 dr=64 in=bf16 qo=bf16 cache=bf16 nb=32", 2},
      {"tq=4096 ts=4096 tk=4096 h=16 dn=8 dr=64 in=bf16 qo=bf16 cache=bf16 nb=64", 4},
      {"tq=4096 ts=4096 tk=4096 h=16 dn=8 dr=64 in=bf16 qo=bf16 cache=bf16 nb=64 style=neox", 2},
  };
  for (const want_rows& w : cases) {
    case_data c = make_case(parse_problem(w.repro));
    apply_zero_copy(c);
    const ropekv_gpu::rk_launch l = ropekv_gpu::rk_make_launch(c.args);
    INFO(w.repro, " ", l.variant);
    CHECK(l.params.skip_q_nope == 1);
    CHECK(l.params.v4_zc_rows == w.rows);
    CHECK(ropekv_gpu::rk_v4_q_shape(l.params) == 0);
  }
}
