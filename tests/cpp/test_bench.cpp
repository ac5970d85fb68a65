// The kernel's two bodies, fast_v4 and the general body, and zero-copy concat (through the sim), the byte count of
// `ropekv bench`, and `ropekv bench` itself on the CPU backends.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/hip/variant.h"
#include "backends/sim/sim_backend.h"
#include "core/case_data.h"
#include "core/compare.h"
#include "core/presets.h"
#include "core/problem.h"
#include "tools/bench.h"

namespace {

using namespace ropekv;

// Restores the kernel variant overrides when a test ends (even on failure).
struct override_guard {
  explicit override_guard(const ropekv_gpu::rk_variant_override& v) { ropekv_gpu::rk_variant_overrides() = v; }
  ~override_guard() { ropekv_gpu::rk_variant_overrides() = {}; }
};

struct run_out {
  case_report report;
  std::string variant;
  case_data got;
};

// Reference vs sim on copies of one case (zero-copy concat applied to all three when asked).
run_out ref_vs_sim(const problem& p, bool zero_copy, void (*edit)(case_data&) = nullptr) {
  case_data initial = make_case(p);
  if (edit != nullptr) edit(initial);
  if (zero_copy) apply_zero_copy(initial);
  case_data ref = initial.clone();  // clone() keeps a zero-copy q_nope in q_out
  case_data got = initial.clone();
  auto cpu = make_cpu_backend();
  auto sim = make_sim_backend();
  cpu->run_host(ref.args, ref.regions());
  sim->run_host(got.args, got.regions());
  compare_options opt;
  return {compare_runs(initial, ref, got, opt), sim->last_variant(), std::move(got)};
}

// Byte-for-byte equality of two runs' buffers.
bool same_bytes(case_data& a, case_data& b) {
  for (auto& [name, buf] : a.buffers) {
    host_buffer& other = b.buffers.at(name);
    if (buf.raw_size_bytes() != other.raw_size_bytes()) return false;
    if (std::memcmp(buf.raw(), other.raw(), buf.raw_size_bytes()) != 0) return false;
  }
  return true;
}

const char* fast_cases[] = {
    "tq=3 ts=3 tk=3 h=16 in=bf16 qo=bf16 cache=bf16 nb=1",
    "tq=3 ts=3 tk=3 h=16 in=bf16 qo=bf16 cache=bf16 nb=1 style=neox",
    "tq=4 ts=4 tk=4 h=8 in=f16 qo=f16 cache=fp8_e4m3fn k_scale=0.5 nb=1 table_dtype=f32",
    "tq=4 ts=5 tk=6 h=5 in=bf16 qo=bf16 cache=fp8_e5m2 nb=1 table=two inplace_q=1 style=neox",
    "tq=6 ts=6 tk=6 h=3 in=bf16 qo=bf16 cache=bf16 nb=1 pad_slots=2 pad_q=skipped pos_oob=clamp",
    "tq=2 ts=2 tk=2 h=4 dn=24 dr=16 in=bf16 qo=bf16 cache=bf16 nb=1 q_layout=head_major",
};

}  // namespace

// The override that makes the plan pick `kernel`: fast_v4 where eligible (the default) or the
// general body (fused_v1) for every case.
ropekv_gpu::rk_variant_override kernel_only(const std::string& kernel) {
  ropekv_gpu::rk_variant_override ov;
  if (kernel == "fused_v1") ov.force_general = 1;
  return ov;
}

// The fast_cases on both bodies: fast_v4 takes every case it is eligible for (all but the
// in-place one), the general body every case when forced; both pass against the reference,
// with and without zero-copy concat.
TEST_CASE("fast_v4 and the general body: sim passes against the reference on the fast cases") {
  for (const std::string kernel : {"fast_v4", "fused_v1"}) {
    override_guard g(kernel_only(kernel));
    for (const char* r : fast_cases) {
      const problem p = parse_problem(r);
      // in-place rope is not fast_v4's (launch_plan.h rk_v4_refusal): the general body takes it
      const bool inplace = p.opt.inplace_q || p.opt.inplace_k;
      const std::string want = inplace ? "fused_v1" : kernel;
      for (bool zc : {false, true}) {
        const run_out o = ref_vs_sim(p, zc);
        INFO(kernel, " ", r, " zero_copy=", zc);
        INFO(format_case_report(o.report, true));
        CHECK(o.report.outcome == case_outcome::passed);
        CHECK(o.variant.rfind(want, 0) == 0);
        CHECK((o.variant.find("+zero_copy") != std::string::npos) == zc);
      }
    }
  }
}

