// The reference (backends/cpu) on hand-computed cases: every option of core/SPEC.md pinned with
// numbers written here (f32 everywhere, so every value is exact).
#include <doctest/doctest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <omp.h>

#include "backends/cpu/cpu_backend.h"
#include "core/cache_map.h"
#include "core/case_data.h"
#include "core/problem.h"
#include "core/convert.h"
#include "tests/cpp/hand_case.h"

using namespace ropekv;
using ropekv::test::hand_case;

namespace {

std::vector<float> q_out_row(const hand_case& c, int64_t t, int64_t h) {
  std::vector<float> r;
  for (int64_t f = 0; f < c.width(); ++f) r.push_back(c.q_out_at(t, h, f));
  return r;
}
std::vector<float> cache_row(const hand_case& c, int64_t slot) {
  std::vector<float> r;
  for (int64_t f = 0; f < c.width(); ++f) r.push_back(c.cache_at(slot, f));
  return r;
}
std::vector<uint32_t> cache_row_bits(const hand_case& c, int64_t slot) {
  std::vector<uint32_t> r;
  for (int64_t f = 0; f < c.width(); ++f) r.push_back(c.cache_bits(slot, f));
  return r;
}
std::vector<uint32_t> q_out_row_bits(const hand_case& c, int64_t t, int64_t h) {
  std::vector<uint32_t> r;
  for (int64_t f = 0; f < c.width(); ++f) r.push_back(c.q_out_bits(t, h, f));
  return r;
}

// One token, one head, Dn = 2, Dr = 4, position 3 whose row is cos [0.5, 2], sin [0.25, 1];
// q_pe = [1, 2, 3, 4], k_pe = [4, 0, 0, -2], q_nope = [100, 101], kv_c = [300, 301], slot 2
// (block 1, entry 0 of a 2 x 2 cache).
hand_case one_token_case() {
  hand_case c;
  c.init();
  c.set_table_row(3, {0.5f, 2.0f}, {0.25f, 1.0f});
  c.positions = {3};
  c.slots = {2};
  c.q_pe = {1, 2, 3, 4};
  c.k_pe = {4, 0, 0, -2};
  return c;
}

// Sets every table row to a 90 degree rotation (cos 0, sin 1): a' = -b, b' = a.
void rotate_90_everywhere(hand_case& c) {
  for (int64_t p = 0; p < c.rows; ++p) {
    c.set_table_row(p, std::vector<float>(static_cast<size_t>(c.dr / 2), 0.0f),
                    std::vector<float>(static_cast<size_t>(c.dr / 2), 1.0f));
  }
}

// reference_run with `threads` OpenMP threads, the process setting restored after.
void reference_run_on_threads(const op_args& a, int threads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  reference_run(a);
  omp_set_num_threads(saved);
}

}  // namespace

TEST_CASE("reference: gptj pairs (2i, 2i+1), joint nope_first") {
  hand_case c = one_token_case();
  reference_run(c.args());
  // pair (0,1) with C=0.5 S=0.25: 1*0.5 - 2*0.25 = 0, 2*0.5 + 1*0.25 = 1.25
  // pair (2,3) with C=2 S=1:     3*2 - 4*1 = 2,     4*2 + 3*1 = 11
  CHECK(q_out_row(c, 0, 0) == std::vector<float>{100, 101, 0, 1.25f, 2, 11});
  // k: (4,0): 4*0.5 - 0 = 2, 0 + 4*0.25 = 1; (0,-2): 0*2 + 2*1 = 2, -2*2 + 0 = -4
  CHECK(cache_row(c, 2) == std::vector<float>{300, 301, 2, 1, 2, -4});
  CHECK(c.cache_bytes_changed_outside({2}) == 0);
}

TEST_CASE("reference: neox pairs (i, i+Dr/2)") {
  hand_case c = one_token_case();
  c.opt.style = rope_style::neox;
  reference_run(c.args());
  // pair (0,2) with C=0.5 S=0.25: 1*0.5 - 3*0.25 = -0.25, 3*0.5 + 1*0.25 = 1.75
  // pair (1,3) with C=2 S=1:     2*2 - 4*1 = 0,          4*2 + 2*1 = 10
  CHECK(q_out_row(c, 0, 0) == std::vector<float>{100, 101, -0.25f, 0, 1.75f, 10});
  // k: (4,0): 2, 1 -> positions 0 and 2; (0,-2): 0*2 + 2*1 = 2, -2*2 + 0 = -4 -> positions 1, 3
  CHECK(cache_row(c, 2) == std::vector<float>{300, 301, 2, 2, 1, -4});
  CHECK(c.cache_bytes_changed_outside({2}) == 0);
}

TEST_CASE("reference: table two (cos and sin with padded row stride) equals table one") {
  hand_case c = one_token_case();
  c.table_two = true;  // the padding column of each row holds NaN: reading it would show
  const op_args a = c.args();
  REQUIRE(a.table() == table_kind::two);
  reference_run(a);
  CHECK(q_out_row(c, 0, 0) == std::vector<float>{100, 101, 0, 1.25f, 2, 11});
  CHECK(cache_row(c, 2) == std::vector<float>{300, 301, 2, 1, 2, -4});
}

TEST_CASE("reference: joint rope_first row order, padded entries and blocks") {
  hand_case c = one_token_case();
  c.entry_pad = 3;
  c.block_pad = 5;
  c.init();  // resize with padding, then the same data as one_token_case
  c.set_table_row(3, {0.5f, 2.0f}, {0.25f, 1.0f});
  c.positions = {3};
  c.slots = {2};
  c.q_pe = {1, 2, 3, 4};
  c.k_pe = {4, 0, 0, -2};
  c.opt.order = row_order::rope_first;
  reference_run(c.args());
  CHECK(cache_row(c, 2) == std::vector<float>{2, 1, 2, -4, 300, 301});
  CHECK(c.cache_bytes_changed_outside({2}) == 0);  // padding of entries and blocks untouched
  CHECK(q_out_row(c, 0, 0) == std::vector<float>{100, 101, 0, 1.25f, 2, 11});
}

TEST_CASE("reference: split layout writes ckv_cache and kpe_cache") {
  hand_case c = one_token_case();
  c.entry_pad = 1;
  c.block_pad = 2;
  c.init();
  c.set_table_row(3, {0.5f, 2.0f}, {0.25f, 1.0f});
  c.positions = {3};
  c.slots = {2};
  c.q_pe = {1, 2, 3, 4};
  c.k_pe = {4, 0, 0, -2};
  c.opt.layout = cache_layout::split;
  reference_run(c.args());
  CHECK(c.ckv_at(2, 0) == 300);
  CHECK(c.ckv_at(2, 1) == 301);
  CHECK(std::vector<float>{c.kpe_at(2, 0), c.kpe_at(2, 1), c.kpe_at(2, 2), c.kpe_at(2, 3)} ==
        std::vector<float>{2, 1, 2, -4});
  // exactly the written elements changed (2 nope + 4 rope floats)
  CHECK(count_not_poison(c.ckv.data(), c.ckv.size()) == 2 * sizeof(float));
  CHECK(count_not_poison(c.kpe.data(), c.kpe.size()) == 4 * sizeof(float));
  CHECK(count_not_poison(c.cache.data(), c.cache.size()) == 0);
}

