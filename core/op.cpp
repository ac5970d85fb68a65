// Enum names (derived from the ROPEKV_ENUM lists) and sizes_of. See core/op.h.
#include "core/op.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/problem.h"

namespace ropekv {
namespace {

// Splits an enum_names list ("gptj, neox") into its names. The list comes from the
// preprocessor's stringisation of __VA_ARGS__, which separates names by ", ".
std::vector<std::string_view> split_enum_list(std::string_view list) {
  std::vector<std::string_view> names;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string_view::npos) comma = list.size();
    std::string_view name = list.substr(start, comma - start);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    names.push_back(name);
    start = comma + 1;
  }
  return names;
}

template <typename E>
const std::vector<std::string_view>& names_of() {
  static const std::vector<std::string_view> names = split_enum_list(enum_names<E>::list);
  return names;
}

template <typename E>
std::string joined_names() {
  std::string out;
  for (std::string_view n : names_of<E>()) {
    if (!out.empty()) out += '|';
    out += n;
  }
  return out;
}

}  // namespace

template <typename E>
std::string_view to_string(E v) {
  const auto& names = names_of<E>();
  const size_t index = static_cast<size_t>(v);
  if (index >= names.size()) {
    throw error("to_string: enum value " + std::to_string(index) + " out of range for {" +
                std::string(enum_names<E>::list) + "}");
  }
  return names[index];
}

template <typename E>
E parse_enum(std::string_view text, const char* arg_name) {
  const auto& names = names_of<E>();
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == text) return static_cast<E>(i);
  }
  throw arg_error(arg_name, joined_names<E>(), "'" + std::string(text) + "'");
}

#define ROPEKV_INSTANTIATE_ENUM(E)                     \
  template std::string_view to_string<E>(E);           \
  template E parse_enum<E>(std::string_view, const char*);

ROPEKV_INSTANTIATE_ENUM(rope_style)
ROPEKV_INSTANTIATE_ENUM(table_kind)
ROPEKV_INSTANTIATE_ENUM(cache_layout)
ROPEKV_INSTANTIATE_ENUM(row_order)
ROPEKV_INSTANTIATE_ENUM(scale_conv)
ROPEKV_INSTANTIATE_ENUM(pad_q)
ROPEKV_INSTANTIATE_ENUM(pos_oob)
ROPEKV_INSTANTIATE_ENUM(ds_scale)
ROPEKV_INSTANTIATE_ENUM(pad_at)
ROPEKV_INSTANTIATE_ENUM(pos_mode)
ROPEKV_INSTANTIATE_ENUM(q_storage)
ROPEKV_INSTANTIATE_ENUM(kv_storage)
ROPEKV_INSTANTIATE_ENUM(scale_storage)
#undef ROPEKV_INSTANTIATE_ENUM

op_sizes sizes_of(const op_args& args) {
  // Reads each size from the tensor that defines it (core/SPEC.md notation); a size whose
  // tensor is absent or of the wrong rank reads as 0. After validate() they are consistent.
  auto dim = [](const tensor_view& v, int d) -> int64_t {
    return (v.present() && v.rank > d) ? v.shape[d] : 0;
  };
  op_sizes s{};
  s.tq = dim(args.q_nope, 0);
  s.heads = dim(args.q_nope, 1);
  s.dn = dim(args.q_nope, 2);
  s.dr = dim(args.q_pe, 2);
  s.tk = dim(args.kv_c, 0);
  s.ts = dim(args.slot_mapping, 0);
  s.table_rows = args.cos_sin.present() ? dim(args.cos_sin, 0) : dim(args.cos, 0);
  const tensor_view& cache = args.cache.present() ? args.cache : args.ckv_cache;
  s.num_blocks = dim(cache, 0);
  s.block_size = dim(cache, cache.present() ? cache_entry_dim(cache) : 1);
  s.kv_heads = kv_head_count(args.kv_c);
  return s;
}

std::array<std::pair<const char*, const tensor_view*>, op_tensor_count> named_tensors(const op_args& a) {
  return {{{"q_nope", &a.q_nope},
           {"q_pe", &a.q_pe},
           {"kv_c", &a.kv_c},
           {"k_pe", &a.k_pe},
           {"positions", &a.positions},
           {"slot_mapping", &a.slot_mapping},
           {"cos_sin", &a.cos_sin},
           {"cos", &a.cos},
           {"sin", &a.sin},
           {"q_out", &a.q_out},
           {"cache", &a.cache},
           {"ckv_cache", &a.ckv_cache},
           {"kpe_cache", &a.kpe_cache},
           {"k_scale", &a.k_scale_tensor},
           {"q_scale", &a.q_scale_tensor},
           {"decode_q_pe_out", &a.decode_q_pe_out},
           {"k_pe_out", &a.k_pe_out},
           {"q_nope_zeros_out", &a.q_nope_zeros_out}}};
}

namespace {
float scale_of(const tensor_view& t, float value, const char* name) {
  if (!t.present()) return value;
  if (t.on_device)
    throw arg_error(name, "a tensor in host memory (a host-side computation reads it)", "device memory");
  if (t.type != dtype::f32 || t.rank != 1 || t.shape[0] != 1 || t.data == nullptr)
    throw arg_error(name, "an f32 tensor [1]", "another tensor");
  float v;
  std::memcpy(&v, t.data, sizeof v);
  return v;
}
}  // namespace

float k_scale_of(const op_args& args) { return scale_of(args.k_scale_tensor, args.k_scale, "k_scale"); }
float q_scale_of(const op_args& args) { return scale_of(args.q_scale_tensor, args.q_scale, "q_scale"); }

}  // namespace ropekv