// The general body's heads per block (the `hpb=N` variant) changes no byte: every split of 13
// heads writes what the default plan (fast_v4) writes.
TEST_CASE("general body: heads-per-block overrides keep the bytes") {
  const problem p = parse_problem("tq=3 ts=3 tk=3 h=13 in=bf16 qo=bf16 cache=bf16 nb=1");
  case_data initial = make_case(p);
  case_data want = initial.clone();
  auto sim = make_sim_backend();
  sim->run_host(want.args, want.regions());
  CHECK(sim->last_variant().rfind("fast_v4", 0) == 0);
  for (int64_t hpb : {1, 2, 5, 13, 20}) {
    ropekv_gpu::rk_variant_override ov = kernel_only("fused_v1");
    ov.heads_per_block = hpb;
    override_guard g(ov);
    case_data got = initial.clone();
    sim->run_host(got.args, got.regions());
    INFO("hpb=", hpb, " ", sim->last_variant());
    CHECK(sim->last_variant().rfind("fused_v1(vec8,hpb" + std::to_string(hpb < 13 ? hpb : 13) + ",", 0) == 0);
    CHECK(same_bytes(want, got));
  }
}

TEST_CASE("fast_v4 and the general body: NaN payloads in q_nope become the canonical NaN like the reference") {
  const problem p = parse_problem("tq=2 ts=2 tk=2 h=4 in=bf16 qo=bf16 cache=bf16 nb=1");
  auto plant = [](case_data& c) {
    uint16_t* q = static_cast<uint16_t*>(c.args.q_nope.data);
    q[0] = 0x7f81;  // signalling-style payload
    q[9] = 0xffd3;  // negative NaN with payload
    q[17] = 0x7f80; // +inf stays
  };
  for (const char* want_variant : {"fast_v4", "fused_v1"}) {
    override_guard g(kernel_only(want_variant));
    const run_out o = ref_vs_sim(p, false, plant);
    INFO(want_variant, " ", format_case_report(o.report, true));
    CHECK(o.report.outcome == case_outcome::passed);
    CHECK(o.variant.rfind(want_variant, 0) == 0);
    const uint16_t* out = static_cast<const uint16_t*>(o.got.args.q_out.data);
    CHECK(out[0] == 0x7fc0);
    CHECK(out[9] == 0xffc0);
    CHECK(out[17] == 0x7f80);
  }
}

// fast_v4: the cases its plan accepts.
const char* v4_cases[] = {
    "tq=3 ts=3 tk=3 h=16 in=bf16 qo=bf16 cache=bf16 nb=1",
    "tq=3 ts=3 tk=3 h=16 in=bf16 qo=bf16 cache=bf16 nb=1 style=neox",
    "tq=4 ts=4 tk=4 h=8 in=f16 qo=f16 cache=fp8_e4m3fn k_scale=0.5 nb=1 table_dtype=f32",
    "tq=4 ts=4 tk=4 h=8 in=f16 qo=f16 cache=f16 nb=2 bs=4 style=neox table=two",
    "tq=4 ts=5 tk=6 h=5 in=bf16 qo=bf16 cache=fp8_e5m2 nb=1 table=two style=neox scale_conv=reciprocal k_scale=3",
    "tq=5 ts=5 tk=5 h=3 in=bf16 qo=bf16 cache=fp8_e4m3fnuz k_scale=0.25 nb=2 bs=3 layout=split table_dtype=f16",
    "tq=5 ts=5 tk=5 h=3 in=bf16 qo=bf16 cache=bf16 nb=2 bs=3 order=rope_first entry_pad=8 block_pad=16",
    "tq=6 ts=6 tk=6 h=3 in=bf16 qo=bf16 cache=bf16 nb=1 pad_slots=2 pad_q=skipped pos_oob=clamp",
    "tq=6 ts=6 tk=6 h=3 in=bf16 qo=bf16 cache=fp8_e5m2fnuz nb=1 pad_slots=2 pad_q=computed style=neox",
    "tq=2 ts=4 tk=5 h=4 dn=24 dr=16 in=bf16 qo=bf16 cache=bf16 nb=1 q_layout=head_major kv_layout=fused",
    "tq=2 ts=2 tk=2 h=200 dn=8 dr=32 in=bf16 qo=bf16 cache=bf16 nb=1 style=neox",
    // divide mode with a scale that is not a power of two (an IEEE division per element) and
    // with 2^-3 (an exact multiply by 8, rk_params::k_mul)
    "tq=3 ts=4 tk=4 h=6 in=bf16 qo=bf16 cache=fp8_e4m3fn k_scale=0.37 nb=1 amp=300",
    "tq=3 ts=4 tk=4 h=6 in=f16 qo=f16 cache=fp8_e5m2 k_scale=0.125 nb=1 amp=3000",
};

