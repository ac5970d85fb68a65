// Model presets and their YaRN cos/sin tables.
//
// yarn_cos_sin_f32 follows vLLM's DeepseekScalingRotaryEmbedding (rotary_embedding/
// deepseek_scaling_rope.py and common.py), evaluated with the float32 operation order torch uses:
//   pos_freqs[i]   = fp32(base) ** fp32(fp32(2i) / dim)            (fp32 pow)
//   extrap[i]      = 1 / pos_freqs[i]                              (fp32)
//   interp[i]      = 1 / (fp32(factor) * pos_freqs[i])             (fp32, two roundings)
//   low, high      = floor/ceil of the correction dims (double, Python math), clamped to
//                    [0, dim - 1]; high += 0.001 when low == high
//   ramp[i]        = clamp(fp32(fp32(i) - low) / fp32(high - low), 0, 1)   (fp32)
//   mask[i]        = (1 - ramp[i]) * extrapolation_factor (= 1)            (fp32)
//   inv_freq[i]    = interp[i] * (1 - mask[i]) + extrap[i] * mask[i]       (fp32, each op rounded)
//   freqs[t][i]    = fp32(t) * inv_freq[i]                         (fp32, t < original * factor)
//   cos, sin       = cos(freqs) * fp32(mscale), sin likewise        (fp32)
// with mscale = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
// (double, Python), = 1 for every preset here.
//
// Choices where torch is not one fixed function:
// - fp32 pow: computed as pow in double then rounded to float (correctly rounded except in
//   astronomically rare near-ties); glibc's powf agrees on every exponent of the presets. numpy's
//   float32 power (AVX-512 SIMD) does not: 4 of DeepSeek's 32 values are 1-2 ulp off, which then
//   shifts inv_freq; tests/python/test_presets.py therefore rounds a float64 pow.
// - cos/sin of the fp32 value `freqs`: evaluated in double and rounded to float, i.e. the
//   correctly-rounded float32 result. torch's vectorised (Sleef) float cos/sin and numpy's SIMD
//   float32 cos/sin may differ from it by 1 ulp for large arguments; CUDA's cosf by up to 2.
// - On CUDA, torch divides a tensor by a Python scalar as a multiply by the scalar's fp32
//   reciprocal; the ramp (i - low) / (high - low) is built on the default device, which may be
//   the GPU. We follow IEEE fp32 division (what torch does on the CPU); the two can differ in
//   the last ulp of a ramp value.
#include "core/presets.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ropekv {

namespace {

yarn_params deepseek_yarn() { return yarn_params{10000.0, 40.0, 32.0, 1.0, 4096, 1.0, 1.0}; }
yarn_params kimi_yarn() { return yarn_params{50000.0, 32.0, 1.0, 1.0, 4096, 1.0, 1.0}; }

model_preset make_preset(const char* name, const char* description, int64_t heads, yarn_params y) {
  return model_preset{name, description, heads, 512, 64, rope_style::gptj, y, 64, dtype::bf16};
}

// Python's yarn_find_correction_dim, in double.
double correction_dim(double num_rotations, double dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (num_rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
}

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

float fp32_pow(float base, float exponent) {
  return static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(exponent)));
}

}  // namespace

const std::vector<model_preset>& model_presets() {
  static const std::vector<model_preset> presets = {
      make_preset("deepseek-v3", "DeepSeek V3 / R1, TP1: 128 heads, YaRN factor 40", 128,
                  deepseek_yarn()),
      make_preset("deepseek-v3-tp8", "DeepSeek V3 / R1, TP8: 16 heads per GPU, YaRN factor 40", 16,
                  deepseek_yarn()),
      make_preset("kimi-k2", "Kimi K2, TP1: 64 heads, YaRN theta 5e4 factor 32", 64, kimi_yarn()),
      make_preset("kimi-k2-tp8", "Kimi K2, TP8: 8 heads per GPU, YaRN theta 5e4 factor 32", 8,
                  kimi_yarn()),
      make_preset("deepseek-v2-lite", "DeepSeek V2-Lite: 16 heads, YaRN factor 40", 16,
                  deepseek_yarn()),
  };
  return presets;
}

const model_preset& find_preset(std::string_view name) {
  std::string names = "one of ";
  bool first = true;
  for (const model_preset& m : model_presets()) {
    if (m.name == name) return m;
    names += first ? "" : ", ";
    names += m.name;
    first = false;
  }
  throw arg_error("preset", names, fmt::format("'{}'", name));
}