TEST_CASE("reference: paged_cache_map offsets") {
  hand_case c = one_token_case();
  c.entry_pad = 3;
  c.block_pad = 5;
  c.init();
  paged_cache_map m = paged_cache_map::from_args(c.args());
  // entry stride 9, block stride 2 * 9 + 5 = 23; slot 3 = block 1, entry 1
  CHECK(m.capacity_slots() == 4);
  CHECK(m.nope_offset_elems(3, 0, 1) == 23 + 9 + 1);
  CHECK(m.rope_offset_elems(3, 0, 0) == 23 + 9 + 2);
  c.opt.order = row_order::rope_first;
  m = paged_cache_map::from_args(c.args());
  CHECK(m.rope_offset_elems(3, 0, 0) == 23 + 9);
  CHECK(m.nope_offset_elems(3, 0, 0) == 23 + 9 + 4);
  c.opt.layout = cache_layout::split;
  m = paged_cache_map::from_args(c.args());
  // ckv entry stride 2 + 3, block 2 * 5 + 5; kpe entry 4 + 3, block 2 * 7 + 5
  CHECK(m.nope_offset_elems(3, 0, 1) == 15 + 5 + 1);
  CHECK(m.rope_offset_elems(3, 0, 2) == 19 + 7 + 2);
  CHECK(m.nope_tensor() == paged_cache_map::part_tensor::ckv_cache);
  CHECK(m.rope_tensor() == paged_cache_map::part_tensor::kpe_cache);
}

// Tq = 2, Ts = 3, Tk = 4, H = 2. slots [3, -1, 0]; token 3 is past Ts (position 99, never read).
// Table row 1 rotates by 90 degrees (a' = -b, b' = a); the other rows are the identity.
hand_case padded_case(pad_q padding) {
  hand_case c;
  c.tq = 2; c.ts = 3; c.tk = 4; c.heads = 2;
  c.init();
  c.set_table_row(1, {0, 0}, {1, 1});
  c.slots = {3, -1, 0};
  c.positions = {1, 1, 2, 99};
  c.opt.padding = padding;
  return c;
}

TEST_CASE("reference: slot -1 writes no cache byte; pad_q computed writes its q row") {
  hand_case c = padded_case(pad_q::computed);
  c.opt.inplace_k = true;
  const std::vector<float> k_pe_before = c.k_pe;
  reference_run(c.args());
  // token 0 (slot 3): q_pe [200..203] -> [-201, 200, -203, 202]; head 1 [204..207]
  CHECK(q_out_row(c, 0, 0) == std::vector<float>{100, 101, -201, 200, -203, 202});
  CHECK(q_out_row(c, 0, 1) == std::vector<float>{102, 103, -205, 204, -207, 206});
  // token 1 (slot -1): q still computed
  CHECK(q_out_row(c, 1, 0) == std::vector<float>{104, 105, -209, 208, -211, 210});
  CHECK(q_out_row(c, 1, 1) == std::vector<float>{106, 107, -213, 212, -215, 214});
  // cache: token 0 into slot 3 (rotated), token 2 (t >= Tq, identity row 2) into slot 0
  CHECK(cache_row(c, 3) == std::vector<float>{300, 301, -401, 400, -403, 402});
  CHECK(cache_row(c, 0) == std::vector<float>{304, 305, 408, 409, 410, 411});
  CHECK(c.cache_bytes_changed_outside({0, 3}) == 0);
  // in-place k: only tokens whose slot >= 0 and t < Ts
  CHECK(std::vector<float>(c.k_pe.begin(), c.k_pe.begin() + 4) == std::vector<float>{-401, 400, -403, 402});
  CHECK(std::vector<float>(c.k_pe.begin() + 4, c.k_pe.end()) ==
        std::vector<float>(k_pe_before.begin() + 4, k_pe_before.end()));
}

TEST_CASE("reference: pad_q skipped leaves the padding token's q row and never reads its position") {
  hand_case c = padded_case(pad_q::skipped);
  c.positions[1] = 99;  // out of range, but the token is unused
  reference_run(c.args());
  CHECK(q_out_row(c, 0, 0) == std::vector<float>{100, 101, -201, 200, -203, 202});
  CHECK(c.q_row_poisoned(1, 0));
  CHECK(c.q_row_poisoned(1, 1));
  CHECK(cache_row(c, 3) == std::vector<float>{300, 301, -401, 400, -403, 402});
  CHECK(cache_row(c, 0) == std::vector<float>{304, 305, 408, 409, 410, 411});
  CHECK(c.cache_bytes_changed_outside({0, 3}) == 0);
}

TEST_CASE("reference: pos_oob clamp uses rows 0 and P-1; error names the token") {
  hand_case c;
  c.tq = 2; c.ts = 2; c.tk = 2; c.rows = 2;
  c.init();
  c.set_table_row(1, {0, 0}, {1, 1});  // row 1 rotates, row 0 is the identity
  c.positions = {7, -3};
  SUBCASE("clamp") {
    c.opt.positions = pos_oob::clamp;
    reference_run(c.args());
    CHECK(q_out_row(c, 0, 0) == std::vector<float>{100, 101, -201, 200, -203, 202});  // row 1
    CHECK(q_out_row(c, 1, 0) == std::vector<float>{102, 103, 204, 205, 206, 207});    // row 0
  }
  SUBCASE("error") {
    try {
      reference_run(c.args());
      FAIL("no error");
    } catch (const arg_error& e) {
      CHECK(e.arg() == "positions[0]");
      CHECK(e.expected() == "[0, 2)");
      CHECK(e.got() == "7");
    }
    CHECK(c.outputs_not_poison() == 0);
  }
}

TEST_CASE("reference: inplace_q and inplace_k write rope back; q_out uses the original q_pe") {
  hand_case c = one_token_case();
  c.opt.inplace_q = true;
  c.opt.inplace_k = true;
  reference_run(c.args());
  CHECK(q_out_row(c, 0, 0) == std::vector<float>{100, 101, 0, 1.25f, 2, 11});
  CHECK(c.q_pe == std::vector<float>{0, 1.25f, 2, 11});
  CHECK(c.k_pe == std::vector<float>{2, 1, 2, -4});
  CHECK(cache_row(c, 2) == std::vector<float>{300, 301, 2, 1, 2, -4});
}

TEST_CASE("reference: inplace_q only for computed q rows, inplace_k only for written tokens") {
  hand_case c;
  c.tq = 2; c.ts = 2; c.tk = 3;
  c.init();
  rotate_90_everywhere(c);
  c.slots = {-1, 1};
  c.opt.padding = pad_q::skipped;
  c.opt.inplace_q = true;
  c.opt.inplace_k = true;
  reference_run(c.args());
  // q token 0 skipped: q_pe row 0 unchanged; q token 1 rotated in place
  CHECK(std::vector<float>(c.q_pe.begin(), c.q_pe.begin() + 4) == std::vector<float>{200, 201, 202, 203});
  CHECK(std::vector<float>(c.q_pe.begin() + 4, c.q_pe.end()) == std::vector<float>{-205, 204, -207, 206});
  // k token 0 (slot -1) unchanged, token 1 rotated, token 2 (>= Ts) unchanged
  CHECK(c.k_pe == std::vector<float>{400, 401, 402, 403, -405, 404, -407, 406, 408, 409, 410, 411});
}

