// The reference backend: core/SPEC.md, literally. OpenMP over tokens; every conversion goes
// through core/convert.h; cache addresses come from core/cache_map.h.
#include "backends/cpu/cpu_backend.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cache_map.h"
#include "core/convert.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/validate.h"

namespace ropekv {
namespace {

inline uint8_t* byte_ptr(const tensor_view& v, int64_t offset_elems) {
  return static_cast<uint8_t*>(v.data) +
         offset_elems * static_cast<int64_t>(dtype_size_bytes(v.type));
}

int64_t load_index(const tensor_view& v, int64_t i) {
  const uint64_t bits = load_bits(v.type, byte_ptr(v, i * v.strides_elems[0]));
  switch (v.type) {
    case dtype::i32: return static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(bits)));
    case dtype::i64: return static_cast<int64_t>(bits);
    default:
      throw error(fmt::format("reference: dtype {} is not an index dtype", dtype_name(v.type)));
  }
}

// fp32 value of every bit pattern of a 16-bit float dtype (f16, bf16), built once through
// core/convert.h: decoding a row is then a table lookup per element.
const std::vector<float>& decode_table_16(dtype t) {
  auto build = [](dtype type) {
    std::vector<float> table(65536);
    for (uint32_t b = 0; b < 65536; ++b) table[b] = decode_to_f32(type, b);
    return table;
  };
  static const std::vector<float> f16_table = build(dtype::f16);
  static const std::vector<float> bf16_table = build(dtype::bf16);
  switch (t) {
    case dtype::f16: return f16_table;
    case dtype::bf16: return bf16_table;
    default: throw error(fmt::format("reference: no 16-bit decode table for {}", dtype_name(t)));
  }
}

// Decodes n contiguous elements of float dtype t at p into fp32 (exact: f16/bf16 upcast).
void decode_row(dtype t, const uint8_t* p, int64_t n, float* out) {
  switch (t) {
    case dtype::f32:
      std::memcpy(out, p, static_cast<size_t>(n) * sizeof(float));  // decode_to_f32(f32) is the bits
      return;
    case dtype::f16:
    case dtype::bf16: {
      const float* table = decode_table_16(t).data();
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, p + 2 * i, 2);
        out[i] = table[bits];
      }
      return;
    }
    default: {
      const int64_t es = static_cast<int64_t>(dtype_size_bytes(t));
      for (int64_t i = 0; i < n; ++i) {
        out[i] = decode_to_f32(t, static_cast<uint32_t>(load_bits(t, p + i * es)));
      }
    }
  }
}

// Writes n element codes (bit patterns in the low bits) into a contiguous row of dtype t.
void store_row(dtype t, uint8_t* p, const uint32_t* codes, int64_t n) {
  switch (dtype_size_bytes(t)) {
    case 1:
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(codes[i]);
      return;
    case 2:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t c = static_cast<uint16_t>(codes[i]);
        std::memcpy(p + 2 * i, &c, 2);
      }
      return;
    case 4: std::memcpy(p, codes, static_cast<size_t>(n) * 4); return;
    default:
      throw error(fmt::format("reference: bad output element size of {}", dtype_name(t)));
  }
}

// True when finite, non-zero f lies exactly halfway between two neighbours of the (coarser than
// f32) format ff. Rounding v -> fp32 -> ff equals rounding v -> ff unless fp32(v) is such a
// midpoint: every midpoint of f16 / bf16 is an fp32 value, so the fp32 rounding cannot cross one.
bool is_midpoint_of(const float_format& ff, float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const int biased = static_cast<int>((u >> 23) & 0xffu);
  uint32_t m = u & 0x7fffffu;
  int quantum_exp_f32 = -149, lead_exp = 0;
  if (biased == 0) {
    if (m == 0) return false;
    lead_exp = -149 + 31 - __builtin_clz(m);
  } else {
    m |= 0x800000u;
    quantum_exp_f32 = biased - 150;
    lead_exp = biased - 127;
  }
  const int min_exp = 1 - ff.bias;
  const int quantum_exp = std::max(lead_exp, min_exp) - ff.man_bits;
  const int k = quantum_exp - 1 - quantum_exp_f32;  // bit of m worth half a quantum of ff
  if (k < 0 || k > 24) return false;
  const uint64_t mask = (uint64_t{2} << k) - 1;
  return (m & mask) == (uint64_t{1} << k);
}

}  // namespace