TEST_CASE("fast_v4: sim passes against the reference; bytes identical to the general path") {
  {
    const std::string kernel = "fast_v4";
    for (const char* r : v4_cases) {
      const problem p = parse_problem(r);
      for (bool zc : {false, true}) {
        override_guard g(kernel_only(kernel));
        const run_out o = ref_vs_sim(p, zc);
        INFO(kernel, " ", r, " zero_copy=", zc);
        INFO(format_case_report(o.report, true));
        CHECK(o.report.outcome == case_outcome::passed);
        CHECK(o.variant.rfind(kernel, 0) == 0);
        CHECK((o.variant.find("+zero_copy") != std::string::npos) == zc);
      }
      case_data initial = make_case(p);
      case_data fast = initial.clone();
      case_data general = initial.clone();
      auto sim = make_sim_backend();
      {
        override_guard g(kernel_only(kernel));
        sim->run_host(fast.args, fast.regions());
        CHECK(sim->last_variant().rfind(kernel, 0) == 0);
      }
      {
        ropekv_gpu::rk_variant_override ov;
        ov.force_general = 1;
        override_guard g(ov);
        sim->run_host(general.args, general.regions());
        CHECK(sim->last_variant().rfind("fused_v1", 0) == 0);
      }
      INFO(kernel, " ", r);
      CHECK(same_bytes(fast, general));
    }
  }
}

// fast_v4's launch shape knobs (groups per block, groups per cache entry) change no byte, with
// and without zero-copy (which packs several q rows into one 32-thread group).
TEST_CASE("fast_v4: groups per block and per cache entry keep the bytes") {
  for (const char* r : {v4_cases[2], v4_cases[5], v4_cases[7], v4_cases[8], v4_cases[9], v4_cases[10],
                        "tq=3 ts=5 tk=5 h=7 dn=1048 dr=48 in=bf16 qo=bf16 cache=fp8_e4m3fn nb=2 bs=4 pad_slots=1"}) {
    const problem p = parse_problem(r);
    for (bool zc : {false, true}) {
      case_data initial = make_case(p);
      if (zc) {  // the zero-copy form, as ref_vs_sim builds it
        const run_out o = ref_vs_sim(p, true);
        CHECK(o.report.outcome == case_outcome::passed);
      }
      case_data want = initial.clone();
      auto sim = make_sim_backend();
      {
        ropekv_gpu::rk_variant_override ov;
        ov.force_general = 1;
        override_guard g(ov);
        sim->run_host(want.args, want.regions());
      }
      for (int64_t gpb : {1, 3, 8}) {
        for (int64_t kvs : {1, 2, 4}) {
          for (int32_t qp : {0, 1}) {  // one or two q rows per group
            ropekv_gpu::rk_variant_override ov;
            ov.v4_groups_per_block = gpb;
            ov.v4_kv_split = kvs;
            ov.v4_kv_rope_group = static_cast<int32_t>((gpb + kvs) & 1);
            ov.v4_q_pairs = qp;
            override_guard g(ov);
            case_data got = initial.clone();
            sim->run_host(got.args, got.regions());
            INFO(r, " gpb=", gpb, " kvs=", kvs, " kvr=", ov.v4_kv_rope_group, " qp=", qp, " ", sim->last_variant());
            CHECK(sim->last_variant().rfind("fast_v4", 0) == 0);
            // pairs: copy mode (these runs copy q_nope), at least two heads, 2 rope units <= 32
            const bool pairs = qp == 1 && p.heads >= 2 && 2 * (p.dr / (p.opt.style == rope_style::neox ? 16 : 8)) <= 32;
            CHECK((sim->last_variant().find("+qp") != std::string::npos) == pairs);
            CHECK(same_bytes(want, got));
          }
        }
      }
    }
  }
}

