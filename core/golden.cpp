// Golden files: a minimal safetensors writer/reader and an .npy writer (docs/golden-format.md).
// Byte order: ropekv runs on little-endian hosts only (x86-64, AArch64); tensor bytes are written
// as they are in memory, which is what both formats ask for ('<' / little-endian).
#include "core/golden.h"

#include "core/file_io.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <unistd.h>

#include "core/error.h"
#include "core/memory_budget.h"
#include "core/validate.h"

#ifndef ROPEKV_VERSION
#define ROPEKV_VERSION "unknown"
#endif
#ifndef ROPEKV_GIT_COMMIT
#define ROPEKV_GIT_COMMIT "unknown"
#endif

namespace ropekv {

namespace {

using json = nlohmann::json;

constexpr uint64_t max_header_bytes = 100'000'000;  // the safetensors limit
constexpr size_t max_rank_in_file = 8;

// --- strided views <-> contiguous bytes -------------------------------------------------------

std::vector<int64_t> shape_of(const tensor_view& v) {
  return std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.rank);
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Calls f(element offset in the view, flat logical index) for every element, row-major.
template <typename F>
void for_each_element(const tensor_view& v, F&& f) {
  if (v.rank < 1 || v.rank > 4) throw error(fmt::format("golden: unsupported view rank {}", v.rank));
  const int64_t d0 = v.shape[0];
  const int64_t d1 = v.rank >= 2 ? v.shape[1] : 1;
  const int64_t d2 = v.rank >= 3 ? v.shape[2] : 1;
  const int64_t d3 = v.rank >= 4 ? v.shape[3] : 1;
  const int64_t s0 = v.strides_elems[0];
  const int64_t s1 = v.rank >= 2 ? v.strides_elems[1] : 0;
  const int64_t s2 = v.rank >= 3 ? v.strides_elems[2] : 0;
  const int64_t s3 = v.rank >= 4 ? v.strides_elems[3] : 0;
  int64_t flat = 0;
  for (int64_t i = 0; i < d0; ++i)
    for (int64_t j = 0; j < d1; ++j)
      for (int64_t k = 0; k < d2; ++k)
        for (int64_t l = 0; l < d3; ++l) f(i * s0 + j * s1 + k * s2 + l * s3, flat++);
}

golden_tensor gather(const tensor_view& v) {
  golden_tensor t;
  t.type = v.type;
  t.shape = shape_of(v);
  const size_t esz = dtype_size_bytes(v.type);
  t.bytes.resize(static_cast<size_t>(numel_of(t.shape)) * esz);
  const uint8_t* base = static_cast<const uint8_t*>(v.data);
  for_each_element(v, [&](int64_t off, int64_t flat) {
    std::memcpy(t.bytes.data() + static_cast<size_t>(flat) * esz,
                base + off * static_cast<int64_t>(esz), esz);
  });
  return t;
}

void scatter(const golden_tensor& t, const tensor_view& v, const std::string& name) {
  if (t.type != v.type || t.shape != shape_of(v))
    throw error(fmt::format("golden: tensor '{}' does not fit its view", name));
  const size_t esz = dtype_size_bytes(v.type);
  uint8_t* base = static_cast<uint8_t*>(v.data);
  for_each_element(v, [&](int64_t off, int64_t flat) {
    std::memcpy(base + off * static_cast<int64_t>(esz),
                t.bytes.data() + static_cast<size_t>(flat) * esz, esz);
  });
}

// The view of `args` that a golden tensor name refers to ("q_out.initial" -> q_out).
const tensor_view& view_named(const op_args& a, const std::string& name) {
  const std::string base = name.substr(0, name.find('.'));
  for (const auto& [n, view] : named_tensors(a))
    if (base == n) return *view;
  throw error(fmt::format("golden: no view for tensor '{}'", name));
}

bool is_expected(const std::string& name) {
  const std::string suffix = ".expected";
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_initial(const std::string& name) {
  const std::string suffix = ".initial";
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string dtypes_json(const golden_file& f) {
  json d = json::object();
  for (const auto& [name, t] : f.tensors) d[name] = dtype_name(t.type);
  return d.dump();
}

// What a file of format version 2 stores for a golden_file: the tensors in file order (views of
// f's tensors, or parts made for the file), the `derived` recipes of the rest, and every name's
// dtype (the `dtypes` metadata: derived tensors and parts included).
struct stored_form {
  std::vector<std::pair<std::string, const golden_tensor*>> tensors;
  std::map<std::string, golden_tensor> parts;  // owned: e.g. q_out.expected.rope
  json derived = json::object();
  json dtypes = json::object();
};

// A tensor whose bytes are all one value: that byte, else -1.
int uniform_byte(const golden_tensor& t) {
  if (t.bytes.empty()) return -1;
  const uint8_t b = t.bytes[0];
  for (uint8_t v : t.bytes)
    if (v != b) return -1;
  return b;
}

// True when every [Dn] row at the start of q_out's [Dn + Dr] rows holds q_nope's bytes.
bool nope_columns_are(const golden_tensor& q_out, const golden_tensor& q_nope) {
  if (q_out.type != q_nope.type || q_out.shape.size() != 3 || q_nope.shape.size() != 3 ||
      q_out.shape[0] != q_nope.shape[0] || q_out.shape[1] != q_nope.shape[1] || q_out.shape[2] < q_nope.shape[2])
    return false;
  const size_t esz = dtype_size_bytes(q_out.type);
  const size_t rows = static_cast<size_t>(q_out.shape[0] * q_out.shape[1]);
  const size_t out_row = static_cast<size_t>(q_out.shape[2]) * esz, nope_row = static_cast<size_t>(q_nope.shape[2]) * esz;
  for (size_t r = 0; r < rows; ++r)
    if (std::memcmp(q_out.bytes.data() + r * out_row, q_nope.bytes.data() + r * nope_row, nope_row) != 0) return false;
  return true;
}

// The columns [begin, begin + width) of every row of a tensor (last dimension).
golden_tensor last_columns(const golden_tensor& t, int64_t begin, int64_t width) {
  golden_tensor part;
  part.type = t.type;
  part.shape = t.shape;
  part.shape.back() = width;
  const size_t esz = dtype_size_bytes(t.type);
  const size_t rows = static_cast<size_t>(numel_of(t.shape) / std::max<int64_t>(t.shape.back(), 1));
  const size_t row = static_cast<size_t>(t.shape.back()) * esz, w = static_cast<size_t>(width) * esz;
  part.bytes.resize(rows * w);
  for (size_t r = 0; r < rows; ++r)
    std::memcpy(part.bytes.data() + r * w, t.bytes.data() + r * row + static_cast<size_t>(begin) * esz, w);
  return part;
}

stored_form stored_form_of(const golden_file& f, const golden_write_options& opt) {
  stored_form s;
  for (const golden_tensor_spec& spec : golden_tensor_specs(f.prob)) {
    auto it = f.tensors.find(spec.name);
    if (it == f.tensors.end()) throw arg_error("golden tensors", "tensor " + spec.name, "none");
    const golden_tensor& t = it->second;
    s.dtypes[spec.name] = dtype_name(t.type);
    if (!opt.store_all && is_initial(spec.name)) {
      const int b = uniform_byte(t);
      if (b >= 0) {  // the poison make_case fills outputs with
        s.derived[spec.name] = {{"fill_byte", b}, {"shape", t.shape}};
        continue;
      }
    }
    if (!opt.store_all && spec.name == "q_out.expected" && nope_columns_are(t, f.tensors.at("q_nope"))) {
      // q_out in the input dtype, every row computed: its nope columns are q_nope's bytes
      const std::string part = "q_out.expected.rope";
      const int64_t dn = f.tensors.at("q_nope").shape[2];
      s.parts[part] = last_columns(t, dn, t.shape[2] - dn);
      s.tensors.emplace_back(part, &s.parts[part]);
      s.dtypes[part] = dtype_name(t.type);
      s.derived[spec.name] = {{"concat_last", {"q_nope", part}}, {"shape", t.shape}};
      continue;
    }
    s.tensors.emplace_back(spec.name, &t);
  }
  return s;
}

// The metadata a file carries for `f` stored as `s`.
json file_metadata(const golden_file& f, const stored_form& s) {
  json meta = json::object();
  for (const auto& [k, v] : f.metadata) meta[k] = v;
  meta["format_version"] = std::to_string(golden_format_version);
  meta["repro"] = f.prob.to_repro();
  meta["dtypes"] = s.dtypes.dump();
  meta["derived"] = s.derived.dump();
  return meta;
}

[[noreturn]] void file_error(const std::string& path, const std::string& what,
                             const std::string& expected, const std::string& got) {
  throw arg_error(what.empty() ? path : path + ": " + what, expected, got);
}

// Writes `head` then the byte chunks atomically (core/file_io.h): a reader never sees half a file.
void write_file(const std::string& path, const std::string& head,
                const std::vector<const std::vector<uint8_t>*>& chunks) {
  std::vector<std::string_view> parts{head};
  for (const std::vector<uint8_t>* c : chunks)
    parts.emplace_back(reinterpret_cast<const char*>(c->data()), c->size());
  write_file_atomic(path, parts, "");
}

std::string le_u64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

const char* npy_descr(dtype t) {
  switch (t) {
    case dtype::f32: return "<f4";
    case dtype::f16: return "<f2";
    case dtype::bf16: return "<u2";
    case dtype::fp8_e4m3fn:
    case dtype::fp8_e4m3fnuz:
    case dtype::fp8_e5m2:
    case dtype::fp8_e5m2fnuz:
    case dtype::u8: return "|u1";
    case dtype::i32: return "<i4";
    case dtype::i64: return "<i8";
    default: throw error(fmt::format("npy_descr: invalid dtype value {}", static_cast<int>(t)));
  }
}

}  // namespace

int64_t golden_tensor::numel() const { return numel_of(shape); }

const char* safetensors_dtype_name(dtype t) {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::fp8_e4m3fn: return "F8_E4M3";
    case dtype::fp8_e5m2: return "F8_E5M2";
    case dtype::fp8_e4m3fnuz: return "F8_E4M3FNUZ";
    case dtype::fp8_e5m2fnuz: return "F8_E5M2FNUZ";
    case dtype::u8: return "U8";
    case dtype::i32: return "I32";
    case dtype::i64: return "I64";
    default:
      throw error(fmt::format("safetensors_dtype_name: invalid dtype value {}", static_cast<int>(t)));
  }
}

std::vector<golden_tensor_spec> golden_tensor_specs(const problem& p) {
  std::vector<golden_tensor_spec> s;
  const int64_t w = p.dn + p.dr;
  s.push_back({"q_nope", p.in_dtype, {p.tq, p.heads, p.dn}});
  s.push_back({"q_pe", p.in_dtype, {p.tq, p.heads, p.dr}});
  // kv heads: kh = 1 keeps the rank-2 k rows and rank-3 caches; kh > 1 adds the head dimension
  const int64_t kh = p.kv_heads;
  auto k_rows = [&](int64_t width) {
    return kh == 1 ? std::vector<int64_t>{p.tk, width} : std::vector<int64_t>{p.tk, kh, width};
  };
  auto cache_shape = [&](int64_t width) {
    return kh == 1 ? std::vector<int64_t>{p.num_blocks, p.block_size, width}
                   : std::vector<int64_t>{p.num_blocks, kh, p.block_size, width};
  };
  s.push_back({"kv_c", p.in_dtype, k_rows(p.dn)});
  s.push_back({"k_pe", p.in_dtype, k_rows(p.dr)});
  s.push_back({"positions", p.pos_dtype, {p.tk}});
  s.push_back({"slot_mapping", p.slot_dtype, {p.ts}});
  if (p.table == table_kind::one) {
    s.push_back({"cos_sin", p.table_dtype, {p.table_rows, p.dr}});
  } else {
    s.push_back({"cos", p.table_dtype, {p.table_rows, p.dr / 2}});
    s.push_back({"sin", p.table_dtype, {p.table_rows, p.dr / 2}});
  }
  if (p.scales == scale_storage::tensor) {
    s.push_back({"k_scale", dtype::f32, {1}});
    s.push_back({"q_scale", dtype::f32, {1}});
  }
  for (const char* when : {".initial", ".expected"}) {
    s.push_back({std::string("q_out") + when, p.q_out_dtype, {p.tq, p.heads, w}});
    if (single_cache_tensor(p.opt.layout)) {
      s.push_back({std::string("cache") + when, p.cache_dtype, cache_shape(cache_row_elems(p.opt.layout, p.dn, p.dr))});
    } else {
      s.push_back({std::string("ckv_cache") + when, p.cache_dtype, cache_shape(p.dn)});
      s.push_back({std::string("kpe_cache") + when, p.cache_dtype, cache_shape(p.dr)});
    }
    // decode outputs (core/SPEC.md "Decode outputs"), those the repro's dec_out passes
    if (p.dec_q_pe) s.push_back({std::string("decode_q_pe_out") + when, p.in_dtype, {p.dec_tokens, p.heads, p.dr}});
    if (p.dec_k_pe) s.push_back({std::string("k_pe_out") + when, p.in_dtype, k_rows(p.dr)});
    if (p.dec_zeros) s.push_back({std::string("q_nope_zeros_out") + when, p.in_dtype, {p.dec_tokens, p.heads, p.dn}});
  }
  if (p.opt.inplace_q) s.push_back({"q_pe.expected", p.in_dtype, {p.tq, p.heads, p.dr}});
  if (p.opt.inplace_k) s.push_back({"k_pe.expected", p.in_dtype, k_rows(p.dr)});
  return s;
}

golden_file make_golden(const case_data& before, const case_data& after) {
  if (before.prob != after.prob)
    throw arg_error("after", "the same problem as before", after.prob.to_repro());
  golden_file f;
  f.prob = before.prob;
  for (const golden_tensor_spec& spec : golden_tensor_specs(f.prob)) {
    const op_args& a = is_expected(spec.name) ? after.args : before.args;
    f.tensors[spec.name] = gather(view_named(a, spec.name));
  }
  f.metadata["format"] = "ropekv-golden";
  f.metadata["contract_version"] = std::to_string(contract_version);
  f.metadata["ropekv_version"] = ROPEKV_VERSION;
  f.metadata["ropekv_commit"] = ROPEKV_GIT_COMMIT;
  f.metadata["repro"] = f.prob.to_repro();
  f.metadata["dtypes"] = dtypes_json(f);
  return f;
}

namespace {

// A tensor the streaming writer stores: a view of a case, whole or from column `begin` of its last
// dimension on (q_out.expected.rope).
struct view_tensor {
  std::string name;
  tensor_view view;
  int64_t begin = 0;
  std::vector<int64_t> shape() const {
    std::vector<int64_t> s = shape_of(view);
    if (!s.empty()) s.back() -= begin;
    return s;
  }
  uint64_t size_bytes() const {
    return static_cast<uint64_t>(numel_of(shape())) * dtype_size_bytes(view.type);
  }
};

// The one byte every element of a view holds, else -1 (an empty view: -1, stored).
int uniform_byte_of(const tensor_view& v) {
  if (v.numel() == 0) return -1;
  const size_t esz = dtype_size_bytes(v.type);
  const auto* base = static_cast<const uint8_t*>(v.data);
  const int b = base[0];
  bool same = true;
  for_each_element(v, [&](int64_t off, int64_t) {
    const uint8_t* p = base + off * static_cast<int64_t>(esz);
    for (size_t i = 0; i < esz && same; ++i) same = p[i] == b;
  });
  return same ? b : -1;
}

// nope_columns_are on the views themselves (no gathered copies).
bool nope_columns_are(const tensor_view& q_out, const tensor_view& q_nope) {
  if (q_out.type != q_nope.type || q_out.rank != 3 || q_nope.rank != 3 || q_out.shape[0] != q_nope.shape[0] ||
      q_out.shape[1] != q_nope.shape[1] || q_out.shape[2] < q_nope.shape[2])
    return false;
  const int64_t esz = static_cast<int64_t>(dtype_size_bytes(q_out.type));
  const auto* o = static_cast<const uint8_t*>(q_out.data);
  const auto* n = static_cast<const uint8_t*>(q_nope.data);
  for (int64_t t = 0; t < q_out.shape[0]; ++t)
    for (int64_t h = 0; h < q_out.shape[1]; ++h)
      for (int64_t d = 0; d < q_nope.shape[2]; ++d)
        if (std::memcmp(o + (t * q_out.strides_elems[0] + h * q_out.strides_elems[1] + d * q_out.strides_elems[2]) * esz,
                        n + (t * q_nope.strides_elems[0] + h * q_nope.strides_elems[1] + d * q_nope.strides_elems[2]) * esz,
                        static_cast<size_t>(esz)) != 0)
          return false;
  return true;
}

// The logical, row-major bytes of t, handed to `sink` in pieces of about 4 MiB.
void stream_view(const view_tensor& t, const chunk_sink& sink) {
  constexpr size_t piece = size_t{4} << 20;
  const size_t esz = dtype_size_bytes(t.view.type);
  const int64_t width = t.view.rank > 0 ? t.view.shape[t.view.rank - 1] : 1;
  const auto* base = static_cast<const uint8_t*>(t.view.data);
  std::string buf;
  buf.reserve(piece + esz);
  if (t.view.numel() == 0) return;
  for_each_element(t.view, [&](int64_t off, int64_t flat) {
    if (t.begin > 0 && flat % width < t.begin) return;
    buf.append(reinterpret_cast<const char*>(base + off * static_cast<int64_t>(esz)), esz);
    if (buf.size() >= piece) {
      sink(buf);
      buf.clear();
    }
  });
  if (!buf.empty()) sink(buf);
}

}  // namespace

void write_golden(const std::string& path, const case_data& before, const case_data& after,
                  const golden_write_options& opt) {
  // Streamed from the cases' views: the file's tensors are never gathered in memory (the same
  // bytes as write_golden(path, make_golden(before, after), opt)).
  if (before.prob != after.prob)
    throw arg_error("after", "the same problem as before", after.prob.to_repro());
  golden_file f;  // metadata only
  f.prob = before.prob;
  f.metadata["format"] = "ropekv-golden";
  f.metadata["contract_version"] = std::to_string(contract_version);
  f.metadata["ropekv_version"] = ROPEKV_VERSION;
  f.metadata["ropekv_commit"] = ROPEKV_GIT_COMMIT;
  f.metadata["repro"] = f.prob.to_repro();
  stored_form s;
  std::vector<view_tensor> stored;
  for (const golden_tensor_spec& spec : golden_tensor_specs(f.prob)) {
    const tensor_view& v = view_named(is_expected(spec.name) ? after.args : before.args, spec.name);
    s.dtypes[spec.name] = dtype_name(spec.type);
    if (!opt.store_all && is_initial(spec.name)) {
      const int b = uniform_byte_of(v);
      if (b >= 0) {
        s.derived[spec.name] = {{"fill_byte", b}, {"shape", spec.shape}};
        continue;
      }
    }
    if (!opt.store_all && spec.name == "q_out.expected" && nope_columns_are(v, before.args.q_nope)) {
      const std::string part = "q_out.expected.rope";
      stored.push_back({part, v, before.args.q_nope.shape[2]});
      s.dtypes[part] = dtype_name(spec.type);
      s.derived[spec.name] = {{"concat_last", {"q_nope", part}}, {"shape", spec.shape}};
      continue;
    }
    stored.push_back({spec.name, v, 0});
  }
  json header = json::object();
  uint64_t offset = 0;
  for (const view_tensor& t : stored) {
    header[t.name] = {{"dtype", safetensors_dtype_name(t.view.type)},
                      {"shape", t.shape()},
                      {"data_offsets", {offset, offset + t.size_bytes()}}};
    offset += t.size_bytes();
  }
  header["__metadata__"] = file_metadata(f, s);
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';  // data starts 8-byte aligned
  const std::string head = le_u64(text.size()) + text;
  write_file_atomic_stream(
      path,
      [&](const chunk_sink& sink) {
        sink(head);
        for (const view_tensor& t : stored) stream_view(t, sink);
      },
      "");
}

void write_golden(const std::string& path, const golden_file& f, const golden_write_options& opt) {
  const stored_form s = stored_form_of(f, opt);
  json header = json::object();
  std::vector<const std::vector<uint8_t>*> chunks;
  uint64_t offset = 0;
  for (const auto& [name, t] : s.tensors) {
    header[name] = {{"dtype", safetensors_dtype_name(t->type)},
                    {"shape", t->shape},
                    {"data_offsets", {offset, offset + t->bytes.size()}}};
    offset += t->bytes.size();
    chunks.push_back(&t->bytes);
  }
  header["__metadata__"] = file_metadata(f, s);
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';  // data starts 8-byte aligned
  write_file(path, le_u64(text.size()) + text, chunks);
}

namespace {
void write_npy_files(const std::string& dir, const golden_file& f, const stored_form& s);
}  // namespace

void write_golden_npy(const std::string& dir, const case_data& before, const case_data& after,
                      const golden_write_options& opt) {
  const golden_file f = make_golden(before, after);
  const stored_form s = stored_form_of(f, opt);
  // Every file goes into a new folder beside `dir`, which then replaces `dir` whole
  // (install_folder): no stale file of an earlier case, no symlink followed, no half a case.
  const std::string final_dir = dir;
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(dir).lexically_normal().parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) file_error(parent.string(), "", "a folder that can be created", ec.message());
  const std::string tmp_dir = std::filesystem::path(dir).lexically_normal().string() + ".tmp." +
                              std::to_string(::getpid());
  std::filesystem::remove_all(tmp_dir, ec);
  if (!std::filesystem::create_directory(tmp_dir, ec) || ec)
    file_error(tmp_dir, "", "a folder that can be created", ec ? ec.message() : "it exists");
  try {
    write_npy_files(tmp_dir, f, s);
  } catch (...) {
    std::filesystem::remove_all(tmp_dir, ec);
    throw;
  }
  install_folder(tmp_dir, final_dir, "");
}

namespace {

void write_npy_files(const std::string& dir, const golden_file& f, const stored_form& s) {
  json tensors = json::object();
  for (const auto& [name, t] : s.tensors) {
    std::string shape = "(";
    for (size_t i = 0; i < t->shape.size(); ++i) shape += fmt::format("{}, ", t->shape[i]);
    if (t->shape.size() > 1) shape.resize(shape.size() - 2);
    else if (t->shape.size() == 1) shape.resize(shape.size() - 1);  // "(n,)"
    shape += ")";
    std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                   npy_descr(t->type), shape);
    // magic (6) + version (2) + header length (2) + dict + padding + '\n' == multiple of 64
    size_t total = 10 + dict.size() + 1;
    dict.append((64 - total % 64) % 64, ' ');
    dict += '\n';
    std::string head = std::string("\x93NUMPY\x01\x00", 8);
    head += static_cast<char>(dict.size() & 0xff);
    head += static_cast<char>((dict.size() >> 8) & 0xff);
    head += dict;
    const std::string file = name + ".npy";
    write_file(dir + "/" + file, head, {&t->bytes});
    tensors[name] = {{"file", file}, {"dtype", dtype_name(t->type)}, {"npy_dtype", npy_descr(t->type)},
                     {"shape", t->shape}};
  }
  json meta = file_metadata(f, s);
  meta["dtypes"] = s.dtypes;    // objects here, not strings
  meta["derived"] = s.derived;
  meta["tensors"] = tensors;
  write_file(dir + "/meta.json", meta.dump(2) + "\n", {});
}

}  // namespace

