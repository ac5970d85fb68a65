// A small op call built by hand over std::vectors (f32 inputs, i64 indices, any output dtype),
// for the reference and validation tests. Independent of problem/make_case on purpose: the
// tests pin the semantics of core/SPEC.md with numbers written in the test.
#pragma once
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/convert.h"
#include "core/op.h"
#include "core/tensor.h"

namespace ropekv::test {

struct hand_case {
  // sizes (core/SPEC.md notation)
  int64_t tq = 1, ts = 1, tk = 1, heads = 1, dn = 2, dr = 4, rows = 4, nb = 2, bs = 2;
  int64_t entry_pad = 0, block_pad = 0;  // cache padding, in elements
  bool table_two = false;                // cos and sin [P, Dr/2] with one padding column (NaN)
  dtype q_out_dtype = dtype::f32, cache_dtype = dtype::f32;
  op_options opt;
  float k_scale = 1.0f, q_scale = 1.0f;

  // inputs
  std::vector<float> q_nope, q_pe, kv_c, k_pe;  // [Tq, H, Dn], [Tq, H, Dr], [Tk, Dn], [Tk, Dr]
  std::vector<float> cos_sin;                   // [P, Dr]: Dr/2 cos then Dr/2 sin
  std::vector<float> cos_t, sin_t;              // [P, Dr/2 + 1] each (table two, padded rows)
  std::vector<int64_t> positions, slots;        // [Tk], [Ts]
  // outputs (raw bytes of their dtype; poisoned by init())
  std::vector<uint8_t> q_out;                   // [Tq, H, Dn + Dr]
  std::vector<uint8_t> cache, ckv, kpe;         // joint [nb, bs, Dn + Dr] or split ckv / kpe

  int64_t width() const { return dn + dr; }
  int64_t table_two_stride() const { return dr / 2 + 1; }
  int64_t joint_entry_stride() const { return width() + entry_pad; }
  int64_t joint_block_stride() const { return bs * joint_entry_stride() + block_pad; }
  int64_t ckv_entry_stride() const { return dn + entry_pad; }
  int64_t ckv_block_stride() const { return bs * ckv_entry_stride() + block_pad; }
  int64_t kpe_entry_stride() const { return dr + entry_pad; }
  int64_t kpe_block_stride() const { return bs * kpe_entry_stride() + block_pad; }

  // Sizes every vector, fills inputs with distinct values (q_nope[i] = 100 + i, ...),
  // positions 0, slots t, a table of cos 1, sin 0, and poisons the outputs.
  void init() {
    q_nope.assign(static_cast<size_t>(tq * heads * dn), 0.0f);
    q_pe.assign(static_cast<size_t>(tq * heads * dr), 0.0f);
    kv_c.assign(static_cast<size_t>(tk * dn), 0.0f);
    k_pe.assign(static_cast<size_t>(tk * dr), 0.0f);
    for (size_t i = 0; i < q_nope.size(); ++i) q_nope[i] = 100.0f + static_cast<float>(i);
    for (size_t i = 0; i < q_pe.size(); ++i) q_pe[i] = 200.0f + static_cast<float>(i);
    for (size_t i = 0; i < kv_c.size(); ++i) kv_c[i] = 300.0f + static_cast<float>(i);
    for (size_t i = 0; i < k_pe.size(); ++i) k_pe[i] = 400.0f + static_cast<float>(i);
    cos_sin.assign(static_cast<size_t>(rows * dr), 0.0f);
    cos_t.assign(static_cast<size_t>(rows * table_two_stride()), std::numeric_limits<float>::quiet_NaN());
    sin_t.assign(static_cast<size_t>(rows * table_two_stride()), std::numeric_limits<float>::quiet_NaN());
    for (int64_t p = 0; p < rows; ++p) {
      std::vector<float> c(static_cast<size_t>(dr / 2), 1.0f), s(static_cast<size_t>(dr / 2), 0.0f);
      set_table_row(p, c, s);
    }
    positions.assign(static_cast<size_t>(tk), 0);
    slots.resize(static_cast<size_t>(ts));
    for (int64_t t = 0; t < ts; ++t) slots[static_cast<size_t>(t)] = t;
    const size_t qes = dtype_size_bytes(q_out_dtype), ces = dtype_size_bytes(cache_dtype);
    q_out.assign(static_cast<size_t>(tq * heads * width()) * qes, 0);
    cache.assign(static_cast<size_t>(nb * joint_block_stride()) * ces, 0);
    ckv.assign(static_cast<size_t>(nb * ckv_block_stride()) * ces, 0);
    kpe.assign(static_cast<size_t>(nb * kpe_block_stride()) * ces, 0);
    poison_outputs();
  }

  void poison_outputs() {
    fill_poison(q_out.data(), q_out.size());
    fill_poison(cache.data(), cache.size());
    fill_poison(ckv.data(), ckv.size());
    fill_poison(kpe.data(), kpe.size());
  }

  // Row p of the table(s): cos values c[0..Dr/2), sin values s[0..Dr/2).
  void set_table_row(int64_t p, const std::vector<float>& c, const std::vector<float>& s) {
    for (int64_t i = 0; i < dr / 2; ++i) {
      cos_sin[static_cast<size_t>(p * dr + i)] = c[static_cast<size_t>(i)];
      cos_sin[static_cast<size_t>(p * dr + dr / 2 + i)] = s[static_cast<size_t>(i)];
      cos_t[static_cast<size_t>(p * table_two_stride() + i)] = c[static_cast<size_t>(i)];
      sin_t[static_cast<size_t>(p * table_two_stride() + i)] = s[static_cast<size_t>(i)];
    }
  }