// Zero-copy on fast_v4 with several q rows per lane (rk_v4_q_rope_rows): every row count, with
// heads that do not fill the last group, padding skipped or computed, clamped positions and the
// decode outputs, equals the reference; the variant names the row count.
TEST_CASE("fast_v4 zero-copy: q rows per lane 1..4 against the reference") {
  const char* cases[] = {
      "tq=3 ts=3 tk=3 h=16 in=bf16 qo=bf16 cache=bf16 nb=1",
      "tq=3 ts=4 tk=4 h=7 in=bf16 qo=bf16 cache=fp8_e4m3fn k_scale=0.5 nb=1 style=neox table_dtype=f32",
      "tq=6 ts=6 tk=6 h=37 in=f16 qo=f16 cache=f16 nb=1 pad_slots=2 pad_q=skipped pos_oob=clamp",
      "tq=5 ts=5 tk=5 h=21 in=bf16 qo=bf16 cache=bf16 nb=1 pad_slots=1 pad_q=computed dec=3 dec_out=qzk",
      "tq=2 ts=2 tk=2 h=200 dn=8 dr=32 in=bf16 qo=bf16 cache=bf16 nb=1 style=neox",
  };
  for (const char* r : cases) {
    const problem p = parse_problem(r);
    for (int32_t rows : {1, 2, 3, 4}) {
      for (int64_t gpb : {1, 8}) {
        ropekv_gpu::rk_variant_override ov;
        ov.v4_zc_rows = rows;
        ov.v4_groups_per_block = gpb;
        override_guard g(ov);
        const run_out o = ref_vs_sim(p, true);
        INFO(r, " zcr=", rows, " gpb=", gpb, " ", o.variant);
        INFO(format_case_report(o.report, true));
        CHECK(o.report.outcome == case_outcome::passed);
        CHECK(o.variant.rfind("fast_v4", 0) == 0);
        const std::string named = rows > 1 ? "+zero_copy(rows" + std::to_string(rows) + ")" : "+zero_copy";
        CHECK(o.variant.find(named) != std::string::npos);
      }
    }
  }
}

// Compile-time specialisation (launch_plan.h rk_v4_visit): the instantiation the plan names in
// the variant, and bytes identical to the generic instantiation (dtypes read at run time).
TEST_CASE("fast_v4: specialised instantiations name themselves and match the generic one bit for bit") {
  {
  const std::string kernel = "fast_v4";
  const std::vector<std::pair<const char*, const char*>> want = {
      {v4_cases[0], "bf16/bf16/gptj/bf16"},
      {v4_cases[1], "bf16/bf16/neox/bf16"},
      {v4_cases[2], "f16/e4m3fn/gptj/f32"},
      {v4_cases[4], "bf16/e5m2/neox/bf16"},
      {v4_cases[5], "generic"},  // f16 table with bf16 q: not instantiated
      {v4_cases[8], "bf16/e5m2fnuz/neox/bf16"},
  };
  for (const auto& [r, name] : want) {
    const problem p = parse_problem(r);
    case_data initial = make_case(p);
    case_data spec = initial.clone();
    case_data generic = initial.clone();
    auto sim = make_sim_backend();
    {
      override_guard g(kernel_only(kernel));
      sim->run_host(spec.args, spec.regions());
    }
    INFO(kernel, " ", r, " -> ", sim->last_variant());
    CHECK(sim->last_variant().rfind(kernel, 0) == 0);
    CHECK(sim->last_variant().find(std::string(",") + name + ")") != std::string::npos);
    {
      ropekv_gpu::rk_variant_override ov = kernel_only(kernel);
      ov.v4_generic = 1;
      override_guard g(ov);
      sim->run_host(generic.args, generic.regions());
      CHECK(sim->last_variant().rfind(kernel, 0) == 0);
      CHECK(sim->last_variant().find(",generic)") != std::string::npos);
    }
    CHECK(same_bytes(spec, generic));
    CHECK(!same_bytes(spec, initial));  // the op wrote something
  }
  }
}