TEST_CASE("reference: fp8 cache, divide vs reciprocal, saturation") {
  // 10.9375 / 7 = 1.5625 exactly: a tie of e4m3fn between 1.5 (0x3c) and 1.625 (0x3d), which
  // rounds to even 0x3c. fp32(1/7) is above 1/7, so fp32(10.9375 * fp32(1/7)) = 1.5625001192
  // rounds up to 0x3d. 3500 / 7 = 500 > 448 saturates to 0x7e; 7 / 7 = 1 is 0x38.
  const float x = 10.9375f, scale = 7.0f;
  REQUIRE(x / scale == 1.5625f);
  REQUIRE(x * (1.0f / scale) > 1.5625f);
  hand_case c;
  c.cache_dtype = dtype::fp8_e4m3fn;
  c.k_scale = scale;
  c.init();
  c.slots = {0};
  c.kv_c = {x, 3500};
  c.k_pe = {x, 0, 7, 0};  // identity table row: rope = k_pe
  SUBCASE("divide") {
    c.opt.scale = scale_conv::divide;
    reference_run(c.args());
    CHECK(cache_row_bits(c, 0) == std::vector<uint32_t>{0x3c, 0x7e, 0x3c, 0x00, 0x38, 0x00});
  }
  SUBCASE("reciprocal") {
    c.opt.scale = scale_conv::reciprocal;
    reference_run(c.args());
    CHECK(cache_row_bits(c, 0) == std::vector<uint32_t>{0x3d, 0x7e, 0x3d, 0x00, 0x38, 0x00});
  }
  CHECK(c.cache_bytes_changed_outside({0}) == 0);
}

TEST_CASE("reference: fp8 q_out uses q_scale; non-fp8 outputs ignore the scales") {
  hand_case c;
  c.q_out_dtype = dtype::fp8_e4m3fn;
  c.q_scale = 7.0f;
  c.k_scale = 3.0f;  // f32 cache: ignored
  c.init();
  c.q_nope = {10.9375f, -3500};
  c.q_pe = {10.9375f, 0, 7, 0};
  c.kv_c = {5, 6};
  c.k_pe = {1, 2, 3, 4};
  SUBCASE("divide") {
    reference_run(c.args());
    CHECK(q_out_row_bits(c, 0, 0) == std::vector<uint32_t>{0x3c, 0xfe, 0x3c, 0x00, 0x38, 0x00});
  }
  SUBCASE("reciprocal") {
    c.opt.scale = scale_conv::reciprocal;
    reference_run(c.args());
    CHECK(q_out_row_bits(c, 0, 0) == std::vector<uint32_t>{0x3d, 0xfe, 0x3d, 0x00, 0x38, 0x00});
  }
  CHECK(cache_row(c, 0) == std::vector<float>{5, 6, 1, 2, 3, 4});
}

TEST_CASE("reference: Tq = 0 and Ts = 0 are no-ops; Tq = 0 with Ts > 0 writes only the cache") {
  hand_case c;
  c.tq = 0; c.ts = 0; c.tk = 2;
  c.init();
  c.opt.inplace_q = c.opt.inplace_k = true;
  const std::vector<float> k_pe_before = c.k_pe;
  reference_run(c.args());
  CHECK(c.outputs_not_poison() == 0);
  CHECK(c.k_pe == k_pe_before);

  hand_case d;
  d.tq = 0; d.ts = 1; d.tk = 2;
  d.init();
  reference_run(d.args());
  CHECK(cache_row(d, 0) == std::vector<float>{300, 301, 400, 401, 402, 403});
  CHECK(d.cache_bytes_changed_outside({0}) == 0);
}

TEST_CASE("reference: exact value where an fp32 evaluation cancels ") {
  // gptj pair (a, b) with a = C = 1 + 2^-23, b = -(1 + 2^-22), S = -(1 + 2^-23):
  //   a' = a*C + R(a)*S = a*C + (-b)*S
  //      = (1 + 2^-22 + 2^-46) - (1 + 3*2^-23 + 2^-45) = -(2^-23 + 2^-46)      (exact)
  // An fp32 kernel doing fmaf(a, C, fp32((-b)*S)) rounds (-b)*S to -(1 + 3*2^-23) first and gets
  //   (1 + 2^-22 + 2^-46) - (1 + 3*2^-23) = -(2^-23 - 2^-46): 3 ULP of f32 away.
  const float a = 1.0f + 0x1p-23f, C = 1.0f + 0x1p-23f;
  const float b = -(1.0f + 0x1p-22f), S = -(1.0f + 0x1p-23f);
  hand_case c;
  c.init();
  c.set_table_row(0, {C, 1.0f}, {S, 0.0f});
  c.q_pe = {a, b, 0, 0};
  reference_run(c.args());
  const float exact = -(0x1p-23f + 0x1p-46f);
  CHECK(c.q_out_at(0, 0, 2) == exact);

  const float fp32_eval = std::fmaf(a, C, (-b) * S);
  CHECK(fp32_eval == -(0x1p-23f - 0x1p-46f));
  uint32_t ref_bits = 0, f32_bits = 0;
  std::memcpy(&ref_bits, &exact, 4);
  std::memcpy(&f32_bits, &fp32_eval, 4);
  CHECK(ulp_distance(dtype::f32, ref_bits, f32_bits) == 3);
  CHECK(ulp_distance(dtype::f32, c.q_out_bits(0, 0, 2), ref_bits) == 0);
  // the partner: b' = b*C + a*S, exact in double then one rounding
  const double b_exact = std::fma(static_cast<double>(b), C, static_cast<double>(a) * S);
  CHECK(c.q_out_at(0, 0, 3) == static_cast<float>(b_exact));
}

TEST_CASE("reference: backend interface") {
  auto be = make_cpu_backend();
  CHECK(be->name() == "ref");
  hand_case c = one_token_case();
  CHECK(be->unsupported_reason(c.args()) == "");
  CHECK(be->device_description().find("OpenMP threads") != std::string::npos);
  be->run_host(c.args(), {});
  CHECK(q_out_row(c, 0, 0) == std::vector<float>{100, 101, 0, 1.25f, 2, 11});
}

