// The problem descriptor: canonical repro strings, parsing, constraints, random generation.
#include "core/problem.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/presets.h"
#include "core/rng.h"

namespace ropekv {

namespace {

// Every repro key, in the canonical print order (docs/golden-format.md).
constexpr std::array<const char*, 45> repro_keys = {
    "tq",        "ts",        "tk",         "h",          "kh",        "dn",        "dr",        "p",
    "bs",        "nb",        "in",         "table_dtype", "pos",      "slot",      "qo",
    "cache",     "table",     "style",      "layout",     "ds_scale",  "order",     "scale_conv", "pad_q",
    "pos_oob",   "inplace_q", "inplace_k",  "k_scale",    "q_scale",   "scales",    "q_layout",
    "zero_copy", "kv_layout", "dec_out",   "dec",
    "row_pad",   "entry_pad", "block_pad",  "table_pad",  "pad_slots", "pad_at",    "positions",
    "rope_table", "amp",      "seed",       "",
};
constexpr size_t num_repro_keys = repro_keys.size() - 1;  // the trailing "" is a sentinel

std::string key_list() {
  std::string out = "one of ";
  for (size_t i = 0; i < num_repro_keys; ++i) {
    if (i) out += ", ";
    out += repro_keys[i];
  }
  return out;
}

// Bounds that keep every size computation far from int64 overflow (a repro is user input).
constexpr int64_t max_tokens_limit = int64_t{1} << 24;
constexpr int64_t max_heads_limit = int64_t{1} << 16;
constexpr int64_t max_dim_limit = int64_t{1} << 16;
constexpr int64_t max_rows_limit = int64_t{1} << 26;
constexpr int64_t max_block_size_limit = int64_t{1} << 20;
constexpr int64_t max_blocks_limit = int64_t{1} << 24;
constexpr int64_t max_pad_limit = int64_t{1} << 16;
constexpr double max_buffer_bytes = 0x1p40;  // one buffer of a case: at most 1 TiB

int64_t parse_i64(std::string_view key, std::string_view text) {
  int64_t v = 0;
  const char* b = text.data();
  const char* e = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(b, e, v);
  if (text.empty() || ec != std::errc() || ptr != e)
    throw arg_error(std::string(key), "a decimal integer", fmt::format("'{}'", text));
  return v;
}

uint64_t parse_u64(std::string_view key, std::string_view text) {
  uint64_t v = 0;
  const char* b = text.data();
  const char* e = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(b, e, v);
  if (text.empty() || ec != std::errc() || ptr != e)
    throw arg_error(std::string(key), "an unsigned 64-bit decimal integer", fmt::format("'{}'", text));
  return v;
}

bool parse_flag(std::string_view key, std::string_view text) {
  if (text == "0") return false;
  if (text == "1") return true;
  throw arg_error(std::string(key), "0 or 1", fmt::format("'{}'", text));
}

// Decimal (or hex-float) text consumed whole; strtof/strtod round correctly.
float parse_f32(std::string_view key, std::string_view text) {
  std::string s(text);
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0])))
    throw arg_error(std::string(key), "a decimal number", fmt::format("'{}'", text));
  char* end = nullptr;
  float v = std::strtof(s.c_str(), &end);
  if (end != s.c_str() + s.size())
    throw arg_error(std::string(key), "a decimal number", fmt::format("'{}'", text));
  return v;
}

double parse_f64(std::string_view key, std::string_view text) {
  std::string s(text);
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0])))
    throw arg_error(std::string(key), "a decimal number", fmt::format("'{}'", text));
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size())
    throw arg_error(std::string(key), "a decimal number", fmt::format("'{}'", text));
  return v;
}

uint32_t f32_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
uint64_t f64_bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}

bool is_input_dtype(dtype t) { return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16; }
bool is_index_dtype(dtype t) { return t == dtype::i32 || t == dtype::i64; }
bool is_output_dtype(dtype t) { return dtype_is_float(t); }

void check_range(const char* key, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) throw arg_error(key, fmt::format("{} .. {}", lo, hi), std::to_string(v));
}

void check_dtype(const char* key, dtype t, bool ok, const char* allowed) {
  if (!ok) throw arg_error(key, allowed, dtype_name(t));
}

void check_scale(const char* key, float s) {
  if (!std::isfinite(s) || !(s > 0.0f))
    throw arg_error(key, "a finite value > 0", fmt::format("{}", s));
}

// rope_table: "random" or a preset's name (whose YaRN table must have the problem's rows, when
// check_rows).
void check_rope_table(const std::string& name, int64_t table_rows, bool check_rows) {
  if (name == "random") return;
  std::string names = "random";
  const model_preset* found = nullptr;
  for (const model_preset& m : model_presets()) {
    names += ", " + m.name;
    if (m.name == name) found = &m;
  }
  if (!found) throw arg_error("rope_table", "one of " + names, name);
  const int64_t rows = yarn_table_rows(found->yarn);
  if (check_rows && table_rows > rows)
    throw arg_error("p", fmt::format("<= {} (rows of the {} YaRN table)", rows, name), std::to_string(table_rows));
}