// Beyond grid.y's limit (65535): fast_v4 (a 1-D grid of groups) and the general body (grid.x =
// tokens) cover every token.
TEST_CASE("fast_v4 and the general body: more than 65535 tokens are all written") {
  const problem p = parse_problem("tq=65600 ts=65600 tk=65600 h=1 dn=8 dr=8 p=64 in=bf16 qo=bf16 cache=bf16 bs=64 nb=1025");
  for (const std::string kernel : {"fast_v4", "fused_v1"}) {
    override_guard g(kernel_only(kernel));
    const run_out o = ref_vs_sim(p, false);
    INFO(kernel, " ", format_case_report(o.report, true));
    CHECK(o.report.outcome == case_outcome::passed);
    CHECK(o.variant.rfind(kernel, 0) == 0);
  }
}

TEST_CASE("fast_v4 refused (the general body instead) for more than 32 rope units per row") {
  for (const char* r : {"tq=2 ts=2 tk=2 h=3 dn=16 dr=264 in=bf16 qo=bf16 cache=bf16 nb=1",
                        "tq=2 ts=2 tk=2 h=3 dn=16 dr=528 in=bf16 qo=bf16 cache=bf16 nb=1 style=neox"}) {
    const run_out o = ref_vs_sim(parse_problem(r), false);
    INFO(r, " ", o.variant);
    CHECK(o.report.outcome == case_outcome::passed);
    CHECK(o.variant.rfind("fused_v1", 0) == 0);
  }
}

TEST_CASE("fast_v4 refused (the general body instead) for in-place rope, misaligned cache, odd neox Dr") {
  for (const char* r : {"tq=2 ts=2 tk=2 h=4 in=bf16 qo=bf16 cache=bf16 nb=1 inplace_k=1",
                        "tq=2 ts=2 tk=2 h=4 in=bf16 qo=bf16 cache=bf16 nb=1 entry_pad=1",
                        "tq=2 ts=2 tk=2 h=4 dr=8 in=bf16 qo=bf16 cache=bf16 nb=1 style=neox",
                        "tq=2 ts=2 tk=2 h=4 in=bf16 qo=bf16 cache=f16 nb=1",
                        "tq=2 ts=2 tk=2 h=4 in=bf16 qo=fp8_e4m3fn cache=bf16 nb=1"}) {
    const run_out o = ref_vs_sim(parse_problem(r), false);
    INFO(r, " ", o.variant);
    CHECK(o.report.outcome == case_outcome::passed);
    CHECK(o.variant.rfind("fused_v1", 0) == 0);
  }
}

TEST_CASE("fast_v4 refused (the general body instead) on misaligned rows and mixed dtypes") {
  for (const char* r : {"tq=2 ts=2 tk=2 h=4 in=bf16 qo=bf16 cache=bf16 nb=1 row_pad=1",
                        "tq=2 ts=2 tk=2 h=4 in=bf16 qo=f32 cache=bf16 nb=1",
                        "tq=2 ts=2 tk=2 h=4 dn=20 in=bf16 qo=bf16 cache=bf16 nb=1",
                        "tq=2 ts=2 tk=2 h=4 in=f32 qo=f32 cache=bf16 nb=1"}) {
    const run_out o = ref_vs_sim(parse_problem(r), false);
    INFO(r, " ", o.variant);
    CHECK(o.report.outcome == case_outcome::passed);
    CHECK(o.variant.rfind("fused_v1", 0) == 0);
  }
}

TEST_CASE("bench byte count: deepseek-v3, 1 token, bf16 (exact) and zero-copy") {
  case_data c = make_case(preset_problem("deepseek-v3", 1));
  const bench_bytes b = count_bytes(c.args);
  // q_nope 128*512*2 + q_pe 128*64*2 + kv_c 512*2 + k_pe 64*2 + pos 8 + slot 8 + table row 64*2
  CHECK(b.read == 131072 + 16384 + 1024 + 128 + 8 + 8 + 128);
  // q_out 128*576*2 + cache entry 576*2
  CHECK(b.written == 147456 + 1152);
  apply_zero_copy(c);
  const bench_bytes z = count_bytes(c.args);
  CHECK(z.read == b.read - 131072);
  CHECK(z.written == b.written - 131072);
}

