// One case in memory: buffers with the strides the problem asks for, deterministic inputs,
// poisoned outputs.
#include "core/case_data.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/convert.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/memory_budget.h"
#include "core/presets.h"
#include "core/rng.h"

namespace ropekv {

namespace {

// RNG tensor ids: fixed forever (golden data and repro strings depend on them).
enum : uint64_t {
  id_q_nope = 1,
  id_q_pe = 2,
  id_kv_c = 3,
  id_k_pe = 4,
  id_positions = 5,
  id_slots = 6,
  id_angles = 7,
  id_same_position = 8,
  id_pad_choice = 9,
  id_oob_choice = 10,
  id_stale = 11,
};

// Layout of every buffer of a case, derived from the problem alone.
struct layout {
  int64_t q_nope_row, q_pe_row;  // innermost row stride of q_nope / q_pe (elements)
  int64_t kv_c_row, k_pe_row;    // row stride of kv_c / k_pe (fused: the same)
  int64_t q_out_row;
  int64_t table_row;             // cos_sin, or each of cos / sin
  int64_t entry_stride[2];       // joint: [0]; split: ckv [0], kpe [1]
  int64_t block_stride[2];
  int64_t head_stride[2];        // kv heads (kh > 1): between the heads of a block
};

// kh > 1, layout joint or split: the cache's memory order. AITER's [nb, KH, bs, D] (heads outer),
// or, when bit 1 of the seed is set, vLLM's [nb, bs, KH, D] (heads inner: the entry stride spans
// KH rows) viewed as [nb, KH, bs, D]. Shuffled keeps each (block, head) pair's tiled run whole.
bool cache_heads_inner(const problem& p) {
  return p.kv_heads > 1 && p.opt.layout != cache_layout::shuffled && ((p.seed >> 1) & 1) != 0;
}

layout layout_of(const problem& p) {
  layout l{};
  l.q_nope_row = p.dn + p.row_pad_elems;
  l.q_pe_row = p.dr + p.row_pad_elems;
  if (p.kv_layout == kv_storage::fused) {
    l.kv_c_row = l.k_pe_row = p.dn + p.dr + p.row_pad_elems;
  } else {
    l.kv_c_row = p.dn + p.row_pad_elems;
    l.k_pe_row = p.dr + p.row_pad_elems;
  }
  l.q_out_row = p.dn + p.dr + p.row_pad_elems;
  l.table_row = (p.table == table_kind::one ? p.dr : p.dr / 2) + p.table_pad_elems;
  if (single_cache_tensor(p.opt.layout)) {
    l.entry_stride[0] = cache_row_elems(p.opt.layout, p.dn, p.dr) + p.entry_pad_elems;
    l.entry_stride[1] = 0;
  } else {
    l.entry_stride[0] = p.dn + p.entry_pad_elems;
    l.entry_stride[1] = p.dr + p.entry_pad_elems;
  }
  const bool inner = cache_heads_inner(p);
  // saturating: the budget of an out-of-bounds problem (check_problem refuses it) must not wrap
  for (int i = 0; i < 2; ++i) {
    const int64_t row = l.entry_stride[i];
    if (inner) {
      l.head_stride[i] = row;
      l.entry_stride[i] = sat_mul(p.kv_heads, row);
      l.block_stride[i] = sat_add(sat_mul(p.block_size, l.entry_stride[i]), p.block_pad_elems);
    } else {
      l.head_stride[i] = sat_mul(p.block_size, row);
      l.block_stride[i] = sat_add(sat_mul(p.kv_heads, l.head_stride[i]), p.block_pad_elems);
    }
  }
  return l;
}

size_t bytes_of(int64_t elems, dtype t) {
  return static_cast<size_t>(elems) * dtype_size_bytes(t);
}

// Bytes of `elems` elements of t, saturating at INT64_MAX (the budget of a problem that breaks
// its constraints must not wrap).
int64_t sat_bytes(int64_t elems, dtype t) { return sat_mul(elems, static_cast<int64_t>(dtype_size_bytes(t))); }

// Sizes in bytes of every buffer, by name (saturating: check_problem bounds each to 2^40).
std::map<std::string, int64_t> buffer_sizes(const problem& p) {
  const layout l = layout_of(p);
  std::map<std::string, int64_t> s;
  const int64_t q_rows = sat_mul(p.tq, p.heads);
  if (!p.zero_copy) s["q_nope"] = sat_bytes(sat_mul(q_rows, l.q_nope_row), p.in_dtype);
  s["q_pe"] = sat_bytes(sat_mul(q_rows, l.q_pe_row), p.in_dtype);
  const int64_t k_rows = sat_mul(p.tk, p.kv_heads);
  if (p.kv_layout == kv_storage::fused) {
    s["kv"] = sat_bytes(sat_mul(k_rows, l.kv_c_row), p.in_dtype);
  } else {
    s["kv_c"] = sat_bytes(sat_mul(k_rows, l.kv_c_row), p.in_dtype);
    s["k_pe"] = sat_bytes(sat_mul(k_rows, l.k_pe_row), p.in_dtype);
  }
  s["positions"] = sat_bytes(p.tk, p.pos_dtype);
  s["slot_mapping"] = sat_bytes(p.ts, p.slot_dtype);
  if (p.table == table_kind::one) {
    s["cos_sin"] = sat_bytes(sat_mul(p.table_rows, l.table_row), p.table_dtype);
  } else {
    s["cos"] = sat_bytes(sat_mul(p.table_rows, l.table_row), p.table_dtype);
    s["sin"] = sat_bytes(sat_mul(p.table_rows, l.table_row), p.table_dtype);
  }
  s["q_out"] = sat_bytes(sat_mul(q_rows, l.q_out_row), p.q_out_dtype);
  if (single_cache_tensor(p.opt.layout)) {
    s["cache"] = sat_bytes(sat_mul(p.num_blocks, l.block_stride[0]), p.cache_dtype);
  } else {
    s["ckv_cache"] = sat_bytes(sat_mul(p.num_blocks, l.block_stride[0]), p.cache_dtype);
    s["kpe_cache"] = sat_bytes(sat_mul(p.num_blocks, l.block_stride[1]), p.cache_dtype);
  }
  if (p.scales == scale_storage::tensor) s["k_scale"] = s["q_scale"] = sizeof(float);
  // Decode outputs: rows padded like the inputs' (row_pad), poisoned like every output.
  const int64_t dec_rows = sat_mul(p.dec_tokens, p.heads);
  if (p.dec_q_pe) s["decode_q_pe_out"] = sat_bytes(sat_mul(dec_rows, sat_add(p.dr, p.row_pad_elems)), p.in_dtype);
  if (p.dec_zeros) s["q_nope_zeros_out"] = sat_bytes(sat_mul(dec_rows, sat_add(p.dn, p.row_pad_elems)), p.in_dtype);
  if (p.dec_k_pe) s["k_pe_out"] = sat_bytes(sat_mul(k_rows, sat_add(p.dr, p.row_pad_elems)), p.in_dtype);
  return s;
}

// A buffer of `size_bytes`, with a clear error when the allocation fails (not a bare bad_alloc).
host_buffer allocate_buffer(const std::string& name, int64_t size_bytes, size_t guard_bytes) {
  if (size_bytes < 0 || size_bytes == INT64_MAX)
    throw arg_error("case buffer " + name, "at most 2^62 bytes", "more (the problem breaks its bounds)");
  try {
    return host_buffer(static_cast<size_t>(size_bytes), guard_bytes);
  } catch (const std::bad_alloc&) {
    throw error(fmt::format("out of memory allocating case buffer {} ({}): use --max-memory to check a "
                            "case's memory before it is built, or fewer tokens",
                            name, human_bytes(static_cast<uint64_t>(size_bytes))));
  }
}

uint8_t* buf(std::map<std::string, host_buffer>& b, const char* name) {
  auto it = b.find(name);
  if (it == b.end()) throw error(fmt::format("case_data: buffer '{}' missing", name));
  return it->second.data();
}

// The views of a case into its buffers (used by make_case and clone).
op_args make_args(const problem& p, std::map<std::string, host_buffer>& b) {
  const layout l = layout_of(p);
  op_args a;
  const int64_t T = p.tq, H = p.heads;
  if (p.q_layout == q_storage::token_major) {
    if (!p.zero_copy)
      a.q_nope = make_view(p.in_dtype, buf(b, "q_nope"), {T, H, p.dn}, {H * l.q_nope_row, l.q_nope_row, 1});
    a.q_pe = make_view(p.in_dtype, buf(b, "q_pe"), {T, H, p.dr}, {H * l.q_pe_row, l.q_pe_row, 1});
  } else {  // memory [H, T, D] viewed as [T, H, D]
    if (!p.zero_copy)
      a.q_nope = make_view(p.in_dtype, buf(b, "q_nope"), {T, H, p.dn}, {l.q_nope_row, T * l.q_nope_row, 1});
    a.q_pe = make_view(p.in_dtype, buf(b, "q_pe"), {T, H, p.dr}, {l.q_pe_row, T * l.q_pe_row, 1});
  }
  // k rows: [Tk, D] (kh = 1), or [Tk, KH, D] token-major (kh > 1)
  const int64_t KH = p.kv_heads;
  auto k_view = [&](uint8_t* base, int64_t width, int64_t row) {
    if (KH == 1) return make_view(p.in_dtype, base, {p.tk, width}, {row, 1});
    return make_view(p.in_dtype, base, {p.tk, KH, width}, {KH * row, row, 1});
  };
  if (p.kv_layout == kv_storage::fused) {
    uint8_t* kv = buf(b, "kv");
    a.kv_c = k_view(kv, p.dn, l.kv_c_row);
    a.k_pe = k_view(kv + bytes_of(p.dn, p.in_dtype), p.dr, l.k_pe_row);
  } else {
    a.kv_c = k_view(buf(b, "kv_c"), p.dn, l.kv_c_row);
    a.k_pe = k_view(buf(b, "k_pe"), p.dr, l.k_pe_row);
  }
  a.positions = make_view(p.pos_dtype, buf(b, "positions"), {p.tk}, {1});
  a.slot_mapping = make_view(p.slot_dtype, buf(b, "slot_mapping"), {p.ts}, {1});
  if (p.table == table_kind::one) {
    a.cos_sin = make_view(p.table_dtype, buf(b, "cos_sin"), {p.table_rows, p.dr}, {l.table_row, 1});
  } else {
    a.cos = make_view(p.table_dtype, buf(b, "cos"), {p.table_rows, p.dr / 2}, {l.table_row, 1});
    a.sin = make_view(p.table_dtype, buf(b, "sin"), {p.table_rows, p.dr / 2}, {l.table_row, 1});
  }
  a.q_out = make_view(p.q_out_dtype, buf(b, "q_out"), {T, H, p.dn + p.dr}, {H * l.q_out_row, l.q_out_row, 1});
  // zero-copy concat: q_nope is q_out's first Dn columns (make_case fills them through this view)
  if (p.zero_copy) a.q_nope = make_view(p.in_dtype, a.q_out.data, {T, H, p.dn}, {H * l.q_out_row, l.q_out_row, 1});
  const int64_t nb = p.num_blocks, bs = p.block_size;
  // caches: [nb, bs, D] (kh = 1), or [nb, KH, bs, D] (kh > 1; memory order: layout_of)
  auto cache_view = [&](uint8_t* base, int64_t width, int i) {
    if (KH == 1) return make_view(p.cache_dtype, base, {nb, bs, width}, {l.block_stride[i], l.entry_stride[i], 1});
    return make_view(p.cache_dtype, base, {nb, KH, bs, width},
                     {l.block_stride[i], l.head_stride[i], l.entry_stride[i], 1});
  };
  if (single_cache_tensor(p.opt.layout)) {
    a.cache = cache_view(buf(b, "cache"), cache_row_elems(p.opt.layout, p.dn, p.dr), 0);
  } else {
    a.ckv_cache = cache_view(buf(b, "ckv_cache"), p.dn, 0);
    a.kpe_cache = cache_view(buf(b, "kpe_cache"), p.dr, 1);
  }
  if (p.scales == scale_storage::tensor) {
    // The floats are a NaN decoy: a backend must read the tensors (validate rejects a NaN float).
    a.k_scale_tensor = make_view(dtype::f32, buf(b, "k_scale"), {1}, {1});
    a.q_scale_tensor = make_view(dtype::f32, buf(b, "q_scale"), {1}, {1});
    a.k_scale = a.q_scale = std::numeric_limits<float>::quiet_NaN();
  } else {
    a.k_scale = p.k_scale;
    a.q_scale = p.q_scale;
  }
  // Decode outputs [N, H, D]: token-major, or head-major memory [H, N, D] like q with
  // q_layout=head_major (so both orders of the outer strides are exercised).
  const int64_t N = p.dec_tokens;
  auto decode_view = [&](const char* name, int64_t width) {
    const int64_t row = width + p.row_pad_elems;
    if (p.q_layout == q_storage::token_major)
      return make_view(p.in_dtype, buf(b, name), {N, H, width}, {H * row, row, 1});
    return make_view(p.in_dtype, buf(b, name), {N, H, width}, {row, N * row, 1});
  };
  if (p.dec_q_pe) a.decode_q_pe_out = decode_view("decode_q_pe_out", p.dr);
  if (p.dec_zeros) a.q_nope_zeros_out = decode_view("q_nope_zeros_out", p.dn);
  if (p.dec_k_pe) a.k_pe_out = k_view(buf(b, "k_pe_out"), p.dr, p.dr + p.row_pad_elems);
  a.options = p.opt;
  return a;
}

// encode_from_f64(t, x, ieee) for the input dtypes, fast: a double in the normal range of f16 /
// bf16 is rounded to nearest even on its own bits (one rounding, like encode_from_f64); zero,
// subnormal results and overflow take encode_from_f64. test_case_data.cpp checks both agree.
uint32_t encode_input(dtype t, double x) {
  uint64_t b;
  std::memcpy(&b, &x, 8);
  const uint32_t sign16 = static_cast<uint32_t>(b >> 63) << 15;
  int man_bits, bias;
  double min_normal, max_finite;
  switch (t) {
    case dtype::f32: {
      const float f = static_cast<float>(x);  // one IEEE rounding to nearest even
      uint32_t fb;
      std::memcpy(&fb, &f, 4);
      return fb;
    }
    case dtype::bf16: man_bits = 7; bias = 127; min_normal = 0x1p-126; max_finite = 0x1.fep127; break;
    case dtype::f16: man_bits = 10; bias = 15; min_normal = 0x1p-14; max_finite = 65504.0; break;
    default: return encode_from_f64(t, x, overflow_mode::ieee);
  }
  if (x == 0.0) return sign16;
  if (!(std::abs(x) >= min_normal)) return encode_from_f64(t, x, overflow_mode::ieee);
  const int shift = 52 - man_bits;
  const uint64_t round = (uint64_t{1} << (shift - 1)) - 1 + ((b >> shift) & 1);
  const uint64_t r = (b + round) & ~((uint64_t{1} << shift) - 1);
  double rounded;
  std::memcpy(&rounded, &r, 8);
  if (!(std::abs(rounded) <= max_finite)) return encode_from_f64(t, x, overflow_mode::ieee);
  const uint32_t exp = static_cast<uint32_t>(static_cast<int>((r >> 52) & 0x7ff) - 1023 + bias);
  const uint32_t man = static_cast<uint32_t>((r >> shift) & ((uint64_t{1} << man_bits) - 1));
  return sign16 | (exp << man_bits) | man;
}

uint8_t* elem_ptr(const tensor_view& v, int64_t offset_elems) {
  return static_cast<uint8_t*>(v.data) +
         offset_elems * static_cast<int64_t>(dtype_size_bytes(v.type));
}

// Fills every logical element of a rank-2 or rank-3 float view with uniform [-amp, amp] values
// from rng(seed, id, flat logical index), rounded once to the view's dtype.
void fill_uniform(const tensor_view& v, uint64_t seed, uint64_t id, double amp) {
  const int64_t inner = v.shape[v.rank - 1];
  const int64_t d0 = v.shape[0], d1 = v.rank == 3 ? v.shape[1] : 1;
  const int64_t s0 = v.strides_elems[0], s1 = v.rank == 3 ? v.strides_elems[1] : 0;
  for (int64_t i = 0; i < d0; ++i) {
    for (int64_t j = 0; j < d1; ++j) {
      const int64_t row = i * d1 + j;
      uint8_t* base = elem_ptr(v, i * s0 + j * s1);
      for (int64_t k = 0; k < inner; ++k) {
        const uint64_t idx = static_cast<uint64_t>(row * inner + k);
        const double x = (2.0 * rng_unit(seed, id, idx) - 1.0) * amp;
        store_bits(v.type, base + k * static_cast<int64_t>(dtype_size_bytes(v.type)),
                   encode_input(v.type, x));
      }
    }
  }
}

// Full YaRN tables are expensive (163840 rows); keep the ones built in this process.
std::vector<float> yarn_table_cached(const model_preset& m, int64_t dr, int64_t rows) {
  const int64_t full_rows = yarn_table_rows(m.yarn);
  if (rows < full_rows) return yarn_cos_sin_f32(m.yarn, dr, rows);
  static std::mutex mutex;
  static std::map<std::pair<std::string, int64_t>, std::vector<float>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_pair(m.name, dr);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, yarn_cos_sin_f32(m.yarn, dr, full_rows)).first;
  return it->second;
}

void fill_tables(const problem& p, const op_args& a) {
  const int64_t half = p.dr / 2;
  const dtype t = p.table_dtype;
  const size_t esz = dtype_size_bytes(t);
  // cos_value(row, i), sin_value(row, i) as fp32/double, then one rounding into the table dtype.
  auto write = [&](int64_t row, int64_t i, double c, double s) {
    const uint32_t cb = encode_input(t, c);
    const uint32_t sb = encode_input(t, s);
    if (p.table == table_kind::one) {
      uint8_t* r = elem_ptr(a.cos_sin, row * a.cos_sin.strides_elems[0]);
      store_bits(t, r + i * esz, cb);
      store_bits(t, r + (half + i) * esz, sb);
    } else {
      store_bits(t, elem_ptr(a.cos, row * a.cos.strides_elems[0]) + i * esz, cb);
      store_bits(t, elem_ptr(a.sin, row * a.sin.strides_elems[0]) + i * esz, sb);
    }
  };
  if (p.rope_table == "random") {
    constexpr double two_pi = 6.283185307179586476925286766559;
    for (int64_t row = 0; row < p.table_rows; ++row)
      for (int64_t i = 0; i < half; ++i) {
        const double theta =
            (rng_unit(p.seed, id_angles, static_cast<uint64_t>(row * half + i)) - 0.5) * two_pi;
        write(row, i, std::cos(theta), std::sin(theta));
      }
  } else {
    const model_preset& m = find_preset(p.rope_table);
    const std::vector<float> table = yarn_table_cached(m, p.dr, p.table_rows);
    for (int64_t row = 0; row < p.table_rows; ++row)
      for (int64_t i = 0; i < half; ++i)
        write(row, i, table[static_cast<size_t>(row * p.dr + i)],
              table[static_cast<size_t>(row * p.dr + half + i)]);
  }
}

// k distinct values of [0, n) from a partial Fisher-Yates shuffle (sparse: O(k) memory).
std::vector<int64_t> distinct_sample(uint64_t seed, uint64_t id, int64_t n, int64_t k) {
  std::unordered_map<int64_t, int64_t> swapped;
  auto at = [&](int64_t i) {
    auto it = swapped.find(i);
    return it == swapped.end() ? i : it->second;
  };
  std::vector<int64_t> out(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    const int64_t j = i + static_cast<int64_t>(
                              rng_below(seed, id, static_cast<uint64_t>(i), static_cast<uint64_t>(n - i)));
    const int64_t vi = at(i), vj = at(j);
    swapped[j] = vi;
    out[static_cast<size_t>(i)] = vj;
  }
  return out;
}

// Which of the first Ts tokens get slot -1, per pad_at.
std::vector<bool> padding_tokens(const problem& p) {
  std::vector<bool> pad(static_cast<size_t>(p.ts), false);
  const int64_t n = p.pad_slots;
  switch (p.pad_where) {
    case pad_at::head:
      for (int64_t t = 0; t < n; ++t) pad[static_cast<size_t>(t)] = true;
      break;
    case pad_at::tail:
      for (int64_t t = p.ts - n; t < p.ts; ++t) pad[static_cast<size_t>(t)] = true;
      break;
    case pad_at::middle: {
      const int64_t start = (p.ts - n) / 2;
      for (int64_t t = start; t < start + n; ++t) pad[static_cast<size_t>(t)] = true;
      break;
    }
    case pad_at::spread:
      for (int64_t t : distinct_sample(p.seed, id_pad_choice, p.ts, n)) pad[static_cast<size_t>(t)] = true;
      break;
    default:
      throw error(fmt::format("padding_tokens: invalid pad_at value {}", static_cast<int>(p.pad_where)));
  }
  return pad;
}

void fill_indices(const problem& p, const op_args& a) {
  // slots: distinct, random, in [0, nb * bs); -1 at padding tokens
  const std::vector<bool> pad = padding_tokens(p);
  const std::vector<int64_t> slots =
      distinct_sample(p.seed, id_slots, p.num_blocks * p.block_size, p.ts - p.pad_slots);
  size_t next = 0;
  const size_t slot_bytes = dtype_size_bytes(p.slot_dtype);
  for (int64_t t = 0; t < p.ts; ++t) {
    const int64_t s = pad[static_cast<size_t>(t)] ? -1 : slots[next++];
    store_bits(p.slot_dtype, static_cast<uint8_t*>(a.slot_mapping.data) + t * slot_bytes,
               static_cast<uint64_t>(s));  // store_bits keeps the low bytes (two's complement)
  }
  // positions
  const int64_t P = p.table_rows;
  const int64_t same = static_cast<int64_t>(rng_below(p.seed, id_same_position, 0, static_cast<uint64_t>(P)));
  const int64_t pos_max = p.pos_dtype == dtype::i32 ? INT32_MAX : INT64_MAX;
  const size_t pos_bytes = dtype_size_bytes(p.pos_dtype);
  for (int64_t t = 0; t < p.tk; ++t) {
    const uint64_t ut = static_cast<uint64_t>(t);
    int64_t pos = 0;
    switch (p.positions) {
      case pos_mode::random:
        pos = static_cast<int64_t>(rng_below(p.seed, id_positions, ut, static_cast<uint64_t>(P)));
        break;
      case pos_mode::near_end:
        pos = P - 1 - static_cast<int64_t>(rng_below(p.seed, id_positions, ut,
                                                     static_cast<uint64_t>(std::min<int64_t>(8, P))));
        break;
      case pos_mode::same:
        pos = same;
        break;
      default:
        throw error(fmt::format("fill_indices: invalid pos_mode value {}", static_cast<int>(p.positions)));
    }
    // A token is used when t < Ts and (slot >= 0 or its q row is computed) (core/SPEC.md).
    const bool has_slot = t < p.ts && !pad[static_cast<size_t>(t)];
    const bool q_computed = t < p.tq && (has_slot || p.opt.padding == pad_q::computed);
    const bool used = t < p.ts && (has_slot || q_computed);
    const double u = rng_unit(p.seed, id_oob_choice, ut);
    // clamp: ~10% of positions out of range on purpose (half below 0, half >= P);
    // unused tokens: half hold a stale out-of-range position that must never be read.
    const bool out_of_range = p.opt.positions == pos_oob::clamp ? u < 0.1 : (!used && u < 0.5);
    if (out_of_range) {
      const uint64_t r = rng_u64(p.seed, id_stale, ut);
      const int64_t delta = static_cast<int64_t>((r >> 1) % 1000);
      if (r & 1) pos = -1 - delta;
      else pos = P + std::min<int64_t>(delta, pos_max - P);
    }
    store_bits(p.pos_dtype, static_cast<uint8_t*>(a.positions.data) + t * pos_bytes,
               static_cast<uint64_t>(pos));
  }
}

}  // namespace