uint32_t reference_round_f64(dtype t, double v) {
  switch (t) {
    case dtype::f32:
    case dtype::f16:
    case dtype::bf16: break;
    default: return encode_from_f64(t, v, dtype_is_fp8(t) ? overflow_mode::saturate : overflow_mode::ieee);
  }
  if (std::isnan(v)) return encode_from_f64(t, v, overflow_mode::ieee);  // canonical NaN
  const float f = static_cast<float>(v);  // IEEE round to nearest even: one rounding
  if (t == dtype::f32) return encode_from_f32(t, f, overflow_mode::ieee);
  if (static_cast<double>(f) == v || !is_midpoint_of(float_format_of(t), f)) {
    return encode_from_f32(t, f, overflow_mode::ieee);  // the same rounding as from v
  }
  return encode_from_f64(t, v, overflow_mode::ieee);  // fp32(v) is a midpoint: round v itself
}

namespace {

uint32_t round_f64_fast(dtype t, double v) { return reference_round_f64(t, v); }

// How one output (q_out or the cache) rounds its values.
struct output_rule {
  dtype type;
  bool fp8;
  scale_conv conv;
  float scale;             // q_scale or k_scale
  float recip;             // fp32(1 / scale)
  overflow_mode overflow;  // saturate for fp8, ieee otherwise

  output_rule(dtype t, scale_conv c, float s)
      : type(t), fp8(dtype_is_fp8(t)), conv(c), scale(s), recip(1.0f / s),
        overflow(dtype_is_fp8(t) ? overflow_mode::saturate : overflow_mode::ieee) {}

  // Data-movement element: round(fp32(x)), or for fp8 round_sat(fp32(x / scale)) (divide) /
  // round_sat(fp32(x * fp32(1 / scale))) (reciprocal), each a single fp32 operation.
  uint32_t encode_nope(float x) const {
    if (!fp8) return encode_from_f32(type, x, overflow);
    switch (conv) {
      case scale_conv::divide: return encode_from_f32(type, x / scale, overflow);
      case scale_conv::reciprocal: return encode_from_f32(type, x * recip, overflow);
    }
    throw error(fmt::format("reference: bad scale_conv {}", static_cast<int>(conv)));
  }

  // Rope element: v is the exact x*C + R(x)*S (a double fma of exact products); scaled in
  // double for fp8, then rounded once.
  uint32_t encode_rope(double v) const {
    if (!fp8) return round_f64_fast(type, v);
    switch (conv) {
      case scale_conv::divide: return encode_from_f64(type, v / static_cast<double>(scale), overflow);
      case scale_conv::reciprocal:
        return encode_from_f64(type, v * static_cast<double>(recip), overflow);
    }
    throw error(fmt::format("reference: bad scale_conv {}", static_cast<int>(conv)));
  }
};

// rope(x) for one row of Dr values: out[j] = x[j]*C + R(x[j])*S, exactly (in double: the two
// products of fp32 values are exact, the sum is one rounding of a double fma).
void rope_row(rope_style style, int64_t dr, const float* x, const float* cos_row,
              const float* sin_row, double* out) {
  const int64_t half = dr / 2;
  for (int64_t i = 0; i < half; ++i) {
    int64_t ia = 0, ib = 0;  // the pair (a, b) that uses cos[i], sin[i]
    switch (style) {
      case rope_style::gptj: ia = 2 * i; ib = 2 * i + 1; break;
      case rope_style::neox: ia = i; ib = i + half; break;
      default: throw error(fmt::format("reference: bad rope_style {}", static_cast<int>(style)));
    }
    const double c = cos_row[i], s = sin_row[i];
    const double a = x[ia], b = x[ib];
    out[ia] = std::fma(a, c, -b * s);  // a' = a*C + R(a)*S, R(a) = -b
    out[ib] = std::fma(b, c, a * s);   // b' = b*C + R(b)*S, R(b) = a
  }
}

// The data-movement codes of every bit pattern of a 16-bit input dtype for one output rule:
// round(fp32(x)) (or its fp8 scaled form) depends only on x's bits, so a large call computes
// each of the 65536 codes once (through core/convert.h, exactly as the per-element path).
std::vector<uint32_t> nope_table_16(dtype in, const output_rule& rule) {
  const float* decoded = decode_table_16(in).data();
  std::vector<uint32_t> table(65536);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < 65536; ++b) table[static_cast<size_t>(b)] = rule.encode_nope(decoded[b]);
  return table;
}

