// Golden files: a minimal safetensors writer/reader and an .npy writer (docs/golden-format.md).
// Byte order: ropekv runs on little-endian hosts only (x86-64, AArch64); tensor bytes are written
// as they are in memory, which is what both formats ask for ('<' / little-endian).
#include "core/golden.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

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
  if (v.rank < 1 || v.rank > 3) throw error(fmt::format("golden: unsupported view rank {}", v.rank));
  const int64_t d0 = v.shape[0];
  const int64_t d1 = v.rank >= 2 ? v.shape[1] : 1;
  const int64_t d2 = v.rank >= 3 ? v.shape[2] : 1;
  const int64_t s0 = v.strides_elems[0];
  const int64_t s1 = v.rank >= 2 ? v.strides_elems[1] : 0;
  const int64_t s2 = v.rank >= 3 ? v.strides_elems[2] : 0;
  int64_t flat = 0;
  for (int64_t i = 0; i < d0; ++i)
    for (int64_t j = 0; j < d1; ++j)
      for (int64_t k = 0; k < d2; ++k) f(i * s0 + j * s1 + k * s2, flat++);
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
  if (base == "q_nope") return a.q_nope;
  if (base == "q_pe") return a.q_pe;
  if (base == "kv_c") return a.kv_c;
  if (base == "k_pe") return a.k_pe;
  if (base == "positions") return a.positions;
  if (base == "slot_mapping") return a.slot_mapping;
  if (base == "cos_sin") return a.cos_sin;
  if (base == "cos") return a.cos;
  if (base == "sin") return a.sin;
  if (base == "q_out") return a.q_out;
  if (base == "cache") return a.cache;
  if (base == "ckv_cache") return a.ckv_cache;
  if (base == "kpe_cache") return a.kpe_cache;
  throw error(fmt::format("golden: no view for tensor '{}'", name));
}

bool is_expected(const std::string& name) {
  const std::string suffix = ".expected";
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string dtypes_json(const golden_file& f) {
  json d = json::object();
  for (const auto& [name, t] : f.tensors) d[name] = dtype_name(t.type);
  return d.dump();
}

[[noreturn]] void file_error(const std::string& path, const std::string& what,
                             const std::string& expected, const std::string& got) {
  throw arg_error(what.empty() ? path : path + ": " + what, expected, got);
}

void write_bytes(const std::string& path, const std::string& head, const golden_file& f,
                 const std::vector<std::string>* order) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) file_error(path, "", "a writable file", std::strerror(errno));
  out.write(head.data(), static_cast<std::streamsize>(head.size()));
  if (order)
    for (const std::string& name : *order) {
      const golden_tensor& t = f.tensors.at(name);
      out.write(reinterpret_cast<const char*>(t.bytes.data()),
                static_cast<std::streamsize>(t.bytes.size()));
    }
  out.close();
  if (!out) file_error(path, "", "a complete write", std::strerror(errno));
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
    case dtype::fp8_e4m3fnuz:
    case dtype::fp8_e5m2fnuz:
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
  s.push_back({"kv_c", p.in_dtype, {p.tk, p.dn}});
  s.push_back({"k_pe", p.in_dtype, {p.tk, p.dr}});
  s.push_back({"positions", p.pos_dtype, {p.tk}});
  s.push_back({"slot_mapping", p.slot_dtype, {p.ts}});
  if (p.table == table_kind::one) {
    s.push_back({"cos_sin", p.table_dtype, {p.table_rows, p.dr}});
  } else {
    s.push_back({"cos", p.table_dtype, {p.table_rows, p.dr / 2}});
    s.push_back({"sin", p.table_dtype, {p.table_rows, p.dr / 2}});
  }
  for (const char* when : {".initial", ".expected"}) {
    s.push_back({std::string("q_out") + when, p.q_out_dtype, {p.tq, p.heads, w}});
    if (p.opt.layout == cache_layout::joint) {
      s.push_back({std::string("cache") + when, p.cache_dtype, {p.num_blocks, p.block_size, w}});
    } else {
      s.push_back({std::string("ckv_cache") + when, p.cache_dtype, {p.num_blocks, p.block_size, p.dn}});
      s.push_back({std::string("kpe_cache") + when, p.cache_dtype, {p.num_blocks, p.block_size, p.dr}});
    }
  }
  if (p.opt.inplace_q) s.push_back({"q_pe.expected", p.in_dtype, {p.tq, p.heads, p.dr}});
  if (p.opt.inplace_k) s.push_back({"k_pe.expected", p.in_dtype, {p.tk, p.dr}});
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