namespace {

// Bytes per element of every safetensors dtype (0: sub-byte or unknown; such a tensor can be
// listed and ignored, never matched).
int64_t safetensors_elem_size(const std::string& d) {
  static const std::map<std::string, int64_t> sizes = {
      {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E4M3FNUZ", 1},
      {"F8_E5M2FNUZ", 1}, {"F8_E8M0", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2}, {"BF16", 2},
      {"I32", 4}, {"U32", 4}, {"F32", 4}, {"I64", 8}, {"U64", 8}, {"F64", 8}, {"C64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

// numel of a shape read from a file, bounded (2^40 elements) so that byte counts cannot overflow.
uint64_t checked_numel(const std::vector<int64_t>& shape, const std::string& path, const std::string& where,
                       const std::string& text) {
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) file_error(path, where, "non-negative integers", text);
    const uint64_t v = static_cast<uint64_t>(d);
    if (v > (uint64_t{1} << 40) || (v != 0 && numel > (uint64_t{1} << 40) / v))
      file_error(path, where, "a tensor of at most 2^40 elements", text);
    numel *= v;
  }
  return numel;
}

// The header's JSON, parsed strictly: a key repeated in one object is an error (the JSON library
// keeps the last one silently), as is anything but spaces after the closing brace (the format pads
// with spaces; a NUL-padded header is not one a writer made).
json parse_header_strictly(const std::string& text, const std::string& path) {
  const size_t close = text.find_last_not_of(' ');
  if (close == std::string::npos || text[close] != '}' || text.find('\0') != std::string::npos)
    file_error(path, "header", "a JSON object padded with spaces only", "other bytes (e.g. NUL padding)");
  std::vector<std::set<std::string>> keys;
  std::string repeated;
  json::parser_callback_t cb = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    else if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    else if (event == json::parse_event_t::key && !keys.empty() && parsed.is_string() &&
             !keys.back().insert(parsed.get<std::string>()).second && repeated.empty())
      repeated = parsed.get<std::string>();
    return true;
  };
  json header = json::parse(text, cb, /*allow_exceptions=*/false);
  if (header.is_discarded()) file_error(path, "header", "valid JSON", "unparseable text");
  if (!repeated.empty()) file_error(path, "header", "each key once per object", "'" + repeated + "' twice");
  return header;
}

tensor_file read_safetensors(const std::string& path) {
  // Header first: its length is checked against the file's size before anything else is read,
  // and the data is read tensor by tensor, so a huge, sparse or endless file costs nothing.
  const input_file in(path);
  const uint64_t size = in.size();
  if (size < 8)
    file_error(path, "size", "at least 8 bytes (the safetensors header length)", fmt::format("{} bytes", size));
  uint8_t len_bytes[8];
  in.read_at(0, len_bytes, 8, "header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > size - 8 || header_len > max_header_bytes || header_len < 2)
    file_error(path, "header length", fmt::format("2 .. {} (file size {} - 8)",
                                                  std::min<uint64_t>(size - 8, max_header_bytes), size),
               std::to_string(header_len));
  std::string header_text(static_cast<size_t>(header_len), ' ');
  in.read_at(8, header_text.data(), header_len, "header");
  const uint64_t data_at = 8 + header_len;
  const uint64_t data_size = size - data_at;
  json header = parse_header_strictly(header_text, path);
  if (!header.is_object()) file_error(path, "header", "a JSON object", header.type_name());

  tensor_file tf;
  tf.path = path;
  auto meta_it = header.find("__metadata__");
  if (meta_it != header.end() && !meta_it->is_null()) {
    if (!meta_it->is_object()) file_error(path, "__metadata__", "an object of strings", meta_it->type_name());
    for (auto it = meta_it->begin(); it != meta_it->end(); ++it) {
      if (!it->is_string()) file_error(path, "__metadata__." + it.key(), "a string", it->type_name());
      tf.metadata[it.key()] = it->get<std::string>();
    }
  }
  struct extent {
    uint64_t begin, end;
    std::string name;
    bool operator<(const extent& o) const { return std::tie(begin, end, name) < std::tie(o.begin, o.end, o.name); }
  };
  std::vector<extent> extents;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    const json& e = *it;
    const std::string where = "tensor " + name;
    if (!e.is_object()) file_error(path, where, "an object", e.type_name());
    auto dt = e.find("dtype");
    auto sh = e.find("shape");
    auto off = e.find("data_offsets");
    if (dt == e.end() || !dt->is_string()) file_error(path, where + " dtype", "a string", "something else");
    if (sh == e.end() || !sh->is_array() || sh->size() > max_rank_in_file)
      file_error(path, where + " shape", "an array of at most 8 integers", "something else");
    if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      file_error(path, where + " data_offsets", "[begin, end] (unsigned integers)", off == e.end() ? "none" : off->dump());
    file_tensor t;
    t.source = path;
    t.dtype = dt->get<std::string>();
    t.elem_size = safetensors_elem_size(t.dtype);
    for (const json& d : *sh) {
      if (!d.is_number_unsigned()) file_error(path, where + " shape", "non-negative integers", sh->dump());
      t.shape.push_back(d.get<uint64_t>() > (uint64_t{1} << 40) ? -1 : static_cast<int64_t>(d.get<uint64_t>()));
    }
    const uint64_t numel = checked_numel(t.shape, path, where + " shape", sh->dump());
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (begin > end || end > data_size)
      file_error(path, where + " data_offsets", fmt::format("0 <= begin <= end <= {} (data bytes)", data_size),
                 fmt::format("[{}, {}]", begin, end));
    (void)numel;  // the byte count is checked against the dtype the tensor is read as
    t.bytes.resize(static_cast<size_t>(end - begin));
    extents.push_back({begin, end, name});
    tf.tensors.emplace(name, std::move(t));
  }
  // The data is exactly the tensors, one after another: no overlap, no hole, no trailing bytes.
  std::sort(extents.begin(), extents.end());
  uint64_t covered = 0;
  for (const extent& e : extents) {
    if (e.begin == e.end) continue;
    if (e.begin != covered)
      file_error(path, "tensor " + e.name + " data_offsets",
                 fmt::format("to start at byte {} (tensors back to back, no overlap or hole)", covered),
                 fmt::format("[{}, {}]", e.begin, e.end));
    covered = e.end;
  }
  if (covered != data_size)
    file_error(path, "size", fmt::format("{} bytes (header and tensor data)", data_at + covered),
               fmt::format("{} bytes ({} trailing)", size, data_size - covered));
  for (const extent& e : extents)
    in.read_at(data_at + e.begin, tf.tensors.at(e.name).bytes.data(), e.end - e.begin, "tensor " + e.name);
  return tf;
}

// --- .npy ------------------------------------------------------------------------------------

// The header dict of an .npy file: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
struct npy_header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

npy_header parse_npy_header(const std::string& h, const std::string& path) {
  size_t i = 0;
  auto bad = [&](const std::string& expected) -> void {
    file_error(path, "header", expected, fmt::format("'{}' at offset {}", i < h.size() ? h.substr(i, 20) : "", i));
  };
  auto skip = [&] { while (i < h.size() && (h[i] == ' ' || h[i] == '\t' || h[i] == '\n')) ++i; };
  auto expect_char = [&](char c) {
    skip();
    if (i >= h.size() || h[i] != c) bad(std::string("'") + c + "'");
    ++i;
  };
  auto read_string = [&]() {
    skip();
    if (i >= h.size() || (h[i] != '\'' && h[i] != '"')) bad("a quoted string");
    const char q = h[i++];
    const size_t close = h.find(q, i);
    if (close == std::string::npos) bad("a closing quote");
    std::string s = h.substr(i, close - i);
    i = close + 1;
    return s;
  };
  npy_header r;
  bool have_descr = false, have_order = false, have_shape = false;
  expect_char('{');
  for (;;) {
    skip();
    if (i < h.size() && h[i] == '}') { ++i; break; }
    const std::string key = read_string();
    expect_char(':');
    skip();
    if (key == "descr") {
      if (i < h.size() && h[i] == '[') file_error(path, "descr", "a simple dtype (not a structured one)", "a list");
      r.descr = read_string();
      have_descr = true;
    } else if (key == "fortran_order") {
      if (h.compare(i, 4, "True") == 0) { r.fortran_order = true; i += 4; }
      else if (h.compare(i, 5, "False") == 0) { r.fortran_order = false; i += 5; }
      else bad("True or False");
      have_order = true;
    } else if (key == "shape") {
      expect_char('(');
      for (;;) {
        skip();
        if (i < h.size() && h[i] == ')') { ++i; break; }
        size_t j = i;
        while (j < h.size() && h[j] >= '0' && h[j] <= '9') ++j;
        if (j == i || j - i > 15) bad("a non-negative integer of at most 15 digits");
        r.shape.push_back(std::stoll(h.substr(i, j - i)));
        i = j;
        if (i < h.size() && h[i] == 'L') ++i;  // Python 2 longs
        if (r.shape.size() > max_rank_in_file) file_error(path, "shape", "at most 8 dimensions", "more");
        skip();
        if (i < h.size() && h[i] == ',') ++i;
        else if (i < h.size() && h[i] == ')') { ++i; break; }
        else bad("',' or ')'");
      }
      have_shape = true;
    } else {
      file_error(path, "header key", "descr, fortran_order or shape", "'" + key + "'");
    }
    skip();
    if (i < h.size() && h[i] == ',') { ++i; continue; }
    expect_char('}');
    break;
  }
  if (!have_descr || !have_order || !have_shape)
    file_error(path, "header", "the keys descr, fortran_order and shape", "'" + h + "'");
  return r;
}

// Bytes per element of an npy descr ropekv reads: '<f4' '<f2' '<f8' '<i1'..'<i8' '<u1'..'<u8'
// '|b1' and the void types '|V1' '<V2' (ml_dtypes' fp8 and bfloat16 as np.save writes them).
int64_t npy_elem_size(const std::string& descr, const std::string& path) {
  if (descr.size() < 3 || (descr[0] != '<' && descr[0] != '|' && descr[0] != '>' && descr[0] != '='))
    file_error(path, "descr", "a dtype like '<f4', '<u2', '|u1'", "'" + descr + "'");
  const char kind = descr[1];
  size_t used = 0;
  int64_t n = 0;
  try {
    n = std::stoll(descr.substr(2), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != descr.size() - 2 || std::string("fiubV").find(kind) == std::string::npos || n < 1 || n > 8)
    file_error(path, "descr", "a numeric dtype like '<f4', '<i8', '|u1', '<V2'", "'" + descr + "'");
  if (descr[0] == '>' && n > 1) file_error(path, "descr", "little-endian data ('<')", "'" + descr + "' (big-endian)");
  return n;
}

// '<u1', '|u1' and '=u1' are one dtype; multi-byte '=' is little-endian here.
std::string canonical_descr(const std::string& descr, int64_t size) {
  return std::string(1, size == 1 ? '|' : '<') + descr.substr(1);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

tensor_file read_npy_folder(const std::string& dir) {
  tensor_file tf;
  tf.path = dir;
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (ends_with(name, ".npy") && name.size() > 4) files.push_back(name);
  }
  if (ec) file_error(dir, "", "a readable folder", ec.message());
  const std::string meta_path = dir + "/meta.json";
  if (std::filesystem::exists(meta_path, ec)) {
    const std::string text = read_small_file(meta_path, max_header_bytes);
    json meta = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (meta.is_discarded()) file_error(meta_path, "", "a JSON object", "text that is not JSON");
    if (!meta.is_object()) file_error(meta_path, "", "a JSON object", std::string("a JSON ") + meta.type_name());
    for (auto it = meta.begin(); it != meta.end(); ++it) {
      if (it->is_string()) tf.metadata[it.key()] = it->get<std::string>();
      else if (it.key() == "dtypes" || it.key() == "derived") tf.metadata[it.key()] = it->dump();  // objects in meta.json
    }
  }
  if (files.empty() && tf.metadata.empty()) file_error(dir, "", "a golden file (.safetensors) or a folder of .npy files", "a directory without .npy files");
  for (const std::string& f : files)
    tf.tensors.emplace(f.substr(0, f.size() - 4), read_npy(dir + "/" + f));
  return tf;
}

}  // namespace

file_tensor read_npy(const std::string& path) {
  // Header first (magic, version, header length, dict), then the data size it implies against
  // the file's size, then the data: a huge or endless file is refused before it is read.
  const input_file in(path);
  const uint64_t size = in.size();
  uint8_t pre[12] = {};
  if (size >= 10) in.read_at(0, pre, std::min<uint64_t>(size, 12), "magic");
  if (size < 10 || std::memcmp(pre, "\x93NUMPY", 6) != 0)
    file_error(path, "magic", "an .npy file (\\x93NUMPY, 10+ bytes)",
               size < 10 ? fmt::format("{} bytes", size) : "other bytes");
  const int major = pre[6];
  uint64_t header_len = 0, header_at = 0;
  if (major == 1) {
    header_len = pre[8] | (uint64_t{pre[9]} << 8);
    header_at = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) file_error(path, "size", "at least 12 bytes (npy 2.0 header length)", fmt::format("{} bytes", size));
    header_len = pre[8] | (uint64_t{pre[9]} << 8) | (uint64_t{pre[10]} << 16) | (uint64_t{pre[11]} << 24);
    header_at = 12;
  } else {
    file_error(path, "version", "1.0, 2.0 or 3.0", fmt::format("{}.{}", major, static_cast<int>(pre[7])));
  }
  if (header_len > size - header_at)
    file_error(path, "header length", fmt::format("at most {} (file size {})", size - header_at, size),
               fmt::format("{} (truncated)", header_len));
  std::string header(static_cast<size_t>(header_len), ' ');
  in.read_at(header_at, header.data(), header_len, "header");
  const npy_header h = parse_npy_header(header, path);
  if (h.fortran_order)
    file_error(path, "fortran_order", "False (C order: save np.ascontiguousarray(x))", "True");
  file_tensor t;
  t.source = path;
  t.elem_size = npy_elem_size(h.descr, path);
  t.dtype = canonical_descr(h.descr, t.elem_size);
  t.shape = h.shape;
  std::string shape_text = json(h.shape).dump();
  const uint64_t numel = checked_numel(t.shape, path, "shape", shape_text);
  const uint64_t nbytes = numel * static_cast<uint64_t>(t.elem_size);
  const uint64_t have = size - header_at - header_len;
  if (have != nbytes)
    file_error(path, "data", fmt::format("{} bytes for shape {} of {}", nbytes, shape_text, t.dtype),
               fmt::format("{} bytes{}", have, have < nbytes ? " (truncated)" : ""));
  t.bytes.resize(static_cast<size_t>(nbytes));
  in.read_at(header_at + header_len, t.bytes.data(), nbytes, "data");
  return t;
}

tensor_file read_tensor_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return read_npy_folder(path);
  return read_safetensors(path);
}