  // The op_args over the vectors (valid until a vector is resized).
  op_args args() {
    op_args a;
    a.q_nope = make_view(dtype::f32, q_nope.data(), {tq, heads, dn});
    a.q_pe = make_view(dtype::f32, q_pe.data(), {tq, heads, dr});
    a.kv_c = make_view(dtype::f32, kv_c.data(), {tk, dn});
    a.k_pe = make_view(dtype::f32, k_pe.data(), {tk, dr});
    a.positions = make_view(dtype::i64, positions.data(), {tk});
    a.slot_mapping = make_view(dtype::i64, slots.data(), {ts});
    if (table_two) {
      a.cos = make_view(dtype::f32, cos_t.data(), {rows, dr / 2}, {table_two_stride(), 1});
      a.sin = make_view(dtype::f32, sin_t.data(), {rows, dr / 2}, {table_two_stride(), 1});
    } else {
      a.cos_sin = make_view(dtype::f32, cos_sin.data(), {rows, dr});
    }
    a.q_out = make_view(q_out_dtype, q_out.data(), {tq, heads, width()});
    if (opt.layout == cache_layout::joint) {
      a.cache = make_view(cache_dtype, cache.data(), {nb, bs, width()},
                          {joint_block_stride(), joint_entry_stride(), 1});
    } else {
      a.ckv_cache = make_view(cache_dtype, ckv.data(), {nb, bs, dn},
                              {ckv_block_stride(), ckv_entry_stride(), 1});
      a.kpe_cache = make_view(cache_dtype, kpe.data(), {nb, bs, dr},
                              {kpe_block_stride(), kpe_entry_stride(), 1});
    }
    a.k_scale = k_scale;
    a.q_scale = q_scale;
    a.options = opt;
    return a;
  }

  // Output element readers (decoded through core/convert.h).
  static float decode_at(dtype t, const std::vector<uint8_t>& bytes, int64_t offset_elems) {
    return decode_to_f32(t, static_cast<uint32_t>(load_bits(
                                t, bytes.data() + offset_elems * static_cast<int64_t>(dtype_size_bytes(t)))));
  }
  uint32_t q_out_bits(int64_t t, int64_t h, int64_t f) const {
    return static_cast<uint32_t>(load_bits(
        q_out_dtype, q_out.data() + ((t * heads + h) * width() + f) *
                                        static_cast<int64_t>(dtype_size_bytes(q_out_dtype))));
  }
  float q_out_at(int64_t t, int64_t h, int64_t f) const {
    return decode_to_f32(q_out_dtype, q_out_bits(t, h, f));
  }
  // Joint cache: feature f of the entry of slot s (in the row's own feature order).
  uint32_t cache_bits(int64_t slot, int64_t f) const {
    const int64_t off = (slot / bs) * joint_block_stride() + (slot % bs) * joint_entry_stride() + f;
    return static_cast<uint32_t>(
        load_bits(cache_dtype, cache.data() + off * static_cast<int64_t>(dtype_size_bytes(cache_dtype))));
  }
  float cache_at(int64_t slot, int64_t f) const { return decode_to_f32(cache_dtype, cache_bits(slot, f)); }
  float ckv_at(int64_t slot, int64_t f) const {
    return decode_at(cache_dtype, ckv, (slot / bs) * ckv_block_stride() + (slot % bs) * ckv_entry_stride() + f);
  }
  float kpe_at(int64_t slot, int64_t f) const {
    return decode_at(cache_dtype, kpe, (slot / bs) * kpe_block_stride() + (slot % bs) * kpe_entry_stride() + f);
  }
  // True when q_out row (t, h) still holds poison in every byte.
  bool q_row_poisoned(int64_t t, int64_t h) const {
    const size_t es = dtype_size_bytes(q_out_dtype);
    return count_not_poison(q_out.data() + static_cast<size_t>((t * heads + h) * width()) * es,
                            static_cast<size_t>(width()) * es) == 0;
  }
  // Bytes of the joint cache outside the listed slots' rows that are not poison.
  size_t cache_bytes_changed_outside(const std::vector<int64_t>& written_slots) const {
    std::vector<uint8_t> expect_poison(cache.size(), 1);
    const size_t es = dtype_size_bytes(cache_dtype);
    for (int64_t s : written_slots) {
      const int64_t off = (s / bs) * joint_block_stride() + (s % bs) * joint_entry_stride();
      for (int64_t f = 0; f < width(); ++f) {
        for (size_t b = 0; b < es; ++b) expect_poison[static_cast<size_t>(off + f) * es + b] = 0;
      }
    }
    size_t n = 0;
    for (size_t i = 0; i < cache.size(); ++i) n += expect_poison[i] && cache[i] != poison_byte;
    return n;
  }
  size_t outputs_not_poison() const {
    return count_not_poison(q_out.data(), q_out.size()) + count_not_poison(cache.data(), cache.size()) +
           count_not_poison(ckv.data(), ckv.size()) + count_not_poison(kpe.data(), kpe.size());
  }
};

}  // namespace ropekv::test