void write_golden(const std::string& path, const case_data& before, const case_data& after) {
  write_golden(path, make_golden(before, after));
}

void write_golden(const std::string& path, const golden_file& f) {
  json header = json::object();
  std::vector<std::string> order;
  uint64_t offset = 0;
  for (const golden_tensor_spec& spec : golden_tensor_specs(f.prob)) {
    auto it = f.tensors.find(spec.name);
    if (it == f.tensors.end()) throw arg_error("golden tensors", "tensor " + spec.name, "none");
    const golden_tensor& t = it->second;
    header[spec.name] = {{"dtype", safetensors_dtype_name(t.type)},
                         {"shape", t.shape},
                         {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
    order.push_back(spec.name);
  }
  json meta = json::object();
  for (const auto& [k, v] : f.metadata) meta[k] = v;
  meta["repro"] = f.prob.to_repro();
  meta["dtypes"] = dtypes_json(f);
  header["__metadata__"] = meta;
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';  // data starts 8-byte aligned
  write_bytes(path, le_u64(text.size()) + text, f, &order);
}

void write_golden_npy(const std::string& dir, const case_data& before, const case_data& after) {
  const golden_file f = make_golden(before, after);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) file_error(dir, "", "a folder that can be created", ec.message());
  json tensors = json::object();
  for (const auto& [name, t] : f.tensors) {
    std::string shape = "(";
    for (size_t i = 0; i < t.shape.size(); ++i) shape += fmt::format("{}, ", t.shape[i]);
    if (t.shape.size() > 1) shape.resize(shape.size() - 2);
    else if (t.shape.size() == 1) shape.resize(shape.size() - 1);  // "(n,)"
    shape += ")";
    std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                   npy_descr(t.type), shape);
    // magic (6) + version (2) + header length (2) + dict + padding + '\n' == multiple of 64
    size_t total = 10 + dict.size() + 1;
    dict.append((64 - total % 64) % 64, ' ');
    dict += '\n';
    std::string head = std::string("\x93NUMPY\x01\x00", 8);
    head += static_cast<char>(dict.size() & 0xff);
    head += static_cast<char>((dict.size() >> 8) & 0xff);
    head += dict;
    const std::string file = name + ".npy";
    std::ofstream out(dir + "/" + file, std::ios::binary | std::ios::trunc);
    if (!out) file_error(dir + "/" + file, "", "a writable file", std::strerror(errno));
    out.write(head.data(), static_cast<std::streamsize>(head.size()));
    out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
    out.close();
    if (!out) file_error(dir + "/" + file, "", "a complete write", std::strerror(errno));
    tensors[name] = {{"file", file}, {"dtype", dtype_name(t.type)}, {"npy_dtype", npy_descr(t.type)},
                     {"shape", t.shape}};
  }
  json meta = json::object();
  for (const auto& [k, v] : f.metadata) meta[k] = v;
  meta["dtypes"] = json::parse(f.metadata.at("dtypes"));  // an object here, not a string
  meta["tensors"] = tensors;
  std::ofstream out(dir + "/meta.json", std::ios::trunc);
  if (!out) file_error(dir + "/meta.json", "", "a writable file", std::strerror(errno));
  out << meta.dump(2) << "\n";
  out.close();
  if (!out) file_error(dir + "/meta.json", "", "a complete write", std::strerror(errno));
}

