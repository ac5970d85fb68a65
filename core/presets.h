// Model presets and their YaRN cos/sin tables (vLLM DeepseekScalingRotaryEmbedding semantics).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "core/problem.h"

namespace ropekv {

struct yarn_params {
  double theta;               // rope base
  double factor;              // scaling factor
  double beta_fast, beta_slow;
  int64_t original_max_pos;   // original_max_position_embeddings
  double mscale, mscale_all_dim;
};

struct model_preset {
  std::string name;           // "deepseek-v3", ...
  std::string description;
  int64_t heads;
  int64_t dn, dr;
  rope_style style;
  yarn_params yarn;
  int64_t block_size;
  dtype model_dtype;
};

const std::vector<model_preset>& model_presets();
// Throws arg_error("preset", <list of names>, name) when unknown.
const model_preset& find_preset(std::string_view name);

// The [P, Dr] table, row p = Dr/2 cos then Dr/2 sin, computed in fp32 exactly as vLLM's
// DeepseekScalingRotaryEmbedding does (before its cast to the model dtype).
std::vector<float> yarn_cos_sin_f32(const yarn_params& y, int64_t dr, int64_t rows);
// The [Dr/2] inverse frequencies behind that table (fp32, same operation order).
std::vector<float> yarn_inv_freq_f32(const yarn_params& y, int64_t dr);
// Rows vLLM allocates: original_max_pos * factor.
int64_t yarn_table_rows(const yarn_params& y);

// A problem for preset `name` with `tokens` decode tokens (Tq = Ts = Tk = tokens), cache sized
// for the tokens, its YaRN table, and the model dtype everywhere.
problem preset_problem(std::string_view name, int64_t tokens, uint64_t seed = 1);

}  // namespace ropekv
