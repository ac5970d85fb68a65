// Every error rule of core/SPEC.md "Errors": the message (argument, expected, got) and a failed
// call that leaves the poisoned q_out and cache (and the in-place q_pe / k_pe) byte-for-byte as
// they were. Run through the reference backend's run_host, as a user would.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/validate.h"
#include "tests/cpp/hand_case.h"

using namespace ropekv;
using ropekv::test::hand_case;

namespace {

// Tq = 2, Ts = 3, Tk = 3, H = 2, Dn = 2, Dr = 4, P = 4, cache 2 blocks x 2 entries, f32, both
// in-place options on (so the in-place inputs are outputs that must also stay untouched).
// Shapes: q_nope [2, 2, 2], q_pe [2, 2, 4], q_out [2, 2, 6], kv_c [3, 2], k_pe [3, 4],
// cache [2, 2, 6], cos_sin [4, 4].
hand_case base_case() {
  hand_case c;
  c.tq = 2; c.ts = 3; c.tk = 3; c.heads = 2;
  c.opt.inplace_q = c.opt.inplace_k = true;
  c.init();
  return c;
}

struct error_case {
  const char* what;
  std::function<void(hand_case&)> setup;        // before args() (sizes, data, options)
  std::function<void(hand_case&, op_args&)> mutate;  // on the built args
  std::string arg, expected, got;               // got "*" = any; "prefix*" = starts with
};

void run_error_case(const error_case& ec) {
  INFO(std::string(ec.what));
  hand_case c = base_case();
  if (ec.setup) {
    ec.setup(c);
  }
  op_args a = c.args();
  if (ec.mutate) ec.mutate(c, a);
  const std::vector<float> q_pe_before = c.q_pe, k_pe_before = c.k_pe;
  auto be = make_cpu_backend();
  bool threw = false;
  try {
    be->run_host(a, {});
  } catch (const arg_error& e) {
    threw = true;
    CHECK(e.arg() == ec.arg);
    CHECK(e.expected() == ec.expected);
    if (!ec.got.empty() && ec.got.back() == '*') {
      CHECK(e.got().rfind(ec.got.substr(0, ec.got.size() - 1), 0) == 0);
    } else {
      CHECK(e.got() == ec.got);
    }
    CHECK(std::string(e.what()) == e.arg() + ": expected " + e.expected() + ", got " + e.got());
  }
  CHECK_MESSAGE(threw, "no arg_error");
  CHECK(c.outputs_not_poison() == 0);
  CHECK(c.q_pe == q_pe_before);
  CHECK(c.k_pe == k_pe_before);
}

const float nan_f = std::numeric_limits<float>::quiet_NaN();
const float inf_f = std::numeric_limits<float>::infinity();

}  // namespace