// The constraints of check_problem on one key that its value meets or breaks whatever the other
// keys are, one row per key: check_problem checks every row, then the constraints between keys;
// check_pins checks the rows of the pinned keys alone (a pinned h=0 or dr=7 suits no problem).
// Keys whose constraints depend on others (cache, dec, pad_slots, ...) are checked in
// check_problem; for pins, the rows marked pins_only hold the part that depends on no other key.
struct single_key_check {
  std::string_view key;
  void (*check)(const problem& p);
  bool pins_only = false;
};
constexpr const char* output_dtypes_allowed = "one of f32, f16, bf16, fp8_e4m3fn, fp8_e4m3fnuz, fp8_e5m2, fp8_e5m2fnuz";
constexpr single_key_check single_key_checks[] = {
    {"tq", [](const problem& p) { check_range("tq", p.tq, 0, max_tokens_limit); }},
    {"ts", [](const problem& p) { check_range("ts", p.ts, 0, max_tokens_limit); }},
    {"tk", [](const problem& p) { check_range("tk", p.tk, 0, max_tokens_limit); }},
    {"h", [](const problem& p) { check_range("h", p.heads, 1, max_heads_limit); }},
    {"kh", [](const problem& p) { check_range("kh", p.kv_heads, 1, max_heads_limit); }},
    {"dn", [](const problem& p) { check_range("dn", p.dn, 1, max_dim_limit); }},
    {"dr",
     [](const problem& p) {
       check_range("dr", p.dr, 2, max_dim_limit);
       if (p.dr % 2 != 0) throw arg_error("dr", "an even number", std::to_string(p.dr));
     }},
    {"p", [](const problem& p) { check_range("p", p.table_rows, 1, max_rows_limit); }},
    {"bs", [](const problem& p) { check_range("bs", p.block_size, 1, max_block_size_limit); }},
    {"nb", [](const problem& p) { check_range("nb", p.num_blocks, 1, max_blocks_limit); }},
    {"in", [](const problem& p) { check_dtype("in", p.in_dtype, is_input_dtype(p.in_dtype), "one of f32, f16, bf16"); }},
    {"table_dtype",
     [](const problem& p) {
       check_dtype("table_dtype", p.table_dtype, is_input_dtype(p.table_dtype), "one of f32, f16, bf16");
     }},
    {"pos", [](const problem& p) { check_dtype("pos", p.pos_dtype, is_index_dtype(p.pos_dtype), "one of i32, i64"); }},
    {"slot", [](const problem& p) { check_dtype("slot", p.slot_dtype, is_index_dtype(p.slot_dtype), "one of i32, i64"); }},
    {"qo",
     [](const problem& p) { check_dtype("qo", p.q_out_dtype, is_output_dtype(p.q_out_dtype), output_dtypes_allowed); }},
    {"k_scale", [](const problem& p) { check_scale("k_scale", p.k_scale); }},
    {"q_scale", [](const problem& p) { check_scale("q_scale", p.q_scale); }},
    {"row_pad", [](const problem& p) { check_range("row_pad", p.row_pad_elems, 0, max_pad_limit); }},
    {"entry_pad", [](const problem& p) { check_range("entry_pad", p.entry_pad_elems, 0, max_pad_limit); }},
    {"block_pad", [](const problem& p) { check_range("block_pad", p.block_pad_elems, 0, max_pad_limit); }},
    {"table_pad", [](const problem& p) { check_range("table_pad", p.table_pad_elems, 0, max_pad_limit); }},
    {"pad_slots", [](const problem& p) { check_range("pad_slots", p.pad_slots, 0, max_tokens_limit); }, true},
    {"dec", [](const problem& p) { check_range("dec", p.dec_tokens, 0, max_tokens_limit); }, true},
    {"amp",
     [](const problem& p) {
       if (!std::isfinite(p.amplitude) || !(p.amplitude > 0.0))
         throw arg_error("amp", "a finite value > 0", fmt::format("{}", p.amplitude));
     }},
    {"rope_table", [](const problem& p) { check_rope_table(p.rope_table, p.table_rows, /*check_rows=*/false); }},
};

void check_key_alone(const problem& p, std::string_view key) {
  for (const single_key_check& c : single_key_checks)
    if (c.key == key) c.check(p);
}

void check_bytes(const char* what, double elems, dtype t) {
  double bytes = elems * static_cast<double>(dtype_size_bytes(t));
  if (bytes > max_buffer_bytes)
    throw arg_error(what, "a buffer of at most 2^40 bytes", fmt::format("{} bytes", bytes));
}

// dec_out: "none", or the letters of the decode outputs passed, in the order q, z, k
// (q: decode_q_pe_out, z: q_nope_zeros_out, k: k_pe_out).
std::string dec_out_text(const problem& p) {
  std::string s;
  if (p.dec_q_pe) s += 'q';
  if (p.dec_zeros) s += 'z';
  if (p.dec_k_pe) s += 'k';
  return s.empty() ? "none" : s;
}

void parse_dec_out(problem& p, std::string_view key, std::string_view text) {
  const char* expected = "none, or some of the letters q, z, k in that order (q: decode_q_pe_out, "
                         "z: q_nope_zeros_out, k: k_pe_out)";
  p.dec_q_pe = p.dec_zeros = p.dec_k_pe = false;
  if (text == "none") return;
  size_t i = 0;
  for (char letter : {'q', 'z', 'k'}) {
    if (i < text.size() && text[i] == letter) {
      (letter == 'q' ? p.dec_q_pe : letter == 'z' ? p.dec_zeros : p.dec_k_pe) = true;
      ++i;
    }
  }
  if (text.empty() || i != text.size()) throw arg_error(std::string(key), expected, fmt::format("'{}'", text));
}

}  // namespace

std::string problem::to_repro() const {
  std::string s;
  s.reserve(512);
  auto add = [&](const char* key, const auto& value) {
    if (!s.empty()) s += ' ';
    s += key;
    s += '=';
    s += fmt::format("{}", value);
  };
  add("tq", tq);
  add("ts", ts);
  add("tk", tk);
  add("h", heads);
  add("kh", kv_heads);
  add("dn", dn);
  add("dr", dr);
  add("p", table_rows);
  add("bs", block_size);
  add("nb", num_blocks);
  add("in", dtype_name(in_dtype));
  add("table_dtype", dtype_name(table_dtype));
  add("pos", dtype_name(pos_dtype));
  add("slot", dtype_name(slot_dtype));
  add("qo", dtype_name(q_out_dtype));
  add("cache", dtype_name(cache_dtype));
  add("table", to_string(table));
  add("style", to_string(opt.style));
  add("layout", to_string(opt.layout));
  add("ds_scale", to_string(opt.tile_scale));
  add("order", to_string(opt.order));
  add("scale_conv", to_string(opt.scale));
  add("pad_q", to_string(opt.padding));
  add("pos_oob", to_string(opt.positions));
  add("inplace_q", opt.inplace_q ? 1 : 0);
  add("inplace_k", opt.inplace_k ? 1 : 0);
  add("k_scale", k_scale);  // fmt "{}" of a float: the shortest decimal that round-trips
  add("q_scale", q_scale);
  add("scales", to_string(scales));
  add("q_layout", to_string(q_layout));
  add("zero_copy", zero_copy ? 1 : 0);
  add("kv_layout", to_string(kv_layout));
  add("dec_out", dec_out_text(*this));
  add("dec", dec_tokens);
  add("row_pad", row_pad_elems);
  add("entry_pad", entry_pad_elems);
  add("block_pad", block_pad_elems);
  add("table_pad", table_pad_elems);
  add("pad_slots", pad_slots);
  add("pad_at", to_string(pad_where));
  add("positions", to_string(positions));
  add("rope_table", rope_table);
  add("amp", amplitude);  // shortest decimal that round-trips the double
  add("seed", seed);
  return s;
}