bool file_dtype_fits(const std::string& d, dtype t) {
  if (d == dtype_name(t) || d == safetensors_dtype_name(t) || d == npy_descr(t)) return true;
  switch (t) {
    case dtype::f32: return d == "<f4";
    case dtype::f16: return d == "<f2";
    case dtype::bf16: return d == "<u2" || d == "<V2" || d == "<i2";
    case dtype::fp8_e4m3fn:
    case dtype::fp8_e4m3fnuz:
    case dtype::fp8_e5m2:
    case dtype::fp8_e5m2fnuz:
      return d == "U8" || d == "u8" || d == "|u1" || d == "|V1";
    case dtype::u8: return d == "|u1";
    case dtype::i32: return d == "<i4";
    case dtype::i64: return d == "<i8";
    default: return false;
  }
}

golden_tensor golden_tensor_from_file(const file_tensor& ft, const golden_tensor_spec& spec, const std::string& what) {
  if (!file_dtype_fits(ft.dtype, spec.type))
    throw arg_error(what + " dtype",
                    fmt::format("{} ({}, npy '{}')", dtype_name(spec.type), safetensors_dtype_name(spec.type),
                                npy_descr(spec.type)),
                    ft.dtype);
  if (ft.shape != spec.shape) throw arg_error(what + " shape", json(spec.shape).dump(), json(ft.shape).dump());
  golden_tensor t;
  t.type = spec.type;
  t.shape = ft.shape;
  t.bytes = ft.bytes;
  if (t.bytes.size() != static_cast<size_t>(t.numel()) * dtype_size_bytes(t.type))
    throw arg_error(what + " data", fmt::format("{} bytes for shape {}", t.numel() * static_cast<int64_t>(dtype_size_bytes(t.type)),
                                                json(t.shape).dump()),
                    fmt::format("{} bytes", t.bytes.size()));
  return t;
}