TEST_CASE("validate: presence, rank, dtype, stride, alignment, options") {
  const std::vector<error_case> cases = {
      {"q_out absent", nullptr, [](hand_case&, op_args& a) { a.q_out = {}; },
       "q_out", "a tensor [Tq, H, Dn + Dr]", "absent"},
      {"q_nope rank 2", nullptr,
       [](hand_case& c, op_args& a) { a.q_nope = make_view(dtype::f32, c.q_nope.data(), {4, 2}); },
       "q_nope", "rank 3", "rank 2 [4, 2]"},
      {"q_nope dtype i32", nullptr, [](hand_case&, op_args& a) { a.q_nope.type = dtype::i32; },
       "q_nope.dtype", "f32|f16|bf16", "i32"},
      {"q_pe dtype differs from q_nope", nullptr,
       [](hand_case&, op_args& a) { a.q_pe.type = dtype::bf16; a.q_pe.strides_elems = {16, 8, 1}; },
       "q_pe.dtype", "f32 (dtype of q_nope)", "bf16"},
      {"k_pe dtype differs from kv_c", nullptr, [](hand_case&, op_args& a) { a.k_pe.type = dtype::f16; },
       "k_pe.dtype", "f32 (dtype of kv_c)", "f16"},
      {"positions dtype f32", nullptr, [](hand_case&, op_args& a) { a.positions.type = dtype::f32; },
       "positions.dtype", "i32|i64", "f32"},
      {"slot_mapping dtype u8", nullptr, [](hand_case&, op_args& a) { a.slot_mapping.type = dtype::u8; },
       "slot_mapping.dtype", "i32|i64", "u8"},
      {"q_out dtype i64", nullptr, [](hand_case&, op_args& a) { a.q_out.type = dtype::i64; },
       "q_out.dtype", "f32|f16|bf16|fp8_e4m3fn|fp8_e4m3fnuz|fp8_e5m2|fp8_e5m2fnuz", "i64"},
      {"cos_sin dtype fp8", nullptr, [](hand_case&, op_args& a) { a.cos_sin.type = dtype::fp8_e4m3fn; },
       "cos_sin.dtype", "f32|f16|bf16", "fp8_e4m3fn"},
      {"q_pe innermost stride 2", nullptr,
       [](hand_case&, op_args& a) { a.q_pe.strides_elems = {16, 8, 2}; },
       "q_pe.strides[2]", "1 (innermost contiguous)", "2"},
      {"kv_c negative stride", nullptr, [](hand_case&, op_args& a) { a.kv_c.strides_elems[0] = -2; },
       "kv_c.strides[0]", ">= 0", "-2"},
      {"negative dim", nullptr, [](hand_case&, op_args& a) { a.k_pe.shape[0] = -1; },
       "k_pe.shape[0]", ">= 0", "-1"},
      {"misaligned q_nope", nullptr,
       [](hand_case& c, op_args& a) { a.q_nope.data = reinterpret_cast<uint8_t*>(c.q_nope.data()) + 1; },
       "q_nope", "data aligned to 4 bytes", "address *"},
      {"q_out on device", nullptr, [](hand_case&, op_args& a) { a.q_out.on_device = true; },
       "q_out", "host memory (like q_nope)", "device memory"},
      {"bad rope_style value", nullptr,
       [](hand_case&, op_args& a) { a.options.style = static_cast<rope_style>(7); },
       "options.style", "gptj, neox", "7"},
      {"bad scale_conv value", nullptr,
       [](hand_case&, op_args& a) { a.options.scale = static_cast<scale_conv>(2); },
       "options.scale_conv", "divide, reciprocal", "2"},
  };
  for (const auto& ec : cases) run_error_case(ec);
}

TEST_CASE("validate: shapes and sizes") {
  const std::vector<error_case> cases = {
      {"q_pe heads", nullptr,
       [](hand_case& c, op_args& a) { a.q_pe = make_view(dtype::f32, c.q_pe.data(), {2, 1, 4}); },
       "q_pe.shape[1]", "[2, 2, 4]", "[2, 1, 4]"},
      {"kv_c width", nullptr,
       [](hand_case& c, op_args& a) { a.kv_c = make_view(dtype::f32, c.kv_c.data(), {3, 3}, {2, 1}); },
       "kv_c.shape[1]", "[3, 2]", "[3, 3]"},
      {"k_pe width", nullptr,
       [](hand_case& c, op_args& a) { a.k_pe = make_view(dtype::f32, c.k_pe.data(), {3, 2}); },
       "k_pe.shape[1]", "[3, 4]", "[3, 2]"},
      {"positions length", nullptr,
       [](hand_case& c, op_args& a) { a.positions = make_view(dtype::i64, c.positions.data(), {2}); },
       "positions.shape[0]", "[3]", "[2]"},
      {"q_out width", nullptr,
       [](hand_case& c, op_args& a) { a.q_out = make_view(dtype::f32, c.q_out.data(), {2, 2, 5}); },
       "q_out.shape[2]", "[2, 2, 6]", "[2, 2, 5]"},
      {"H = 0", [](hand_case& c) { c.heads = 0; c.init(); }, nullptr, "q_nope.shape[1]", "H > 0", "0"},
      {"Dn = 0", [](hand_case& c) { c.dn = 0; c.init(); }, nullptr, "q_nope.shape[2]", "Dn > 0", "0"},
      {"Dr odd", [](hand_case& c) { c.dr = 3; c.init(); }, nullptr, "q_pe.shape[2]", "Dr even and > 0", "3"},
      {"Tq > Ts", [](hand_case& c) { c.tq = 3; c.ts = 2; c.init(); }, nullptr,
       "q_nope.shape[0]", "<= 2 (Ts, slot_mapping.shape[0])", "3"},
      {"Ts > Tk", [](hand_case& c) { c.tk = 2; c.init(); }, nullptr,
       "slot_mapping.shape[0]", "<= 2 (Tk, kv_c.shape[0])", "3"},
      {"cos_sin width", nullptr,
       [](hand_case& c, op_args& a) { a.cos_sin = make_view(dtype::f32, c.cos_sin.data(), {4, 2}); },
       "cos_sin.shape[1]", "[4, 4]", "[4, 2]"},
      {"cos_sin zero rows", nullptr,
       [](hand_case& c, op_args& a) { a.cos_sin = make_view(dtype::f32, c.cos_sin.data(), {0, 4}); },
       "cos_sin.shape[0]", "P > 0", "0"},
      {"table two: sin rows", [](hand_case& c) { c.table_two = true; },
       [](hand_case& c, op_args& a) { a.sin = make_view(dtype::f32, c.sin_t.data(), {3, 2}, {3, 1}); },
       "sin.shape[0]", "[4, 2]", "[3, 2]"},
      {"table two: cos width", [](hand_case& c) { c.table_two = true; },
       [](hand_case& c, op_args& a) { a.cos = make_view(dtype::f32, c.cos_t.data(), {4, 3}, {3, 1}); },
       "cos.shape[1]", "[4, 2]", "[4, 3]"},
      {"table two: sin missing", [](hand_case& c) { c.table_two = true; },
       [](hand_case&, op_args& a) { a.sin = {}; },
       "sin", "a table [P, Dr/2] (table two: cos is given)", "absent"},
      {"no table", nullptr, [](hand_case&, op_args& a) { a.cos_sin = {}; },
       "cos_sin", "a table [P, Dr], or cos and sin [P, Dr/2]", "absent"},
      {"both tables", nullptr,
       [](hand_case& c, op_args& a) { a.cos = make_view(dtype::f32, c.cos_t.data(), {4, 2}, {3, 1}); },
       "cos", "absent (table one: cos_sin is given)", "a tensor [4, 2]"},
      {"cache width", nullptr,
       [](hand_case& c, op_args& a) { a.cache = make_view(dtype::f32, c.cache.data(), {2, 2, 5}, {12, 6, 1}); },
       "cache.shape[2]", "[2, 2, 6]", "[2, 2, 5]"},
      {"cache block_size 0", nullptr,
       [](hand_case& c, op_args& a) { a.cache = make_view(dtype::f32, c.cache.data(), {2, 0, 6}); },
       "cache.shape[1]", "block_size > 0", "0"},
  };
  for (const auto& ec : cases) run_error_case(ec);
}