TEST_CASE("bench byte count: padding, fp8 cache, distinct positions") {
  problem p = parse_problem("tq=4 ts=6 tk=6 h=2 in=bf16 qo=bf16 cache=fp8_e4m3fn nb=1 pad_slots=2 pad_q=skipped positions=same");
  case_data c = make_case(p);
  const bench_bytes b = count_bytes(c.args);
  // 4 used tokens (2 padded, q skipped); with pad at the tail both padded tokens are t = 4, 5
  // (q rows only t < 4 exist): q rows 4, k rows 4, one distinct position
  const int64_t q_rows = 4, k_rows = 4;
  CHECK(b.read == 6 * 8 + 4 * 8 + 1 * 64 * 2 + q_rows * 2 * 576 * 2 + k_rows * 576 * 2);
  CHECK(b.written == q_rows * 2 * 576 * 2 + k_rows * 576 * 1);
}

TEST_CASE("bench --layout fp8_ds_mla: one u8-cache case per preset, 656 bytes written per entry") {
  bench_opts o;
  o.backend = "sim";
  o.cases = {"deepseek-v3:2"};
  o.caches = "bf16,fp8_e4m3fn";  // the layout fixes its cache: one case, not two
  o.layouts = "fp8_ds_mla";
  o.variants = "auto";
  o.budget_s = 0.01;
  o.copy_mb = 8;
  std::ostringstream out, err;
  REQUIRE(run_bench(o, out, err) == 0);
  INFO(out.str());
  CHECK(out.str().find("deepseek-v3:2 cache=u8 layout=fp8_ds_mla") != std::string::npos);
  CHECK(out.str().find("cache=bf16") == std::string::npos);
  CHECK(out.str().find("+ds_mla") != std::string::npos);
  problem p = preset_problem("deepseek-v3", 1);
  p.opt.layout = cache_layout::fp8_ds_mla;
  p.cache_dtype = dtype::u8;
  case_data c = make_case(p);
  // q_out 128*576*2 + one 656-byte entry (512 e4m3fn, 4 f32 scales, 64 bf16 rope values)
  CHECK(count_bytes(c.args).written == 147456 + 656);
}

TEST_CASE("ropekv bench on sim and ref: table and JSON") {
  const std::string json = (std::filesystem::temp_directory_path() / "ropekv_test_bench.json").string();
  for (const char* be : {"sim", "ref"}) {
    bench_opts o;
    o.backend = be;
    o.cases = {"deepseek-v3:2"};
    o.caches = "bf16";
    o.variants = "auto";
    o.budget_s = 0.01;
    o.copy_mb = 8;
    o.json = json;
    o.force = true;  // the second backend's run replaces the first one's file
    std::ostringstream out, err;
    REQUIRE(run_bench(o, out, err) == 0);
    INFO(out.str());
    CHECK(out.str().find("deepseek-v3:2 cache=bf16") != std::string::npos);
    std::ifstream f(json);
    const nlohmann::json j = nlohmann::json::parse(f);
    CHECK(j["backend"] == be);
    REQUIRE(j["results"].size() == 2);  // copy and zero_copy
    CHECK(j["results"][0]["mode"] == "copy");
    CHECK(j["results"][1]["mode"] == "zero_copy");
    CHECK(j["results"][0]["us_median"].get<double>() > 0);
    CHECK(j["results"][1]["bytes_total"].get<int64_t>() < j["results"][0]["bytes_total"].get<int64_t>());
    CHECK(j["copy"]["gbps_read_plus_write"].get<double>() > 0);
    if (std::string(be) == "sim") CHECK(j["results"][1]["variant"].get<std::string>().find("zero_copy") != std::string::npos);
    CHECK(j["results"][0]["verified"] == "not run");
  }
  std::filesystem::remove(json);
}

