// The reference backend: core/SPEC.md, literally. OpenMP over (token, row) pairs; every
// conversion goes through core/convert.h (its row-wise forms, each equal to the scalar rule);
// cache addresses come from core/cache_map.h.
#include "backends/cpu/cpu_backend.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/cache_map.h"
#include "core/convert.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/validate.h"

namespace ropekv {
namespace {

// A view's data pointer and element size, read once per call (the hot loop then does no
// dtype lookups for addresses).
struct raw_view {
  uint8_t* data;
  int64_t elem_bytes;
  explicit raw_view(const tensor_view& v)
      : data(static_cast<uint8_t*>(v.data)), elem_bytes(static_cast<int64_t>(dtype_size_bytes(v.type))) {}
  uint8_t* at(int64_t offset_elems) const { return data + offset_elems * elem_bytes; }
};


// Per-thread rows, sized once per call.
struct scratch_rows {
  std::vector<float> cos_row, sin_row, x, nope;  // fp32 inputs
  int64_t table_token = -1;                      // the token whose cos/sin rows are loaded
  std::vector<double> rot, scaled, nope_scaled;  // exact rope values; values to be rounded
  std::vector<uint8_t> codes;                    // one output row part, rounded, before its store
  std::vector<uint8_t> entry;                    // layout shuffled: one part, before it is scattered
  explicit scratch_rows(const op_sizes& sz)
      : cos_row(static_cast<size_t>(sz.dr / 2)), sin_row(static_cast<size_t>(sz.dr / 2)),
        x(static_cast<size_t>(sz.dr)), nope(static_cast<size_t>(sz.dn)),
        rot(static_cast<size_t>(sz.dr)), scaled(static_cast<size_t>(sz.dr)),
        nope_scaled(static_cast<size_t>(sz.dn)),
        codes(static_cast<size_t>(std::max(sz.dn, sz.dr)) * 4),
        entry(static_cast<size_t>(std::max(sz.dn, sz.dr)) * 4) {}
};

// How one output (q_out or the cache) rounds its values.
struct output_rule {
  dtype type;
  bool fp8;
  scale_conv conv;
  float scale;             // q_scale or k_scale
  float recip;             // fp32(1 / scale)
  overflow_mode overflow;  // saturate for fp8, ieee otherwise
  int64_t elem_bytes;      // of `type`

  output_rule(dtype t, scale_conv c, float s)
      : type(t), fp8(dtype_is_fp8(t)), conv(c), scale(s), recip(1.0f / s),
        overflow(dtype_is_fp8(t) ? overflow_mode::saturate : overflow_mode::ieee),
        elem_bytes(static_cast<int64_t>(dtype_size_bytes(t))) {
    switch (c) {
      case scale_conv::divide:
      case scale_conv::reciprocal: break;
      default: throw error(fmt::format("reference: bad scale_conv {}", static_cast<int>(c)));
    }
  }

  // Outputs (q_out, the cache) are written once and not read back by the op: their rows are
  // stored with non-temporal stores (core/convert.h *_stream: the same bytes, no
  // read-for-ownership of the destination lines; each thread fences once after its last
  // item). In-place rows (q_pe, k_pe) were just read: plain stores.

  // Data-movement row: n elements of dtype `in` at src -> n elements of `type` at dst.
  // Each is round(fp32(x)), or for fp8 round_sat(fp32(x / scale)) (divide) /
  // round_sat(fp32(x * fp32(1 / scale))) (reciprocal), each a single fp32 operation.
  void write_nope(dtype in, const uint8_t* src, uint8_t* dst, int64_t n, scratch_rows& s) const {
    if (in == type && !fp8) {
      // round(fp32(x)) into x's own dtype is x, except that a NaN becomes the canonical NaN.
      if (src == dst) {
        recode_row_same_dtype(type, src, dst, n);  // zero-copy concat: q_nope is q_out itself
      } else {
        recode_row_same_dtype_stream(type, src, dst, n);
      }
      return;
    }
    float* x = s.nope.data();
    double* v = s.nope_scaled.data();
    decode_row_to_f32(in, src, x, n);  // fp32(x): exact
    if (!fp8) {
      for (int64_t d = 0; d < n; ++d) v[d] = x[d];
    } else if (conv == scale_conv::divide) {
      for (int64_t d = 0; d < n; ++d) v[d] = static_cast<float>(x[d] / scale);  // fp32 divide
    } else {
      for (int64_t d = 0; d < n; ++d) v[d] = static_cast<float>(x[d] * recip);  // fp32 multiply
    }
    encode_row_from_f64(type, v, s.codes.data(), n, overflow);  // one rounding of an fp32 value
    copy_bytes_stream(s.codes.data(), dst, n * elem_bytes);
  }