TEST_CASE("validate: cache layout and overlapping entries") {
  auto split = [](hand_case& c) { c.opt.layout = cache_layout::split; };
  const std::vector<error_case> cases = {
      {"joint: cache missing", nullptr, [](hand_case&, op_args& a) { a.cache = {}; },
       "cache", "a tensor [num_blocks, block_size, Dn + Dr] (layout joint)", "absent"},
      {"joint: ckv_cache given", nullptr,
       [](hand_case& c, op_args& a) { a.ckv_cache = make_view(dtype::f32, c.ckv.data(), {2, 2, 2}); },
       "ckv_cache", "absent (layout joint)", "a tensor [2, 2, 2]"},
      {"split: cache given", split,
       [](hand_case& c, op_args& a) { a.cache = make_view(dtype::f32, c.cache.data(), {2, 2, 6}); },
       "cache", "absent (layout split)", "a tensor [2, 2, 6]"},
      {"split: kpe_cache missing", split, [](hand_case&, op_args& a) { a.kpe_cache = {}; },
       "kpe_cache", "a tensor [num_blocks, block_size, Dr] (layout split)", "absent"},
      {"split: kpe_cache dtype", split,
       [](hand_case&, op_args& a) { a.kpe_cache.type = dtype::bf16; a.kpe_cache.strides_elems = {16, 8, 1}; },
       "kpe_cache.dtype", "f32 (dtype of ckv_cache)", "bf16"},
      {"split: kpe_cache blocks", split,
       [](hand_case& c, op_args& a) { a.kpe_cache = make_view(dtype::f32, c.kpe.data(), {1, 2, 4}); },
       "kpe_cache.shape[0]", "[2, 2, 4]", "[1, 2, 4]"},
      {"joint: entry stride < row width", nullptr,
       [](hand_case&, op_args& a) { a.cache.strides_elems = {12, 5, 1}; },
       "cache.strides[1]", ">= 6 (row width)", "5"},
      {"joint: block stride < block_size x entry stride", nullptr,
       [](hand_case&, op_args& a) { a.cache.strides_elems = {11, 6, 1}; },
       "cache.strides[0]", ">= 12 (block_size x entry stride)", "11"},
      {"split: ckv entries overlap", split,
       [](hand_case&, op_args& a) { a.ckv_cache.strides_elems = {4, 1, 1}; },
       "ckv_cache.strides[1]", ">= 2 (row width)", "1"},
      {"split: kpe blocks overlap", split,
       [](hand_case&, op_args& a) { a.kpe_cache.strides_elems = {4, 4, 1}; },
       "kpe_cache.strides[0]", ">= 8 (block_size x entry stride)", "4"},
  };
  for (const auto& ec : cases) run_error_case(ec);
}