// Encodes one nope row (n input elements of dtype `in` at src) and stores it at dst (a row of
// the output dtype).
struct nope_encoder {
  dtype in;
  const output_rule* rule;
  std::vector<uint32_t> table;  // empty: per-element path
  // Set when the table is the identity on every code except NaN codes (same 16-bit dtype in
  // and out, no scale): a row is then copied and only its NaN codes are re-encoded. Checked
  // against the table itself, so it cannot disagree with the per-element path.
  bool copy_with_nan_fixup = false;
  uint16_t nan_above = 0;  // a code c is NaN iff (c & 0x7fff) > nan_above

  nope_encoder(dtype in_type, const output_rule& r, int64_t elements) : in(in_type), rule(&r) {
    const bool is16 = in_type == dtype::f16 || in_type == dtype::bf16;
    if (!is16 || elements < 4 * 65536) return;
    table = nope_table_16(in_type, r);
    if (r.type != in_type) return;
    const float_format& ff = float_format_of(in_type);
    nan_above = static_cast<uint16_t>(((1u << ff.exp_bits) - 1u) << ff.man_bits);
    copy_with_nan_fixup = true;
    for (uint32_t b = 0; b < 65536; ++b) {
      const bool is_nan = (b & 0x7fffu) > nan_above;
      if (table[b] != b && !is_nan) copy_with_nan_fixup = false;
      if (is_nan != is_nan_bits(in_type, b)) copy_with_nan_fixup = false;
    }
  }

  void write(const uint8_t* src, uint8_t* dst, int64_t n, float* scratch, uint32_t* codes) const {
    if (copy_with_nan_fixup) {
      std::memmove(dst, src, static_cast<size_t>(n) * 2);  // memmove: q_nope may alias q_out
      bool any_nan = false;
      for (int64_t d = 0; d < n; ++d) {
        uint16_t bits;
        std::memcpy(&bits, dst + 2 * d, 2);
        any_nan |= (bits & 0x7fffu) > nan_above;
      }
      if (!any_nan) return;
      for (int64_t d = 0; d < n; ++d) {
        uint16_t bits;
        std::memcpy(&bits, dst + 2 * d, 2);
        const uint16_t code = static_cast<uint16_t>(table[bits]);
        std::memcpy(dst + 2 * d, &code, 2);
      }
      return;
    }
    if (!table.empty()) {
      for (int64_t d = 0; d < n; ++d) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * d, 2);
        codes[d] = table[bits];
      }
    } else {
      decode_row(in, src, n, scratch);
      for (int64_t d = 0; d < n; ++d) codes[d] = rule->encode_nope(scratch[d]);
    }
    store_row(rule->type, dst, codes, n);
  }
};

}  // namespace

