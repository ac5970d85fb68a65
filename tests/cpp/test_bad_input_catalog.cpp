// The bad-input catalog. Each row starts from a valid case built by make_case (bf16
// inputs and outputs, both in-place options on, real strides), breaks exactly one thing, and
// runs the call through backend::run_host of EVERY backend compiled in (ref, sim, and hip in a
// GPU build). For each row and backend:
//   - the call throws arg_error naming the expected argument, with a non-empty expected and got
//     and what() == "<arg>: expected <expected>, got <got>" containing the row's fragment;
//   - every buffer of the case (inputs, poisoned q_out and cache, in-place q_pe / k_pe, guards)
//     is byte-for-byte what it was before the call.
// The same base cases, unbroken, run without error and write q_out and the cache (so a row's
// error comes from its one change, not from a broken base).
//
// List every case with its expected error:
//   ROPEKV_LIST_CATALOG=1 ropekv_tests -tc='bad-input catalog*'
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <limits>
#include <string>
#include <vector>

#include "core/case_data.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/problem.h"
#include "core/validate.h"
#include "tools/backends_registry.h"

using namespace ropekv;

namespace {

// Tq = 3, Ts = 4, Tk = 5, H = 4, Dn = 32, Dr = 16, P = 64, cache 4 blocks x 4 entries (16 slots).
// Shapes: q_nope [3, 4, 32], q_pe [3, 4, 16], q_out [3, 4, 48], kv_c [5, 32], k_pe [5, 16],
// positions [5], slot_mapping [4], cos_sin [64, 16], cache [4, 4, 48] (or ckv [4, 4, 32] and
// kpe [4, 4, 16]).
constexpr int64_t tq = 3, ts = 4, tk = 5, heads = 4, dn = 32, dr = 16, rows = 64, bs = 4, nb = 4;
constexpr int64_t capacity = nb * bs;

problem base_problem() {
  problem p;
  p.tq = tq; p.ts = ts; p.tk = tk; p.heads = heads; p.dn = dn; p.dr = dr;
  p.table_rows = rows; p.block_size = bs; p.num_blocks = nb;
  p.in_dtype = p.table_dtype = p.q_out_dtype = p.cache_dtype = dtype::bf16;
  p.opt.inplace_q = p.opt.inplace_k = true;
  p.seed = 7;
  return p;
}

void split(problem& p) { p.opt.layout = cache_layout::split; }
void table_two(problem& p) { p.table = table_kind::two; }
// Layout shuffled: one block of 16 entries (its tile), the same 16 slots.
void shuffled(problem& p) {
  p.opt.layout = cache_layout::shuffled;
  p.block_size = 16;
  p.num_blocks = 1;
}
// Layout fp8_ds_mla: its fixed sizes (Dn 512, Dr 64), u8 entries of 656 bytes: cache [4, 4, 656].
void ds_mla(problem& p) {
  p.opt.layout = cache_layout::fp8_ds_mla;
  p.cache_dtype = dtype::u8;
  p.dn = 512;
  p.dr = 64;
}
void fp8_outputs(problem& p) {
  p.q_out_dtype = dtype::fp8_e4m3fn;
  p.cache_dtype = dtype::fp8_e4m3fn;
  p.k_scale = 0.5f;
  p.q_scale = 2.0f;
}

// Scales as [1] f32 tensors (scales=tensor), fp8 outputs so that they matter.
void scale_tensors(problem& p) {
  fp8_outputs(p);
  p.scales = scale_storage::tensor;
}
// All three decode outputs, N = 2 < Tq = 3: decode_q_pe_out [2, 4, 16], q_nope_zeros_out
// [2, 4, 32], k_pe_out [5, 16].
void decode_outputs(problem& p) {
  p.dec_q_pe = p.dec_zeros = p.dec_k_pe = true;
  p.dec_tokens = 2;
}
// Two kv heads (core/SPEC.md "kv heads"): kv_c [5, 2, 32], k_pe [5, 2, 16], cache [4, 2, 4, 48]
// (seed 7: vLLM's memory order, heads inner: strides [384, 48, 96, 1]).
void kv_heads(problem& p) { p.kv_heads = 2; }
void kv_heads_split(problem& p) {
  kv_heads(p);
  split(p);
}
// ... with k_pe_out [5, 2, 16]
void kv_heads_k_pe_out(problem& p) {
  kv_heads(p);
  p.dec_k_pe = true;
}
void set_f32(const tensor_view& v, float x) { std::memcpy(v.data, &x, sizeof x); }

uint8_t* buf(case_data& c, const char* name) { return c.buffers.at(name).data(); }

void set_index(const tensor_view& v, int64_t i, int64_t value) {
  store_bits(v.type, static_cast<uint8_t*>(v.data) + i * v.strides_elems[0] * dtype_size_bytes(v.type),
             static_cast<uint64_t>(value));
}
int64_t get_index(const tensor_view& v, int64_t i) {
  const uint64_t bits =
      load_bits(v.type, static_cast<uint8_t*>(v.data) + i * v.strides_elems[0] * dtype_size_bytes(v.type));
  return v.type == dtype::i32 ? static_cast<int64_t>(static_cast<int32_t>(bits)) : static_cast<int64_t>(bits);
}

struct bad_case {
  const char* name;
  std::function<void(problem&)> prep;                  // on the problem before make_case
  std::function<void(case_data&, op_args&)> mutate;    // the one broken thing
  std::string arg;                                     // arg_error::arg(), exactly
  std::string fragment;                                // must occur in what()
};

const float nan_f = std::numeric_limits<float>::quiet_NaN();
const float inf_f = std::numeric_limits<float>::infinity();

std::vector<bad_case> catalog() {
  using C = case_data;
  using A = op_args;
  return {
      // --- shapes
      {"q_pe has fewer heads than q_nope", nullptr, [](C&, A& a) { a.q_pe.shape[1] = heads - 1; },
       "q_pe.shape[1]", "expected [3, 4, 16], got [3, 3, 16]"},
      {"kv_c narrower than Dn", nullptr, [](C&, A& a) { a.kv_c.shape[1] = dn - 1; },
       "kv_c.shape[1]", "expected [5, 32], got [5, 31]"},
      {"k_pe rows != Tk", nullptr, [](C&, A& a) { a.k_pe.shape[0] = tk - 1; },
       "k_pe.shape[0]", "expected [5, 16], got [4, 16]"},
      {"q_out one column too wide", nullptr, [](C&, A& a) { a.q_out.shape[2] = dn + dr + 1; },
       "q_out.shape[2]", "expected [3, 4, 48], got [3, 4, 49]"},
      {"positions shorter than Tk", nullptr, [](C&, A& a) { a.positions.shape[0] = tk - 2; },
       "positions.shape[0]", "expected [5], got [3]"},
      {"cache row width != Dn + Dr", nullptr, [](C&, A& a) { a.cache.shape[2] = dn + dr - 2; },
       "cache.shape[2]", "expected [4, 4, 48], got [4, 4, 46]"},
      {"odd Dr", nullptr,
       [](C&, A& a) { a.q_pe.shape[2] = dr - 1; a.k_pe.shape[1] = dr - 1; },
       "q_pe.shape[2]", "expected Dr even and > 0, got 15"},
      {"Tq > Ts", nullptr, [](C&, A& a) { a.slot_mapping.shape[0] = tq - 1; },
       "q_nope.shape[0]", "expected <= 2 (Ts, slot_mapping.shape[0]), got 3"},
      {"Ts > Tk", nullptr,
       [](C&, A& a) { a.kv_c.shape[0] = a.k_pe.shape[0] = a.positions.shape[0] = ts - 1; },
       "slot_mapping.shape[0]", "expected <= 3 (Tk, kv_c.shape[0]), got 4"},
      {"negative dimension", nullptr, [](C&, A& a) { a.kv_c.shape[0] = -1; },
       "kv_c.shape[0]", "expected >= 0, got -1"},
      // --- rank
      {"q_nope rank 2", nullptr,
       [](C&, A& a) { a.q_nope = make_view(a.q_nope.type, a.q_nope.data, {tq * heads, dn}); },
       "q_nope", "expected rank 3, got rank 2 [12, 32]"},
      {"cache rank 4 with 4 kv heads, kv_c with 1", nullptr,
       [](C&, A& a) { a.cache = make_view(a.cache.type, a.cache.data, {nb, bs, 1, dn + dr}); },
       "cache.shape[1]", "expected 1 (KH, kv heads of kv_c), got 4"},
      {"cache rank 2", nullptr, [](C&, A& a) { a.cache = make_view(a.cache.type, a.cache.data, {nb * bs, dn + dr}); },
       "cache", "expected rank 3 [num_blocks, block_size, D] or 4 [num_blocks, KH, block_size, D], got rank 2 [16, 48]"},
      {"slot_mapping rank 2", nullptr,
       [](C&, A& a) { a.slot_mapping = make_view(a.slot_mapping.type, a.slot_mapping.data, {2, 2}); },
       "slot_mapping", "expected rank 1, got rank 2 [2, 2]"},
      // --- dtype
      {"q_nope dtype i32", nullptr, [](C&, A& a) { a.q_nope.type = dtype::i32; },
       "q_nope.dtype", "expected f32|f16|bf16, got i32"},
      {"k_pe dtype differs from kv_c", nullptr, [](C&, A& a) { a.k_pe.type = dtype::f16; },
       "k_pe.dtype", "expected bf16 (dtype of kv_c), got f16"},
      {"slot_mapping dtype f32", nullptr, [](C&, A& a) { a.slot_mapping.type = dtype::f32; },
       "slot_mapping.dtype", "expected i32|i64, got f32"},
      {"positions dtype u8", nullptr, [](C&, A& a) { a.positions.type = dtype::u8; },
       "positions.dtype", "expected i32|i64, got u8"},
      {"q_out dtype i32", nullptr, [](C&, A& a) { a.q_out.type = dtype::i32; },
       "q_out.dtype", "got i32"},
      {"cache dtype i64", nullptr, [](C&, A& a) { a.cache.type = dtype::i64; },
       "cache.dtype", "got i64"},
      {"cos_sin dtype fp8", nullptr, [](C&, A& a) { a.cos_sin.type = dtype::fp8_e5m2; },
       "cos_sin.dtype", "expected f32|f16|bf16, got fp8_e5m2"},
      {"split: kpe_cache dtype differs from ckv_cache", split,
       [](C&, A& a) { a.kpe_cache.type = dtype::f16; },
       "kpe_cache.dtype", "expected bf16 (dtype of ckv_cache), got f16"},
      // --- strides
      {"q_pe innermost dim not contiguous", nullptr, [](C&, A& a) { a.q_pe.strides_elems[2] = 2; },
       "q_pe.strides[2]", "expected 1 (innermost contiguous), got 2"},
      {"cache innermost stride 0", nullptr, [](C&, A& a) { a.cache.strides_elems[2] = 0; },
       "cache.strides[2]", "expected 1 (innermost contiguous), got 0"},
      {"kv_c negative row stride (reversed view)", nullptr,
       [](C&, A& a) {
         a.kv_c.data = static_cast<uint8_t*>(a.kv_c.data) + (tk - 1) * a.kv_c.strides_elems[0] * 2;
         a.kv_c.strides_elems[0] = -a.kv_c.strides_elems[0];
       },
       "kv_c.strides[0]", "expected >= 0, got -32"},
      {"q_out negative head stride", nullptr,
       [](C&, A& a) { a.q_out.strides_elems[1] = -a.q_out.strides_elems[1]; },
       "q_out.strides[1]", "expected >= 0, got -48"},
      {"cache negative block stride", nullptr,
       [](C&, A& a) { a.cache.strides_elems[0] = -a.cache.strides_elems[0]; },
       "cache.strides[0]", "expected >= 0, got -192"},
      // --- cache layouts whose entries overlap
      {"cache entry stride < row width", nullptr,
       [](C&, A& a) { a.cache.strides_elems = {bs * (dn + dr - 1), dn + dr - 1, 1}; },
       "cache.strides[1]", "expected >= 48 (row width), got 47"},
      {"cache block stride < block_size x entry stride", nullptr,
       [](C&, A& a) { a.cache.strides_elems = {bs * (dn + dr) - 1, dn + dr, 1}; },
       "cache.strides[0]", "expected >= 192 (block_size x entry stride), got 191"},
      {"split: ckv_cache entry stride < Dn", split,
       [](C&, A& a) { a.ckv_cache.strides_elems = {bs * dn, dn / 2, 1}; },
       "ckv_cache.strides[1]", "expected >= 32 (row width), got 16"},
      {"split: kpe_cache blocks overlap (block stride 0)", split,
       [](C&, A& a) { a.kpe_cache.strides_elems[0] = 0; },
       "kpe_cache.strides[0]", "expected >= 64 (block_size x entry stride), got 0"},
      {"split: caches of different block counts", split,
       [](C&, A& a) { a.kpe_cache.shape[0] = nb - 1; },
       "kpe_cache.shape[0]", "expected [4, 4, 16], got [3, 4, 16]"},
      {"split: caches of different block sizes", split,
       [](C&, A& a) { a.kpe_cache.shape[1] = bs / 2; },
       "kpe_cache.shape[1]", "expected [4, 4, 16], got [4, 2, 16]"},
      // --- tables
      {"table one: width Dr/2 instead of Dr", nullptr, [](C&, A& a) { a.cos_sin.shape[1] = dr / 2; },
       "cos_sin.shape[1]", "expected [64, 16], got [64, 8]"},
      {"table two: cos width Dr instead of Dr/2", table_two, [](C&, A& a) { a.cos.shape[1] = dr; },
       "cos.shape[1]", "expected [64, 8], got [64, 16]"},
      {"table two: sin has fewer rows than cos", table_two, [](C&, A& a) { a.sin.shape[0] = rows - 1; },
       "sin.shape[0]", "expected [64, 8], got [63, 8]"},
      {"table one and a cos table both given", nullptr,
       [](C& c, A& a) { a.cos = make_view(a.cos_sin.type, buf(c, "cos_sin"), {rows, dr / 2}, {dr, 1}); },
       "cos", "expected absent (table one: cos_sin is given)"},
      // --- missing tensors, both cache layouts given
      {"q_out missing", nullptr, [](C&, A& a) { a.q_out = {}; }, "q_out", "got absent"},
      {"positions missing", nullptr, [](C&, A& a) { a.positions = {}; }, "positions", "got absent"},
      {"slot_mapping missing", nullptr, [](C&, A& a) { a.slot_mapping = {}; }, "slot_mapping", "got absent"},
      {"k_pe missing", nullptr, [](C&, A& a) { a.k_pe = {}; }, "k_pe", "got absent"},
      {"no cos/sin table", nullptr, [](C&, A& a) { a.cos_sin = {}; }, "cos_sin", "got absent"},
      {"table two: sin missing", table_two, [](C&, A& a) { a.sin = {}; }, "sin", "got absent"},
      {"joint: cache missing", nullptr, [](C&, A& a) { a.cache = {}; },
       "cache", "expected a tensor [num_blocks, block_size, Dn + Dr] (layout joint), got absent"},
      {"joint cache and split caches both given", nullptr,
       [](C& c, A& a) { a.ckv_cache = make_view(a.cache.type, buf(c, "cache"), {nb, bs, dn}, {bs * (dn + dr), dn + dr, 1}); },
       "ckv_cache", "expected absent (layout joint), got a tensor [4, 4, 32]"},
      {"split caches and a joint cache both given", split,
       [](C& c, A& a) { a.cache = make_view(a.ckv_cache.type, buf(c, "ckv_cache"), {nb, bs, dn}); },
       "cache", "expected absent (layout split)"},
      // --- overlapping outputs
      {"q_out over the cache", nullptr,
       [](C& c, A& a) { a.cache = make_view(a.cache.type, buf(c, "q_out"), {2, bs, dn + dr}); },
       "q_out", "expected memory disjoint from output cache, got overlapping cache"},
      {"q_out over an input (kv_c)", nullptr,
       [](C& c, A& a) { a.kv_c = make_view(a.kv_c.type, buf(c, "q_out") + 96, {tk, dn}); },
       "q_out", "expected memory disjoint from input kv_c, got overlapping kv_c"},
      {"q_out over an input (positions)", nullptr,
       [](C& c, A& a) { a.positions = make_view(a.positions.type, buf(c, "q_out") + 64, {tk}); },
       "q_out", "expected memory disjoint from input positions, got overlapping positions"},
      {"q_out over the in-place q_pe", nullptr,
       [](C& c, A& a) { a.q_pe = make_view(a.q_pe.type, buf(c, "q_out") + 2 * dn, {tq, heads, dr}, {heads * (dn + dr), dn + dr, 1}); },
       "q_out", "expected memory disjoint from output q_pe, got overlapping q_pe"},
      {"q_nope inside q_out but not its prefix", nullptr,
       [](C& c, A& a) { a.q_nope = make_view(a.q_nope.type, buf(c, "q_out") + 2 * (dn + dr), {tq, heads, dn}, {heads * (dn + dr), dn + dr, 1}); },
       "q_out", "expected memory disjoint from input q_nope, got overlapping q_nope"},
      {"cache over an input (kv_c)", nullptr,
       [](C& c, A& a) { a.kv_c = make_view(a.kv_c.type, buf(c, "cache") + 2 * 100, {tk, dn}); },
       "cache", "expected memory disjoint from input kv_c, got overlapping kv_c"},
      {"cache over the in-place k_pe", nullptr,
       [](C& c, A& a) { a.k_pe = make_view(a.k_pe.type, buf(c, "cache") + 2 * dn, {tk, dr}, {dn + dr, 1}); },
       "cache", "expected memory disjoint from output k_pe, got overlapping k_pe"},
      {"split: kpe_cache inside ckv_cache", split,
       [](C& c, A& a) { a.kpe_cache = make_view(a.kpe_cache.type, buf(c, "ckv_cache"), {nb, bs, dr}, {bs * dr, dr, 1}); },
       "ckv_cache", "expected memory disjoint from output kpe_cache, got overlapping kpe_cache"},
      // --- slot and position values
      {"slot == capacity", nullptr, [](C&, A& a) { set_index(a.slot_mapping, 1, capacity); },
       "slot_mapping[1]", "expected < 16, got 16"},
      {"slot 2^40", nullptr, [](C&, A& a) { set_index(a.slot_mapping, 3, int64_t{1} << 40); },
       "slot_mapping[3]", "expected < 16, got 1099511627776"},
      {"i32 slot == capacity", [](problem& p) { p.slot_dtype = dtype::i32; },
       [](C&, A& a) { set_index(a.slot_mapping, 2, capacity); },
       "slot_mapping[2]", "expected < 16, got 16"},
      {"duplicate slots", nullptr,
       [](C&, A& a) { set_index(a.slot_mapping, 3, get_index(a.slot_mapping, 0)); },
       "slot_mapping[3]", "expected unique slot, got "},
      {"position == table rows", nullptr, [](C&, A& a) { set_index(a.positions, 1, rows); },
       "positions[1]", "expected [0, 64), got 64"},
      {"position < 0", nullptr, [](C&, A& a) { set_index(a.positions, 0, -1); },
       "positions[0]", "expected [0, 64), got -1"},
      {"i32 position 2^31 - 1", [](problem& p) { p.pos_dtype = dtype::i32; },
       [](C&, A& a) { set_index(a.positions, 2, INT32_MAX); },
       "positions[2]", "expected [0, 64), got 2147483647"},
      {"padding token with q computed: its position is read", nullptr,
       [](C&, A& a) { set_index(a.slot_mapping, 0, -1); set_index(a.positions, 0, rows + 5); },
       "positions[0]", "expected [0, 64), got 69"},
      // --- scales
      {"k_scale NaN", nullptr, [](C&, A& a) { a.k_scale = nan_f; }, "k_scale", "expected finite and > 0, got nan"},
      {"k_scale inf", nullptr, [](C&, A& a) { a.k_scale = inf_f; }, "k_scale", "got inf"},
      {"k_scale 0", nullptr, [](C&, A& a) { a.k_scale = 0.0f; }, "k_scale", "got 0"},
      {"k_scale -0", nullptr, [](C&, A& a) { a.k_scale = -0.0f; }, "k_scale", "got -0"},
      {"k_scale negative", nullptr, [](C&, A& a) { a.k_scale = -1.0f; }, "k_scale", "got -1"},
      {"k_scale NaN, fp8 cache", fp8_outputs, [](C&, A& a) { a.k_scale = nan_f; }, "k_scale", "got nan"},
      {"k_scale 0, fp8 cache", fp8_outputs, [](C&, A& a) { a.k_scale = 0.0f; }, "k_scale", "got 0"},
      {"q_scale NaN", nullptr, [](C&, A& a) { a.q_scale = nan_f; }, "q_scale", "got nan"},
      {"q_scale -inf", nullptr, [](C&, A& a) { a.q_scale = -inf_f; }, "q_scale", "got -inf"},
      {"q_scale 0, fp8 q_out", fp8_outputs, [](C&, A& a) { a.q_scale = 0.0f; }, "q_scale", "got 0"},
      {"q_scale negative, fp8 q_out", fp8_outputs, [](C&, A& a) { a.q_scale = -2.0f; }, "q_scale", "got -2"},
      {"q_scale inf, fp8 q_out", fp8_outputs, [](C&, A& a) { a.q_scale = inf_f; }, "q_scale", "got inf"},
      {"k_scale tensor holds NaN", scale_tensors, [](C&, A& a) { set_f32(a.k_scale_tensor, nan_f); },
       "k_scale[0]", "expected finite and > 0, got nan"},
      {"q_scale tensor holds 0", scale_tensors, [](C&, A& a) { set_f32(a.q_scale_tensor, 0.0f); },
       "q_scale[0]", "expected finite and > 0, got 0"},
      {"k_scale tensor negative", scale_tensors, [](C&, A& a) { set_f32(a.k_scale_tensor, -0.5f); },
       "k_scale[0]", "got -0.5"},
      {"k_scale tensor f16", scale_tensors, [](C&, A& a) { a.k_scale_tensor.type = dtype::f16; },
       "k_scale.dtype", "expected f32, got f16"},
      {"q_scale tensor of 2 elements", scale_tensors, [](C&, A& a) { a.q_scale_tensor.shape[0] = 2; },
       "q_scale.shape[0]", "expected [1], got [2]"},
      {"k_scale tensor of rank 0", scale_tensors, [](C&, A& a) { a.k_scale_tensor.rank = 0; },
       "k_scale", "expected rank 1, got rank 0"},
      {"k_scale tensor in device memory, the rest on the host", scale_tensors,
       [](C&, A& a) { a.k_scale_tensor.on_device = true; },
       "k_scale", "expected host memory (like q_nope), got device memory"},
      {"q_scale tensor inside q_out", scale_tensors, [](C&, A& a) { a.q_scale_tensor.data = a.q_out.data; },
       "q_out", "expected memory disjoint from input q_scale"},
      // --- decode outputs (decode_q_pe_out, q_nope_zeros_out, k_pe_out)
      {"decode outputs: N > Tq", decode_outputs, [](C&, A& a) { a.decode_q_pe_out.shape[0] = tq + 1; },
       "decode_q_pe_out.shape[0]", "expected N <= 3 (Tq, q_nope.shape[0]), got 4"},
      {"decode outputs: zero buffer alone with N > Tq", decode_outputs,
       [](C&, A& a) {
         a.decode_q_pe_out = tensor_view{};
         a.q_nope_zeros_out.shape[0] = tq + 2;
       },
       "q_nope_zeros_out.shape[0]", "expected N <= 3 (Tq, q_nope.shape[0]), got 5"},
      {"decode outputs: two different N", decode_outputs, [](C&, A& a) { a.q_nope_zeros_out.shape[0] = 1; },
       "q_nope_zeros_out.shape[0]", "expected 2 (N, decode_q_pe_out.shape[0]), got 1"},
      {"decode_q_pe_out narrower than Dr", decode_outputs, [](C&, A& a) { a.decode_q_pe_out.shape[2] = dr - 2; },
       "decode_q_pe_out.shape[2]", "expected [2, 4, 16], got [2, 4, 14]"},
      {"q_nope_zeros_out with fewer heads", decode_outputs, [](C&, A& a) { a.q_nope_zeros_out.shape[1] = heads - 1; },
       "q_nope_zeros_out.shape[1]", "expected [2, 4, 32], got [2, 3, 32]"},
      {"k_pe_out rows != Tk", decode_outputs, [](C&, A& a) { a.k_pe_out.shape[0] = tk - 1; },
       "k_pe_out.shape[0]", "expected [5, 16], got [4, 16]"},
      {"decode_q_pe_out of rank 2", decode_outputs, [](C&, A& a) { a.decode_q_pe_out.rank = 2; },
       "decode_q_pe_out", "expected rank 3, got rank 2"},
      {"decode_q_pe_out f16, q_pe bf16", decode_outputs, [](C&, A& a) { a.decode_q_pe_out.type = dtype::f16; },
       "decode_q_pe_out.dtype", "expected bf16 (dtype of q_pe), got f16"},
      {"q_nope_zeros_out f32, q_nope bf16", decode_outputs, [](C&, A& a) { a.q_nope_zeros_out.type = dtype::f32; },
       "q_nope_zeros_out.dtype", "expected bf16 (dtype of q_nope), got f32"},
      {"k_pe_out fp8", decode_outputs, [](C&, A& a) { a.k_pe_out.type = dtype::fp8_e4m3fn; },
       "k_pe_out.dtype", "expected f32|f16|bf16, got fp8_e4m3fn"},
      {"decode_q_pe_out aliases itself (head stride 0)", decode_outputs,
       [](C&, A& a) { a.decode_q_pe_out.strides_elems[1] = 0; },
       "decode_q_pe_out.strides[1]", "an output must not alias itself"},
      {"decode_q_pe_out inside q_out", decode_outputs, [](C&, A& a) { a.decode_q_pe_out.data = a.q_out.data; },
       "q_out", "expected memory disjoint from output decode_q_pe_out, got overlapping decode_q_pe_out"},
      {"q_nope_zeros_out inside q_out", decode_outputs,
       [](C& c, A& a) { a.q_nope_zeros_out.data = buf(c, "q_out") + 2 * 8; },
       "q_out", "expected memory disjoint from output q_nope_zeros_out, got overlapping q_nope_zeros_out"},
      {"k_pe_out is the in-place k_pe", decode_outputs, [](C&, A& a) { a.k_pe_out.data = a.k_pe.data; },
       "k_pe", "expected memory disjoint from output k_pe_out, got overlapping k_pe_out"},
      {"k_pe_out over an input (kv_c)", decode_outputs, [](C&, A& a) { a.k_pe_out.data = a.kv_c.data; },
       "k_pe_out", "expected memory disjoint from input kv_c, got overlapping kv_c"},
      {"decode_q_pe_out inside q_nope_zeros_out", decode_outputs,
       [](C&, A& a) { a.decode_q_pe_out.data = a.q_nope_zeros_out.data; },
       "decode_q_pe_out", "expected memory disjoint from output q_nope_zeros_out, got overlapping q_nope_zeros_out"},
      {"k_pe_out in device memory, the rest on the host", decode_outputs,
       [](C&, A& a) { a.k_pe_out.on_device = true; },
       "k_pe_out", "expected host memory (like q_nope), got device memory"},
      // --- misaligned data pointers (rejected: see docs/bad-inputs.md)
      {"q_nope misaligned (bf16 + 1 byte)", nullptr,
       [](C&, A& a) { a.q_nope.data = static_cast<uint8_t*>(a.q_nope.data) + 1; },
       "q_nope", "expected data aligned to 2 bytes, got address "},
      {"cache misaligned (bf16 + 1 byte)", nullptr,
       [](C&, A& a) { a.cache.data = static_cast<uint8_t*>(a.cache.data) + 1; },
       "cache", "expected data aligned to 2 bytes"},
      {"positions misaligned (i64 + 4 bytes)", nullptr,
       [](C&, A& a) { a.positions.data = static_cast<uint8_t*>(a.positions.data) + 4; },
       "positions", "expected data aligned to 8 bytes"},
      {"q_out misaligned (f32 + 2 bytes)", [](problem& p) { p.q_out_dtype = dtype::f32; },
       [](C&, A& a) { a.q_out.data = static_cast<uint8_t*>(a.q_out.data) + 2; },
       "q_out", "expected data aligned to 4 bytes"},
      // --- outputs that alias themselves (two indices, one element: racing or lost writes)
      {"q_out head stride 0 (all heads write one row)", nullptr,
       [](C&, A& a) { a.q_out.strides_elems[1] = 0; },
       "q_out.strides[1]", "expected >= 48 (span of dims 2: an output must not alias itself), got 0"},
      {"q_out head stride 8 < row width 48", nullptr,
       [](C&, A& a) { a.q_out.strides_elems[1] = 8; },
       "q_out.strides[1]", "expected >= 48 (span of dims 2: an output must not alias itself), got 8"},
      {"q_out token stride 0", nullptr,
       [](C&, A& a) { a.q_out.strides_elems[0] = 0; },
       "q_out.strides[0]", "expected >= 48 (span of dims 2: an output must not alias itself), got 0"},
      {"q_out token stride < H x row (tokens share heads' rows)", nullptr,
       [](C&, A& a) { a.q_out.strides_elems[0] = 2 * (dn + dr); },
       "q_out.strides[0]", "expected >= 192 (span of dims 2,1: an output must not alias itself), got 96"},
      {"in-place q_pe head stride 0", nullptr,
       [](C&, A& a) { a.q_pe.strides_elems[1] = 0; },
       "q_pe.strides[1]", "an output must not alias itself), got 0"},
      {"in-place k_pe token stride 0", nullptr,
       [](C&, A& a) { a.k_pe.strides_elems[0] = 0; },
       "k_pe.strides[0]", "an output must not alias itself), got 0"},
      // --- byte extents that do not fit in int64 (every later offset would wrap)
      {"cache block stride 2^62", nullptr,
       [](C&, A& a) { a.cache.strides_elems[0] = int64_t{1} << 62; },
       "cache", "expected a byte extent that fits in int64, got overflow"},
      {"q_out token stride 2^61 (bf16: 2^63 bytes)", nullptr,
       [](C&, A& a) { a.q_out.strides_elems[0] = int64_t{1} << 61; },
       "q_out", "expected a byte extent that fits in int64, got overflow"},
      {"cos_sin with 2^62 rows", nullptr,
       [](C&, A& a) { a.cos_sin.shape[0] = int64_t{1} << 62; },
       "cos_sin", "expected a byte extent that fits in int64, got overflow"},
      {"positions with 2^62 entries (an input)", nullptr,
       [](C&, A& a) { a.positions.shape[0] = int64_t{1} << 62; },
       "positions", "expected a byte extent that fits in int64, got overflow"},
      {"split: kpe_cache block stride 2^61", split,
       [](C&, A& a) { a.kpe_cache.strides_elems[0] = int64_t{1} << 61; },
       "kpe_cache", "expected a byte extent that fits in int64, got overflow"},
      {"q_nope broadcast (strides 0) over 2^32 x 2^32 x 32 elements", nullptr,
       [](C&, A& a) {
         a.q_nope.shape[0] = a.q_nope.shape[1] = int64_t{1} << 32;
         a.q_nope.strides_elems[0] = a.q_nope.strides_elems[1] = 0;
       },
       "q_nope", "expected an element count that fits in int64, got overflow"},
      // --- null data with elements
      {"q_out data nullptr", nullptr, [](C&, A& a) { a.q_out.data = nullptr; },
       "q_out.data", "expected non-null, got null"},
      {"cache data nullptr", nullptr, [](C&, A& a) { a.cache.data = nullptr; },
       "cache.data", "expected non-null, got null"},
      {"kv_c data nullptr (an input)", nullptr, [](C&, A& a) { a.kv_c.data = nullptr; },
       "kv_c.data", "expected non-null, got null"},
      {"split: ckv_cache data nullptr", split, [](C&, A& a) { a.ckv_cache.data = nullptr; },
       "ckv_cache.data", "expected non-null, got null"},
      // --- memory space, option values
      {"q_out flagged as device memory", nullptr, [](C&, A& a) { a.q_out.on_device = true; },
       "q_out", "expected host memory (like q_nope), got device memory"},
      {"rope_style out of range", nullptr,
       [](C&, A& a) { a.options.style = static_cast<rope_style>(9); },
       "options.style", "expected gptj, neox, got 9"},
      // --- layout shuffled (16-entry tiles, 16-byte runs: core/SPEC.md)
      {"shuffled: block size not a multiple of 16", shuffled,
       [](C&, A& a) { a.cache.shape[1] = 8; },
       "cache.shape[1]", "expected block_size a multiple of 16 (layout shuffled: 16-token tiles), got 8"},
      {"shuffled: entry stride != Dn + Dr", shuffled,
       [](C&, A& a) { a.cache.strides_elems = {16 * (dn + dr), dn + dr - 8, 1}; },
       "cache.strides[1]", "expected 48 (Dn + Dr: layout shuffled packs a block, no entry padding), got 40"},
      {"shuffled: order rope_first", shuffled,
       [](C&, A& a) { a.options.order = row_order::rope_first; },
       "options.order", "expected nope_first (layout shuffled keeps a block's rope part after its nope part), got rope_first"},
      {"shuffled: split caches given instead", shuffled,
       [](C& c, A& a) {
         a.ckv_cache = make_view(a.cache.type, buf(c, "cache"), {1, 16, dn}, {16 * (dn + dr), dn + dr, 1});
       },
       "ckv_cache", "expected absent (layout shuffled), got a tensor [1, 16, 32]"},
      // --- layout fp8_ds_mla (656-byte u8 entries: core/SPEC.md)
      {"fp8_ds_mla: cache dtype bf16", ds_mla, [](C&, A& a) { a.cache.type = dtype::bf16; },
       "cache.dtype", "expected u8, got bf16"},
      {"fp8_ds_mla: entries of 576 bytes", ds_mla, [](C&, A& a) { a.cache.shape[2] = 576; },
       "cache.shape[2]", "expected [4, 4, 656], got [4, 4, 576]"},
      {"fp8_ds_mla: f32 kv_c and k_pe", ds_mla,
       [](C&, A& a) { a.kv_c.type = a.k_pe.type = dtype::f32; },
       "k_pe.dtype", "expected bf16 or f16 (layout fp8_ds_mla stores the rope part in k_pe's 16-bit dtype), got f32"},
      {"fp8_ds_mla: Dn 256", ds_mla,
       [](C&, A& a) {
         a.q_nope.shape[2] = a.kv_c.shape[1] = 256;
         a.q_out.shape[2] = 256 + 64;
       },
       "q_nope.shape[2]", "expected Dn = 512 (layout fp8_ds_mla: 4 tiles of 128), got 256"},
      {"fp8_ds_mla: entry stride not a multiple of 4", ds_mla,
       [](C&, A& a) { a.cache.strides_elems = {4 * 658, 658, 1}; },
       "cache.strides[1]", "expected a multiple of 4 bytes (layout fp8_ds_mla: f32 scales in every entry), got 658"},
      {"fp8_ds_mla: cache pointer 2 bytes off 4-byte alignment", ds_mla,
       [](C&, A& a) { a.cache.data = static_cast<uint8_t*>(a.cache.data) + 2; },
       "cache.data", "expected a 4-byte aligned address (layout fp8_ds_mla: f32 scales)"},
      {"fp8_ds_mla: order rope_first", ds_mla,
       [](C&, A& a) { a.options.order = row_order::rope_first; },
       "options.order", "expected nope_first (layout fp8_ds_mla: nope bytes, scales, then rope), got rope_first"},
      {"fp8_ds_mla: split caches given instead", ds_mla,
       [](C& c, A& a) { a.ckv_cache = make_view(dtype::u8, buf(c, "cache"), {4, 4, 512}, {4 * 656, 656, 1}); },
       "ckv_cache", "expected absent (layout fp8_ds_mla), got a tensor [4, 4, 512]"},
      // --- kv heads (KH > 1: [Tk, KH, D] k rows, [nb, KH, bs, D] caches: core/SPEC.md)
      {"kv heads: KH = 3 does not divide H = 4", kv_heads,
       [](C&, A& a) { a.kv_c.shape[1] = a.k_pe.shape[1] = 3; },
       "kv_c.shape[1]", "expected a divisor of H = 4 (q_nope.shape[1]), got 3"},
      {"kv heads: k_pe with 1 head, kv_c with 2", kv_heads, [](C&, A& a) { a.k_pe.shape[1] = 1; },
       "k_pe.shape[1]", "expected [5, 2, 16], got [5, 1, 16]"},
      {"kv heads: k_pe of rank 2, kv_c of rank 3", kv_heads,
       [](C&, A& a) { a.k_pe = make_view(a.k_pe.type, a.k_pe.data, {tk, dr}, {a.k_pe.strides_elems[0], 1}); },
       "k_pe", "expected rank 3 (kv_c's: [Tk, KH, Dr]), got rank 2 [5, 16]"},
      {"kv heads: cache with 1 head, kv_c with 2", kv_heads, [](C&, A& a) { a.cache.shape[1] = 1; },
       "cache.shape[1]", "expected 2 (KH, kv heads of kv_c), got 1"},
      {"kv heads: rank-3 cache with KH = 2", kv_heads,
       [](C&, A& a) {
         a.cache = make_view(a.cache.type, a.cache.data, {nb, bs, dn + dr}, {a.cache.strides_elems[0], a.cache.strides_elems[2], 1});
       },
       "cache", "expected rank 4 [num_blocks, KH = 2, block_size, D] (kv_c has 2 kv heads), got rank 3 [4, 4, 48]"},
      {"kv heads: split, kpe_cache with 1 head", kv_heads_split, [](C&, A& a) { a.kpe_cache.shape[1] = 1; },
       "kpe_cache.shape[1]", "expected 2 (KH, kv heads of kv_c), got 1"},
      {"kv heads: fp8_ds_mla with kv_c of 2 heads", ds_mla,
       [](C&, A& a) {
         a.kv_c = make_view(a.kv_c.type, a.kv_c.data, {tk, 2, 256}, {a.kv_c.strides_elems[0], 256, 1});
         a.k_pe = make_view(a.k_pe.type, a.k_pe.data, {tk, 2, 32}, {a.k_pe.strides_elems[0], 32, 1});
       },
       "kv_c.shape[1]", "expected 1 (layout fp8_ds_mla: one kv head per entry), got 2"},
      {"kv heads: k_pe_out with 1 head, k_pe with 2", kv_heads_k_pe_out, [](C&, A& a) { a.k_pe_out.shape[1] = 1; },
       "k_pe_out.shape[1]", "expected [5, 2, 16], got [5, 1, 16]"},
      {"kv heads: k_pe_out of rank 2", kv_heads_k_pe_out,
       [](C&, A& a) { a.k_pe_out = make_view(a.k_pe_out.type, a.k_pe_out.data, {tk, dr}, {2 * dr, 1}); },
       "k_pe_out", "expected rank 3 (k_pe's: [Tk, KH, Dr]), got rank 2 [5, 16]"},
      {"kv heads: cache head stride overlapping rows", kv_heads,
       [](C&, A& a) { a.cache.strides_elems[1] = (dn + dr) / 2; },
       "cache.strides[1]", "expected >= 48 (span of dims 3: an output must not alias itself), got 24"},
      {"kv heads: split, kpe_cache heads on one row", kv_heads_split,
       [](C&, A& a) { a.kpe_cache.strides_elems[1] = 0; },
       "kpe_cache.strides[1]", "expected >= 16 (span of dims 3: an output must not alias itself), got 0"},
  };
}

// Every byte of every buffer of the case, guards included.
std::vector<std::vector<uint8_t>> snapshot(case_data& c) {
  std::vector<std::vector<uint8_t>> s;
  for (auto& [name, b] : c.buffers) s.emplace_back(b.raw(), b.raw() + b.raw_size_bytes());
  return s;
}

// The outputs of a case: q_out and the cache(s).
std::vector<const char*> output_buffers(const problem& p) {
  std::vector<const char*> out = {"q_out"};
  if (single_cache_tensor(p.opt.layout)) {
    out.push_back("cache");
  } else {
    out.push_back("ckv_cache");
    out.push_back("kpe_cache");
  }
  if (p.dec_q_pe) out.push_back("decode_q_pe_out");
  if (p.dec_zeros) out.push_back("q_nope_zeros_out");
  if (p.dec_k_pe) out.push_back("k_pe_out");
  return out;
}

std::vector<std::string> backends_under_test() {
  std::vector<std::string> names;
  for (const std::string& n : compiled_backend_names()) {
    if (n == "ref" || n == "sim" || n == "hip") names.push_back(n);
  }
  return names;
}

// The listing (every case with the error it expects): ROPEKV_LIST_CATALOG=1 ropekv_tests -tc='bad-input catalog*'
bool listing_requested() {
  const char* e = std::getenv("ROPEKV_LIST_CATALOG");
  return e != nullptr && *e != '\0' && std::string(e) != "0";
}

// Runs one catalog row on one backend. Returns "" when the call failed as the row expects and
// wrote nothing; otherwise every way it did not, one per line.
std::string run_row(const bad_case& bc, backend& be) {
  std::ostringstream problems;
  problem p = base_problem();
  if (bc.prep) bc.prep(p);
  case_data c = make_case(p);
  op_args a = c.args;
  if (bc.mutate) bc.mutate(c, a);
  // The outputs are poisoned before the call (make_case's promise; checked, not assumed).
  for (const char* out : output_buffers(p)) {
    const host_buffer& b = c.buffers.at(out);
    if (count_not_poison(b.data(), b.size_bytes()) != 0) problems << out << " not poisoned before the call\n";
  }
  const std::vector<std::vector<uint8_t>> before = snapshot(c);
  try {
    be.run_host(a, c.regions());
    problems << "no error\n";
  } catch (const arg_error& e) {
    const std::string what = e.what();
    if (e.arg() != bc.arg) problems << "arg '" << e.arg() << "', expected '" << bc.arg << "'\n";
    if (e.expected().empty()) problems << "empty 'expected'\n";
    if (e.got().empty()) problems << "empty 'got'\n";
    if (what != e.arg() + ": expected " + e.expected() + ", got " + e.got())
      problems << "what() is not '<arg>: expected <expected>, got <got>'\n";
    if (what.find(bc.fragment) == std::string::npos) problems << "no fragment '" << bc.fragment << "'\n";
    if (!problems.str().empty()) problems << "message: " << what << "\n";
  } catch (const std::exception& e) {
    problems << "not an arg_error: " << e.what() << "\n";
  }
  const std::vector<std::vector<uint8_t>> after = snapshot(c);
  size_t i = 0;
  for (auto& [name, b] : c.buffers) {
    if (after[i] != before[i]) {
      size_t n = 0;
      for (size_t k = 0; k < after[i].size(); ++k) n += after[i][k] != before[i][k];
      problems << "buffer " << name << ": " << n << " bytes changed\n";
    }
    ++i;
  }
  return problems.str();
}

// A backend that writes q_out (and, with `before_validate`, does so even for a bad call), then
// runs the reference: the catalog must catch the first kind.
class writes_first_backend final : public backend {
 public:
  explicit writes_first_backend(bool before_validate) : before_validate_(before_validate) {}
  std::string name() const override { return "writes_first"; }
  std::string unsupported_reason(const op_args&) const override { return {}; }
  void run_host(const op_args& args, const std::vector<memory_region>& regions) override {
    if (!before_validate_) validate(args);
    if (args.q_out.data != nullptr) static_cast<uint8_t*>(args.q_out.data)[0] = 0;
    find_backend("ref")()->run_host(args, regions);
  }