TEST_CASE("validate: outputs overlapping outputs or inputs") {
  const std::vector<error_case> cases = {
      {"cache over q_out", nullptr,
       [](hand_case& c, op_args& a) { a.cache = make_view(dtype::f32, c.q_out.data(), {2, 2, 6}); },
       "q_out", "memory disjoint from output cache", "overlapping cache"},
      {"kv_c inside q_out", nullptr,
       [](hand_case& c, op_args& a) { a.kv_c = make_view(dtype::f32, c.q_out.data() + 8, {3, 2}); },
       "q_out", "memory disjoint from input kv_c", "overlapping kv_c"},
      {"q_nope inside q_out, not its prefix", nullptr,
       [](hand_case& c, op_args& a) {
         a.q_nope = make_view(dtype::f32, c.q_out.data() + 4, {2, 2, 2}, {12, 6, 1});
       },
       "q_out", "memory disjoint from input q_nope", "overlapping q_nope"},
      {"cos_sin inside q_out", nullptr,
       [](hand_case& c, op_args& a) { a.cos_sin = make_view(dtype::f32, c.q_out.data(), {4, 4}); },
       "q_out", "memory disjoint from input cos_sin", "overlapping cos_sin"},
      {"in-place k_pe inside cache", nullptr,
       [](hand_case& c, op_args& a) { a.k_pe = make_view(dtype::f32, c.cache.data(), {3, 4}); },
       "cache", "memory disjoint from output k_pe", "overlapping k_pe"},
      {"k_pe (input) inside cache", [](hand_case& c) { c.opt.inplace_k = false; },
       [](hand_case& c, op_args& a) { a.k_pe = make_view(dtype::f32, c.cache.data(), {3, 4}); },
       "cache", "memory disjoint from input k_pe", "overlapping k_pe"},
      {"in-place q_pe over q_nope", nullptr,
       [](hand_case& c, op_args& a) { a.q_nope = make_view(dtype::f32, c.q_pe.data(), {2, 2, 2}, {8, 4, 1}); },
       "q_pe", "memory disjoint from input q_nope", "overlapping q_nope"},
      {"split: kpe_cache over ckv_cache", [](hand_case& c) { c.opt.layout = cache_layout::split; },
       [](hand_case& c, op_args& a) { a.kpe_cache = make_view(dtype::f32, c.ckv.data(), {2, 2, 4}, {2, 1, 1}); },
       "kpe_cache.strides[1]", ">= 4 (row width)", "1"},
      {"split: kpe_cache shares ckv_cache bytes",
       [](hand_case& c) { c.opt.layout = cache_layout::split; c.entry_pad = 6; c.init(); },  // ckv: 32 floats
       [](hand_case& c, op_args& a) { a.kpe_cache = make_view(dtype::f32, c.ckv.data() + 4, {2, 2, 4}); },
       "ckv_cache", "memory disjoint from output kpe_cache", "overlapping kpe_cache"},
  };
  for (const auto& ec : cases) run_error_case(ec);
}