TEST_CASE("reference: reference_round_f64 equals encode_from_f64 (midpoints of f16/bf16 included)") {
  // fp32(v) can land exactly on a midpoint of f16/bf16 while v is just off it: the fast path
  // must then round v itself. Probe every f16/bf16 midpoint region with offsets below fp32's
  // resolution, plus random doubles.
  uint64_t state = 12345;
  auto next = [&state]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 11;
  };
  int64_t checked = 0, mismatches = 0;
  for (dtype t : {dtype::f16, dtype::bf16, dtype::f32, dtype::fp8_e4m3fn, dtype::fp8_e5m2fnuz}) {
    const overflow_mode mode = dtype_is_fp8(t) ? overflow_mode::saturate : overflow_mode::ieee;
    const uint32_t codes = t == dtype::f32 ? 0 : (dtype_size_bytes(t) == 1 ? 256u : 65536u);
    for (uint32_t b = 0; b + 1 < codes; ++b) {
      const double lo = decode_to_f64(t, b), hi = decode_to_f64(t, b + 1);
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const double mid = (lo + hi) / 2;  // exact in double
      for (double v : {mid, std::nextafter(mid, 1e300), std::nextafter(mid, -1e300),
                       mid + std::fabs(mid) * 0x1p-30, mid - std::fabs(mid) * 0x1p-30}) {
        ++checked;
        mismatches += reference_round_f64(t, v) != encode_from_f64(t, v, mode);
      }
    }
    for (int i = 0; i < 20000; ++i) {
      const double v = std::ldexp(static_cast<double>(next()) * 0x1p-53 - 0.5, static_cast<int>(next() % 80) - 40);
      ++checked;
      mismatches += reference_round_f64(t, v) != encode_from_f64(t, v, mode);
    }
    const double nan = std::numeric_limits<double>::quiet_NaN();
    CHECK(reference_round_f64(t, nan) == encode_from_f64(t, nan, mode));
    CHECK(reference_round_f64(t, 1e300) == encode_from_f64(t, 1e300, mode));
    CHECK(reference_round_f64(t, -1e300) == encode_from_f64(t, -1e300, mode));
  }
  CHECK(checked > 600000);
  CHECK(mismatches == 0);
}

TEST_CASE("reference: large 16-bit calls (table and copy paths) equal the per-element rule") {
  // Tq = Ts = Tk = 256, H = 8, Dn = 128: 2^18 nope elements take the 65536-entry table path
  // (and, for bf16 -> bf16, the copy path with NaN re-encoding). q_nope and kv_c cycle through
  // every bit pattern, NaN payloads included.
  const int64_t T = 256, H = 8, Dn = 128, Dr = 4, P = 2;
  for (dtype out : {dtype::bf16, dtype::f16, dtype::fp8_e4m3fn}) {
    for (dtype in : {dtype::bf16, dtype::f16}) {
      CAPTURE(dtype_name(in));
      CAPTURE(dtype_name(out));
      std::vector<uint16_t> q_nope(T * H * Dn), q_pe(T * H * Dr, 0), kv_c(T * Dn), k_pe(T * Dr, 0);
      std::vector<float> table(P * Dr, 0.0f);
      std::vector<int64_t> pos(T, 0), slot(T);
      for (size_t i = 0; i < q_nope.size(); ++i) q_nope[i] = static_cast<uint16_t>(i * 7);
      for (size_t i = 0; i < kv_c.size(); ++i) kv_c[i] = static_cast<uint16_t>(i * 3 + 1);
      for (int64_t t = 0; t < T; ++t) slot[t] = T - 1 - t;
      const size_t es = dtype_size_bytes(out);
      std::vector<uint8_t> q_out(T * H * (Dn + Dr) * es), cache(T * (Dn + Dr) * es);
      op_args a;
      a.q_nope = make_view(in, q_nope.data(), {T, H, Dn});
      a.q_pe = make_view(in, q_pe.data(), {T, H, Dr});
      a.kv_c = make_view(in, kv_c.data(), {T, Dn});
      a.k_pe = make_view(in, k_pe.data(), {T, Dr});
      a.positions = make_view(dtype::i64, pos.data(), {T});
      a.slot_mapping = make_view(dtype::i64, slot.data(), {T});
      a.cos_sin = make_view(dtype::f32, table.data(), {P, Dr});
      a.q_out = make_view(out, q_out.data(), {T, H, Dn + Dr});
      a.cache = make_view(out, cache.data(), {T / 16, 16, Dn + Dr});
      a.q_scale = 0.75f;
      a.k_scale = 3.0f;
      reference_run(a);
      const overflow_mode mode = dtype_is_fp8(out) ? overflow_mode::saturate : overflow_mode::ieee;
      auto expect = [&](uint16_t bits, float scale) {
        const float x = decode_to_f32(in, bits);
        return encode_from_f32(out, dtype_is_fp8(out) ? x / scale : x, mode);
      };
      int64_t bad = 0;
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t d = 0; d < Dn; ++d) {
            const uint64_t got = load_bits(out, q_out.data() + ((t * H + h) * (Dn + Dr) + d) * es);
            bad += got != expect(q_nope[(t * H + h) * Dn + d], a.q_scale);
          }
        }
        for (int64_t d = 0; d < Dn; ++d) {
          const uint64_t got = load_bits(out, cache.data() + (slot[t] * (Dn + Dr) + d) * es);
          bad += got != expect(kv_c[t * Dn + d], a.k_scale);
        }
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("reference: many tokens, 1 to 3 threads, bf16 -> bf16 and fp8: every element equals the scalar rule") {
  // The hot path (row-wise conversions, OpenMP over (token, row) items in dynamic chunks, the
  // cos/sin row kept per thread while it stays on one token) against SPEC.md written out one
  // element at a time with the scalar conversions. Random bf16 data with NaN, inf, zeros and
  // subnormals sprinkled in; random positions (repeated ones included); a few padding slots.
  const int64_t T = 203, H = 3, Dn = 24, Dr = 8, P = 37, half = Dr / 2;
  uint64_t state = 99;
  auto next = [&state]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 17;
  };
  auto random_bf16 = [&]() -> uint16_t {
    const uint64_t r = next();
    switch (r % 64) {
      case 0: return 0x7fc1;                         // NaN with a payload
      case 1: return 0xff81;                         // negative signaling-pattern NaN
      case 2: return 0x7f80;                         // inf
      case 3: return 0x0003;                         // subnormal
      case 4: return 0x8000;                         // -0
      default: return static_cast<uint16_t>(0x3c00 + (r >> 8) % 0x0600) ^ ((r & 128) ? 0x8000 : 0);
    }
  };
  std::vector<uint16_t> q_nope(T * H * Dn), q_pe(T * H * Dr), kv_c(T * Dn), k_pe(T * Dr), table(P * Dr);
  for (auto* v : {&q_nope, &q_pe, &kv_c, &k_pe}) for (auto& b : *v) b = random_bf16();
  for (auto& b : table) b = static_cast<uint16_t>(0x3c00 + next() % 0x0400) ^ ((next() & 1) ? 0x8000 : 0);
  std::vector<int64_t> pos(T), slot(T);
  for (int64_t t = 0; t < T; ++t) {
    pos[t] = static_cast<int64_t>(next() % P);
    slot[t] = (t % 17 == 5) ? -1 : (T - 1 - t) * 2;  // unique, spread over two blocks' worth
  }
  const int64_t bs = 16, nb = (2 * T + bs - 1) / bs;
  for (dtype out : {dtype::bf16, dtype::fp8_e4m3fn}) {
    const size_t es = dtype_size_bytes(out);
    std::vector<std::vector<uint8_t>> q_outs, caches;
    for (int threads : {1, 2, 3}) {
      std::vector<uint8_t> q_out(T * H * (Dn + Dr) * es, 0xee), cache(nb * bs * (Dn + Dr) * es, 0xee);
      op_args a;
      a.q_nope = make_view(dtype::bf16, q_nope.data(), {T, H, Dn});
      a.q_pe = make_view(dtype::bf16, q_pe.data(), {T, H, Dr});
      a.kv_c = make_view(dtype::bf16, kv_c.data(), {T, Dn});
      a.k_pe = make_view(dtype::bf16, k_pe.data(), {T, Dr});
      a.positions = make_view(dtype::i64, pos.data(), {T});
      a.slot_mapping = make_view(dtype::i64, slot.data(), {T});
      a.cos_sin = make_view(dtype::bf16, table.data(), {P, Dr});
      a.q_out = make_view(out, q_out.data(), {T, H, Dn + Dr});
      a.cache = make_view(out, cache.data(), {nb, bs, Dn + Dr});
      a.q_scale = 0.5f;
      a.k_scale = 3.0f;
      a.options.style = out == dtype::bf16 ? rope_style::gptj : rope_style::neox;
      a.options.scale = scale_conv::reciprocal;
      a.options.padding = pad_q::skipped;
      reference_run_on_threads(a, threads);
      q_outs.push_back(q_out);
      caches.push_back(cache);
    }
    CAPTURE(std::string(dtype_name(out)));
    CHECK(q_outs[0] == q_outs[1]);
    CHECK(q_outs[0] == q_outs[2]);
    CHECK(caches[0] == caches[1]);
    CHECK(caches[0] == caches[2]);

    // SPEC.md, one element at a time.
    const bool fp8 = dtype_is_fp8(out);
    const overflow_mode mode = fp8 ? overflow_mode::saturate : overflow_mode::ieee;
    const bool gptj = out == dtype::bf16;
    auto x_of = [](uint16_t b) { return static_cast<double>(decode_to_f32(dtype::bf16, b)); };
    auto nope_code = [&](uint16_t b, float scale) {
      const float x = decode_to_f32(dtype::bf16, b);
      return encode_from_f32(out, fp8 ? x * (1.0f / scale) : x, mode);
    };
    // element j of rope(row) for table row p, scaled for fp8, rounded once
    int64_t nan_rope = 0;
    auto rope_code = [&](const uint16_t* row, int64_t p, int64_t j, float scale) {
      const int64_t i = gptj ? j / 2 : j % half;
      const bool is_a = gptj ? j % 2 == 0 : j < half;
      const int64_t partner = gptj ? (is_a ? j + 1 : j - 1) : (is_a ? j + half : j - half);
      const double c = x_of(table[p * Dr + i]), s = x_of(table[p * Dr + half + i]);
      const double rx = is_a ? -x_of(row[partner]) : x_of(row[partner]);
      double v = x_of(row[j]) * c + rx * s;
      if (fp8) v *= static_cast<double>(1.0f / scale);
      return encode_from_f64(out, v, mode);
    };
    // A rope element with a NaN input is NaN, but the sign of a NaN that arithmetic produces is
    // not pinned (the compiler may evaluate x*C + (-b)*S as x*C - b*S; with two NaN inputs the
    // hardware's operand order decides): SPEC.md's rule (both NaN passes) applies there.
    // Data-movement elements are compared bit for bit (canonical NaN, sign kept).
    auto same_nan = [&](uint64_t got, uint64_t want) {
      const bool ok = got != want && is_nan_bits(out, static_cast<uint32_t>(got)) &&
                      is_nan_bits(out, static_cast<uint32_t>(want));
      nan_rope += ok;
      return ok;
    };
    int64_t bad = 0, checked = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = pos[t];
      for (int64_t h = 0; h < H; ++h) {
        const uint8_t* row = q_outs[0].data() + (t * H + h) * (Dn + Dr) * es;
        for (int64_t d = 0; d < Dn + Dr; ++d) {
          const uint64_t got = load_bits(out, row + d * es);
          uint64_t want = 0xeeeeeeee & ((uint64_t{1} << (8 * es)) - 1);  // skipped: untouched
          if (slot[t] >= 0) {
            want = d < Dn ? nope_code(q_nope[(t * H + h) * Dn + d], 0.5f)
                          : rope_code(&q_pe[(t * H + h) * Dr], p, d - Dn, 0.5f);
          }
          if (d >= Dn && same_nan(got, want)) continue;
          if (got != want && bad < 5) MESSAGE("q_out t " << t << " h " << h << " d " << d << ": got " << got << " want " << want);
          bad += got != want;
          ++checked;
        }
      }
      if (slot[t] < 0) continue;
      const uint8_t* entry = caches[0].data() + slot[t] * (Dn + Dr) * es;
      for (int64_t d = 0; d < Dn + Dr; ++d) {
        const uint64_t want = d < Dn ? nope_code(kv_c[t * Dn + d], 3.0f) : rope_code(&k_pe[t * Dr], p, d - Dn, 3.0f);
        const uint64_t got = load_bits(out, entry + d * es);
        if (d >= Dn && same_nan(got, want)) continue;
        if (got != want && bad < 5) MESSAGE("cache t " << t << " d " << d << ": got " << got << " want " << want);
        bad += got != want;
        ++checked;
      }
    }
    MESSAGE(std::string(dtype_name(out)) << ": " << nan_rope << " rope NaN elements differ only in the NaN's sign");
    CHECK(checked > 20000);
    CHECK(bad == 0);
  }
}