std::vector<memory_region> case_data::regions() {
  std::vector<memory_region> out;
  out.reserve(buffers.size());
  for (auto& [name, b] : buffers) out.push_back(memory_region{b.raw(), b.raw_size_bytes()});
  return out;
}

case_data case_data::clone() const {
  if (!dropped.empty()) throw error("case_data::clone: the case dropped its poisoned outputs (clone_outputs makes them anew)");
  case_data c;
  c.prob = prob;
  for (const auto& [name, b] : buffers) {
    host_buffer copy = allocate_buffer(name, static_cast<int64_t>(b.size_bytes()), b.guard_bytes());
    std::memcpy(copy.raw(), b.raw(), b.raw_size_bytes());
    c.buffers.emplace(name, std::move(copy));
  }
  c.args = make_args(c.prob, c.buffers);
  return c;
}

std::vector<case_buffer_size> case_buffer_sizes(const problem& prob) {
  std::vector<case_buffer_size> out;
  const int64_t guard = static_cast<int64_t>(host_buffer::default_guard_bytes);
  for (const auto& [name, size] : buffer_sizes(prob)) {
    case_buffer_size b;
    b.name = name;
    b.data_bytes = size;
    b.alloc_bytes = host_buffer::allocation_bytes(size, guard);
    b.output = is_output_buffer(prob, name);
    out.push_back(std::move(b));
  }
  return out;
}