bool problem::operator==(const problem& o) const {
  return tq == o.tq && ts == o.ts && tk == o.tk && heads == o.heads && kv_heads == o.kv_heads && dn == o.dn &&
         dr == o.dr && table_rows == o.table_rows && block_size == o.block_size &&
         num_blocks == o.num_blocks && in_dtype == o.in_dtype && table_dtype == o.table_dtype &&
         pos_dtype == o.pos_dtype && slot_dtype == o.slot_dtype &&
         q_out_dtype == o.q_out_dtype && cache_dtype == o.cache_dtype && table == o.table &&
         opt.style == o.opt.style && opt.layout == o.opt.layout && opt.order == o.opt.order &&
         opt.tile_scale == o.opt.tile_scale &&
         opt.scale == o.opt.scale && opt.padding == o.opt.padding &&
         opt.positions == o.opt.positions && opt.inplace_q == o.opt.inplace_q &&
         opt.inplace_k == o.opt.inplace_k && f32_bits(k_scale) == f32_bits(o.k_scale) &&
         f32_bits(q_scale) == f32_bits(o.q_scale) && scales == o.scales && q_layout == o.q_layout &&
         zero_copy == o.zero_copy &&
         dec_q_pe == o.dec_q_pe && dec_zeros == o.dec_zeros && dec_k_pe == o.dec_k_pe &&
         dec_tokens == o.dec_tokens &&
         kv_layout == o.kv_layout && row_pad_elems == o.row_pad_elems &&
         entry_pad_elems == o.entry_pad_elems && block_pad_elems == o.block_pad_elems &&
         table_pad_elems == o.table_pad_elems && pad_slots == o.pad_slots &&
         pad_where == o.pad_where && positions == o.positions && rope_table == o.rope_table &&
         f64_bits(amplitude) == f64_bits(o.amplitude) && seed == o.seed;
}

namespace {

// Splits "key=value key=value ..." into tokens; `arg` names the argument in errors.
std::vector<std::pair<std::string_view, std::string_view>> repro_tokens(std::string_view text,
                                                                         const char* arg) {
  std::vector<std::pair<std::string_view, std::string_view>> out;
  size_t i = 0;
  const size_t n = text.size();
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (i < n) {
    while (i < n && is_space(text[i])) ++i;
    if (i >= n) break;
    size_t j = i;
    while (j < n && !is_space(text[j])) ++j;
    std::string_view token = text.substr(i, j - i);
    i = j;
    size_t eq = token.find('=');
    if (eq == std::string_view::npos || eq == 0)
      throw arg_error(arg, "key=value tokens separated by spaces", fmt::format("'{}'", token));
    std::string_view key = token.substr(0, eq);
    bool known = false;
    for (size_t k = 0; k < num_repro_keys; ++k) known = known || key == repro_keys[k];
    if (!known) throw arg_error(arg, key_list(), fmt::format("'{}'", key));
    out.emplace_back(key, token.substr(eq + 1));
  }
  return out;
}

// Sets one field from its repro key and text; throws arg_error naming the key.
void set_problem_key(problem& p, std::string_view key, std::string_view val) {
  std::string k(key);
  const char* kc = k.c_str();
  if (key == "tq") p.tq = parse_i64(key, val);
  else if (key == "ts") p.ts = parse_i64(key, val);
  else if (key == "tk") p.tk = parse_i64(key, val);
  else if (key == "h") p.heads = parse_i64(key, val);
  else if (key == "kh") p.kv_heads = parse_i64(key, val);
  else if (key == "dn") p.dn = parse_i64(key, val);
  else if (key == "dr") p.dr = parse_i64(key, val);
  else if (key == "p") p.table_rows = parse_i64(key, val);
  else if (key == "bs") p.block_size = parse_i64(key, val);
  else if (key == "nb") p.num_blocks = parse_i64(key, val);
  else if (key == "in") p.in_dtype = parse_dtype(val, kc);
  else if (key == "table_dtype") p.table_dtype = parse_dtype(val, kc);
  else if (key == "pos") p.pos_dtype = parse_dtype(val, kc);
  else if (key == "slot") p.slot_dtype = parse_dtype(val, kc);
  else if (key == "qo") p.q_out_dtype = parse_dtype(val, kc);
  else if (key == "cache") p.cache_dtype = parse_dtype(val, kc);
  else if (key == "table") p.table = parse_enum<table_kind>(val, kc);
  else if (key == "style") p.opt.style = parse_enum<rope_style>(val, kc);
  else if (key == "layout") p.opt.layout = parse_enum<cache_layout>(val, kc);
  else if (key == "ds_scale") p.opt.tile_scale = parse_enum<ds_scale>(val, kc);
  else if (key == "order") p.opt.order = parse_enum<row_order>(val, kc);
  else if (key == "scale_conv") p.opt.scale = parse_enum<scale_conv>(val, kc);
  else if (key == "pad_q") p.opt.padding = parse_enum<pad_q>(val, kc);
  else if (key == "pos_oob") p.opt.positions = parse_enum<pos_oob>(val, kc);
  else if (key == "inplace_q") p.opt.inplace_q = parse_flag(key, val);
  else if (key == "inplace_k") p.opt.inplace_k = parse_flag(key, val);
  else if (key == "k_scale") p.k_scale = parse_f32(key, val);
  else if (key == "q_scale") p.q_scale = parse_f32(key, val);
  else if (key == "scales") p.scales = parse_enum<scale_storage>(val, kc);
  else if (key == "q_layout") p.q_layout = parse_enum<q_storage>(val, kc);
  else if (key == "zero_copy") p.zero_copy = parse_flag(key, val);
  else if (key == "kv_layout") p.kv_layout = parse_enum<kv_storage>(val, kc);
  else if (key == "dec_out") parse_dec_out(p, key, val);
  else if (key == "dec") p.dec_tokens = parse_i64(key, val);
  else if (key == "row_pad") p.row_pad_elems = parse_i64(key, val);
  else if (key == "entry_pad") p.entry_pad_elems = parse_i64(key, val);
  else if (key == "block_pad") p.block_pad_elems = parse_i64(key, val);
  else if (key == "table_pad") p.table_pad_elems = parse_i64(key, val);
  else if (key == "pad_slots") p.pad_slots = parse_i64(key, val);
  else if (key == "pad_at") p.pad_where = parse_enum<pad_at>(val, kc);
  else if (key == "positions") p.positions = parse_enum<pos_mode>(val, kc);
  else if (key == "rope_table") {
    if (val.empty()) throw arg_error("rope_table", "random or a preset name", "''");
    p.rope_table = std::string(val);
  } else if (key == "amp") p.amplitude = parse_f64(key, val);
  else if (key == "seed") p.seed = parse_u64(key, val);
  else throw error(fmt::format("parse_problem: key '{}' listed but not handled", key));
}

}  // namespace