TEST_CASE("reference: streamed output rows at every alignment (padded q_out and cache rows, zero-copy, table two), f16 and bf16, 1 and 2 threads") {
  // The reference writes q_out and cache rows with non-temporal stores (core/convert.h
  // *_stream): an unaligned head and tail per row, 16-byte chunks between. Rows here start at
  // every 2-byte offset modulo 16 (q_out head stride Dn + Dr + 1, cache entry stride
  // Dn + Dr + 3, base pointers one element past 64-byte alignment), Dn is odd (a tail in every
  // row), q_nope and kv_c hold NaN codes of both signs (canonicalised by the streaming loop),
  // and the padding elements between rows must keep their poison. Also zero-copy (q_nope is
  // the first Dn columns of q_out: the in-place path) and table two (the prefetch of the next
  // token's cos and sin rows).
  const int64_t T = 37, H = 3, Dn = 203, Dr = 6, P = 11, half = Dr / 2;
  const int64_t q_row = Dn + Dr + 1, entry = Dn + Dr + 3, bs = 8, nb = (T + bs - 1) / bs + 1;
  uint64_t state = 7;
  auto next = [&state]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 17;
  };
  for (dtype t16 : {dtype::bf16, dtype::f16}) {
    for (bool zero_copy : {false, true}) {
      for (int threads : {1, 2}) {
        CAPTURE(std::string(dtype_name(t16)));
        CAPTURE(zero_copy);
        CAPTURE(threads);
        const uint16_t nan_a = t16 == dtype::bf16 ? 0x7f81 : 0x7c01, nan_b = t16 == dtype::bf16 ? 0xffff : 0xfdff;
        auto random_code = [&](bool with_nan) -> uint16_t {
          const uint64_t r = next();
          if (with_nan && r % 29 == 0) return (r & 64) ? nan_a : nan_b;
          return static_cast<uint16_t>(0x3800 + (r >> 8) % 0x0600) ^ ((r & 128) ? 0x8000 : 0);  // normal in both
        };
        // q_out (and q_nope when zero-copy) one element past a 64-byte boundary
        std::vector<uint16_t> q_out_buf(32 + static_cast<size_t>(T * H * q_row), 0xdead);
        uint16_t* q_out = q_out_buf.data() + ((64 - reinterpret_cast<uintptr_t>(q_out_buf.data()) % 64) % 64) / 2 + 1;
        std::vector<uint16_t> cache_buf(32 + static_cast<size_t>(nb * bs * entry), 0xbeef);
        uint16_t* cache = cache_buf.data() + ((64 - reinterpret_cast<uintptr_t>(cache_buf.data()) % 64) % 64) / 2 + 1;
        std::vector<uint16_t> q_nope_sep(T * H * Dn), q_pe(T * H * Dr), kv_c(T * Dn), k_pe(T * Dr), cos_t(P * half), sin_t(P * half);
        for (auto& b : q_nope_sep) b = random_code(true);
        for (auto& b : kv_c) b = random_code(true);
        for (auto* v : {&q_pe, &k_pe, &cos_t, &sin_t}) for (auto& b : *v) b = random_code(false);
        if (zero_copy) {
          for (int64_t r = 0; r < T * H; ++r) std::copy_n(&q_nope_sep[r * Dn], Dn, q_out + r * q_row);
        }
        const std::vector<uint16_t> q_out_before = q_out_buf, cache_before = cache_buf;
        std::vector<int64_t> pos(T), slot(T);
        for (int64_t t = 0; t < T; ++t) {
          pos[t] = static_cast<int64_t>(next() % P);
          slot[t] = (t % 9 == 4) ? -1 : nb * bs - 1 - t;  // unique; a few padding tokens
        }
        op_args a;
        a.q_nope = zero_copy ? make_view(t16, q_out, {T, H, Dn}, {H * q_row, q_row, 1})
                             : make_view(t16, q_nope_sep.data(), {T, H, Dn});
        a.q_pe = make_view(t16, q_pe.data(), {T, H, Dr});
        a.kv_c = make_view(t16, kv_c.data(), {T, Dn});
        a.k_pe = make_view(t16, k_pe.data(), {T, Dr});
        a.positions = make_view(dtype::i64, pos.data(), {T});
        a.slot_mapping = make_view(dtype::i64, slot.data(), {T});
        a.cos = make_view(t16, cos_t.data(), {P, half});
        a.sin = make_view(t16, sin_t.data(), {P, half});
        a.q_out = make_view(t16, q_out, {T, H, Dn + Dr}, {H * q_row, q_row, 1});
        a.cache = make_view(t16, cache, {nb, bs, Dn + Dr}, {bs * entry, entry, 1});
        a.options.style = rope_style::gptj;
        a.options.padding = pad_q::computed;
        reference_run_on_threads(a, threads);

        // SPEC.md one element at a time: nope round(fp32(x)) (NaN -> canonical NaN of its sign),
        // rope the exact x*C + R(x)*S rounded once (inputs have no NaN: bit-exact).
        auto x_of = [&](uint16_t b) { return static_cast<double>(decode_to_f32(t16, b)); };
        auto nope_code = [&](uint16_t b) { return encode_from_f32(t16, decode_to_f32(t16, b), overflow_mode::ieee); };
        auto rope_code = [&](const uint16_t* row, int64_t p, int64_t j) {
          const int64_t i = j / 2, partner = j % 2 == 0 ? j + 1 : j - 1;
          const double rx = j % 2 == 0 ? -x_of(row[partner]) : x_of(row[partner]);
          return encode_from_f64(t16, x_of(row[j]) * x_of(cos_t[p * half + i]) + rx * x_of(sin_t[p * half + i]), overflow_mode::ieee);
        };
        std::vector<uint16_t> want_q = q_out_before, want_cache = cache_before;
        const ptrdiff_t q0 = q_out - q_out_buf.data(), c0 = cache - cache_buf.data();
        int64_t nan_inputs = 0;
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t h = 0; h < H; ++h) {
            uint16_t* w = want_q.data() + q0 + (t * H + h) * q_row;
            for (int64_t d = 0; d < Dn; ++d) {
              const uint16_t x = q_nope_sep[(t * H + h) * Dn + d];
              nan_inputs += is_nan_bits(t16, x);
              w[d] = static_cast<uint16_t>(nope_code(x));
            }
            for (int64_t j = 0; j < Dr; ++j) w[Dn + j] = static_cast<uint16_t>(rope_code(&q_pe[(t * H + h) * Dr], pos[t], j));
          }
          if (slot[t] < 0) continue;
          uint16_t* w = want_cache.data() + c0 + slot[t] * entry;  // block stride bs * entry
          for (int64_t d = 0; d < Dn; ++d) w[d] = static_cast<uint16_t>(nope_code(kv_c[t * Dn + d]));
          for (int64_t j = 0; j < Dr; ++j) w[Dn + j] = static_cast<uint16_t>(rope_code(&k_pe[t * Dr], pos[t], j));
        }
        CHECK(nan_inputs > 50);
        int64_t bad_q = 0, bad_cache = 0;
        for (size_t i = 0; i < want_q.size(); ++i) bad_q += q_out_buf[i] != want_q[i];
        for (size_t i = 0; i < want_cache.size(); ++i) bad_cache += cache_buf[i] != want_cache[i];
        CHECK(bad_q == 0);
        CHECK(bad_cache == 0);
      }
    }
  }
}