namespace {

// Rebuilds the derived tensor `spec` from its recipe (docs/golden-format.md "Derived tensors"):
// {"fill_byte": B, "shape": S} or {"concat_last": [stored, ...], "shape": S}. Every source of a
// concat is a stored tensor; the names used go to *parts.
golden_tensor derived_tensor(const std::string& path, const golden_tensor_spec& spec, const json& recipe,
                             const json& dtypes, const std::map<std::string, golden_tensor>& stored,
                             std::set<std::string>& parts, derived_recipe* defer = nullptr) {
  const std::string where = "__metadata__.derived." + spec.name;
  if (!recipe.is_object()) file_error(path, where, "an object (a recipe)", recipe.dump());
  auto dn = dtypes.find(spec.name);
  if (dn == dtypes.end() || !dn->is_string() || dn->get<std::string>() != dtype_name(spec.type))
    file_error(path, "__metadata__.dtypes." + spec.name, dtype_name(spec.type),
               dn == dtypes.end() ? std::string("none") : dn->dump());
  auto sh = recipe.find("shape");
  if (sh == recipe.end() || *sh != json(spec.shape))
    file_error(path, where + ".shape", json(spec.shape).dump() + " (the repro's)", sh == recipe.end() ? "none" : sh->dump());
  golden_tensor t;
  t.type = spec.type;
  t.shape = spec.shape;
  const size_t esz = dtype_size_bytes(t.type);
  auto fill = recipe.find("fill_byte");
  auto cat = recipe.find("concat_last");
  if (recipe.size() != 2 || (fill == recipe.end()) == (cat == recipe.end()))
    file_error(path, where, "{\"fill_byte\": B, \"shape\": S} or {\"concat_last\": [names], \"shape\": S}", recipe.dump());
  if (fill != recipe.end()) {
    if (!is_initial(spec.name))
      file_error(path, where + ".fill_byte", "a recipe of an *.initial tensor only", spec.name);
    if (!fill->is_number_unsigned() || fill->get<uint64_t>() > 255)
      file_error(path, where + ".fill_byte", "an integer 0..255", fill->dump());
    if (defer) {  // checked, left to be built in place
      defer->fill_byte = static_cast<int>(fill->get<uint64_t>());
      return t;
    }
    t.bytes.assign(static_cast<size_t>(t.numel()) * esz, static_cast<uint8_t>(fill->get<uint64_t>()));
    return t;
  }
  if (!cat->is_array() || cat->empty()) file_error(path, where + ".concat_last", "a list of stored tensor names", cat->dump());
  std::vector<const golden_tensor*> src;
  int64_t width = 0;
  for (const json& n : *cat) {
    auto it = n.is_string() ? stored.find(n.get<std::string>()) : stored.end();
    if (it == stored.end()) file_error(path, where + ".concat_last", "names of stored tensors", n.dump());
    const golden_tensor& p = it->second;
    if (p.type != t.type || p.shape.size() != t.shape.size() ||
        !std::equal(t.shape.begin(), t.shape.end() - 1, p.shape.begin()))
      file_error(path, where + ".concat_last " + it->first,
                 fmt::format("{} of shape {} except the last dimension", dtype_name(t.type), json(t.shape).dump()),
                 fmt::format("{} {}", dtype_name(p.type), json(p.shape).dump()));
    width += p.shape.back();
    src.push_back(&p);
    parts.insert(it->first);
  }
  if (width != t.shape.back())
    file_error(path, where + ".concat_last", fmt::format("last dimensions summing to {}", t.shape.back()), std::to_string(width));
  if (defer) {
    for (const json& n : *cat) defer->concat.push_back(n.get<std::string>());
    return t;
  }
  t.bytes.resize(static_cast<size_t>(t.numel()) * esz);
  const size_t rows = t.shape.back() == 0 ? 0 : static_cast<size_t>(t.numel() / t.shape.back());
  uint8_t* out = t.bytes.data();
  for (size_t r = 0; r < rows; ++r)
    for (const golden_tensor* p : src) {
      const size_t w = static_cast<size_t>(p->shape.back()) * esz;
      std::memcpy(out, p->bytes.data() + r * w, w);
      out += w;
    }
  return t;
}

}  // namespace