problem parse_problem(std::string_view repro) {
  problem p;
  std::set<std::string, std::less<>> seen;
  for (auto [key, val] : repro_tokens(repro, "repro")) {
    if (!seen.insert(std::string(key)).second)
      throw arg_error(std::string(key), "the key once", "it twice");
    set_problem_key(p, key, val);
  }
  check_problem(p);
  return p;
}

void check_pins(std::string_view pins) {
  problem p;
  std::set<std::string, std::less<>> seen;
  for (auto [key, val] : repro_tokens(pins, "--pin")) {
    if (!seen.insert(std::string(key)).second)
      throw arg_error("--pin", "each key once", fmt::format("'{}' twice", key));
    set_problem_key(p, key, val);
    check_key_alone(p, key);
  }
}

namespace {

// Layout shuffled (core/SPEC.md): the first key of p that breaks its constraints, as an
// arg_error's parts; key empty when none does (or the layout is another).
struct shuffled_violation {
  std::string key, expected, got;
};
int64_t shuffled_run(const problem& p) {
  return shuffled_run_elems(static_cast<int64_t>(dtype_size_bytes(p.cache_dtype)));
}
shuffled_violation shuffled_check(const problem& p) {
  if (p.opt.layout != cache_layout::shuffled) return {};
  const int64_t run = shuffled_run(p);
  const std::string runs = fmt::format("a multiple of {} (layout shuffled, cache {}: runs of 16 bytes)", run,
                                       dtype_name(p.cache_dtype));
  if (p.block_size % shuffled_tile_tokens != 0)
    return {"bs", "a multiple of 16 (layout shuffled: 16-token tiles)", std::to_string(p.block_size)};
  if (p.dn % run != 0) return {"dn", runs, std::to_string(p.dn)};
  if (p.dr % run != 0) return {"dr", runs, std::to_string(p.dr)};
  if (p.entry_pad_elems != 0)
    return {"entry_pad", "0 (layout shuffled packs each block)", std::to_string(p.entry_pad_elems)};
  if (p.opt.order != row_order::nope_first)
    return {"order", "nope_first (layout shuffled)", std::string(to_string(p.opt.order))};
  return {};
}

// Layout fp8_ds_mla (core/SPEC.md): the first key of p that breaks its constraints (key empty
// when none does). Other layouts: ds_scale keeps its default, and the cache is not u8.
struct ds_mla_violation {
  std::string key, expected, got;
};
ds_mla_violation ds_mla_check(const problem& p) {
  if (p.opt.layout != cache_layout::fp8_ds_mla) {
    if (p.opt.tile_scale != ds_scale::amax)
      return {"ds_scale", "amax (ds_scale is read by layout fp8_ds_mla only)", std::string(to_string(p.opt.tile_scale))};
    return {};
  }
  if (p.in_dtype != dtype::bf16 && p.in_dtype != dtype::f16)
    return {"in", "bf16 or f16 (layout fp8_ds_mla keeps the rope part in the 16-bit input dtype)",
            dtype_name(p.in_dtype)};
  if (p.dn != ds_mla_dn) return {"dn", "512 (layout fp8_ds_mla)", std::to_string(p.dn)};
  if (p.dr != ds_mla_dr) return {"dr", "64 (layout fp8_ds_mla)", std::to_string(p.dr)};
  if (p.kv_heads != 1) return {"kh", "1 (layout fp8_ds_mla: one kv head per entry)", std::to_string(p.kv_heads)};
  if (p.cache_dtype != dtype::u8)
    return {"cache", "u8 (layout fp8_ds_mla: 656-byte entries)", dtype_name(p.cache_dtype)};
  if (p.opt.order != row_order::nope_first)
    return {"order", "nope_first (layout fp8_ds_mla)", std::string(to_string(p.opt.order))};
  if (p.entry_pad_elems % 4 != 0)
    return {"entry_pad", "a multiple of 4 (layout fp8_ds_mla: f32 scales stay aligned)", std::to_string(p.entry_pad_elems)};
  if (p.block_pad_elems % 4 != 0)
    return {"block_pad", "a multiple of 4 (layout fp8_ds_mla: f32 scales stay aligned)", std::to_string(p.block_pad_elems)};
  return {};
}

// Enough cache blocks for the non-padding slots at p's block size.
void ensure_blocks(problem& p) {
  if (p.block_size <= 0) return;
  const int64_t written = std::max<int64_t>(p.ts - p.pad_slots, 0);
  p.num_blocks = std::max(p.num_blocks, (written + p.block_size - 1) / p.block_size);
}

// Moves p's free keys (free(key) true) into layout shuffled's domain: block size, Dn and Dr
// rounded up to what the tiles need, no entry padding, nope first, enough blocks.
template <typename F>
void fit_shuffled(problem& p, F&& free) {
  auto up = [](int64_t v, int64_t m) { return (v + m - 1) / m * m; };
  const int64_t run = shuffled_run(p);
  if (free("bs")) p.block_size = up(std::max<int64_t>(p.block_size, 1), shuffled_tile_tokens);
  if (free("dn")) p.dn = up(p.dn, run);
  if (free("dr")) p.dr = up(p.dr, run);
  if (free("entry_pad")) p.entry_pad_elems = 0;
  if (free("order")) p.opt.order = row_order::nope_first;
  if (free("nb")) ensure_blocks(p);
}

// Moves p's free keys into layout fp8_ds_mla's domain: a 16-bit input (bf16 for f32), Dn 512,
// Dr 64, a u8 cache, nope first, paddings rounded down to multiples of 4, enough blocks.
template <typename F>
void fit_ds_mla(problem& p, F&& free) {
  if (free("in") && p.in_dtype != dtype::bf16 && p.in_dtype != dtype::f16) p.in_dtype = dtype::bf16;
  if (free("dn")) p.dn = ds_mla_dn;
  if (free("dr")) p.dr = ds_mla_dr;
  if (free("kh")) p.kv_heads = 1;
  if (free("cache")) p.cache_dtype = dtype::u8;
  if (free("order")) p.opt.order = row_order::nope_first;
  if (free("entry_pad")) p.entry_pad_elems = p.entry_pad_elems / 4 * 4;
  if (free("block_pad")) p.block_pad_elems = p.block_pad_elems / 4 * 4;
  if (free("nb")) ensure_blocks(p);
}

}  // namespace