bool is_output_buffer(const problem& prob, const std::string& name) {
  static const char* const outputs[] = {"q_out", "cache", "ckv_cache", "kpe_cache", "decode_q_pe_out",
                                        "k_pe_out", "q_nope_zeros_out"};
  for (const char* o : outputs)
    if (name == o) return true;
  if (prob.opt.inplace_q && name == "q_pe") return true;
  if (prob.opt.inplace_k && (name == "k_pe" || (name == "kv" && prob.kv_layout == kv_storage::fused))) return true;
  return false;
}

namespace {
bool is_pure_output(const std::string& name) {
  static const char* const outputs[] = {"q_out", "cache", "ckv_cache", "kpe_cache", "decode_q_pe_out",
                                        "k_pe_out", "q_nope_zeros_out"};
  for (const char* o : outputs)
    if (name == o) return true;
  return false;
}
}  // namespace

case_data case_data::clone_outputs() const {
  case_data c;
  c.prob = prob;
  for (const auto& [name, b] : buffers) {
    if (!is_output_buffer(prob, name)) {
      c.buffers.emplace(name, b.share());
      continue;
    }
    host_buffer copy = allocate_buffer(name, static_cast<int64_t>(b.size_bytes()), b.guard_bytes());
    std::memcpy(copy.raw(), b.raw(), b.raw_size_bytes());
    c.buffers.emplace(name, std::move(copy));
  }
  for (const auto& [name, size] : dropped) {
    host_buffer fresh = allocate_buffer(name, static_cast<int64_t>(size), host_buffer::default_guard_bytes);
    fill_poison(fresh.data(), fresh.size_bytes());
    c.buffers.emplace(name, std::move(fresh));
  }
  c.args = make_args(c.prob, c.buffers);
  return c;
}