golden_file read_golden(const std::string& path) { return golden_from_tensor_file(read_tensor_file(path), false); }

golden_file golden_from_tensor_file(const tensor_file& tf) {
  tensor_file copy = tf;
  return golden_from_tensor_file(std::move(copy), false);
}

golden_file golden_from_tensor_file(tensor_file&& tf, bool defer_derived) {
  const std::string& path = tf.path;
  golden_file f;
  f.metadata = tf.metadata;
  if (f.metadata.empty()) file_error(path, "__metadata__", "an object of strings", "none");
  auto meta = [&](const char* key) -> const std::string& {
    auto it = f.metadata.find(key);
    if (it == f.metadata.end()) file_error(path, std::string("__metadata__.") + key, "present", "missing");
    return it->second;
  };
  if (meta("format") != "ropekv-golden")
    file_error(path, "__metadata__.format", "ropekv-golden", meta("format"));
  if (meta("contract_version") != std::to_string(contract_version))
    file_error(path, "__metadata__.contract_version", std::to_string(contract_version), meta("contract_version"));
  try {
    f.prob = parse_problem(meta("repro"));
  } catch (const arg_error& e) {
    file_error(path, "repro " + e.arg(), e.expected(), e.got());
  }
  int version = 1;  // files written before format_version existed
  if (auto v = f.metadata.find("format_version"); v != f.metadata.end()) {
    if (v->second == "1") version = 1;
    else if (v->second == "2") version = 2;
    else
      file_error(path, "__metadata__.format_version",
                 fmt::format("1 or 2 (the golden format versions this ropekv {} reads)", ROPEKV_VERSION), v->second);
  }
  json dtypes = json::parse(meta("dtypes"), nullptr, false);
  if (dtypes.is_discarded() || !dtypes.is_object())
    file_error(path, "__metadata__.dtypes", "a JSON object: tensor name -> dtype", meta("dtypes"));
  json derived = json::object();
  if (auto d = f.metadata.find("derived"); d != f.metadata.end()) {
    if (version < 2) file_error(path, "__metadata__.derived", "none in a format version 1 file", "present");
    derived = json::parse(d->second, nullptr, false);
    if (derived.is_discarded() || !derived.is_object())
      file_error(path, "__metadata__.derived", "a JSON object: tensor name -> recipe", d->second);
  }

  for (auto& [name, ft] : tf.tensors) {
    const std::string where = "tensor " + name;
    const std::string& src = ft.source.empty() ? path : ft.source;
    auto dn = dtypes.find(name);
    if (dn == dtypes.end() || !dn->is_string())
      file_error(path, "__metadata__.dtypes." + name, "the tensor's ropekv dtype", "none");
    golden_tensor t;
    try {
      t.type = parse_dtype(dn->get<std::string>(), "dtype");
    } catch (const arg_error& err) {
      file_error(path, "__metadata__.dtypes." + name, err.expected(), err.got());
    }
    // golden files name their dtype exactly; fnuz also as U8 (files written before safetensors
    // had the fnuz names)
    const bool fnuz = t.type == dtype::fp8_e4m3fnuz || t.type == dtype::fp8_e5m2fnuz;
    if (ft.dtype != safetensors_dtype_name(t.type) && ft.dtype != npy_descr(t.type) && !(fnuz && ft.dtype == "U8"))
      file_error(src, where + " dtype",
                 fmt::format("{} (for {})", src == path ? safetensors_dtype_name(t.type) : npy_descr(t.type),
                             dtype_name(t.type)),
                 ft.dtype);
    t.shape = ft.shape;
    if (ft.bytes.size() != static_cast<size_t>(t.numel()) * dtype_size_bytes(t.type))
      file_error(src, where + (src == path ? " data_offsets" : " data"),
                 fmt::format("{} bytes for shape {}", t.numel() * static_cast<int64_t>(dtype_size_bytes(t.type)),
                             json(t.shape).dump()),
                 fmt::format("{} bytes", ft.bytes.size()));
    t.bytes = std::move(ft.bytes);  // moved: the file's bytes are held once
    f.tensors.emplace(name, std::move(t));
  }

  // the tensors must be exactly those the repro implies, stored or derived
  std::set<std::string> wanted, parts;
  const std::vector<golden_tensor_spec> specs = golden_tensor_specs(f.prob);
  for (const golden_tensor_spec& spec : specs) wanted.insert(spec.name);
  for (auto it = derived.begin(); it != derived.end(); ++it) {
    if (!wanted.count(it.key()))
      file_error(path, "__metadata__.derived." + it.key(), "a tensor the repro implies", "an unknown name");
    if (f.tensors.count(it.key()))
      file_error(path, "tensor " + it.key(), "stored or derived, not both", "both");
  }
  // stored tensors are checked before any derived one is built: a recipe's size then follows
  // from stored bytes (a concat's sources; a fill is only for `X.initial`, whose `X.expected` is
  // stored or a concat), so a small file cannot make the reader allocate much
  for (const golden_tensor_spec& spec : specs) {
    auto it = f.tensors.find(spec.name);
    if (it == f.tensors.end()) {
      if (!derived.contains(spec.name))
        file_error(path, "tensor " + spec.name, "present or derived (the repro needs it)", "missing");
      continue;
    }
    if (it->second.type != spec.type)
      file_error(path, "tensor " + spec.name + " dtype", dtype_name(spec.type), dtype_name(it->second.type));
    if (it->second.shape != spec.shape)
      file_error(path, "tensor " + spec.name + " shape", json(spec.shape).dump(), json(it->second.shape).dump());
  }
  std::map<std::string, golden_tensor> rebuilt;  // from stored tensors only
  for (const golden_tensor_spec& spec : specs) {
    auto d = derived.find(spec.name);
    if (d == derived.end()) continue;
    if (defer_derived) {
      derived_recipe r;
      derived_tensor(path, spec, *d, dtypes, f.tensors, parts, &r);
      f.deferred[spec.name] = r;
    } else {
      rebuilt[spec.name] = derived_tensor(path, spec, *d, dtypes, f.tensors, parts);
    }
  }
  for (const auto& [name, t] : f.tensors)
    if (!wanted.count(name) && !parts.count(name))
      file_error(path, "tensor " + name, "only tensors the repro implies (or parts of a derived one)", "an extra tensor");
  if (!defer_derived)  // deferred: the parts stay until load_golden_case has built the tensor
    for (const std::string& part : parts)
      if (!wanted.count(part)) f.tensors.erase(part);  // q_out.expected.rope: only a piece of q_out.expected
  f.tensors.merge(rebuilt);
  return f;
}