TEST_CASE("validate: outputs that alias themselves") {
  // q_out [2, 2, 6] strides [12, 6, 1]; q_pe [2, 2, 4] [8, 4, 1]; k_pe [3, 4] [4, 1].
  const std::string no_alias = ": an output must not alias itself)";
  const std::vector<error_case> cases = {
      {"q_out head stride 0", nullptr, [](hand_case&, op_args& a) { a.q_out.strides_elems[1] = 0; },
       "q_out.strides[1]", ">= 6 (span of dims 2" + no_alias, "0"},
      {"q_out head stride 5 < row width", nullptr, [](hand_case&, op_args& a) { a.q_out.strides_elems[1] = 5; },
       "q_out.strides[1]", ">= 6 (span of dims 2" + no_alias, "5"},
      {"q_out token stride 0", nullptr, [](hand_case&, op_args& a) { a.q_out.strides_elems[0] = 0; },
       "q_out.strides[0]", ">= 6 (span of dims 2" + no_alias, "0"},
      {"q_out token stride 11 < H x row", nullptr, [](hand_case&, op_args& a) { a.q_out.strides_elems[0] = 11; },
       "q_out.strides[0]", ">= 12 (span of dims 2,1" + no_alias, "11"},
      {"q_out token stride == head stride", nullptr,
       [](hand_case&, op_args& a) { a.q_out.strides_elems[0] = 6; },
       "q_out.strides[1]", ">= 12 (span of dims 2,0" + no_alias, "6"},
      {"head-major q_out whose heads overlap", nullptr,
       [](hand_case&, op_args& a) { a.q_out.strides_elems = {6, 11, 1}; },
       "q_out.strides[1]", ">= 12 (span of dims 2,0" + no_alias, "11"},
      {"in-place q_pe token stride 0", nullptr, [](hand_case&, op_args& a) { a.q_pe.strides_elems[0] = 0; },
       "q_pe.strides[0]", ">= 4 (span of dims 2" + no_alias, "0"},
      {"in-place k_pe token stride 3 < Dr", nullptr, [](hand_case&, op_args& a) { a.k_pe.strides_elems[0] = 3; },
       "k_pe.strides[0]", ">= 4 (span of dims 1" + no_alias, "3"},
  };
  for (const auto& ec : cases) run_error_case(ec);
}

TEST_CASE("validate: extents that overflow int64, null data, wrapping address ranges") {
  const int64_t big = int64_t{1} << 62;
  const std::vector<error_case> cases = {
      {"cache block stride 2^62", nullptr, [big](hand_case&, op_args& a) { a.cache.strides_elems[0] = big; },
       "cache", "a byte extent that fits in int64", "overflow"},
      {"q_out token stride 2^61 (f32: 2^63 bytes)", nullptr,
       [](hand_case&, op_args& a) { a.q_out.strides_elems[0] = int64_t{1} << 61; },
       "q_out", "a byte extent that fits in int64", "overflow"},
      {"q_out token stride 2^63 - 1", nullptr,
       [](hand_case&, op_args& a) { a.q_out.strides_elems[0] = INT64_MAX; },
       "q_out", "a byte extent that fits in int64", "overflow"},
      {"cos_sin with 2^62 rows", nullptr, [big](hand_case&, op_args& a) { a.cos_sin.shape[0] = big; },
       "cos_sin", "a byte extent that fits in int64", "overflow"},
      {"kv_c row stride 2^62 (an input)", nullptr, [big](hand_case&, op_args& a) { a.kv_c.strides_elems[0] = big; },
       "kv_c", "a byte extent that fits in int64", "overflow"},
      {"split: ckv_cache entry stride 2^62", [](hand_case& c) { c.opt.layout = cache_layout::split; },
       [big](hand_case&, op_args& a) { a.ckv_cache.strides_elems[1] = big; },
       "ckv_cache", "a byte extent that fits in int64", "overflow"},
      {"broadcast q_nope of 2^64 elements", nullptr,
       [](hand_case&, op_args& a) {
         a.q_nope.shape[0] = a.q_nope.shape[1] = int64_t{1} << 32;
         a.q_nope.strides_elems[0] = a.q_nope.strides_elems[1] = 0;
       },
       "q_nope", "an element count that fits in int64", "overflow [4294967296, 4294967296, 2]"},
      {"Dn + Dr overflows (Tq = Ts = Tk = 0)", nullptr,
       [](hand_case&, op_args& a) {
         a.q_nope.shape = {0, 2, INT64_MAX};
         a.q_pe.shape[0] = 0;
         a.kv_c.shape = {0, INT64_MAX};
         a.k_pe.shape[0] = a.positions.shape[0] = a.slot_mapping.shape[0] = 0;
         a.q_out.shape[0] = 0;
       },
       "q_nope.shape[2]", "Dn + Dr that fits in int64", "overflow"},
      {"q_out data null", nullptr, [](hand_case&, op_args& a) { a.q_out.data = nullptr; },
       "q_out.data", "non-null", "null"},
      {"cache data null", nullptr, [](hand_case&, op_args& a) { a.cache.data = nullptr; },
       "cache.data", "non-null", "null"},
      {"in-place q_pe data null", nullptr, [](hand_case&, op_args& a) { a.q_pe.data = nullptr; },
       "q_pe.data", "non-null", "null"},
      {"positions data null", nullptr, [](hand_case&, op_args& a) { a.positions.data = nullptr; },
       "positions.data", "non-null", "null"},
      {"split: kpe_cache data null", [](hand_case& c) { c.opt.layout = cache_layout::split; },
       [](hand_case&, op_args& a) { a.kpe_cache.data = nullptr; },
       "kpe_cache.data", "non-null", "null"},
      {"q_out range wraps past the end of the address space", nullptr,
       [](hand_case&, op_args& a) { a.q_out.data = reinterpret_cast<void*>(UINTPTR_MAX - 7); },
       "q_out", "96 bytes from address 0xfffffffffffffff8 inside the address space", "a range that wraps around"},
  };
  for (const auto& ec : cases) run_error_case(ec);
}

