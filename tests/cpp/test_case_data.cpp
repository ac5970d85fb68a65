// make_case: buffers, strides and views, deterministic data, slots and positions, poison, clone.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "core/case_data.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/presets.h"
#include "core/rng.h"
#include "core/validate.h"

using namespace ropekv;

namespace {

int64_t load_int(const tensor_view& v, int64_t i) {
  const uint64_t bits = load_bits(v.type, static_cast<const uint8_t*>(v.data) + i * dtype_size_bytes(v.type));
  return v.type == dtype::i32 ? static_cast<int64_t>(static_cast<int32_t>(bits)) : static_cast<int64_t>(bits);
}

double load_float(const tensor_view& v, std::initializer_list<int64_t> idx) {
  const uint8_t* p = static_cast<const uint8_t*>(v.data) + v.offset_elems(idx) * dtype_size_bytes(v.type);
  return decode_to_f64(v.type, static_cast<uint32_t>(load_bits(v.type, p)));
}

// The value make_case promises for input element `flat` of tensor `id` (1 q_nope, 2 q_pe, 3 kv_c, 4 k_pe).
double promised(const problem& p, uint64_t id, int64_t flat) {
  const double x = (2.0 * rng_unit(p.seed, id, static_cast<uint64_t>(flat)) - 1.0) * p.amplitude;
  return decode_to_f64(p.in_dtype, encode_from_f64(p.in_dtype, x, overflow_mode::ieee));
}

bool same_bytes(const case_data& a, const case_data& b) {
  if (a.buffers.size() != b.buffers.size()) return false;
  for (const auto& [name, buf] : a.buffers) {
    auto it = b.buffers.find(name);
    if (it == b.buffers.end() || it->second.size_bytes() != buf.size_bytes()) return false;
    if (std::memcmp(it->second.data(), buf.data(), buf.size_bytes()) != 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("make_case: head-major q view, fused kv slices, padded strides") {
  const problem p = parse_problem(
      "tq=3 ts=4 tk=5 h=2 dn=8 dr=4 p=16 bs=3 nb=3 in=f32 table=two q_layout=head_major "
      "kv_layout=fused row_pad=2 entry_pad=5 block_pad=7 table_pad=1 layout=split table_dtype=f32 seed=9");
  case_data c = make_case(p);
  const op_args& a = c.args;
  // buffers
  std::set<std::string> names;
  for (const auto& [n, b] : c.buffers) names.insert(n);
  CHECK(names == std::set<std::string>{"q_nope", "q_pe", "kv", "positions", "slot_mapping", "cos",
                                       "sin", "q_out", "ckv_cache", "kpe_cache"});
  // q: memory [H, T, D + pad] seen as [T, H, D]
  CHECK(a.q_nope.shape_string() == "[3, 2, 8]");
  CHECK(a.q_nope.strides_elems[0] == 10);
  CHECK(a.q_nope.strides_elems[1] == 30);
  CHECK(a.q_nope.strides_elems[2] == 1);
  CHECK(a.q_nope.offset_elems({2, 1, 3}) == 30 + 20 + 3);
  CHECK(c.buffers.at("q_nope").size_bytes() == 2 * 3 * 10 * 4);
  CHECK(a.q_pe.strides_elems[0] == 6);
  CHECK(a.q_pe.strides_elems[1] == 18);
  // fused kv: one [Tk, dn + dr + pad] buffer, column slices
  const uint8_t* kv = c.buffers.at("kv").data();
  CHECK(a.kv_c.data == kv);
  CHECK(a.k_pe.data == kv + 8 * 4);
  CHECK(a.kv_c.strides_elems[0] == 14);
  CHECK(a.k_pe.strides_elems[0] == 14);
  CHECK(c.buffers.at("kv").size_bytes() == 5 * 14 * 4);
  // q_out token-major with row pad
  CHECK(a.q_out.strides_elems[0] == 2 * 14);
  CHECK(a.q_out.strides_elems[1] == 14);
  // split caches: entry stride = width + entry_pad, block stride = bs * entry + block_pad
  CHECK(a.ckv_cache.shape_string() == "[3, 3, 8]");
  CHECK(a.ckv_cache.strides_elems[1] == 13);
  CHECK(a.ckv_cache.strides_elems[0] == 3 * 13 + 7);
  CHECK(a.kpe_cache.strides_elems[1] == 9);
  CHECK(a.kpe_cache.strides_elems[0] == 3 * 9 + 7);
  CHECK(c.buffers.at("kpe_cache").size_bytes() == 3 * (3 * 9 + 7) * dtype_size_bytes(p.cache_dtype));
  CHECK_FALSE(a.cache.present());
  CHECK_FALSE(a.cos_sin.present());
  // tables two: [P, Dr/2] with padded row stride
  CHECK(a.cos.shape_string() == "[16, 2]");
  CHECK(a.cos.strides_elems[0] == 3);
  // logical values do not depend on the memory layout
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t d = 0; d < 8; ++d) CHECK(load_float(a.q_nope, {t, h, d}) == promised(p, 1, (t * 2 + h) * 8 + d));
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t d = 0; d < 4; ++d) CHECK(load_float(a.k_pe, {t, d}) == promised(p, 4, t * 4 + d));
  problem token_major = p;
  token_major.q_layout = q_storage::token_major;
  token_major.kv_layout = kv_storage::separate;
  token_major.row_pad_elems = 0;
  case_data tm = make_case(token_major);
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t d = 0; d < 4; ++d) CHECK(load_float(tm.args.q_pe, {t, h, d}) == load_float(a.q_pe, {t, h, d}));
  // every input value within [-amp, amp]; random table: cos^2 + sin^2 == 1 (f32 table)
  for (int64_t r = 0; r < 16; ++r)
    for (int64_t i = 0; i < 2; ++i) {
      const double cs = load_float(a.cos, {r, i}), sn = load_float(a.sin, {r, i});
      CHECK(std::abs(cs * cs + sn * sn - 1.0) < 1e-6);
    }
}

TEST_CASE("make_case: joint cache layout, table one") {
  const problem p = parse_problem("tq=2 ts=2 tk=2 h=1 dn=4 dr=2 p=8 bs=2 nb=2 entry_pad=1 block_pad=3 table_pad=2");
  case_data c = make_case(p);
  CHECK(c.args.cache.shape_string() == "[2, 2, 6]");
  CHECK(c.args.cache.strides_elems[1] == 7);
  CHECK(c.args.cache.strides_elems[0] == 17);
  CHECK(c.buffers.at("cache").size_bytes() == 2 * 17 * 2);
  CHECK(c.args.cos_sin.shape_string() == "[8, 2]");
  CHECK(c.args.cos_sin.strides_elems[0] == 4);
  CHECK_FALSE(c.args.ckv_cache.present());
}

TEST_CASE("make_case: outputs and caches poisoned (padding bytes included), guards intact") {
  const problem p = random_problem(5, 17, 64);
  case_data c = make_case(p);
  for (const char* out : {"q_out", "cache", "ckv_cache", "kpe_cache"}) {
    auto it = c.buffers.find(out);
    if (it == c.buffers.end()) continue;
    CHECK(count_not_poison(it->second.data(), it->second.size_bytes()) == 0);
  }
  for (const auto& [name, b] : c.buffers) {
    INFO(name);
    CHECK(b.guards_intact());
  }
  const std::vector<memory_region> regions = c.regions();
  CHECK(regions.size() == c.buffers.size());
  for (const memory_region& r : regions) CHECK(r.base != nullptr);
}

TEST_CASE("make_case: slots distinct and in range, -1 placed per pad_at") {
  for (const char* where : {"head", "middle", "tail", "spread"}) {
    INFO(where);
    const problem p = parse_problem(std::string("tq=6 ts=10 tk=12 h=1 dn=4 dr=2 bs=3 nb=3 pad_slots=4 slot=i32 pad_at=") + where);
    case_data c = make_case(p);
    std::vector<int64_t> s;
    for (int64_t t = 0; t < 10; ++t) s.push_back(load_int(c.args.slot_mapping, t));
    std::set<int64_t> distinct;
    std::vector<int64_t> pads;
    for (int64_t t = 0; t < 10; ++t) {
      if (s[t] < 0) {
        CHECK(s[t] == -1);
        pads.push_back(t);
      } else {
        CHECK(s[t] < 9);
        distinct.insert(s[t]);
      }
    }
    CHECK(pads.size() == 4);
    CHECK(distinct.size() == 6);
    const std::string w = where;
    if (w == "head") CHECK(pads == std::vector<int64_t>{0, 1, 2, 3});
    if (w == "tail") CHECK(pads == std::vector<int64_t>{6, 7, 8, 9});
    if (w == "middle") CHECK(pads == std::vector<int64_t>{3, 4, 5, 6});
  }
  // every slot of a full cache used exactly once
  const problem full = parse_problem("tq=1 ts=64 tk=64 h=1 dn=4 dr=2 bs=16 nb=4 slot=i64");
  case_data c = make_case(full);
  std::set<int64_t> all;
  for (int64_t t = 0; t < 64; ++t) all.insert(load_int(c.args.slot_mapping, t));
  CHECK(all.size() == 64);
  CHECK(*all.begin() == 0);
  CHECK(*all.rbegin() == 63);
}

TEST_CASE("make_case: positions per mode; clamp puts some out of range on both sides") {
  const int64_t P = 100;
  auto positions = [&](const std::string& extra) {
    const problem p = parse_problem("tq=200 ts=300 tk=400 h=1 dn=4 dr=2 bs=16 nb=20 p=100 " + extra);
    case_data c = make_case(p);
    std::vector<int64_t> v;
    for (int64_t t = 0; t < p.tk; ++t) v.push_back(load_int(c.args.positions, t));
    return v;
  };
  const std::vector<int64_t> r = positions("positions=random pos=i32");
  for (int64_t t = 0; t < 300; ++t) CHECK((r[t] >= 0 && r[t] < P));  // used tokens in range
  int stale = 0;
  for (int64_t t = 300; t < 400; ++t) stale += r[t] < 0 || r[t] >= P;  // unused: stale values
  CHECK(stale > 20);
  CHECK(std::set<int64_t>(r.begin(), r.begin() + 300).size() > 50);
  const std::vector<int64_t> e = positions("positions=near_end");
  for (int64_t t = 0; t < 300; ++t) CHECK((e[t] >= P - 8 && e[t] < P));
  const std::vector<int64_t> s = positions("positions=same");
  for (int64_t t = 1; t < 300; ++t) CHECK(s[t] == s[0]);
  const std::vector<int64_t> c = positions("pos_oob=clamp");
  int below = 0, above = 0;
  for (int64_t v : c) {
    below += v < 0;
    above += v >= P;
  }
  CHECK(below > 5);
  CHECK(above > 5);
  CHECK(below + above < 100);
  // padding tokens whose q row is skipped are unused: they may hold stale positions
  const std::vector<int64_t> k = positions("pad_slots=300 pad_q=skipped");
  int stale_pad = 0;
  for (int64_t t = 0; t < 300; ++t) stale_pad += k[t] < 0 || k[t] >= P;
  CHECK(stale_pad > 50);
  const std::vector<int64_t> q = positions("pad_slots=300 pad_q=computed");
  for (int64_t t = 0; t < 200; ++t) CHECK((q[t] >= 0 && q[t] < P));  // q rows computed: used
}

TEST_CASE("make_case: a preset's YaRN table, rounded to the table dtype") {
  const problem p = parse_problem("tq=1 ts=1 tk=1 h=1 dn=4 dr=64 p=300 rope_table=deepseek-v3 table_dtype=bf16 table_pad=3");
  case_data c = make_case(p);
  const std::vector<float> y = yarn_cos_sin_f32(find_preset("deepseek-v3").yarn, 64, 300);
  for (int64_t r = 0; r < 300; r += 7)
    for (int64_t i = 0; i < 64; ++i) {
      const double want = decode_to_f64(dtype::bf16, encode_from_f32(dtype::bf16, y[r * 64 + i], overflow_mode::ieee));
      CHECK(load_float(c.args.cos_sin, {r, i}) == want);
    }
}

TEST_CASE("make_case: deterministic; the seed changes the data; clone is deep") {
  const problem p = random_problem(11, 3, 64);
  case_data a = make_case(p);
  case_data b = make_case(p);
  CHECK(same_bytes(a, b));
  problem q = p;
  q.seed = p.seed + 1;
  case_data d = make_case(q);
  bool differs = false;
  for (const auto& [name, buf] : a.buffers)
    if (buf.size_bytes() > 0 && std::memcmp(buf.data(), d.buffers.at(name).data(), buf.size_bytes()) != 0) differs = true;
  CHECK(differs);

  case_data k = a.clone();
  CHECK(k.prob == a.prob);
  CHECK(same_bytes(a, k));
  // views rebased into the copy, same offsets
  auto rel = [](const case_data& c, const tensor_view& v, const char* buf) {
    return static_cast<const uint8_t*>(v.data) - c.buffers.at(buf).data();
  };
  CHECK(k.args.q_out.data != a.args.q_out.data);
  CHECK(rel(k, k.args.q_out, "q_out") == rel(a, a.args.q_out, "q_out"));
  CHECK(k.args.q_out.strides_elems == a.args.q_out.strides_elems);
  // writing the copy leaves the original alone
  k.buffers.at("q_out").data()[0] ^= 0xff;
  CHECK(a.buffers.at("q_out").data()[0] == poison_byte);
  CHECK(k.buffers.at("q_out").guards_intact());
}

TEST_CASE("make_case: 300 random problems build, and validate() accepts their views") {
  for (uint64_t i = 0; i < 300; ++i) {
    const problem p = random_problem(77, i, 256);
    INFO(p.to_repro());
    case_data c = make_case(p);
    CHECK_NOTHROW(validate(c.args));
  }
}

TEST_CASE("make_case: input values are encode_from_f64 of the promised uniform values, every dtype") {
  // amp 1e-4 puts f16 values in the subnormal range, 7e4 beyond f16's max (-> inf), 300 is plain.
  for (const char* in : {"f32", "f16", "bf16"})
    for (const char* amp : {"1e-4", "0.5", "300", "70000"}) {
      const problem p = parse_problem(std::string("tq=16 ts=16 tk=16 h=8 dn=100 dr=6 bs=16 nb=1 in=") + in + " amp=" + amp);
      INFO(p.to_repro());
      case_data c = make_case(p);
      int64_t mismatches = 0;
      for (int64_t t = 0; t < 16; ++t)
        for (int64_t h = 0; h < 8; ++h)
          for (int64_t d = 0; d < 100; ++d) {
            const double got = load_float(c.args.q_nope, {t, h, d});
            const double want = promised(p, 1, (t * 8 + h) * 100 + d);
            mismatches += !(got == want || (std::isnan(got) && std::isnan(want)));
          }
      CHECK(mismatches == 0);
    }
}