std::vector<golden_tensor_spec> golden_output_specs(const problem& p) {
  std::vector<golden_tensor_spec> out;
  for (golden_tensor_spec s : golden_tensor_specs(p))
    if (is_expected(s.name)) {
      s.name = s.name.substr(0, s.name.find('.'));
      out.push_back(s);
    }
  return out;
}

std::vector<golden_tensor_spec> golden_input_specs(const problem& p) {
  std::vector<golden_tensor_spec> out;
  for (const golden_tensor_spec& s : golden_tensor_specs(p))
    if (s.name.find('.') == std::string::npos) out.push_back(s);
  return out;
}

namespace {

// Scatters `tf`'s tensors named by `specs` into `c`; the rest go to *ignored.
void scatter_named(case_data& c, const tensor_file& tf, const std::vector<golden_tensor_spec>& specs,
                   const char* kind, std::vector<std::string>* ignored) {
  std::set<std::string> names;
  for (const golden_tensor_spec& spec : specs) {
    names.insert(spec.name);
    auto it = tf.tensors.find(spec.name);
    if (it == tf.tensors.end()) {
      std::string have;
      for (const auto& [n, t] : tf.tensors) have += (have.empty() ? "" : ", ") + n;
      throw arg_error(tf.path + ": tensor " + spec.name,
                      fmt::format("present ({} of this problem: {} {})", kind, dtype_name(spec.type),
                                  json(spec.shape).dump()),
                      "missing (the file holds: " + (have.empty() ? std::string("nothing") : have) + ")");
    }
    const std::string& src = it->second.source.empty() ? tf.path : it->second.source;
    const golden_tensor t = golden_tensor_from_file(it->second, spec, src + ": tensor " + spec.name);
    scatter(t, view_named(c.args, spec.name), spec.name);
  }
  if (ignored)
    for (const auto& [n, t] : tf.tensors)
      if (!names.count(n)) ignored->push_back(n);
}

}  // namespace

