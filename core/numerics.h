// Numerics models (core/SPEC.md "Numerics models"): the rope arithmetic an implementation does,
// each with its exact evaluation order (emulated here, bit for bit) and an error bound from the
// exact value derived from that order. `fp32` is the contract's rule; the others are the
// arithmetic peers ship on purpose (AITER's Triton op, vLLM's model-dtype rope).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/op.h"

namespace ropekv {

enum class numerics_model : uint8_t {
  fp32,              // exact x*C + R(x)*S of the fp32-upcast operands, rounded once (the contract)
  operand_products,  // P = rnd_T(R(x)*S); v = rnd_T(x*C + P) (one fused multiply-add)
  operand_dtype,     // the whole rope in the input dtype: C, S, both products and the sum rounded
};
inline constexpr int numerics_model_count = 3;
inline constexpr std::array<numerics_model, numerics_model_count> all_numerics_models = {
    numerics_model::fp32, numerics_model::operand_products, numerics_model::operand_dtype};

const char* numerics_model_name(numerics_model m);  // "fp32", "operand-products", "operand-dtype"
// Throws arg_error naming `arg_name` and listing the models when `text` is unknown.
numerics_model parse_numerics_model(std::string_view text, const char* arg_name);
std::string numerics_model_names();  // "fp32, operand-products, operand-dtype"

// One rope output element: out = x*C + partner*S (partner = R(x): -b for the first element of a
// pair, a for the second), decoded operands, their dtypes and the output's.
struct rope_element {
  double x = 0, partner = 0, c = 0, s = 0;
  dtype in = dtype::bf16;     // dtype of x and partner (q_pe / k_pe)
  dtype table = dtype::bf16;  // dtype of C and S
  dtype out = dtype::bf16;    // output element (q_out, cache, or q_pe / k_pe in place)
  float scale = 1.0f;         // fp8 outputs only
  scale_conv conv = scale_conv::divide;
};

// The operand dtype T of `operand-products`: f32 when either operand is f32, else f16 when
// either is f16, else bf16. `operand-dtype` uses the input dtype.
dtype model_operand_dtype(numerics_model m, dtype in, dtype table);

// The output bits model m computes for element e (low bits). NaN operands give a NaN.
uint32_t rope_model_bits(numerics_model m, const rope_element& e);

// The model's allowance: |got - ref| <= max_ulp * ulp(ref) + allowance passes, where ref is the
// exact value rounded once (the reference). fp32: 2^-22 * (|x*C| + |R(x)*S|) / scale.
double rope_model_allowance(numerics_model m, const rope_element& e);

}  // namespace ropekv