problem pin_problem(problem p, std::string_view pins) {
  const bool drawn_ds_mla = p.opt.layout == cache_layout::fp8_ds_mla;
  std::set<std::string, std::less<>> pinned;
  for (auto [key, val] : repro_tokens(pins, "--pin")) {
    set_problem_key(p, key, val);
    pinned.insert(std::string(key));
  }
  if (pinned.empty()) return p;
  auto free = [&](const char* key) { return pinned.count(key) == 0; };
  // Decode outputs: a pinned N asks for them (all three unless dec_out is pinned too) and for
  // at least N q tokens; pinned outputs without a pinned N get an N from the case's seed (every
  // kind: 0, Tq, and in between), so that `--pin dec_out=qzk` covers all N.
  if (!free("dec") && free("dec_out")) p.dec_q_pe = p.dec_zeros = p.dec_k_pe = true;
  if (!free("dec") && free("tq")) p.tq = std::max(p.tq, p.dec_tokens);
  if (free("dec") && !free("dec_out")) {
    const uint64_t u = rng_mix64(p.seed ^ 0x6465636f6465ull);
    const uint64_t kind = u % 4;
    p.dec_tokens = kind == 0 ? p.tq : kind == 1 || p.tq == 0 ? 0 : 1 + static_cast<int64_t>((u >> 8) % static_cast<uint64_t>(p.tq));
  }
  // kv heads: a pinned kh makes a free h a multiple of it; a pinned h makes a free kh divide it.
  if (!free("kh") && free("h") && p.kv_heads > 0 && p.heads % p.kv_heads != 0)
    p.heads = (p.heads + p.kv_heads - 1) / p.kv_heads * p.kv_heads;
  if (free("kh") && p.heads > 0 && p.kv_heads > 0 && p.heads % p.kv_heads != 0) p.kv_heads = std::gcd(p.heads, p.kv_heads);
  // Keep what the generator derived from a pinned size consistent with it.
  if (free("ts")) p.ts = std::max(p.ts, p.tq);
  if (free("tk")) p.tk = std::max(p.tk, p.ts);
  if (free("ts")) p.ts = std::min(p.ts, p.tk);
  if (free("tq")) p.tq = std::min(p.tq, p.ts);
  if (free("pad_slots")) p.pad_slots = std::min(p.pad_slots, p.ts);
  if (free("nb")) ensure_blocks(p);
  if (free("dec")) p.dec_tokens = (p.dec_q_pe || p.dec_zeros) ? std::min(p.dec_tokens, p.tq) : 0;
  // Drawn fp8_ds_mla but another layout pinned: its u8 cache and tile scale rule go (the cache
  // takes the input's dtype); its Dn, Dr, input dtype and paddings stay, valid in any layout.
  if (drawn_ds_mla && p.opt.layout != cache_layout::fp8_ds_mla) {
    if (free("cache") && p.cache_dtype == dtype::u8) p.cache_dtype = p.in_dtype;
    if (free("ds_scale")) p.opt.tile_scale = ds_scale::amax;
  }
  if (p.opt.layout == cache_layout::shuffled) {
    // Pinned shuffled: fit the free keys to it. Drawn shuffled but the pins rule it out (say
    // `dn=100` with a bf16 cache): the case takes layout joint instead.
    problem fitted = p;
    fit_shuffled(fitted, free);
    if (shuffled_check(fitted).key.empty() || !free("layout")) p = fitted;
    else p.opt.layout = cache_layout::joint;
  }
  // A pinned ds_scale=pow2 asks for layout fp8_ds_mla (the only layout that reads it).
  if (!free("ds_scale") && p.opt.tile_scale != ds_scale::amax && free("layout")) p.opt.layout = cache_layout::fp8_ds_mla;
  if (p.opt.layout == cache_layout::fp8_ds_mla) {
    // Pinned fp8_ds_mla: fit the free keys to it. Drawn fp8_ds_mla but the pins rule it out
    // (say `dn=100`): the case takes layout joint instead.
    problem fitted = p;
    fit_ds_mla(fitted, free);
    // pinned onto a case drawn with another layout: its tile scale rule from the case's seed
    if (!drawn_ds_mla && free("ds_scale"))
      fitted.opt.tile_scale = (rng_mix64(p.seed ^ 0x64735f6d6c61ull) & 1) ? ds_scale::pow2 : ds_scale::amax;
    if (ds_mla_check(fitted).key.empty() || !free("layout")) {
      p = fitted;
    } else {
      p.opt.layout = cache_layout::joint;
      if (free("ds_scale")) p.opt.tile_scale = ds_scale::amax;
      if (free("cache") && p.cache_dtype == dtype::u8) p.cache_dtype = p.in_dtype;
    }
  }
  // Zero-copy: q_out takes q's dtype (after the layouts, which may change it). A pinned
  // zero_copy=1 moves a free qo there (or a free in to a pinned 16/32-bit qo); a drawn one that
  // the pins rule out turns off.
  if (p.zero_copy && p.q_out_dtype != p.in_dtype) {
    if (free("qo")) p.q_out_dtype = p.in_dtype;
    else if (free("zero_copy")) p.zero_copy = false;
    else if (free("in") && is_input_dtype(p.q_out_dtype) &&
             (p.opt.layout != cache_layout::fp8_ds_mla || p.q_out_dtype != dtype::f32))  // (its rope part is 16-bit)
      p.in_dtype = p.q_out_dtype;
  }
  check_problem(p);
  return parse_problem(p.to_repro());
}