TEST_CASE("validate: scales") {
  const std::vector<error_case> cases = {
      {"k_scale NaN", [](hand_case& c) { c.k_scale = nan_f; }, nullptr, "k_scale", "finite and > 0", "nan"},
      {"k_scale inf", [](hand_case& c) { c.k_scale = inf_f; }, nullptr, "k_scale", "finite and > 0", "inf"},
      {"k_scale 0", [](hand_case& c) { c.k_scale = 0.0f; }, nullptr, "k_scale", "finite and > 0", "0"},
      {"k_scale -1", [](hand_case& c) { c.k_scale = -1.0f; }, nullptr, "k_scale", "finite and > 0", "-1"},
      {"q_scale -0.5", [](hand_case& c) { c.q_scale = -0.5f; }, nullptr, "q_scale", "finite and > 0", "-0.5"},
      {"q_scale -inf", [](hand_case& c) { c.q_scale = -inf_f; }, nullptr, "q_scale", "finite and > 0", "-inf"},
      {"q_scale NaN, fp8 q_out", [](hand_case& c) { c.q_out_dtype = dtype::fp8_e4m3fn; c.init(); c.q_scale = nan_f; },
       nullptr, "q_scale", "finite and > 0", "nan"},
  };
  for (const auto& ec : cases) run_error_case(ec);
}

TEST_CASE("validate: slot and position values") {
  const std::vector<error_case> cases = {
      {"slot = capacity", [](hand_case& c) { c.slots = {0, 4, 1}; }, nullptr, "slot_mapping[1]", "< 4", "4"},
      {"slot huge", [](hand_case& c) { c.slots = {0, 1, int64_t{1} << 40}; }, nullptr,
       "slot_mapping[2]", "< 4", "1099511627776"},
      {"duplicate slot", [](hand_case& c) { c.slots = {2, -1, 2}; }, nullptr,
       "slot_mapping[2]", "unique slot", "2 (also at token 0)"},
      {"two duplicates: the earliest repeat is named", [](hand_case& c) { c.slots = {3, 3, 3}; }, nullptr,
       "slot_mapping[1]", "unique slot", "3 (also at token 0)"},
      {"position = P of a written token", [](hand_case& c) { c.positions = {0, 0, 4}; }, nullptr,
       "positions[2]", "[0, 4)", "4"},
      {"negative position", [](hand_case& c) { c.positions = {-1, 0, 0}; }, nullptr,
       "positions[0]", "[0, 4)", "-1"},
      {"position of a padding token whose q is computed",
       [](hand_case& c) { c.slots = {0, -1, 1}; c.positions = {0, 9, 0}; }, nullptr,
       "positions[1]", "[0, 4)", "9"},
      {"i32 slot out of range (sign-extended indices)",
       [](hand_case& c) { c.slots = {0, 1, 2}; },
       [](hand_case& c, op_args& a) {
         static int32_t slots32[3];
         slots32[0] = -1; slots32[1] = 5; slots32[2] = 0;
         a.slot_mapping = make_view(dtype::i32, slots32, {3});
       },
       "slot_mapping[1]", "< 4", "5"},
  };
  for (const auto& ec : cases) run_error_case(ec);
}