  // Rope row: rot holds the exact x*C + R(x)*S; scaled in double for fp8 (v / scale, or
  // v * fp32(1 / scale)), then rounded once into n elements of `type` at dst.
  void write_rope(const double* rot, uint8_t* dst, int64_t n, scratch_rows& s) const {
    if (!fp8) {
      encode_row_from_f64(type, rot, s.codes.data(), n, overflow);
    } else {
      double* v = s.scaled.data();
      const double scale_f64 = scale, recip_f64 = recip;
      if (conv == scale_conv::divide) {
        for (int64_t j = 0; j < n; ++j) v[j] = rot[j] / scale_f64;
      } else {
        for (int64_t j = 0; j < n; ++j) v[j] = rot[j] * recip_f64;
      }
      encode_row_from_f64(type, v, s.codes.data(), n, overflow);
    }
    copy_bytes_stream(s.codes.data(), dst, n * elem_bytes);
  }

};

// Layout fp8_ds_mla (core/SPEC.md "The fp8_ds_mla layout"): one 656-byte entry at `entry` from
// kv_c's row (dtype `in`) and the exact rope values `rot` (rounded into k_pe's dtype `rope_t`).
// Per tile of 128 nope values: amax = the largest |x| (fp32(x) exact; NaN ignored, as fmaxf
// does); scale = fp32(amax / 448), at least FLT_MIN (amax) or at least fp32(1e-4) and then the
// smallest power of two >= it (pow2); each value round_sat_e4m3fn(fp32(fp32(x) / scale)), where
// +-inf / inf is the positive NaN.
void write_ds_mla_entry(dtype in, const uint8_t* kv_row, const double* rot, dtype rope_t, ds_scale rule,
                        uint8_t* entry, scratch_rows& s) {
  float* x = s.nope.data();
  double* v = s.nope_scaled.data();
  decode_row_to_f32(in, kv_row, x, ds_mla_dn);
  for (int64_t k = 0; k < ds_mla_tiles; ++k) {
    const float* tile = x + k * ds_mla_tile_elems;
    float amax = 0.0f;
    for (int64_t i = 0; i < ds_mla_tile_elems; ++i) {
      const float a = std::fabs(tile[i]);
      if (a > amax) amax = a;  // a NaN compares false: ignored
    }
    float scale = amax / static_cast<float>(ds_mla_fp8_max);  // one fp32 division
    if (rule == ds_scale::amax) {
      scale = std::max(scale, std::numeric_limits<float>::min());
    } else {
      scale = std::max(scale, 1e-4f);
      if (std::isfinite(scale)) {
        int e = 0;
        const float m = std::frexp(scale, &e);  // scale = m * 2^e, m in [0.5, 1)
        if (m != 0.5f) scale = std::ldexp(1.0f, e);  // inf beyond float's range
      }
    }
    for (int64_t i = 0; i < ds_mla_tile_elems; ++i) {
      const float q = tile[i] / scale;
      // +-inf / inf: the positive NaN, on every platform (x86's default NaN is negative); a NaN
      // input keeps its sign
      v[k * ds_mla_tile_elems + i] = std::isnan(q) && !std::isnan(tile[i]) ? std::numeric_limits<double>::quiet_NaN() : q;
    }
    std::memcpy(entry + ds_mla_scales_offset_bytes + 4 * k, &scale, sizeof scale);
  }
  encode_row_from_f64(dtype::fp8_e4m3fn, v, entry, ds_mla_dn, overflow_mode::saturate);
  encode_row_from_f64(rope_t, rot, entry + ds_mla_rope_offset_bytes, ds_mla_dr, overflow_mode::ieee);
}

// rope(x) for one row of Dr values: out[j] = x[j]*C + R(x[j])*S. The products of two fp32
// values are exact in double, so each sum is the exact value rounded once (in double). One
// plain loop per style so that compilers vectorize both; built also for AVX2 and AVX-512 where
// GCC dispatches at load time: the same bits on every ISA, contracted into an FMA or not
// (both products are exact in double, so fma(a, c, -b*s) rounds the same exact sum once).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
void rope_row(rope_style style, int64_t dr, const float* x, const float* cos_row,
              const float* sin_row, double* out) {
  const int64_t half = dr / 2;
  if (style == rope_style::gptj) {  // pairs (2i, 2i+1) use cos[i], sin[i]
    for (int64_t i = 0; i < half; ++i) {
      const double c = cos_row[i], s = sin_row[i];
      const double a = x[2 * i], b = x[2 * i + 1];
      out[2 * i] = a * c + (-b) * s;     // a' = a*C + R(a)*S, R(a) = -b
      out[2 * i + 1] = b * c + a * s;    // b' = b*C + R(b)*S, R(b) = a
    }
  } else {  // neox: pairs (i, i + Dr/2) use cos[i], sin[i]
    for (int64_t i = 0; i < half; ++i) {
      const double c = cos_row[i], s = sin_row[i];
      const double a = x[i], b = x[i + half];
      out[i] = a * c + (-b) * s;
      out[i + half] = b * c + a * s;
    }
  }
}

}  // namespace

uint32_t reference_round_f64(dtype t, double v) {
  uint32_t code = 0;  // little-endian: the low bytes hold the element
  encode_row_from_f64(t, &v, &code, 1, dtype_is_fp8(t) ? overflow_mode::saturate : overflow_mode::ieee);
  return code;
}

void reference_run(const op_args& args) {
  validate(args, /*check_values=*/true);
  for (const tensor_view* v : {&args.q_nope, &args.q_out, &args.kv_c, &args.cache, &args.ckv_cache}) {
    if (v->on_device) throw arg_error("reference", "host views", "device views");
  }

  const op_sizes sz = sizes_of(args);
  const op_options& opt = args.options;
  switch (opt.style) {
    case rope_style::gptj:
    case rope_style::neox: break;
    default: throw error(fmt::format("reference: bad rope_style {}", static_cast<int>(opt.style)));
  }
  const paged_cache_map map = paged_cache_map::from_args(args);
  const tensor_view& nope_cache = cache_part_view(args, map.nope_tensor());
  const tensor_view& rope_cache = cache_part_view(args, map.rope_tensor());
  const output_rule q_rule(args.q_out.type, opt.scale, q_scale_of(args));
  const output_rule k_rule(nope_cache.type, opt.scale, k_scale_of(args));
  const bool table_one = args.table() == table_kind::one;
  const int64_t half = sz.dr / 2;
  const int64_t ts = sz.ts;
  if (ts == 0) return;  // Tq <= Ts: nothing to write

  const raw_view q_nope_raw(args.q_nope), q_pe_raw(args.q_pe), q_out_raw(args.q_out);
  const raw_view kv_c_raw(args.kv_c), k_pe_raw(args.k_pe);
  const raw_view nope_cache_raw(nope_cache), rope_cache_raw(rope_cache);
  const raw_view cos_sin_raw(args.cos_sin), cos_raw(args.cos), sin_raw(args.sin);
  // Decode outputs (core/SPEC.md "Decode outputs"): rows t < N written with q row t, k_pe_out
  // row t with cache entry t.
  const raw_view dec_q_pe_raw(args.decode_q_pe_out), zeros_raw(args.q_nope_zeros_out), k_pe_out_raw(args.k_pe_out);
  const int64_t n_decode = num_decode_tokens(args);
  // positions, slot_mapping [Ts] (of [Tk]): read whole once per call (core/tensor.h)
  const std::vector<int64_t> positions = read_indices(args.positions, ts);
  const std::vector<int64_t> slot_mapping = read_indices(args.slot_mapping, ts);

  // Reads the cos and sin halves of the table row of token t's position into s (kept while
  // the thread works on the same token).
  auto load_table_row = [&](int64_t t, scratch_rows& s) {
    if (s.table_token == t) return;
    s.table_token = t;
    float* cos_row = s.cos_row.data();
    float* sin_row = s.sin_row.data();
    int64_t p = positions[t];
    if (opt.positions == pos_oob::clamp) p = std::clamp<int64_t>(p, 0, sz.table_rows - 1);
    if (table_one) {
      const tensor_view& tab = args.cos_sin;
      const uint8_t* row = cos_sin_raw.at(p * tab.strides_elems[0]);
      decode_row_to_f32(tab.type, row, cos_row, half);
      decode_row_to_f32(tab.type, row + half * cos_sin_raw.elem_bytes, sin_row, half);
    } else {
      decode_row_to_f32(args.cos.type, cos_raw.at(p * args.cos.strides_elems[0]), cos_row, half);
      decode_row_to_f32(args.sin.type, sin_raw.at(p * args.sin.strides_elems[0]), sin_row, half);
    }
  };

  // A hint, no semantics: fetch token t's table row(s) into the cache ahead of use (positions
  // are random, so the first read of each token's row is a DRAM miss behind the position
  // load; prefetching the next token's row while this token's heads run hides it: ~8% at
  // 4096 x 16). An unused token's position may be anything: clamped for the address only.
  const auto prefetch_bytes = [](const uint8_t* first, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(first + b);  // 64-byte lines
  };
  auto prefetch_table_row = [&](int64_t t) {
    const int64_t p = std::clamp<int64_t>(positions[t], 0, sz.table_rows - 1);
    if (table_one) {
      prefetch_bytes(cos_sin_raw.at(p * args.cos_sin.strides_elems[0]), sz.dr * cos_sin_raw.elem_bytes);
    } else {
      prefetch_bytes(cos_raw.at(p * args.cos.strides_elems[0]), half * cos_raw.elem_bytes);
      prefetch_bytes(sin_raw.at(p * args.sin.strides_elems[0]), half * sin_raw.elem_bytes);
    }
  };

  // A hint as well: the q_nope row after (t, h) (the next head, or head 0 of the next token),
  // so that its DRAM reads overlap this row's rope arithmetic (4096 x 16: 5.1 -> 4.6 ms).
  auto prefetch_next_q_nope_row = [&](int64_t t, int64_t h) {
    if (h + 1 < sz.heads) {
      ++h;
    } else {
      ++t;
      h = 0;
    }
    if (t >= sz.tq) return;
    prefetch_bytes(q_nope_raw.at(t * args.q_nope.strides_elems[0] + h * args.q_nope.strides_elems[1]),
                   sz.dn * q_nope_raw.elem_bytes);
    prefetch_bytes(q_pe_raw.at(t * args.q_pe.strides_elems[0] + h * args.q_pe.strides_elems[1]),
                   sz.dr * q_pe_raw.elem_bytes);
  };

  // One work item per (token t, row j): j < H is q head j, j >= H is the token's k row of kv
  // head j - H (KH of them: core/SPEC.md, each written into its own head of the cache). Items
  // are independent (distinct output rows; distinct cache entries since written slots are
  // unique), so threads share them at any Ts; dynamic chunks keep a preempted thread (shared
  // machine) from holding the others at the final barrier. Chunks of 256 items (~15 tokens at
  // 16 heads, ~300 KB of q rows) keep each thread's reads and streaming writes sequential long
  // enough for the hardware prefetchers: at 4096 x 16 bf16, 2 threads, chunks of 32 took
  // 7.0 ms and chunks of 256 4.6 ms.
#pragma omp parallel
  {
    scratch_rows s(sz);
#pragma omp for schedule(dynamic, 256) collapse(2) nowait
    for (int64_t t = 0; t < ts; ++t) {
      for (int64_t j = 0; j < sz.heads + sz.kv_heads; ++j) {
        if (j == 0 && t + 1 < ts) prefetch_table_row(t + 1);
        const int64_t slot = slot_mapping[t];
        const bool write_cache = slot >= 0;
        const bool compute_q = t < sz.tq && (write_cache || opt.padding == pad_q::computed);

        if (j < sz.heads && compute_q) {  // q_out[t, h] = [q_nope[t, h] | rope(q_pe[t, h])]
          const int64_t h = j;
          prefetch_next_q_nope_row(t, h);
          load_table_row(t, s);
          // rope from the original q_pe row (read whole before any in-place write-back)
          const int64_t pe_off = t * args.q_pe.strides_elems[0] + h * args.q_pe.strides_elems[1];
          decode_row_to_f32(args.q_pe.type, q_pe_raw.at(pe_off), s.x.data(), sz.dr);
          rope_row(opt.style, sz.dr, s.x.data(), s.cos_row.data(), s.sin_row.data(), s.rot.data());

          const int64_t nope_off = t * args.q_nope.strides_elems[0] + h * args.q_nope.strides_elems[1];
          const int64_t out_off = t * args.q_out.strides_elems[0] + h * args.q_out.strides_elems[1];
          q_rule.write_nope(args.q_nope.type, q_nope_raw.at(nope_off), q_out_raw.at(out_off),
                            sz.dn, s);
          q_rule.write_rope(s.rot.data(), q_out_raw.at(out_off + sz.dn), sz.dr, s);
          if (opt.inplace_q) {  // rounded like a non-fp8 output, in q_pe's dtype, no scale
            encode_row_from_f64(args.q_pe.type, s.rot.data(), q_pe_raw.at(pe_off), sz.dr,
                                overflow_mode::ieee);
          }
          if (t < n_decode && args.decode_q_pe_out.present()) {  // like in-place: q's dtype, no scale
            const tensor_view& d = args.decode_q_pe_out;
            encode_row_from_f64(d.type, s.rot.data(),
                                dec_q_pe_raw.at(t * d.strides_elems[0] + h * d.strides_elems[1]), sz.dr,
                                overflow_mode::ieee);
          }
          if (t < n_decode && args.q_nope_zeros_out.present()) {  // +0 is all-zero bits in f32, f16, bf16
            const tensor_view& z = args.q_nope_zeros_out;
            std::memset(zeros_raw.at(t * z.strides_elems[0] + h * z.strides_elems[1]), 0,
                        static_cast<size_t>(sz.dn * zeros_raw.elem_bytes));
          }
        }

        if (j >= sz.heads && write_cache) {  // entry (slot, head kh) = [kv_c[t, kh] | rope(k_pe[t, kh])]
          const int64_t kh = j - sz.heads;
          load_table_row(t, s);
          const int64_t kpe_off = t * args.k_pe.strides_elems[0] + kh * k_row_head_stride(args.k_pe);
          decode_row_to_f32(args.k_pe.type, k_pe_raw.at(kpe_off), s.x.data(), sz.dr);
          rope_row(opt.style, sz.dr, s.x.data(), s.cos_row.data(), s.sin_row.data(), s.rot.data());
          const uint8_t* kv_row = kv_c_raw.at(t * args.kv_c.strides_elems[0] + kh * k_row_head_stride(args.kv_c));
          if (map.layout == cache_layout::fp8_ds_mla) {
            write_ds_mla_entry(args.kv_c.type, kv_row, s.rot.data(), args.k_pe.type, opt.tile_scale,
                               nope_cache_raw.at(map.entry_offset_bytes(slot)), s);
          } else if (map.run_elems == 0) {  // a part's features are contiguous (innermost stride 1)
            k_rule.write_nope(args.kv_c.type, kv_row, nope_cache_raw.at(map.nope_offset_elems(slot, kh, 0)),
                              sz.dn, s);
            k_rule.write_rope(s.rot.data(), rope_cache_raw.at(map.rope_offset_elems(slot, kh, 0)), sz.dr, s);
          } else {  // shuffled: each part rounded whole into s.entry, then stored run by run
            const int64_t run = map.run_elems, eb = nope_cache_raw.elem_bytes;
            auto store_runs = [&](const raw_view& part, int64_t n, auto offset_of) {
              for (int64_t d = 0; d < n; d += run)
                std::memcpy(part.at(offset_of(d)), s.entry.data() + d * eb, static_cast<size_t>(run * eb));
            };
            k_rule.write_nope(args.kv_c.type, kv_row, s.entry.data(), sz.dn, s);
            store_runs(nope_cache_raw, sz.dn, [&](int64_t d) { return map.nope_offset_elems(slot, kh, d); });
            k_rule.write_rope(s.rot.data(), s.entry.data(), sz.dr, s);
            store_runs(rope_cache_raw, sz.dr, [&](int64_t d) { return map.rope_offset_elems(slot, kh, d); });
          }
          if (opt.inplace_k) {
            encode_row_from_f64(args.k_pe.type, s.rot.data(), k_pe_raw.at(kpe_off), sz.dr,
                                overflow_mode::ieee);
          }
          if (args.k_pe_out.present()) {  // the rows inplace_k writes, into k_pe_out
            encode_row_from_f64(args.k_pe_out.type, s.rot.data(),
                                k_pe_out_raw.at(t * args.k_pe_out.strides_elems[0] +
                                                kh * k_row_head_stride(args.k_pe_out)),
                                sz.dr, overflow_mode::ieee);
          }
        }
      }
    }
    stream_store_fence();  // this thread's output rows, before the barrier that ends the region
  }
}

namespace {

class cpu_backend final : public backend {
 public:
  std::string name() const override { return "ref"; }
  std::string unsupported_reason(const op_args&) const override { return {}; }
  void run_host(const op_args& args, const std::vector<memory_region>&) override {
    reference_run(args);  // validates first
  }
  std::string last_variant() const override { return "reference"; }
  std::string device_description() const override {
    return fmt::format("cpu: {} OpenMP threads", omp_get_max_threads());
  }
};

}  // namespace

std::unique_ptr<backend> make_cpu_backend() { return std::make_unique<cpu_backend>(); }

}  // namespace ropekv