TEST_CASE("reference: layout shuffled puts each entry's parts where core/SPEC.md says (runs of 16 bytes, 16-entry tiles)") {
  for (const char* cache : {"bf16", "fp8_e4m3fn", "f32", "f16"}) {
    INFO("cache " << cache);
    problem joint = parse_problem(fmt::format(
        "tq=5 ts=40 tk=41 h=2 dn=32 dr=16 bs=32 nb=3 in=bf16 qo=bf16 cache={} pad_slots=3 block_pad=8 seed=11", cache));
    problem shuffled = joint;
    shuffled.opt.layout = cache_layout::shuffled;
    case_data cj = make_case(joint), cs = make_case(shuffled);
    for (const char* in : {"q_nope", "kv_c", "k_pe", "positions", "slot_mapping"}) {
      INFO("input " << in);
      const host_buffer& a = cj.buffers.at(in);
      const host_buffer& b = cs.buffers.at(in);
      REQUIRE(std::vector<uint8_t>(a.data(), a.data() + a.size_bytes()) ==
              std::vector<uint8_t>(b.data(), b.data() + b.size_bytes()));
    }
    reference_run(cj.args);
    reference_run(cs.args);
    const int64_t es = static_cast<int64_t>(dtype_size_bytes(joint.cache_dtype));
    const int64_t w = 16 / es, dn = joint.dn, dr = joint.dr, bs = joint.block_size;
    const int64_t block_stride = cs.args.cache.strides_elems[0];
    CHECK(block_stride == bs * (dn + dr) + 8);
    const auto* sh = static_cast<const uint8_t*>(cs.args.cache.data);
    const auto* jo = static_cast<const uint8_t*>(cj.args.cache.data);
    const std::vector<int64_t> slots = read_indices(cs.args.slot_mapping, joint.ts);
    int64_t written = 0, checked = 0;
    for (int64_t slot : slots) {
      if (slot < 0) continue;
      ++written;
      const int64_t b = slot / bs, e = slot % bs;
      for (int64_t part = 0; part < 2; ++part) {
        const int64_t width = part == 0 ? dn : dr, start = part == 0 ? 0 : bs * dn;
        for (int64_t f = 0; f < width; ++f) {
          const int64_t off = b * block_stride + start + (e / 16) * 16 * width + (f / w) * 16 * w +
                              (e % 16) * w + f % w;
          const int64_t joff = b * cj.args.cache.strides_elems[0] + e * (dn + dr) + (part == 0 ? 0 : dn) + f;
          checked += std::memcmp(sh + off * es, jo + joff * es, static_cast<size_t>(es)) == 0;
        }
      }
    }
    CHECK(written == joint.ts - joint.pad_slots);
    CHECK(checked == written * (dn + dr));
    // nothing else of the shuffled cache was written: as many bytes left the poison as in joint
    const host_buffer& bj = cj.buffers.at("cache");
    const host_buffer& bsh = cs.buffers.at("cache");
    CHECK(count_not_poison(bsh.data(), bsh.size_bytes()) == count_not_poison(bj.data(), bj.size_bytes()));
    CHECK(bsh.guards_intact());
    // and the map the reference uses says the same for one element: entry 17, nope feature w + 1
    const paged_cache_map m = paged_cache_map::from_args(cs.args);
    CHECK(m.nope_offset_elems(bs + 17, 0, w + 1) == block_stride + 16 * dn + 16 * w + 1 * w + 1);
    CHECK(m.rope_offset_elems(3, 0, 2) == bs * dn + 3 * w + 2);
  }
}

