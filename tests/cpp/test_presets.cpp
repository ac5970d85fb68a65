// Model presets and YaRN tables. The bit-level check against an independent numpy computation
// is tests/python/test_presets.py; here: parameters, structure and invariants.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/presets.h"

using namespace ropekv;

TEST_CASE("presets: names, shapes, YaRN parameters") {
  struct want {
    const char* name;
    int64_t heads;
    double theta, factor, beta_fast;
    int64_t rows;
  };
  const want table[] = {{"deepseek-v3", 128, 1e4, 40, 32, 163840},
                        {"deepseek-v3-tp8", 16, 1e4, 40, 32, 163840},
                        {"kimi-k2", 64, 5e4, 32, 1, 131072},
                        {"kimi-k2-tp8", 8, 5e4, 32, 1, 131072},
                        {"deepseek-v2-lite", 16, 1e4, 40, 32, 163840}};
  CHECK(model_presets().size() == 5);
  for (const want& w : table) {
    INFO(w.name);
    const model_preset& m = find_preset(w.name);
    CHECK(m.name == w.name);
    CHECK(m.heads == w.heads);
    CHECK(m.dn == 512);
    CHECK(m.dr == 64);
    CHECK(m.style == rope_style::gptj);
    CHECK(m.block_size == 64);
    CHECK(m.model_dtype == dtype::bf16);
    CHECK(m.yarn.theta == w.theta);
    CHECK(m.yarn.factor == w.factor);
    CHECK(m.yarn.beta_fast == w.beta_fast);
    CHECK(m.yarn.beta_slow == 1);
    CHECK(m.yarn.original_max_pos == 4096);
    CHECK(m.yarn.mscale == 1);
    CHECK(m.yarn.mscale_all_dim == 1);
    CHECK(yarn_table_rows(m.yarn) == w.rows);
    CHECK_FALSE(m.description.empty());
  }
  try {
    find_preset("llama-3");
    FAIL("no throw");
  } catch (const arg_error& e) {
    CHECK(e.arg() == "preset");
    CHECK(std::string(e.what()).find("deepseek-v3") != std::string::npos);
    CHECK(std::string(e.what()).find("llama-3") != std::string::npos);
  }
}

TEST_CASE("yarn inv_freq: extrapolated below the ramp, interpolated above, blended between") {
  // DeepSeek: correction dims floor(10.47) = 10 and ceil(22.5) = 23 (Python math, by hand).
  const yarn_params y = find_preset("deepseek-v3").yarn;
  const std::vector<float> inv = yarn_inv_freq_f32(y, 64);
  REQUIRE(inv.size() == 32);
  for (int i = 0; i < 32; ++i) {
    INFO("i = " << i);
    const float pos = static_cast<float>(std::pow(1e4, static_cast<double>(static_cast<float>(2 * i) / 64.0f)));
    const float extrap = 1.0f / pos;
    const float interp = 1.0f / (40.0f * pos);
    if (i <= 10) CHECK(inv[i] == extrap);     // ramp 0, mask 1: interp * 0 + extrap * 1
    else if (i >= 23) CHECK(inv[i] == interp);  // mask 0
    else {
      CHECK(inv[i] < extrap);
      CHECK(inv[i] > interp);
    }
    if (i > 0) CHECK(inv[i] < inv[i - 1]);
  }
  CHECK(inv[0] == 1.0f);
  // Kimi K2: beta_fast = beta_slow = 1 -> one ramp step (low = high - 1 or a 0.001 ramp)
  const std::vector<float> kimi = yarn_inv_freq_f32(find_preset("kimi-k2").yarn, 64);
  CHECK(kimi[0] == 1.0f);
  for (int i = 1; i < 32; ++i) CHECK(kimi[i] < kimi[i - 1]);
  CHECK_THROWS_AS(yarn_inv_freq_f32(y, 5), arg_error);
}

TEST_CASE("yarn table: layout cos|sin, unit magnitude, row 0, prefix property") {
  const yarn_params y = find_preset("deepseek-v3").yarn;
  const int64_t rows = 5000;
  const std::vector<float> t = yarn_cos_sin_f32(y, 64, rows);
  REQUIRE(t.size() == static_cast<size_t>(rows * 64));
  const std::vector<float> inv = yarn_inv_freq_f32(y, 64);
  for (int i = 0; i < 32; ++i) {
    CHECK(t[i] == 1.0f);        // cos 0
    CHECK(t[32 + i] == 0.0f);   // sin 0
  }
  for (int64_t r = 0; r < rows; r += 37) {
    for (int i = 0; i < 32; ++i) {
      const double c = t[static_cast<size_t>(r * 64 + i)], s = t[static_cast<size_t>(r * 64 + 32 + i)];
      CHECK(std::abs(c * c + s * s - 1.0) < 4e-7);  // mscale 1: unit magnitude
      // the angle is the fp32 product t * inv_freq (not the exact one): for large t they differ
      const float freq = static_cast<float>(r) * inv[static_cast<size_t>(i)];
      CHECK(std::abs(c - std::cos(static_cast<double>(freq))) <= 0x1p-24);
    }
  }
  // the first rows of a longer table are the shorter table
  const std::vector<float> longer = yarn_cos_sin_f32(y, 64, rows + 100);
  CHECK(std::equal(t.begin(), t.end(), longer.begin()));
  // other widths work (the random generator uses any even dr)
  const std::vector<float> narrow = yarn_cos_sin_f32(y, 6, 10);
  CHECK(narrow.size() == 60);
  CHECK(narrow[0] == 1.0f);
}

TEST_CASE("preset_problem: decode tokens, cache sized, full YaRN table") {
  const problem p = preset_problem("deepseek-v3", 7, 3);
  CHECK(p.tq == 7);
  CHECK(p.ts == 7);
  CHECK(p.tk == 7);
  CHECK(p.heads == 128);
  CHECK(p.dn == 512);
  CHECK(p.dr == 64);
  CHECK(p.block_size == 64);
  CHECK(p.num_blocks == 3);  // ceil(7 / 64) + 2 spare
  CHECK(p.table_rows == 163840);
  CHECK(p.rope_table == "deepseek-v3");
  CHECK(p.in_dtype == dtype::bf16);
  CHECK(p.cache_dtype == dtype::bf16);
  CHECK(p.q_out_dtype == dtype::bf16);
  CHECK(p.opt.style == rope_style::gptj);
  CHECK(p.seed == 3);
  CHECK(parse_problem(p.to_repro()) == p);
  CHECK(preset_problem("kimi-k2-tp8", 256).num_blocks == 6);
  CHECK(preset_problem("kimi-k2-tp8", 256).heads == 8);
  CHECK(preset_problem("kimi-k2", 0).num_blocks == 3);
  CHECK_THROWS_AS(preset_problem("kimi-k2", -1), arg_error);
  CHECK_THROWS_AS(preset_problem("nope", 1), arg_error);
}