void check_problem(const problem& p) {
  for (const single_key_check& c : single_key_checks)
    if (!c.pins_only) c.check(p);
  // the constraints between keys
  if (p.tq > p.ts) throw arg_error("tq", fmt::format("tq <= ts = {}", p.ts), std::to_string(p.tq));
  if (p.ts > p.tk) throw arg_error("ts", fmt::format("ts <= tk = {}", p.tk), std::to_string(p.ts));
  if (p.heads % p.kv_heads != 0)
    throw arg_error("kh", fmt::format("a divisor of h = {}", p.heads), std::to_string(p.kv_heads));
  if (p.opt.layout != cache_layout::fp8_ds_mla)
    check_dtype("cache", p.cache_dtype, is_output_dtype(p.cache_dtype), output_dtypes_allowed);
  check_range("pad_slots", p.pad_slots, 0, p.ts);
  if (p.zero_copy && p.q_out_dtype != p.in_dtype)
    throw arg_error("qo", fmt::format("{} (zero_copy=1: q_nope lies in q_out, so q_out takes q's dtype)", dtype_name(p.in_dtype)),
                    dtype_name(p.q_out_dtype));
  if (p.dec_q_pe || p.dec_zeros) {
    if (p.dec_tokens < 0 || p.dec_tokens > p.tq)
      throw arg_error("dec", fmt::format("0 .. {} (N <= Tq = tq)", p.tq), std::to_string(p.dec_tokens));
  } else if (p.dec_tokens != 0) {
    throw arg_error("dec", fmt::format("0 (dec_out={} passes no [N, H, ..] output)", dec_out_text(p)),
                    std::to_string(p.dec_tokens));
  }
  if (const shuffled_violation v = shuffled_check(p); !v.key.empty()) throw arg_error(v.key, v.expected, v.got);
  if (const ds_mla_violation v = ds_mla_check(p); !v.key.empty()) throw arg_error(v.key, v.expected, v.got);
  const int64_t written = p.ts - p.pad_slots;
  if (p.num_blocks * p.block_size < written)
    throw arg_error("nb", fmt::format("nb * bs >= {} (the non-padding slots)", written),
                    fmt::format("{} * {} = {}", p.num_blocks, p.block_size,
                                p.num_blocks * p.block_size));
  if (p.pos_dtype == dtype::i32 && p.table_rows > INT32_MAX - 4096)
    throw arg_error("p", "a table that i32 positions can index", std::to_string(p.table_rows));
  check_rope_table(p.rope_table, p.table_rows, /*check_rows=*/true);
  // Buffer sizes (all dimensions are bounded above, so these doubles are exact enough).
  const double q_rows = static_cast<double>(p.tq) * static_cast<double>(p.heads);
  check_bytes("q_nope", q_rows * static_cast<double>(p.dn + p.row_pad_elems), p.in_dtype);
  check_bytes("q_out", q_rows * static_cast<double>(p.dn + p.dr + p.row_pad_elems), p.q_out_dtype);
  check_bytes("kv_c", static_cast<double>(p.tk) * static_cast<double>(p.kv_heads) *
                         static_cast<double>(p.dn + p.dr + p.row_pad_elems), p.in_dtype);
  const double entry = static_cast<double>(cache_row_elems(p.opt.layout, p.dn, p.dr) + p.entry_pad_elems);
  const double block = static_cast<double>(p.kv_heads) * static_cast<double>(p.block_size) * entry + p.block_pad_elems;
  check_bytes("cache", static_cast<double>(p.num_blocks) * block, p.cache_dtype);
  check_bytes("cos_sin", static_cast<double>(p.table_rows) * (p.dr + p.table_pad_elems),
              p.table_dtype);
}

// ---------------------------------------------------------------------------------------------
// Random problems (the fuzzer's generator).