 private:
  bool before_validate_;
};

}  // namespace

TEST_CASE("bad-input catalog: the unbroken base cases run on every backend") {
  const std::vector<std::function<void(problem&)>> variants = {nullptr, split, table_two, fp8_outputs, shuffled,
                                                                scale_tensors, decode_outputs, ds_mla,
                                                                kv_heads, kv_heads_split, kv_heads_k_pe_out};
  for (const std::string& be_name : backends_under_test()) {
    for (size_t v = 0; v < variants.size(); ++v) {
      INFO("backend " << be_name << ", base variant " << v);
      problem p = base_problem();
      if (variants[v]) variants[v](p);
      case_data c = make_case(p);
      auto be = find_backend(be_name)();
      REQUIRE_NOTHROW(be->run_host(c.args, c.regions()));
      for (const char* out : output_buffers(p)) {
        INFO("output " << out);
        const host_buffer& b = c.buffers.at(out);
        CHECK(count_not_poison(b.data(), b.size_bytes()) > 0);  // something was written
        CHECK(b.guards_intact());
      }
    }
  }
}

TEST_CASE("bad-input catalog: each malformed call names its argument and writes nothing") {
  const std::vector<bad_case> cases = catalog();
  const std::vector<std::string> backends = backends_under_test();
  REQUIRE(cases.size() >= 30);
  REQUIRE(!backends.empty());
  CHECK(backends.front() == "ref");
  CHECK(std::find(backends.begin(), backends.end(), "sim") != backends.end());
  if (listing_requested()) {
    std::cout << "bad-input catalog: " << cases.size() << " cases x backends {";
    for (size_t i = 0; i < backends.size(); ++i) std::cout << (i ? ", " : "") << backends[i];
    std::cout << "}\n";
  }
  int index = 0;
  for (const bad_case& bc : cases) {
    ++index;
    if (listing_requested()) {
      std::cout << "  [" << index << "] " << bc.name << "  ->  " << bc.arg << ": ..." << bc.fragment << "...\n";
    }
    for (const std::string& be_name : backends) {
      auto be = find_backend(be_name)();
      const std::string problems = run_row(bc, *be);
      CHECK_MESSAGE(problems.empty(), "case [" << index << "] " << std::string(bc.name) << " on backend " << be_name
                                               << ":\n" << problems);
    }
  }
}

TEST_CASE("bad-input catalog: the checks catch a backend that writes before validating") {
  const std::vector<bad_case> cases = catalog();
  writes_first_backend careless(/*before_validate=*/true), careful(/*before_validate=*/false);
  int caught = 0, q_out_null = 0;
  for (const bad_case& bc : cases) {
    CHECK_MESSAGE(run_row(bc, careful) == "", std::string(bc.name));
    const std::string p = run_row(bc, careless);
    caught += p.find("buffer q_out: 1 bytes changed") != std::string::npos;
    problem prob = base_problem();
    if (bc.prep) bc.prep(prob);
    case_data c = make_case(prob);
    op_args a = c.args;
    bc.mutate(c, a);
    q_out_null += a.q_out.data == nullptr;
  }
  // Every row whose q_out pointer is valid is caught (all but "q_out missing" and "q_out data
  // nullptr", where the careless backend has nowhere to write).
  CHECK(q_out_null == 2);
  CHECK(caught == static_cast<int>(cases.size()) - q_out_null);
}