TEST_CASE("validate: accepted calls") {
  auto be = make_cpu_backend();
  SUBCASE("unused tokens' positions are never read") {
    hand_case c = base_case();
    c.ts = 2;
    c.tq = 1;
    c.init();
    c.slots = {0, -1};             // token 1: padding and t >= Tq: unused
    c.positions = {0, 1000, -5};   // token 2: t >= Ts
    CHECK_NOTHROW(be->run_host(c.args(), {}));
  }
  SUBCASE("repeated padding slots are fine") {
    hand_case c = base_case();
    c.slots = {-1, -1, 3};
    CHECK_NOTHROW(be->run_host(c.args(), {}));
  }
  SUBCASE("check_values = false skips slot and position values") {
    hand_case c = base_case();
    c.slots = {7, 7, 7};
    c.positions = {99, 99, 99};
    CHECK_NOTHROW(validate(c.args(), false));
    CHECK_THROWS_AS(validate(c.args(), true), arg_error);
  }
  SUBCASE("kv_c and k_pe as column slices of one [Tk, Dn + Dr] buffer, k_pe in place") {
    hand_case c = base_case();
    c.opt.inplace_q = false;
    std::vector<float> kv(static_cast<size_t>(c.tk * 6));
    for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>(i);
    for (int64_t p = 0; p < c.rows; ++p) c.set_table_row(p, {0, 0}, {1, 1});  // a' = -b, b' = a
    op_args a = c.args();
    a.kv_c = make_view(dtype::f32, kv.data(), {c.tk, 2}, {6, 1});
    a.k_pe = make_view(dtype::f32, kv.data() + 2, {c.tk, 4}, {6, 1});
    REQUIRE_NOTHROW(be->run_host(a, {}));
    // each row [n0, n1, a0, b0, a1, b1] -> [n0, n1, -b0, a0, -b1, a1]
    CHECK(std::vector<float>(kv.begin(), kv.begin() + 6) == std::vector<float>{0, 1, -3, 2, -5, 4});
    CHECK(std::vector<float>(kv.begin() + 12, kv.end()) == std::vector<float>{12, 13, -15, 14, -17, 16});
    CHECK(c.cache_at(2, 0) == 12);
    CHECK(c.cache_at(2, 2) == -15);
  }
  SUBCASE("q_nope is the first Dn columns of q_out (zero-copy concat)") {
    hand_case c = base_case();
    c.opt.inplace_q = false;
    // write q_nope's values into q_out's nope columns, then alias
    for (int64_t t = 0; t < c.tq; ++t) {
      for (int64_t h = 0; h < c.heads; ++h) {
        for (int64_t d = 0; d < c.dn; ++d) {
          const float v = 100.0f + static_cast<float>((t * c.heads + h) * c.dn + d);
          std::memcpy(c.q_out.data() + ((t * c.heads + h) * 6 + d) * 4, &v, 4);
        }
      }
    }
    op_args a = c.args();
    a.q_nope = make_view(dtype::f32, c.q_out.data(), {c.tq, c.heads, c.dn}, {c.heads * 6, 6, 1});
    REQUIRE_NOTHROW(be->run_host(a, {}));
    CHECK(c.q_out_at(1, 1, 0) == 106);
    CHECK(c.q_out_at(1, 1, 1) == 107);
    CHECK(c.q_out_at(1, 1, 2) == 212);  // identity table: rope(q_pe) = q_pe
  }
  SUBCASE("a head-major q_out ([H, Tq, Dn + Dr] memory) is a valid output") {
    hand_case c = base_case();
    op_args a = c.args();
    a.q_out.strides_elems = {6, 12, 1};  // token t, head h at (h * Tq + t) * 6
    REQUIRE_NOTHROW(be->run_host(a, {}));
    // identity table: q_out[t=1, h=0] = [q_nope[1, 0] | q_pe[1, 0]], stored at row 1
    const float* q = reinterpret_cast<const float*>(c.q_out.data());
    CHECK(q[6 + 0] == 104);
    CHECK(q[6 + 2] == 208);
  }
  SUBCASE("inputs may alias themselves: q_nope broadcast over heads, q_pe over tokens") {
    hand_case c = base_case();
    c.opt.inplace_q = false;
    op_args a = c.args();
    a.q_nope.strides_elems[1] = 0;  // every head reads head 0's row
    a.q_pe.strides_elems[0] = 0;    // every token reads token 0's rows
    REQUIRE_NOTHROW(be->run_host(a, {}));
    CHECK(c.q_out_at(1, 1, 0) == 104);  // q_nope[1, 0, 0]
    CHECK(c.q_out_at(1, 1, 2) == 204);  // q_pe[0, 1, 0]
  }
  SUBCASE("an output of extent 1 in a dim may have any stride there") {
    hand_case c = base_case();
    c.tq = 1;
    c.init();
    op_args a = c.args();
    a.q_out.strides_elems[0] = 0;  // one token: its stride is never used
    CHECK_NOTHROW(be->run_host(a, {}));
  }
  SUBCASE("tensors without elements may have null data") {
    hand_case c = base_case();
    c.tq = 0;
    c.init();
    op_args a = c.args();
    a.q_out.data = nullptr;
    a.q_nope.data = nullptr;
    a.q_pe.data = nullptr;
    REQUIRE_NOTHROW(be->run_host(a, {}));
    CHECK(c.cache_at(1, 0) == 302);  // the cache is still written
  }
  SUBCASE("q_pe in place next to q_nope in one [Tq, H, Dn + Dr] buffer") {
    hand_case c = base_case();
    std::vector<float> q(static_cast<size_t>(c.tq * c.heads * 6), 1.0f);
    op_args a = c.args();
    a.q_nope = make_view(dtype::f32, q.data(), {c.tq, c.heads, 2}, {c.heads * 6, 6, 1});
    a.q_pe = make_view(dtype::f32, q.data() + 2, {c.tq, c.heads, 4}, {c.heads * 6, 6, 1});
    CHECK_NOTHROW(be->run_host(a, {}));
  }
}