std::vector<std::string> case_data::drop_poison_outputs() {
  std::vector<std::string> names;
  for (auto it = buffers.begin(); it != buffers.end();) {
    const host_buffer& b = it->second;
    if (is_pure_output(it->first) && b.guard_bytes() == host_buffer::default_guard_bytes && b.guards_intact() &&
        count_not_poison(b.data(), b.size_bytes()) == 0) {
      names.push_back(it->first);
      dropped[it->first] = b.size_bytes();
      it = buffers.erase(it);
    } else {
      ++it;
    }
  }
  // the views of dropped buffers keep their (now dangling) addresses: compare_runs takes them
  // from a run instead; nothing else may read them
  return names;
}

void case_data::replace_buffer(const std::string& name, host_buffer b) {
  host_buffer& old = buffers.at(name);
  if (b.size_bytes() != old.size_bytes() || b.guard_bytes() != old.guard_bytes())
    throw error(fmt::format("case_data::replace_buffer: buffer {} of another size", name));
  const uint8_t* lo = old.data();
  const uint8_t* hi = lo + old.size_bytes();
  for (const auto& [view_name, view] : named_tensors(args)) {
    auto* v = const_cast<tensor_view*>(view);
    auto* p = static_cast<uint8_t*>(v->data);
    if (p && p >= lo && p <= hi) v->data = b.data() + (p - lo);
  }
  old = std::move(b);
}