golden_file read_golden(const std::string& path) {
  // A directory opens as an ifstream on Linux; reading it throws a libstdc++ message without the
  // path. Name it here.
  std::error_code dir_ec;
  if (std::filesystem::is_directory(path, dir_ec)) file_error(path, "", "a golden file", "a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) file_error(path, "", "a readable golden file", std::strerror(errno));
  std::vector<uint8_t> bytes;
  try {
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::exception& e) {
    file_error(path, "", "a readable golden file", e.what());
  }
  if (in.bad()) file_error(path, "", "a readable golden file", "a read error");
  const uint64_t size = bytes.size();
  if (size < 8)
    file_error(path, "size", "at least 8 bytes (the safetensors header length)", fmt::format("{} bytes", size));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[static_cast<size_t>(i)];
  if (header_len > size - 8 || header_len > max_header_bytes || header_len < 2)
    file_error(path, "header length", fmt::format("2 .. {} (file size {} - 8)",
                                                  std::min<uint64_t>(size - 8, max_header_bytes), size),
               std::to_string(header_len));
  const uint8_t* data = bytes.data() + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(header_len),
                            nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) file_error(path, "header", "valid JSON", "unparseable text");
  if (!header.is_object()) file_error(path, "header", "a JSON object", header.type_name());

  golden_file f;
  // metadata
  auto meta_it = header.find("__metadata__");
  if (meta_it == header.end() || !meta_it->is_object())
    file_error(path, "__metadata__", "an object of strings", meta_it == header.end() ? "none" : meta_it->type_name());
  for (auto it = meta_it->begin(); it != meta_it->end(); ++it) {
    if (!it->is_string()) file_error(path, "__metadata__." + it.key(), "a string", it->type_name());
    f.metadata[it.key()] = it->get<std::string>();
  }
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
  json dtypes = json::parse(meta("dtypes"), nullptr, false);
  if (dtypes.is_discarded() || !dtypes.is_object())
    file_error(path, "__metadata__.dtypes", "a JSON object: tensor name -> dtype", meta("dtypes"));

  // tensors
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
    auto dn = dtypes.find(name);
    if (dn == dtypes.end() || !dn->is_string())
      file_error(path, "__metadata__.dtypes." + name, "the tensor's ropekv dtype", "none");
    golden_tensor t;
    try {
      t.type = parse_dtype(dn->get<std::string>(), "dtype");
    } catch (const arg_error& err) {
      file_error(path, "__metadata__.dtypes." + name, err.expected(), err.got());
    }
    if (dt->get<std::string>() != safetensors_dtype_name(t.type))
      file_error(path, where + " dtype", fmt::format("{} (for {})", safetensors_dtype_name(t.type), dtype_name(t.type)),
                 dt->get<std::string>());
    uint64_t numel = 1;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned()) file_error(path, where + " shape", "non-negative integers", sh->dump());
      const uint64_t v = d.get<uint64_t>();
      if (v > (uint64_t{1} << 40) || (v != 0 && numel > (uint64_t{1} << 40) / v))
        file_error(path, where + " shape", "a tensor of at most 2^40 elements", sh->dump());
      numel *= v;
      t.shape.push_back(static_cast<int64_t>(v));
    }
    const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
    if (begin > end || end > data_size)
      file_error(path, where + " data_offsets", fmt::format("0 <= begin <= end <= {} (data bytes)", data_size),
                 fmt::format("[{}, {}]", begin, end));
    const uint64_t nbytes = numel * dtype_size_bytes(t.type);
    if (end - begin != nbytes)
      file_error(path, where + " data_offsets", fmt::format("{} bytes for shape {}", nbytes, sh->dump()),
                 fmt::format("{} bytes", end - begin));
    t.bytes.assign(data + begin, data + end);
    f.tensors.emplace(name, std::move(t));
  }

  // the tensors must be exactly those the repro implies
  std::set<std::string> wanted;
  for (const golden_tensor_spec& spec : golden_tensor_specs(f.prob)) {
    wanted.insert(spec.name);
    auto it = f.tensors.find(spec.name);
    if (it == f.tensors.end()) file_error(path, "tensor " + spec.name, "present (the repro needs it)", "missing");
    if (it->second.type != spec.type)
      file_error(path, "tensor " + spec.name + " dtype", dtype_name(spec.type), dtype_name(it->second.type));
    if (it->second.shape != spec.shape)
      file_error(path, "tensor " + spec.name + " shape", json(spec.shape).dump(), json(it->second.shape).dump());
  }
  for (const auto& [name, t] : f.tensors)
    if (!wanted.count(name)) file_error(path, "tensor " + name, "only tensors the repro implies", "an extra tensor");
  return f;
}

golden_case load_golden_case(const std::string& path) {
  golden_case g;
  g.file = read_golden(path);
  g.initial = make_case(g.file.prob);
  for (const auto& [name, t] : g.file.tensors)
    if (!is_expected(name)) scatter(t, view_named(g.initial.args, name), name);
  g.expected = g.initial.clone();
  for (const auto& [name, t] : g.file.tensors)
    if (is_expected(name)) scatter(t, view_named(g.expected.args, name), name);
  return g;
}

}  // namespace ropekv