// --verify: every (case, mode, variant) run once against the reference before it is timed; the
// rows say so, the closing line counts them. Zero-copy with 1 and 4 q rows per lane, sim.
TEST_CASE("ropekv bench --verify: each row checked against the reference") {
  const std::string json = (std::filesystem::temp_directory_path() / "ropekv_test_bench_verify.json").string();
  bench_opts o;
  o.backend = "sim";
  o.cases = {"deepseek-v3:3"};
  o.repros = {"tq=5 ts=6 tk=6 h=24 in=bf16 qo=bf16 cache=fp8_e4m3fn k_scale=0.5 nb=1 style=neox pad_slots=2 pad_q=skipped"};
  o.caches = "bf16";
  o.variants = "auto,zcr=4";
  o.budget_s = 0;
  o.copy_mb = 1;
  o.json = json;
  o.force = true;
  o.verify = true;
  std::ostringstream out, err;
  REQUIRE(run_bench(o, out, err) == 0);
  INFO(out.str());
  CHECK(out.str().find("verification against the reference: 8 passed, 0 failed") != std::string::npos);
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  REQUIRE(j["results"].size() == 8);  // 2 cases x 2 modes x 2 variants
  for (const nlohmann::json& r : j["results"]) CHECK(r["verified"] == "passed");
  CHECK(j["results"][3]["variant"].get<std::string>().find("+zero_copy(rows4)") != std::string::npos);
  std::filesystem::remove(json);
}

TEST_CASE("ropekv bench: bad options are errors naming the option") {
  bench_opts o;
  o.backend = "sim";
  o.variants = "hpb=0";
  std::ostringstream out, err;
  CHECK_THROWS_WITH_AS(run_bench(o, out, err), doctest::Contains("--variant"), arg_error);
  // the retired kernels' requests (fast_v2, fast_v3 and their knobs) are errors listing the
  // requests there are
  for (const char* gone : {"v2", "v3", "v3generic", "upt=2", "bt=64", "auto,v3", "gpb=2+bt=64"}) {
    INFO(gone);
    o.variants = gone;
    CHECK_THROWS_WITH_AS(run_bench(o, out, err), doctest::Contains("--variant"), arg_error);
    const std::string one = std::string(gone).substr(std::string(gone).find(',') + 1);
    set_kernel_variant("hpb=3");
    try {
      set_kernel_variant(one);
      CHECK(false);
    } catch (const arg_error& e) {
      CHECK(e.arg() == "--variant");
      CHECK(e.expected().find("v4generic") != std::string::npos);
      CHECK(e.expected().find("v3") == std::string::npos);
      CHECK(e.expected().find("upt") == std::string::npos);
    }
    CHECK(ropekv_gpu::rk_variant_overrides().heads_per_block == 3);  // left as it was
  }
  for (const char* kept : {"auto", "v4", "v4generic", "general", "hpb=2", "gpb=8+kvs=2+qp=1", "nozc+nopdl"})
    CHECK_NOTHROW(set_kernel_variant(kept));
  ropekv_gpu::rk_variant_overrides() = {};
  o.variants = "auto";
  o.modes = "sideways";
  CHECK_THROWS_WITH_AS(run_bench(o, out, err), doctest::Contains("--mode"), arg_error);
  o.modes = "copy";
  o.cases = {"deepseek-v3"};
  CHECK_THROWS_WITH_AS(run_bench(o, out, err), doctest::Contains("--case"), arg_error);
}

// --repro without --case: only the repros, named repro1, repro2, ... in the order given.
TEST_CASE("ropekv bench --repro alone times only the repros, each row named by its place") {
  const std::string json = (std::filesystem::temp_directory_path() / "ropekv_test_bench_repros.json").string();
  bench_opts o;
  o.backend = "sim";
  o.repros = {"tq=2 ts=2 tk=2 h=4 dn=16 dr=8 p=16 bs=4 nb=1 pad_q=skipped",
              "tq=3 ts=3 tk=3 h=4 dn=16 dr=8 p=16 bs=4 nb=1 pad_q=computed"};
  o.modes = "copy";
  o.budget_s = 0;
  o.copy_mb = 1;
  o.json = json;
  o.force = true;
  std::ostringstream out, err;
  REQUIRE(run_bench(o, out, err) == 0);
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  REQUIRE(j["results"].size() == 2);
  CHECK(j["results"][0]["case"] == "repro1");
  CHECK(j["results"][1]["case"] == "repro2");
  CHECK(j["results"][1]["repro"].get<std::string>().find("pad_q=computed") != std::string::npos);
  std::filesystem::remove(json);
}