void reference_run(const op_args& args) {
  validate(args, /*check_values=*/true);
  for (const tensor_view* v : {&args.q_nope, &args.q_out, &args.kv_c, &args.cache, &args.ckv_cache}) {
    if (v->on_device) throw arg_error("reference", "host views", "device views");
  }

  const op_sizes sz = sizes_of(args);
  const op_options& opt = args.options;
  const paged_cache_map map = paged_cache_map::from_args(args);
  const tensor_view& nope_cache = cache_part_view(args, map.nope_tensor());
  const tensor_view& rope_cache = cache_part_view(args, map.rope_tensor());
  const output_rule q_rule(args.q_out.type, opt.scale, args.q_scale);
  const output_rule k_rule(nope_cache.type, opt.scale, args.k_scale);
  const bool table_one = args.table() == table_kind::one;
  const int64_t half = sz.dr / 2;
  const int64_t ts = sz.ts;
  if (ts == 0) return;  // Tq <= Ts: nothing to write

  const nope_encoder q_nope_enc(args.q_nope.type, q_rule, sz.tq * sz.heads * sz.dn);
  const nope_encoder k_nope_enc(args.kv_c.type, k_rule, sz.ts * sz.dn);

  // Reads the cos and sin halves of table row p.
  auto load_table_row = [&](int64_t p, float* cos_row, float* sin_row) {
    if (table_one) {
      const tensor_view& t = args.cos_sin;
      const uint8_t* row = byte_ptr(t, p * t.strides_elems[0]);
      decode_row(t.type, row, half, cos_row);
      decode_row(t.type, row + half * static_cast<int64_t>(dtype_size_bytes(t.type)), half, sin_row);
    } else {
      decode_row(args.cos.type, byte_ptr(args.cos, p * args.cos.strides_elems[0]), half, cos_row);
      decode_row(args.sin.type, byte_ptr(args.sin, p * args.sin.strides_elems[0]), half, sin_row);
    }
  };

#pragma omp parallel
  {
    std::vector<float> cos_row(static_cast<size_t>(half)), sin_row(static_cast<size_t>(half));
    std::vector<float> x(static_cast<size_t>(sz.dr)), scratch(static_cast<size_t>(sz.dn));
    std::vector<double> rot(static_cast<size_t>(sz.dr));
    std::vector<uint32_t> nope_codes(static_cast<size_t>(sz.dn)), rope_codes(static_cast<size_t>(sz.dr));

#pragma omp for schedule(static)
    for (int64_t t = 0; t < ts; ++t) {
      const int64_t slot = load_index(args.slot_mapping, t);
      const bool write_cache = slot >= 0;
      const bool compute_q = t < sz.tq && (write_cache || opt.padding == pad_q::computed);
      if (!write_cache && !compute_q) continue;

      int64_t p = load_index(args.positions, t);
      if (opt.positions == pos_oob::clamp) p = std::clamp<int64_t>(p, 0, sz.table_rows - 1);
      load_table_row(p, cos_row.data(), sin_row.data());

      if (compute_q) {
        for (int64_t h = 0; h < sz.heads; ++h) {
          // rope from the original q_pe row (read whole before any in-place write-back)
          const int64_t pe_off = t * args.q_pe.strides_elems[0] + h * args.q_pe.strides_elems[1];
          decode_row(args.q_pe.type, byte_ptr(args.q_pe, pe_off), sz.dr, x.data());
          rope_row(opt.style, sz.dr, x.data(), cos_row.data(), sin_row.data(), rot.data());

          const int64_t nope_off = t * args.q_nope.strides_elems[0] + h * args.q_nope.strides_elems[1];
          const int64_t out_off = t * args.q_out.strides_elems[0] + h * args.q_out.strides_elems[1];
          q_nope_enc.write(byte_ptr(args.q_nope, nope_off), byte_ptr(args.q_out, out_off), sz.dn,
                           scratch.data(), nope_codes.data());
          for (int64_t j = 0; j < sz.dr; ++j) rope_codes[j] = q_rule.encode_rope(rot[j]);
          store_row(args.q_out.type, byte_ptr(args.q_out, out_off + sz.dn), rope_codes.data(), sz.dr);
          if (opt.inplace_q) {
            for (int64_t j = 0; j < sz.dr; ++j) rope_codes[j] = reference_round_f64(args.q_pe.type, rot[j]);
            store_row(args.q_pe.type, byte_ptr(args.q_pe, pe_off), rope_codes.data(), sz.dr);
          }
        }
      }

      if (write_cache) {
        const int64_t kpe_off = t * args.k_pe.strides_elems[0];
        decode_row(args.k_pe.type, byte_ptr(args.k_pe, kpe_off), sz.dr, x.data());
        rope_row(opt.style, sz.dr, x.data(), cos_row.data(), sin_row.data(), rot.data());
        // features of one part are contiguous in the cache (innermost stride 1)
        k_nope_enc.write(byte_ptr(args.kv_c, t * args.kv_c.strides_elems[0]),
                         byte_ptr(nope_cache, map.nope_offset_elems(slot, 0)), sz.dn, scratch.data(),
                         nope_codes.data());
        for (int64_t j = 0; j < sz.dr; ++j) rope_codes[j] = k_rule.encode_rope(rot[j]);
        store_row(rope_cache.type, byte_ptr(rope_cache, map.rope_offset_elems(slot, 0)), rope_codes.data(), sz.dr);
        if (opt.inplace_k) {
          for (int64_t j = 0; j < sz.dr; ++j) rope_codes[j] = reference_round_f64(args.k_pe.type, rot[j]);
          store_row(args.k_pe.type, byte_ptr(args.k_pe, kpe_off), rope_codes.data(), sz.dr);
        }
      }
    }
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
