// Numerics models: emulation and bounds (see core/numerics.h and core/SPEC.md).
// Written from SPEC.md: every rounding below is the model's, in its order; products of two
// values of at most 24 significant bits are exact in double, a sum of such values is rounded
// once in double before the model's rounding (the same caveat as the reference's: a double
// rounding only at an exact tie of the target format, vanishingly rare).
#include "core/numerics.h"

#include <fmt/format.h>

#include <cmath>

#include "core/convert.h"
#include "core/error.h"

namespace ropekv {

const char* numerics_model_name(numerics_model m) {
  switch (m) {
    case numerics_model::fp32: return "fp32";
    case numerics_model::operand_products: return "operand-products";
    case numerics_model::operand_dtype: return "operand-dtype";
    default: throw error(fmt::format("numerics_model_name: bad value {}", static_cast<int>(m)));
  }
}

std::string numerics_model_names() {
  std::string s;
  for (numerics_model m : all_numerics_models) s += (s.empty() ? "" : ", ") + std::string(numerics_model_name(m));
  return s;
}

numerics_model parse_numerics_model(std::string_view text, const char* arg_name) {
  for (numerics_model m : all_numerics_models)
    if (text == numerics_model_name(m)) return m;
  throw arg_error(arg_name, "one of " + numerics_model_names(), fmt::format("'{}'", text));
}

namespace {

bool is_float_operand(dtype t) { return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16; }

// Round once, to nearest even, into t (overflow to inf where t has it).
double rnd(dtype t, double v) {
  return decode_to_f64(t, encode_from_f64(t, v, overflow_mode::ieee));
}

// Unit roundoff of t (half the spacing at 1): 2^-(significand bits incl. the implicit one).
double unit_roundoff(dtype t) { return std::ldexp(1.0, -(float_format_of(t).man_bits + 1)); }

// The output stage shared by every model: value v (already in the model's arithmetic) into the
// output dtype; fp8 outputs scale in fp32 (divide: fp32(v) / scale; reciprocal: fp32(v) *
// fp32(1 / scale)), then one saturating round.
uint32_t store_value(const rope_element& e, double v) {
  if (!dtype_is_fp8(e.out)) return encode_from_f64(e.out, v, overflow_mode::ieee);
  const float vf = static_cast<float>(v);  // v is representable in f32 (T is at most f32)
  float w = 0;
  switch (e.conv) {
    case scale_conv::divide: w = vf / e.scale; break;
    case scale_conv::reciprocal: w = vf * (1.0f / e.scale); break;
    default: throw error(fmt::format("store_value: bad scale_conv {}", static_cast<int>(e.conv)));
  }
  return encode_from_f32(e.out, w, overflow_mode::saturate);
}

double per_scale(const rope_element& e, double a) {
  if (!dtype_is_fp8(e.out)) return a;
  switch (e.conv) {
    case scale_conv::divide: return a / static_cast<double>(e.scale);
    case scale_conv::reciprocal: return a * static_cast<double>(1.0f / e.scale);
    default: throw error(fmt::format("rope_model_allowance: bad scale_conv {}", static_cast<int>(e.conv)));
  }
}

}  // namespace

dtype model_operand_dtype(numerics_model m, dtype in, dtype table) {
  if (!is_float_operand(in)) throw arg_error("in", "f32, f16 or bf16", dtype_name(in));
  if (!is_float_operand(table)) throw arg_error("table_dtype", "f32, f16 or bf16", dtype_name(table));
  switch (m) {
    case numerics_model::fp32: return dtype::f32;
    case numerics_model::operand_products:
      if (in == dtype::f32 || table == dtype::f32) return dtype::f32;
      if (in == dtype::f16 || table == dtype::f16) return dtype::f16;
      return dtype::bf16;
    case numerics_model::operand_dtype: return in;
    default: throw error(fmt::format("model_operand_dtype: bad value {}", static_cast<int>(m)));
  }
}

uint32_t rope_model_bits(numerics_model m, const rope_element& e) {
  switch (m) {
    case numerics_model::fp32: {
      // the exact value of the fp32-upcast operands, scaled in double, rounded once
      double v = std::fma(e.x, e.c, e.partner * e.s);
      if (dtype_is_fp8(e.out)) {
        v = e.conv == scale_conv::divide ? v / static_cast<double>(e.scale)
                                         : v * static_cast<double>(1.0f / e.scale);
        return encode_from_f64(e.out, v, overflow_mode::saturate);
      }
      return encode_from_f64(e.out, v, overflow_mode::ieee);
    }
    case numerics_model::operand_products: {
      const dtype t = model_operand_dtype(m, e.in, e.table);
      const double p = rnd(t, e.partner * e.s);
      return store_value(e, rnd(t, std::fma(e.x, e.c, p)));
    }
    case numerics_model::operand_dtype: {
      const dtype t = e.in;
      const double c = rnd(t, e.c), s = rnd(t, e.s);
      const double a = rnd(t, e.x * c), b = rnd(t, e.partner * s);
      return store_value(e, rnd(t, a + b));
    }
    default: throw error(fmt::format("rope_model_bits: bad value {}", static_cast<int>(m)));
  }
}

double rope_model_allowance(numerics_model m, const rope_element& e) {
  const double sum_abs = std::fabs(e.x * e.c) + std::fabs(e.partner * e.s);
  const double fp32_term = 0x1.0p-22 * sum_abs;  // fp32 evaluation (and the fp8 scaling step)
  switch (m) {
    case numerics_model::fp32: return per_scale(e, fp32_term);
    case numerics_model::operand_products: {
      // |P - R(x)S| <= u|R(x)S|; |v - (xC + P)| <= u|xC + P|  =>  <= u(2|R(x)S| + |xC|) + u^2|R(x)S|
      const dtype t = model_operand_dtype(m, e.in, e.table);
      const double u = unit_roundoff(t);
      const double tiny = float_format_of(t).min_subnormal;  // two roundings, half a step each
      return per_scale(e, fp32_term + (2 * u + u * u) * sum_abs + tiny);
    }
    case numerics_model::operand_dtype: {
      // C, S, both products (each with a rounded table value) and the sum:
      // <= ((1+u)^2 - 1) * sum + u * (1+u)^2 * sum = (3u + 3u^2 + u^3) * sum
      const double u = unit_roundoff(e.in);
      const double tiny = 3 * float_format_of(e.in).min_subnormal;  // five roundings
      return per_scale(e, fp32_term + (3 * u + 4 * u * u) * sum_abs + tiny);
    }
    default: throw error(fmt::format("rope_model_allowance: bad value {}", static_cast<int>(m)));
  }
}

}  // namespace ropekv
