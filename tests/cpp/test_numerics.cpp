// core/numerics: the models' emulation meets each model's own bound, the fp32 model is the
// reference bit for bit, the models are told apart, and compare_runs identifies a run.
#include <doctest/doctest.h>

#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/sim/sim_backend.h"
#include "core/case_data.h"
#include "core/compare.h"
#include "core/convert.h"
#include "core/numerics.h"
#include "core/rng.h"

namespace ropekv {
namespace {

// A random element of in dtype `in` and table dtype `table`; every fourth one nearly cancels
// (partner*S ~= -x*C), where the models differ most.
rope_element random_element(uint64_t i, dtype in, dtype table, dtype out) {
  auto q = [](dtype t, double v) { return decode_to_f64(t, encode_from_f64(t, v, overflow_mode::ieee)); };
  rope_element e;
  e.in = in;
  e.table = table;
  e.out = out;
  e.x = q(in, rng_unit(11, 1, i) * 8 - 4);
  e.c = q(table, rng_unit(11, 2, i) * 2 - 1);
  e.s = q(table, rng_unit(11, 3, i) * 2 - 1);
  e.partner = q(in, rng_unit(11, 4, i) * 8 - 4);
  if (i % 4 == 0 && e.s != 0) e.partner = q(in, -e.x * e.c / e.s * (1 + (rng_unit(11, 5, i) - 0.5) * 1e-3));
  if (dtype_is_fp8(out)) e.scale = static_cast<float>(0.25 + rng_unit(11, 6, i));
  e.conv = i % 2 ? scale_conv::divide : scale_conv::reciprocal;
  return e;
}

}  // namespace

TEST_CASE("numerics: model names parse back, an unknown name lists the models") {
  for (numerics_model m : all_numerics_models)
    CHECK(parse_numerics_model(numerics_model_name(m), "--numerics") == m);
  try {
    parse_numerics_model("bf16", "--numerics");
    FAIL("no error");
  } catch (const arg_error& e) {
    CHECK(e.arg() == "--numerics");
    CHECK(e.expected() == "one of fp32, operand-products, operand-dtype");
    CHECK(e.got() == "'bf16'");
  }
}

TEST_CASE("numerics: each model's emulation is within its own bound, and bf16 models leave fp32's") {
  const dtype floats[] = {dtype::bf16, dtype::f16, dtype::f32};
  const dtype outs[] = {dtype::bf16, dtype::f16, dtype::f32, dtype::fp8_e4m3fn, dtype::fp8_e5m2fnuz};
  compare_options opt;  // max_ulp 1
  for (dtype in : floats)
    for (dtype table : floats)
      for (dtype out : outs) {
        int64_t outside_fp32[numerics_model_count] = {};
        for (uint64_t i = 0; i < 4000; ++i) {
          const rope_element e = random_element(i, in, table, out);
          const uint32_t ref = rope_model_bits(numerics_model::fp32, e);
          for (numerics_model m : all_numerics_models) {
            const uint32_t got = rope_model_bits(m, e);
            int64_t ulp = 0;
            bool used = false;
            const bool ok = rope_element_passes(out, ref, got, rope_model_allowance(m, e), opt, &ulp, &used);
            if (!ok)
              FAIL(std::string(numerics_model_name(m)) << " outside its bound: in=" << std::string(dtype_name(in))
                   << " table=" << std::string(dtype_name(table)) << " out=" << std::string(dtype_name(out))
                   << " element " << i << " ulp " << ulp);
            if (!rope_element_passes(out, ref, got, rope_model_allowance(numerics_model::fp32, e), opt, &ulp, &used))
              ++outside_fp32[static_cast<int>(m)];
          }
        }
        INFO("in=" << std::string(dtype_name(in)) << " table=" << std::string(dtype_name(table))
             << " out=" << std::string(dtype_name(out)));
        CHECK(outside_fp32[0] == 0);
        // bf16 arithmetic cancels visibly against a 16-bit or wider output
        const bool wide_out = out == dtype::f32 || out == dtype::f16;
        if (in == dtype::bf16 && table == dtype::bf16 && wide_out) {
          CHECK(outside_fp32[static_cast<int>(numerics_model::operand_products)] > 0);
          CHECK(outside_fp32[static_cast<int>(numerics_model::operand_dtype)] > 0);
        }
      }
}

TEST_CASE("numerics: the fp32 model is the reference bit for bit; the sim is within fp32") {
  compare_options opt;
  opt.identify_always = true;
  int rope_regions = 0;
  for (uint64_t i = 0; i < 60; ++i) {
    const problem p = random_problem(20261201, i, 24);
    case_data initial = make_case(p);
    case_data ref = initial.clone();
    make_cpu_backend()->run_host(ref.args, ref.regions());
    case_data sim = initial.clone();
    auto be = make_sim_backend();
    if (!be->unsupported_reason(sim.args).empty()) continue;
    be->run_host(sim.args, sim.regions());
    const case_report self = compare_runs(initial, ref, ref, opt);
    const case_report r = compare_runs(initial, ref, sim, opt);
    REQUIRE(r.outcome != case_outcome::failed);
    for (size_t k = 0; k < r.regions.size(); ++k) {
      const region_report& g = r.regions[k];
      if (g.rule != region_rule::rope || g.compared == 0) continue;
      ++rope_regions;
      REQUIRE(g.numerics.size() == numerics_model_count);
      INFO(p.to_repro() << " " << g.name << ": " << numerics_summary(g));
      CHECK(self.regions[k].numerics[0].differ == 0);  // the emulation is the reference
      CHECK(g.numerics[0].outside == 0);               // the sim is within fp32
      CHECK(numerics_identity(g).rfind(g.numerics[0].differ == 0 ? "exactly fp32" : "within fp32", 0) == 0);
    }
  }
  CHECK(rope_regions > 60);
}

TEST_CASE("numerics: a run of operand-products arithmetic is identified, fails fp32, passes its own model") {
  const problem p = parse_problem("tq=4 ts=4 tk=4 h=8 dn=16 dr=64 p=64 bs=4 nb=2 in=bf16 table_dtype=bf16 "
                                  "qo=f32 cache=bf16 rope_table=random seed=5");
  case_data initial = make_case(p);
  case_data ref = initial.clone();
  make_cpu_backend()->run_host(ref.args, ref.regions());
  // b: the reference's outputs with q_out's rope part recomputed the operand-products way
  case_data b = ref.clone();
  const op_args& a = initial.args;
  for (int64_t t = 0; t < p.tq; ++t)
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t j = 0; j < p.dr; ++j) {
        const rope_element e = rope_element_of(a, q_rope_operands(a, t, h, j), a.q_pe.type, a.q_out.type, 1.0f);
        const uint32_t bits = rope_model_bits(numerics_model::operand_products, e);
        const tensor_view& q = b.args.q_out;
        store_bits(q.type,
                   static_cast<uint8_t*>(q.data) + (t * q.strides_elems[0] + h * q.strides_elems[1] + p.dn + j) * 4,
                   bits);
      }
  compare_options opt;
  const case_report fp32 = compare_runs(initial, ref, b, opt);
  CHECK(fp32.outcome == case_outcome::failed);
  const region_report* q = nullptr;
  for (const region_report& g : fp32.regions)
    if (g.name == "q_out.rope") q = &g;
  REQUIRE(q != nullptr);
  CHECK(q->mismatches > 0);
  REQUIRE(q->numerics.size() == numerics_model_count);  // identified because it failed
  CHECK(q->numerics[static_cast<int>(numerics_model::operand_products)].differ == 0);
  CHECK(q->numerics[static_cast<int>(numerics_model::fp32)].differ > 0);
  CHECK(q->numerics[static_cast<int>(numerics_model::fp32)].outside == q->mismatches);
  CHECK(numerics_summary(*q).rfind("exactly operand-products[bf16]; within operand-products[bf16]", 0) == 0);
  CHECK(numerics_identity(*q) == "exactly operand-products[bf16]");
  CHECK(format_case_report(fp32, false).find("numerics: exactly operand-products[bf16]") != std::string::npos);

  opt.numerics = numerics_model::operand_products;
  CHECK(compare_runs(initial, ref, b, opt).outcome == case_outcome::passed);
  opt.strict = true;  // strict drops the model's allowance too
  CHECK(compare_runs(initial, ref, b, opt).outcome == case_outcome::failed);
}

}  // namespace ropekv