// The slot checks against a plain statement of the rule, on random slot_mappings with many
// repeats, padding (-1) and out-of-range slots: the first out-of-range token in token order,
// else the earliest token that repeats a slot of an earlier token and that slot's first token.
// Small cache: validate's bitmap; large cache (capacity > 64 Ts + 65536): its sort.
TEST_CASE("validate: slot errors name the same token as the rule, bitmap and sort alike") {
  std::mt19937_64 rng(20261130);
  for (const int64_t nb : {int64_t{4}, int64_t{1100}}) {
    const int64_t bs = nb == 4 ? 4 : 64;
    const int64_t capacity = nb * bs;
    int errors_seen = 0, dups_seen = 0;
    for (int trial = 0; trial < 300; ++trial) {
      hand_case c;
      c.ts = c.tk = 1 + static_cast<int64_t>(rng() % 24);
      c.tq = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(c.ts));
      c.nb = nb;
      c.bs = bs;
      c.init();
      // slots drawn from a small window so repeats are common; sometimes one out of range
      const int64_t window = 2 + static_cast<int64_t>(rng() % static_cast<uint64_t>(std::min<int64_t>(40, capacity - 2)));
      const int64_t base = static_cast<int64_t>(rng() % static_cast<uint64_t>(capacity - window + 1));
      for (int64_t& s : c.slots) {
        const uint64_t r = rng() % 100;
        s = r < 10 ? -1 : r < 13 ? capacity + static_cast<int64_t>(rng() % 3) : base + static_cast<int64_t>(rng() % static_cast<uint64_t>(window));
      }
      // the rule, stated plainly
      std::string arg, got;
      for (int64_t t = 0; t < c.ts && arg.empty(); ++t) {
        if (c.slots[static_cast<size_t>(t)] >= capacity) {
          arg = "slot_mapping[" + std::to_string(t) + "]";
          got = std::to_string(c.slots[static_cast<size_t>(t)]);
        }
      }
      for (int64_t t = 0; t < c.ts && arg.empty(); ++t) {
        const int64_t s = c.slots[static_cast<size_t>(t)];
        for (int64_t k = 0; k < t && s >= 0; ++k) {
          if (c.slots[static_cast<size_t>(k)] == s) {
            arg = "slot_mapping[" + std::to_string(t) + "]";
            got = std::to_string(s) + " (also at token " + std::to_string(k) + ")";
            ++dups_seen;
            break;
          }
        }
      }
      const op_args a = c.args();
      INFO("nb=", nb, " trial ", trial);
      if (arg.empty()) {
        CHECK_NOTHROW(validate(a, true));
        continue;
      }
      ++errors_seen;
      try {
        validate(a, true);
        FAIL_CHECK("no arg_error, expected ", arg, " ", got);
      } catch (const arg_error& e) {
        CHECK(e.arg() == arg);
        CHECK(e.got() == got);
      }
    }
    CHECK(errors_seen > 100);  // the stream exercises the rule (and passes some calls)
    CHECK(dups_seen > 50);
    CHECK(errors_seen < 300);
  }
}