case_data case_with_outputs(const case_data& initial, const tensor_file& outputs, std::vector<std::string>* ignored) {
  case_data got = initial.clone_outputs();  // the inputs shared: only outputs are scattered in
  scatter_named(got, outputs, golden_output_specs(initial.prob), "an output", ignored);
  return got;
}

case_data case_with_inputs(const problem& prob, const tensor_file& inputs, std::vector<std::string>* ignored) {
  case_data c = make_case(prob);
  scatter_named(c, inputs, golden_input_specs(prob), "an input", ignored);
  if (prob.scales == scale_storage::tensor) {
    // The repro states the scales the tensors hold (validate checks them as it checks a float).
    c.prob.k_scale = k_scale_of(c.args);
    c.prob.q_scale = q_scale_of(c.args);
  }
  return c;
}

namespace {

// A golden tensor as a contiguous view of its bytes.
tensor_view contiguous_view(const golden_tensor& t) {
  tensor_view v;
  v.type = t.type;
  v.rank = static_cast<int>(t.shape.size());
  v.data = const_cast<uint8_t*>(t.bytes.data());
  int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.shape[static_cast<size_t>(d)] = t.shape[static_cast<size_t>(d)];
    v.strides_elems[static_cast<size_t>(d)] = stride;
    stride *= t.shape[static_cast<size_t>(d)];
  }
  return v;
}