uint64_t buffer_checksum(const host_buffer& b) {
  const uint8_t* p = b.raw();
  const size_t n = b.raw_size_bytes();
  uint64_t h = 0x243f6a8885a308d3ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

case_data make_case(const problem& prob) {
  check_problem(prob);
  case_data c;
  c.prob = prob;
  for (const auto& [name, size] : buffer_sizes(prob)) {
    host_buffer b = allocate_buffer(name, size, host_buffer::default_guard_bytes);
    // Inputs' padding bytes are poisoned too: a kernel that reads them sees garbage.
    fill_poison(b.data(), b.size_bytes());
    c.buffers.emplace(name, std::move(b));
  }
  c.args = make_args(prob, c.buffers);
  const double amp = prob.amplitude;
  fill_uniform(c.args.q_nope, prob.seed, id_q_nope, amp);
  fill_uniform(c.args.q_pe, prob.seed, id_q_pe, amp);
  fill_uniform(c.args.kv_c, prob.seed, id_kv_c, amp);
  fill_uniform(c.args.k_pe, prob.seed, id_k_pe, amp);
  fill_tables(prob, c.args);
  fill_indices(prob, c.args);
  if (prob.scales == scale_storage::tensor) {
    std::memcpy(c.args.k_scale_tensor.data, &prob.k_scale, sizeof(float));
    std::memcpy(c.args.q_scale_tensor.data, &prob.q_scale, sizeof(float));
  }
  return c;
}

void apply_zero_copy(case_data& c) {
  if (c.prob.zero_copy) return;
  const op_args& a = c.args;
  if (a.q_out.type != a.q_nope.type)
    throw arg_error("zero_copy", fmt::format("q_out dtype == q_nope dtype ({})", dtype_name(a.q_nope.type)),
                    std::string(dtype_name(a.q_out.type)));
  const int64_t sz = static_cast<int64_t>(dtype_size_bytes(a.q_nope.type));
  const int64_t tq = a.q_nope.shape[0], h = a.q_nope.shape[1], dn = a.q_nope.shape[2];
  for (int64_t t = 0; t < tq; ++t) {
    for (int64_t i = 0; i < h; ++i) {
      const char* src = static_cast<const char*>(a.q_nope.data) +
                        (t * a.q_nope.strides_elems[0] + i * a.q_nope.strides_elems[1]) * sz;
      char* dst = static_cast<char*>(a.q_out.data) +
                  (t * a.q_out.strides_elems[0] + i * a.q_out.strides_elems[1]) * sz;
      std::memcpy(dst, src, static_cast<size_t>(dn * sz));
    }
  }
  // the case is now what make_case builds for the problem with zero_copy=1 (up to its bytes)
  c.prob.zero_copy = true;
  c.buffers.erase("q_nope");
  c.args = make_args(c.prob, c.buffers);
}

}  // namespace ropekv