namespace {

constexpr int64_t small_primes[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61};
constexpr int64_t medium_primes[] = {67, 97, 127, 131, 251, 257, 509, 521, 1021, 2039, 4093};
constexpr int64_t odd_dn[] = {1, 3, 8, 24, 64, 100, 128, 512, 576};
constexpr int64_t odd_dr[] = {2, 4, 6, 8, 16, 32, 128};
constexpr int64_t odd_block_sizes[] = {3, 5, 7, 37};
constexpr dtype input_types[] = {dtype::f32, dtype::f16, dtype::bf16};
constexpr dtype fp8_types[] = {dtype::fp8_e4m3fn, dtype::fp8_e4m3fnuz, dtype::fp8_e5m2,
                               dtype::fp8_e5m2fnuz};
constexpr dtype output_types[] = {dtype::f32,          dtype::f16,        dtype::bf16,
                                  dtype::fp8_e4m3fn,   dtype::fp8_e4m3fnuz, dtype::fp8_e5m2,
                                  dtype::fp8_e5m2fnuz};

template <typename T, size_t N>
T pick(rng_stream& r, const T (&items)[N]) {
  return items[r.below(N)];
}

int64_t random_tokens(rng_stream& r, int64_t max_tokens) {
  const double u = r.next_unit();
  int64_t t;
  if (u < 0.08) t = 0;
  else if (u < 0.28) t = 1;
  else if (u < 0.50) t = pick(r, small_primes);
  else if (u < 0.85) t = r.range(2, 64);
  else if (u < 0.95) t = r.chance(0.5) ? pick(r, medium_primes) : r.range(65, 512);
  else t = r.range(65, std::max<int64_t>(65, max_tokens));
  return std::min(t, max_tokens);
}

float random_scale(rng_stream& r) {
  const double u = r.next_unit();
  if (u < 0.25) return 1.0f;
  if (u < 0.35) return r.chance(0.5) ? 0.5f : 2.0f;
  // log-uniform in [0.01, 10]: non-powers of two almost surely
  return static_cast<float>(std::exp(std::log(0.01) + r.next_unit() * std::log(1000.0)));
}

}  // namespace

problem random_problem(uint64_t seed, uint64_t case_index, int64_t max_tokens) {
  if (max_tokens < 1 || max_tokens > 4096)
    throw arg_error("max_tokens", "1 .. 4096", std::to_string(max_tokens));
  rng_stream r{rng_mix64(seed), rng_mix64(case_index ^ 0x70726f626c656dull)};
  problem p;
  constexpr int64_t max_cost_elems = int64_t{2} << 20;  // tq * h * (dn + dr)

  // sizes
  p.tq = random_tokens(r, max_tokens);
  p.ts = p.tq;
  p.tk = p.tq;
  if (r.chance(0.3)) p.ts = std::min(max_tokens, p.tq + r.range(1, r.chance(0.8) ? 8 : 64));
  p.tk = p.ts;
  if (r.chance(0.3)) p.tk = std::min(max_tokens, p.ts + r.range(1, r.chance(0.8) ? 8 : 64));
  {
    const double u = r.next_unit();
    p.heads = u < 0.3 ? 1 : u < 0.5 ? 8 : u < 0.7 ? 16 : u < 0.88 ? 128 : r.range(2, 40);
  }
  p.dn = r.chance(0.5) ? 512 : pick(r, odd_dn);
  p.dr = r.chance(0.6) ? 64 : pick(r, odd_dr);
  auto bound_cost = [&] {  // tq * h * (dn + dr) <= max_cost_elems: fewer heads first, then fewer tokens
    while (p.heads > 1 && p.tq * p.heads * (p.dn + p.dr) > max_cost_elems) p.heads = (p.heads + 1) / 2;
    if (p.tq * p.heads * (p.dn + p.dr) > max_cost_elems) p.tq = max_cost_elems / (p.dn + p.dr);
  };
  bound_cost();

  {
    const double u = r.next_unit();
    p.block_size = u < 0.2 ? 1 : u < 0.45 ? 16 : u < 0.75 ? 64 : pick(r, odd_block_sizes);
  }
  p.pad_slots = r.chance(0.5) ? 0 : r.range(0, p.ts);
  p.pad_where = static_cast<pad_at>(r.below(4));
  const int64_t written = p.ts - p.pad_slots;
  p.num_blocks = std::max<int64_t>(1, (written + p.block_size - 1) / p.block_size) +
                 (r.chance(0.5) ? 0 : r.range(1, 4));

  // dtypes
  p.in_dtype = pick(r, input_types);
  p.table_dtype = r.chance(0.5) ? p.in_dtype : pick(r, input_types);
  p.pos_dtype = r.chance(0.5) ? dtype::i64 : dtype::i32;
  p.slot_dtype = r.chance(0.5) ? dtype::i64 : dtype::i32;
  p.q_out_dtype = r.chance(0.5) ? p.in_dtype : pick(r, output_types);
  {
    const double u = r.next_unit();
    p.cache_dtype = u < 0.4 ? p.in_dtype : u < 0.8 ? pick(r, fp8_types) : pick(r, output_types);
  }
  // scales: random for fp8 outputs; sometimes non-1 for non-fp8 ones (must be ignored)
  p.k_scale = dtype_is_fp8(p.cache_dtype) || r.chance(0.1) ? random_scale(r) : 1.0f;
  p.q_scale = dtype_is_fp8(p.q_out_dtype) || r.chance(0.1) ? random_scale(r) : 1.0f;

  // op options
  p.table = r.chance(0.5) ? table_kind::one : table_kind::two;
  p.opt.style = r.chance(0.6) ? rope_style::gptj : rope_style::neox;
  p.opt.layout = r.chance(0.6) ? cache_layout::joint : cache_layout::split;
  p.opt.order = r.chance(0.6) ? row_order::nope_first : row_order::rope_first;
  p.opt.scale = r.chance(0.5) ? scale_conv::divide : scale_conv::reciprocal;
  p.opt.padding = r.chance(0.5) ? pad_q::computed : pad_q::skipped;
  p.opt.positions = r.chance(0.7) ? pos_oob::error : pos_oob::clamp;
  p.opt.inplace_q = r.chance(0.2);
  p.opt.inplace_k = r.chance(0.2);

  // memory layout
  p.q_layout = r.chance(0.7) ? q_storage::token_major : q_storage::head_major;
  p.kv_layout = r.chance(0.7) ? kv_storage::separate : kv_storage::fused;
  p.row_pad_elems = r.chance(0.6) ? 0 : r.range(1, 16);
  p.entry_pad_elems = r.chance(0.6) ? 0 : r.range(1, 40);
  p.block_pad_elems = r.chance(0.6) ? 0 : r.range(1, 100);
  p.table_pad_elems = r.chance(0.6) ? 0 : r.range(1, 16);

  // table
  {
    const double u = r.next_unit();
    p.table_rows = u < 0.15 ? r.range(1, 16) : u < 0.85 ? r.range(17, 8192) : r.range(8193, 32768);
  }
  if (r.chance(0.15)) {
    const auto& presets = model_presets();
    const model_preset& m = presets[r.below(presets.size())];
    p.rope_table = m.name;
    const int64_t rows = yarn_table_rows(m.yarn);
    // the first p rows of that table; the whole table only while it stays cheap to build
    if (rows * p.dr <= (int64_t{4} << 20) && r.chance(0.5)) p.table_rows = rows;
    p.table_rows = std::min(p.table_rows, rows);
  } else {
    p.table_rows = std::min(p.table_rows, std::max<int64_t>(16, (int64_t{1} << 19) / p.dr));
  }
  {
    const double u = r.next_unit();
    p.positions = u < 0.7 ? pos_mode::random : u < 0.9 ? pos_mode::near_end : pos_mode::same;
  }
  {
    const double u = r.next_unit();
    if (u < 0.15) p.amplitude = 0.5;
    else if (u < 0.3) p.amplitude = 1.0;
    else if (u < 0.5) p.amplitude = 4.0;
    else if (u < 0.6) p.amplitude = 300.0;
    else p.amplitude = std::round(std::exp(std::log(0.5) + r.next_unit() * std::log(600.0)) * 64) / 64;
  }
  p.seed = r.next_u64();
  // Layout shuffled, drawn last so that every earlier draw (and so every other case of a
  // campaign) is what it was before the layout existed.
  if (r.chance(0.2)) {
    p.opt.layout = cache_layout::shuffled;
    fit_shuffled(p, [](const char*) { return true; });
    bound_cost();  // Dn, Dr were rounded up
  }
  // Scales as tensors, drawn after everything else for the same reason.
  if (r.chance(0.25)) p.scales = scale_storage::tensor;
  // Decode outputs, drawn after everything else for the same reason: each output on its own,
  // and N at Tq, at 0 or in between (AITER gets 0 < N < Tq wrong).
  if (r.chance(0.15)) {
    p.dec_q_pe = r.chance(0.7);
    p.dec_zeros = r.chance(0.7);
    p.dec_k_pe = r.chance(0.6);
    if (!p.dec_q_pe && !p.dec_zeros && !p.dec_k_pe) p.dec_q_pe = p.dec_zeros = p.dec_k_pe = true;
    if (p.dec_q_pe || p.dec_zeros) {
      const double u = r.next_unit();
      p.dec_tokens = u < 0.3 ? p.tq : u < 0.4 ? 0 : r.range(0, p.tq);
    }
  }
  // Layout fp8_ds_mla (vLLM's DeepSeek V3.2 sparse cache), drawn last for the same reason: its
  // fixed sizes (Dn 512, Dr 64), a u8 cache, a 16-bit input, either tile scale rule.
  if (r.chance(0.05)) {
    p.opt.layout = cache_layout::fp8_ds_mla;
    p.opt.tile_scale = r.chance(0.5) ? ds_scale::amax : ds_scale::pow2;
    fit_ds_mla(p, [](const char*) { return true; });
    bound_cost();  // Dn, Dr may have grown
    if (p.dec_tokens > p.tq) p.dec_tokens = p.tq;
  }
  // kv heads (KH > 1: AITER's fused_qk_rope_cat_and_cache_mla), drawn last for the same reason:
  // a divisor of H in [2, 16] (not with layout fp8_ds_mla, whose record holds one head).
  if (r.chance(0.15) && p.opt.layout != cache_layout::fp8_ds_mla) {
    std::vector<int64_t> divisors;
    for (int64_t d = 2; d <= std::min<int64_t>(p.heads, 16); ++d)
      if (p.heads % d == 0) divisors.push_back(d);
    if (!divisors.empty()) p.kv_heads = divisors[r.below(divisors.size())];
  }
  // Zero-copy concat (q_nope already in q_out, as vLLM and SGLang call the op), drawn last for
  // the same reason: q_out then takes q's dtype.
  if (r.chance(0.15)) {
    p.zero_copy = true;
    p.q_out_dtype = p.in_dtype;
  }
  check_problem(p);
  return p;
}