// Decode outputs (core/SPEC.md "Decode outputs"), f32 so every value is exact. Tq = Ts = 3,
// Tk = 4, N = 2, a 90 degree rotation (a' = -b, b' = a); token 1 is padding (slot -1).
TEST_CASE("reference: decode outputs: rows t < N of computed q rows, k_pe_out rows of written tokens") {
  for (const pad_q padding : {pad_q::skipped, pad_q::computed}) {
    INFO("pad_q " << to_string(padding));
    hand_case c;
    c.tq = 3; c.ts = 3; c.tk = 4;
    c.init();
    rotate_90_everywhere(c);
    c.slots = {0, -1, 2};
    c.opt.padding = padding;
    const float mark = 777.0f;  // every decode output element starts here
    std::vector<float> dec(2 * 1 * 4, mark), zeros(2 * 1 * 2, mark), kout(4 * 4, mark);
    op_args a = c.args();
    a.decode_q_pe_out = make_view(dtype::f32, dec.data(), {2, 1, 4});
    a.q_nope_zeros_out = make_view(dtype::f32, zeros.data(), {2, 1, 2});
    a.k_pe_out = make_view(dtype::f32, kout.data(), {4, 4});
    reference_run(a);
    // q_pe rows: [200..203], [204..207]; token 0 rotated, token 1 only when its row is computed
    const std::vector<float> row1 = padding == pad_q::computed ? std::vector<float>{-205, 204, -207, 206}
                                                               : std::vector<float>{mark, mark, mark, mark};
    std::vector<float> want_dec = {-201, 200, -203, 202};
    want_dec.insert(want_dec.end(), row1.begin(), row1.end());
    CHECK(dec == want_dec);
    const std::vector<float> zrow1 = padding == pad_q::computed ? std::vector<float>{0, 0}
                                                                : std::vector<float>{mark, mark};
    CHECK(zeros == std::vector<float>{0, 0, zrow1[0], zrow1[1]});
    for (size_t i = 0; i < zeros.size(); ++i)
      if (zeros[i] == 0.0f) CHECK(!std::signbit(zeros[i]));  // +0, all-zero bits
    // k_pe rows [400..403] .. [412..415]: token 0 and 2 written, 1 (slot -1) and 3 (>= Ts) not
    CHECK(kout == std::vector<float>{-401, 400, -403, 402, mark, mark, mark, mark,
                                     -409, 408, -411, 410, mark, mark, mark, mark});
    // q_out and the cache as without decode outputs
    CHECK(q_out_row(c, 0, 0) == std::vector<float>{100, 101, -201, 200, -203, 202});
    CHECK(cache_row(c, 2) == std::vector<float>{304, 305, -409, 408, -411, 410});
  }
}

TEST_CASE("reference: decode outputs: N = 0 writes no decode row; N = Tq all; with inplace_q equal to q_pe's new rows") {
  hand_case c;
  c.tq = 2; c.ts = 2; c.tk = 2;
  c.init();
  rotate_90_everywhere(c);
  c.opt.inplace_q = true;
  c.opt.inplace_k = true;
  std::vector<float> dec(2 * 4, 777.0f), kout(2 * 4, 777.0f);
  std::vector<float> none(1, 555.0f);
  op_args a = c.args();
  a.decode_q_pe_out = make_view(dtype::f32, dec.data(), {2, 1, 4});
  a.q_nope_zeros_out = make_view(dtype::f32, none.data(), {0, 1, 2});  // N = 0 is fine alone
  a.k_pe_out = make_view(dtype::f32, kout.data(), {2, 4});
  // two different N (2 and 0): an error naming the zero buffer, nothing written
  CHECK_THROWS_WITH_AS(reference_run(a), doctest::Contains("q_nope_zeros_out.shape[0]"), arg_error);
  CHECK(dec == std::vector<float>(8, 777.0f));
  a.q_nope_zeros_out = tensor_view{};
  reference_run(a);
  CHECK(dec == c.q_pe);  // N = Tq: every row, equal to the in-place rows
  CHECK(kout == c.k_pe);
  CHECK(none[0] == 555.0f);
}

// Layout fp8_ds_mla, a tile holding +-inf (core/SPEC.md): scale inf under both rules, finite
// values +-0, each infinity the positive NaN 0x7f whatever its sign (x86's inf / inf is the
// negative NaN; GPUs give the positive one), a NaN input keeping its sign (0xff, 0x7f).
TEST_CASE("reference: layout fp8_ds_mla, a tile with +-inf gets scale inf and the positive NaN for each infinity") {
  for (const char* rule : {"amax", "pow2"}) {
    INFO("ds_scale " << rule);
    problem p = parse_problem(fmt::format(
        "tq=1 ts=1 tk=1 h=1 dn=512 dr=64 bs=2 nb=1 in=bf16 qo=bf16 layout=fp8_ds_mla cache=u8 ds_scale={} seed=5", rule));
    case_data c = make_case(p);
    auto* row = static_cast<uint16_t*>(c.args.kv_c.data);
    const uint16_t tile1[5] = {0x7f80, 0xff80, 0x4000, 0xc000, 0x8000};  // +inf, -inf, 2, -2, -0
    for (int64_t d = 0; d < 512; ++d) row[d] = 0x3f80;  // 1.0
    for (int i = 0; i < 5; ++i) row[128 + i] = tile1[i];
    row[300] = 0xffc1;  // a negative NaN in tile 2 (skipped by its amax)
    row[301] = 0x7fc0;  // a positive NaN
    reference_run(c.args);
    const std::vector<int64_t> slots = read_indices(c.args.slot_mapping, 1);
    REQUIRE(slots[0] >= 0);
    const int64_t bs = p.block_size;
    const auto* entry = static_cast<const uint8_t*>(c.args.cache.data) + (slots[0] / bs) * c.args.cache.strides_elems[0] +
                        (slots[0] % bs) * c.args.cache.strides_elems[1];
    uint32_t scale1 = 0;
    std::memcpy(&scale1, entry + 512 + 4, 4);
    CHECK(scale1 == 0x7f800000u);  // +inf
    const uint8_t codes1[5] = {0x7f, 0x7f, 0x00, 0x80, 0x80};
    for (int i = 0; i < 5; ++i) CHECK(entry[128 + i] == codes1[i]);
    for (int64_t d = 133; d < 256; ++d) CHECK(entry[d] == 0x00);  // 1 / inf = +0
    CHECK(entry[300] == 0xff);
    CHECK(entry[301] == 0x7f);
    CHECK(entry[0] == (std::string(rule) == "pow2" ? 0x78 : 0x7e));  // amax: 1 / fp32(1/448) -> 448; pow2: scale 2^-8, 256
  }
}