// dst = the concatenation of srcs along the last dimension (same outer shape), element by element.
void concat_last_into(const tensor_view& dst, const std::vector<tensor_view>& srcs) {
  const int r = dst.rank;
  const int64_t esz = static_cast<int64_t>(dtype_size_bytes(dst.type));
  int64_t outer = 1;
  for (int d = 0; d < r - 1; ++d) outer *= dst.shape[d];
  std::array<int64_t, max_rank> idx{};
  auto* out = static_cast<uint8_t*>(dst.data);
  for (int64_t o = 0; o < outer; ++o) {
    int64_t doff = 0;
    for (int d = 0; d < r - 1; ++d) doff += idx[d] * dst.strides_elems[d];
    int64_t col = 0;
    for (const tensor_view& sv : srcs) {
      int64_t soff = 0;
      for (int d = 0; d < r - 1; ++d) soff += idx[d] * sv.strides_elems[d];
      const auto* in = static_cast<const uint8_t*>(sv.data);
      for (int64_t k = 0; k < sv.shape[r - 1]; ++k, ++col)
        std::memcpy(out + (doff + col * dst.strides_elems[r - 1]) * esz, in + (soff + k * sv.strides_elems[r - 1]) * esz,
                    static_cast<size_t>(esz));
    }
    for (int d = r - 2; d >= 0; --d) {
      if (++idx[d] < dst.shape[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

bool peek_golden_problem(const std::string& path, problem* prob, int64_t* data_bytes) {
  try {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      const json meta = json::parse(read_small_file(path + "/meta.json", 64u << 20), nullptr, false);
      if (!meta.is_object() || !meta.contains("repro") || !meta["repro"].is_string()) return false;
      *prob = parse_problem(meta["repro"].get<std::string>());
      int64_t total = 0;
      for (const auto& e : std::filesystem::directory_iterator(path, ec))
        if (e.path().extension() == ".npy" && e.is_regular_file(ec)) total = sat_add(total, static_cast<int64_t>(e.file_size(ec)));
      *data_bytes = total;
      return true;
    }
    const input_file in(path);
    if (in.size() < 8) return false;
    uint8_t len_bytes[8];
    in.read_at(0, len_bytes, 8, "header length");
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
    if (header_len > in.size() - 8 || header_len > max_header_bytes || header_len < 2) return false;
    std::string text(static_cast<size_t>(header_len), ' ');
    in.read_at(8, text.data(), header_len, "header");
    const json header = json::parse(text, nullptr, false);
    if (!header.is_object() || !header.contains("__metadata__")) return false;
    const json& meta = header["__metadata__"];
    if (!meta.is_object() || !meta.contains("repro") || !meta["repro"].is_string()) return false;
    *prob = parse_problem(meta["repro"].get<std::string>());
    *data_bytes = static_cast<int64_t>(in.size() - 8 - header_len);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

golden_case load_golden_case(const std::string& path) {
  // Memory: the file's bytes are moved (not copied) out of the reader, each tensor is freed once
  // it is in the case, derived tensors are built in place (never as whole tensors), and the
  // expected case shares the initial case's inputs.
  golden_case g;
  g.file = golden_from_tensor_file(read_tensor_file(path), /*defer_derived=*/true);
  g.initial = make_case(g.file.prob);
  const std::vector<golden_tensor_spec> specs = golden_tensor_specs(g.file.prob);
  // stored tensors read from the file after they are in the case (freed at the end instead):
  // those a deferred concat reads
  std::set<std::string> kept_in_file;
  for (const auto& [name, r] : g.file.deferred)
    for (const std::string& n : r.concat)
      if (n.find('.') != std::string::npos) kept_in_file.insert(n);
  // zero_copy=1: q_nope is q_out's first Dn columns, so the file's q_nope and q_out.initial hold
  // those bytes twice; they must agree (checked once both are in: the file's q_nope is kept)
  const bool zero_copy = g.file.prob.zero_copy;
  if (zero_copy) kept_in_file.insert("q_nope");
  for (const golden_tensor_spec& spec : specs) {
    if (is_expected(spec.name)) continue;
    const tensor_view& v = view_named(g.initial.args, spec.name);
    auto st = g.file.tensors.find(spec.name);
    if (st != g.file.tensors.end()) {
      scatter(st->second, v, spec.name);
      if (!kept_in_file.count(spec.name)) g.file.tensors.erase(st);  // a concat reads an input from the case
      continue;
    }
    const derived_recipe& r = g.file.deferred.at(spec.name);
    // make_case poisoned it already (with zero_copy=1 q_out's nope columns hold q_nope instead)
    if (r.fill_byte >= 0 && (r.fill_byte != poison_byte || (zero_copy && spec.name == "q_out.initial"))) {
      const size_t esz = dtype_size_bytes(v.type);
      uint8_t* base = static_cast<uint8_t*>(v.data);
      for_each_element(v, [&](int64_t off, int64_t) {
        std::memset(base + off * static_cast<int64_t>(esz), r.fill_byte, esz);
      });
    }
  }
  if (zero_copy && gather(g.initial.args.q_nope).bytes != g.file.tensors.at("q_nope").bytes)
    file_error(path, "q_out.initial", "its first Dn columns equal to q_nope (zero_copy=1: q_nope lies in q_out)",
               "other bytes");
  // The file's call must be one the contract accepts (slots within the cache and distinct,
  // positions within the table, ...): a bad file is the file's error, named as such, before any
  // backend runs, never an ERRORED case blamed on the kernel.
  try {
    validate(g.initial.args);
  } catch (const arg_error& e) {
    file_error(path, e.arg(), e.expected(), e.got());
  }
  g.expected = g.initial.clone_outputs();  // the inputs shared
  for (const golden_tensor_spec& spec : specs) {
    if (!is_expected(spec.name)) continue;
    const tensor_view& v = view_named(g.expected.args, spec.name);
    auto st = g.file.tensors.find(spec.name);
    if (st != g.file.tensors.end()) {
      scatter(st->second, v, spec.name);
      if (!kept_in_file.count(spec.name)) g.file.tensors.erase(st);
      continue;
    }
    std::vector<tensor_view> srcs;  // a stored input is read from the case (its bytes, scattered)
    for (const std::string& n : g.file.deferred.at(spec.name).concat)
      srcs.push_back(n.find('.') == std::string::npos ? view_named(g.initial.args, n)
                                                      : contiguous_view(g.file.tensors.at(n)));
    concat_last_into(v, srcs);
  }
  g.file.tensors.clear();
  g.file.deferred.clear();
  return g;
}

}  // namespace ropekv