int64_t yarn_table_rows(const yarn_params& y) {
  // torch.arange(original * factor) has ceil(original * factor) elements
  return static_cast<int64_t>(std::ceil(static_cast<double>(y.original_max_pos) * y.factor));
}

std::vector<float> yarn_inv_freq_f32(const yarn_params& y, int64_t dr) {
  if (dr < 2 || dr % 2 != 0) throw arg_error("dr", "an even number >= 2", std::to_string(dr));
  const int64_t half = dr / 2;
  const float base_f = static_cast<float>(y.theta);
  const float factor_f = static_cast<float>(y.factor);
  auto [low_d, high_d] = [&] {
    double lo = std::floor(correction_dim(y.beta_fast, static_cast<double>(dr), y.theta,
                                          static_cast<double>(y.original_max_pos)));
    double hi = std::ceil(correction_dim(y.beta_slow, static_cast<double>(dr), y.theta,
                                         static_cast<double>(y.original_max_pos)));
    return std::make_pair(std::max(lo, 0.0), std::min(hi, static_cast<double>(dr - 1)));
  }();
  if (low_d == high_d) high_d += 0.001;
  const float low_f = static_cast<float>(low_d);
  const float span_f = static_cast<float>(high_d - low_d);
  const float extrapolation_factor = 1.0f;

  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    volatile float exponent = static_cast<float>(2 * i) / static_cast<float>(dr);
    const float pos_freq = fp32_pow(base_f, exponent);
    volatile float extrap = 1.0f / pos_freq;
    volatile float scaled = factor_f * pos_freq;
    volatile float interp = 1.0f / scaled;
    volatile float ramp = (static_cast<float>(i) - low_f) / span_f;
    ramp = std::min(std::max(static_cast<float>(ramp), 0.0f), 1.0f);
    volatile float mask = (1.0f - ramp) * extrapolation_factor;
    volatile float a = interp * (1.0f - mask);
    volatile float b = extrap * mask;
    inv_freq[static_cast<size_t>(i)] = a + b;
  }
  return inv_freq;
}

std::vector<float> yarn_cos_sin_f32(const yarn_params& y, int64_t dr, int64_t rows) {
  if (rows < 0) throw arg_error("rows", ">= 0", std::to_string(rows));
  const std::vector<float> inv_freq = yarn_inv_freq_f32(y, dr);
  const int64_t half = dr / 2;
  const float mscale = static_cast<float>(yarn_get_mscale(y.factor, y.mscale) /
                                          yarn_get_mscale(y.factor, y.mscale_all_dim));
  std::vector<float> table(static_cast<size_t>(rows * dr));
  for (int64_t t = 0; t < rows; ++t) {
    float* row = table.data() + t * dr;
    const float t_f = static_cast<float>(t);
    for (int64_t i = 0; i < half; ++i) {
      volatile float freq = t_f * inv_freq[static_cast<size_t>(i)];
      const double f = static_cast<double>(freq);
      volatile float c = static_cast<float>(std::cos(f));
      volatile float s = static_cast<float>(std::sin(f));
      row[i] = c * mscale;
      row[half + i] = s * mscale;
    }
  }
  return table;
}

problem preset_problem(std::string_view name, int64_t tokens, uint64_t seed) {
  const model_preset& m = find_preset(name);
  if (tokens < 0 || tokens > (int64_t{1} << 24))
    throw arg_error("tokens", "0 .. 16777216", std::to_string(tokens));
  problem p;
  p.tq = p.ts = p.tk = tokens;
  p.heads = m.heads;
  p.dn = m.dn;
  p.dr = m.dr;
  p.block_size = m.block_size;
  p.num_blocks = std::max<int64_t>(1, (tokens + m.block_size - 1) / m.block_size) + 2;
  p.table_rows = yarn_table_rows(m.yarn);
  p.rope_table = m.name;
  p.in_dtype = p.table_dtype = p.q_out_dtype = p.cache_dtype = m.model_dtype;
  p.pos_dtype = p.slot_dtype = dtype::i64;
  p.opt.style = m.style;
  p.positions = pos_mode::random;
  p.seed = seed;
  check_problem(p);
  return p;
}

}  // namespace ropekv