// Layout fp8_ds_mla (core/SPEC.md "The fp8_ds_mla layout"): one token's 656-byte entry with
// tiles whose bytes and scales are worked out here by hand, both tile scale rules; the rope part
// equals a joint bf16 cache's rope part of the same inputs; nothing else of the cache is written.
TEST_CASE("reference: layout fp8_ds_mla writes e4m3fn tiles, their f32 scales (amax and pow2) and the 16-bit rope part") {
  const char* base = "tq=2 ts=3 tk=3 h=2 dn=512 dr=64 bs=4 nb=2 in=bf16 qo=bf16 pad_slots=1 pad_at=head entry_pad=8 block_pad=4 seed=21";
  struct tile_expect {
    float value[3];           // values 0, 1, 2 of the tile; the other 125 are 0
    uint32_t scale_bits;      // the f32 scale
    uint8_t code[3];          // e4m3fn of values 0, 1, 2
  };
  for (const char* rule : {"amax", "pow2"}) {
    INFO("ds_scale " << rule);
    const bool pow2 = std::string(rule) == "pow2";
    problem joint = parse_problem(base);
    problem ds = parse_problem(fmt::format("{} layout=fp8_ds_mla cache=u8 ds_scale={}", base, rule));
    case_data cj = make_case(joint), cd = make_case(ds);
    for (const char* in : {"q_nope", "kv_c", "k_pe", "positions", "slot_mapping"}) {
      INFO("input " << in);
      const host_buffer& a = cj.buffers.at(in);
      const host_buffer& b = cd.buffers.at(in);
      REQUIRE(std::vector<uint8_t>(a.data(), a.data() + a.size_bytes()) ==
              std::vector<uint8_t>(b.data(), b.data() + b.size_bytes()));
    }
    // tile 0 all zero; tile 1: 336 / 448 = 0.75 exactly; tile 2: amax 3; tile 3: amax 0.5
    const float s3 = 3.0f / 448.0f, s05 = 0.5f / 448.0f;
    uint32_t s3_bits = 0, s05_bits = 0;
    std::memcpy(&s3_bits, &s3, 4);
    std::memcpy(&s05_bits, &s05, 4);
    const tile_expect tiles[4] = {
        // amax: FLT_MIN; pow2: max(0, 1e-4) -> 2^-13
        {{0.0f, 0.0f, 0.0f}, pow2 ? 0x39000000u : 0x00800000u, {0x00, 0x00, 0x00}},
        // amax: scale 0.75: 448 (0x7e), -224 (0xf6), 1.333 -> 1.375 (0x3b);
        // pow2: scale 1: 336 -> 320 (tie, even: 0x7a), -168 -> -160 (tie, even: 0xf2), 1 (0x38)
        {{336.0f, -168.0f, 1.0f}, pow2 ? 0x3f800000u : 0x3f400000u,
         {static_cast<uint8_t>(pow2 ? 0x7a : 0x7e), static_cast<uint8_t>(pow2 ? 0xf2 : 0xf6),
          static_cast<uint8_t>(pow2 ? 0x38 : 0x3b)}},
        // amax: 3 / fp32(3 / 448) rounds to 448; pow2: 2^-7, 3 * 128 = 384 (0x7c)
        {{3.0f, 0.0f, 0.0f}, pow2 ? 0x3c000000u : s3_bits, {static_cast<uint8_t>(pow2 ? 0x7c : 0x7e), 0x00, 0x00}},
        // amax: 448 again; pow2: 0.5 / 448 -> 2^-9, 0.5 * 512 = 256 (0x78); -0 stays -0 (0x80)
        {{0.5f, -0.0f, 0.0f}, pow2 ? 0x3b000000u : s05_bits, {static_cast<uint8_t>(pow2 ? 0x78 : 0x7e), 0x80, 0x00}},
    };
    const std::vector<int64_t> slots = read_indices(cd.args.slot_mapping, ds.ts);
    int64_t t = 0;
    while (slots[t] < 0) ++t;  // the first written token
    for (case_data* c : {&cj, &cd}) {
      auto* row = static_cast<uint16_t*>(c->args.kv_c.data) + t * c->args.kv_c.strides_elems[0];
      for (int64_t d = 0; d < 512; ++d) {
        const tile_expect& e = tiles[d / 128];
        const float v = d % 128 < 3 ? e.value[d % 128] : 0.0f;
        row[d] = static_cast<uint16_t>(encode_from_f32(dtype::bf16, v, overflow_mode::ieee));
      }
    }
    reference_run(cj.args);
    reference_run(cd.args);
    const int64_t bs = ds.block_size;
    const int64_t estride = cd.args.cache.strides_elems[1], bstride = cd.args.cache.strides_elems[0];
    CHECK(estride == 656 + 8);
    CHECK(bstride == bs * (656 + 8) + 4);
    const auto* cache = static_cast<const uint8_t*>(cd.args.cache.data);
    const uint8_t* entry = cache + (slots[t] / bs) * bstride + (slots[t] % bs) * estride;
    for (int64_t k = 0; k < 4; ++k) {
      INFO("tile " << k);
      uint32_t scale_bits = 0;
      std::memcpy(&scale_bits, entry + 512 + 4 * k, 4);
      CHECK(scale_bits == tiles[k].scale_bits);
      for (int64_t i = 0; i < 128; ++i) {
        INFO("value " << i);
        CHECK(entry[k * 128 + i] == (i < 3 ? tiles[k].code[i] : 0x00));
      }
    }
    // every written entry's rope part: the joint bf16 cache's rope values, byte for byte
    const int64_t jbs = cj.args.cache.strides_elems[0], jes = cj.args.cache.strides_elems[1];
    const auto* jcache = static_cast<const uint8_t*>(cj.args.cache.data);
    int64_t written = 0;
    for (int64_t u = 0; u < ds.ts; ++u) {
      if (slots[u] < 0) continue;
      ++written;
      const uint8_t* e = cache + (slots[u] / bs) * bstride + (slots[u] % bs) * estride;
      const uint8_t* j = jcache + 2 * ((slots[u] / bs) * jbs + (slots[u] % bs) * jes + 512);
      CHECK(std::memcmp(e + 528, j, 128) == 0);
    }
    CHECK(written == 2);
    // nothing else written: 656 bytes per written entry left the poison, at most (a byte equal
    // to the poison pattern stays counted as poison)
    const host_buffer& b = cd.buffers.at("cache");
    CHECK(count_not_poison(b.data(), b.size_bytes()) <= written * 656);
    CHECK(count_not_poison(b.data(), b.size_bytes()) > written * 600);
    CHECK(b.guards_intact());
  }
}