problem coerce_aligned16(problem p) {
  auto round_up = [](int64_t v, int64_t m) { return (v + m - 1) / m * m; };
  auto round_down = [](int64_t v, int64_t m) { return v / m * m; };
  if (p.in_dtype != dtype::f16 && p.in_dtype != dtype::bf16)
    p.in_dtype = (p.seed & 1) ? dtype::bf16 : dtype::f16;
  p.q_out_dtype = p.in_dtype;
  p.kv_heads = 1;  // no fast path takes KH > 1 (launch_plan.h): one kv head
  if (!dtype_is_fp8(p.cache_dtype) && p.opt.layout != cache_layout::fp8_ds_mla) p.cache_dtype = p.in_dtype;
  p.opt.inplace_q = false;
  p.opt.inplace_k = false;
  p.dn = round_up(p.dn, 8);
  p.dr = round_up(p.dr, p.opt.style == rope_style::neox ? 16 : 8);
  p.row_pad_elems = round_down(p.row_pad_elems, 8);
  // (fp8_ds_mla: u8 elements, so 16 of them for 16-byte entries)
  const int64_t cache_align = p.opt.layout == cache_layout::fp8_ds_mla ? 16 : 8;
  p.entry_pad_elems = round_down(p.entry_pad_elems, cache_align);
  p.block_pad_elems = round_down(p.block_pad_elems, cache_align);
  p.table_pad_elems = round_down(p.table_pad_elems, 8);
  return parse_problem(p.to_repro());  // canonical and validated (throws arg_error naming the key)
}

}  // namespace ropekv
