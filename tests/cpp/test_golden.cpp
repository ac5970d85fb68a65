// Golden files: safetensors round trip, load_golden_case, npy output, and corrupted files
// (truncated, flipped header bytes, edited headers) that must give arg_error, never a crash.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/case_data.h"
#include "core/error.h"
#include "core/golden.h"
#include "core/presets.h"

using namespace ropekv;
namespace fs = std::filesystem;

namespace {

std::string temp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("ropekv_test_golden_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_all(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

bool same_buffers(const case_data& a, const case_data& b) {
  for (const auto& [name, buf] : a.buffers) {
    const host_buffer& o = b.buffers.at(name);
    if (o.size_bytes() != buf.size_bytes() || std::memcmp(o.data(), buf.data(), buf.size_bytes()) != 0)
      return false;
  }
  return a.buffers.size() == b.buffers.size();
}

// A case and its reference run.
struct run_pair {
  case_data before, after;
};
run_pair run_reference(const problem& p) {
  run_pair r{make_case(p), case_data{}};
  r.after = r.before.clone();
  reference_run(r.after.args);
  return r;
}

// The arg_error message read_golden gives, or "" when the file loads.
std::string load_error(const std::string& path) {
  try {
    load_golden_case(path);
  } catch (const arg_error& e) {
    return e.what();
  }
  return "";
}

// Rewrites a golden file after editing its JSON header.
template <typename F>
void edit_header(const std::string& src, const std::string& dst, F&& edit) {
  std::vector<uint8_t> bytes = read_all(src);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<size_t>(i)];
  nlohmann::json h = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(n));
  edit(h);
  std::string text = h.dump();
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>((text.size() >> (8 * i)) & 0xff);
  out.insert(out.end(), text.begin(), text.end());
  out.insert(out.end(), bytes.begin() + 8 + static_cast<int64_t>(n), bytes.end());
  write_all(dst, out);
}

}  // namespace

TEST_CASE("golden: write, read, load round trip on random problems and a preset") {
  std::vector<problem> problems;
  for (uint64_t i = 0; i < 40; ++i) problems.push_back(random_problem(31, i, 48));
  problems.push_back(preset_problem("kimi-k2-tp8", 5, 2));
  problems.push_back(parse_problem("tq=2 ts=3 tk=4 h=2 dn=8 dr=4 p=32 bs=2 nb=4 inplace_q=1 inplace_k=1 cache=fp8_e4m3fnuz k_scale=0.37 layout=split"));
  int inplace_seen = 0;
  for (const problem& p : problems) {
    INFO(p.to_repro());
    run_pair r = run_reference(p);
    const std::string path = temp_path("case.safetensors");
    write_golden(path, r.before, r.after);
    const golden_file f = read_golden(path);
    CHECK(f.prob == p);
    CHECK(f.metadata.at("format") == "ropekv-golden");
    CHECK(f.metadata.at("contract_version") == "1");
    CHECK(f.metadata.at("repro") == p.to_repro());
    CHECK_FALSE(f.metadata.at("ropekv_version").empty());
    CHECK_FALSE(f.metadata.at("ropekv_commit").empty());
    CHECK(f.metadata.at("format_version") == "2");
    const nlohmann::json dtypes = nlohmann::json::parse(f.metadata.at("dtypes"));
    CHECK(dtypes.at("q_out.expected") == dtype_name(p.q_out_dtype));
    for (const auto& [name, t] : f.tensors) CHECK(dtypes.at(name) == dtype_name(t.type));
    const std::vector<golden_tensor_spec> specs = golden_tensor_specs(p);
    CHECK(f.tensors.size() == specs.size());
    inplace_seen += f.tensors.count("q_pe.expected") + f.tensors.count("k_pe.expected");
    const golden_case g = load_golden_case(path);
    // the rebuilt case is byte-identical to the one written: strides, padding, poison, data
    CHECK(same_buffers(g.initial, r.before));
    CHECK(same_buffers(g.expected, r.after));
    CHECK(g.initial.prob == p);
  }
  CHECK(inplace_seen > 0);
}

TEST_CASE("golden: file tensors are logical, contiguous and overwrite the rebuilt case") {
  const problem p = parse_problem("tq=2 ts=2 tk=3 h=2 dn=4 dr=2 p=8 bs=2 nb=2 in=f32 q_layout=head_major row_pad=3 kv_layout=fused");
  run_pair r = run_reference(p);
  const std::string path = temp_path("edit.safetensors");
  golden_file f = make_golden(r.before, r.after);
  const golden_tensor& q = f.tensors.at("q_nope");
  CHECK(q.shape == std::vector<int64_t>{2, 2, 4});
  CHECK(q.bytes.size() == 2 * 2 * 4 * 4);
  float first = 0;
  std::memcpy(&first, q.bytes.data() + ((1 * 2 + 0) * 4 + 3) * 4, 4);  // [t=1, h=0, d=3]
  const uint8_t* in_view = static_cast<const uint8_t*>(r.before.args.q_nope.data) +
                           r.before.args.q_nope.offset_elems({1, 0, 3}) * 4;
  float want = 0;
  std::memcpy(&want, in_view, 4);
  CHECK(first == want);
  // a user's edited tensor wins over the repro's generated data
  const float edited = 123.5f;
  std::memcpy(f.tensors.at("q_nope").bytes.data(), &edited, 4);
  write_golden(path, f);
  const golden_case g = load_golden_case(path);
  float got = 0;
  std::memcpy(&got, g.initial.args.q_nope.data, 4);
  CHECK(got == edited);
}

TEST_CASE("golden: npy folder with meta.json") {
  const problem p = parse_problem("tq=3 ts=3 tk=3 h=1 dn=4 dr=2 p=8 bs=4 nb=1 in=bf16 cache=fp8_e5m2 k_scale=2 table=two");
  run_pair r = run_reference(p);
  const std::string dir = temp_path("npy_case");
  write_golden_npy(dir, r.before, r.after);
  const nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir + "/meta.json"));
  CHECK(meta.at("format") == "ropekv-golden");
  CHECK(meta.at("repro") == p.to_repro());
  CHECK(meta.at("dtypes").at("cache.expected") == "fp8_e5m2");
  CHECK(meta.at("tensors").at("cos").at("shape") == nlohmann::json::array({8, 1}));
  const golden_file f = make_golden(r.before, r.after);
  // the poisoned outputs are recipes, not files; q_out's nope columns come from q_nope
  CHECK(meta.at("derived").at("q_out.initial").at("fill_byte") == 0xA5);
  CHECK(meta.at("derived").at("q_out.expected").at("concat_last") == nlohmann::json::array({"q_nope", "q_out.expected.rope"}));
  CHECK_FALSE(fs::exists(dir + "/q_out.initial.npy"));
  CHECK(fs::exists(dir + "/cache.expected.npy"));
  int files = 0;
  for (const auto& [name, t] : f.tensors) {
    INFO(name);
    if (meta.at("derived").contains(name)) continue;
    ++files;
    const std::vector<uint8_t> bytes = read_all(dir + "/" + name + ".npy");
    REQUIRE(bytes.size() > 10);
    CHECK(std::memcmp(bytes.data(), "\x93NUMPY\x01\x00", 8) == 0);
    const size_t hlen = bytes[8] | (bytes[9] << 8);
    CHECK((10 + hlen) % 64 == 0);
    const std::string header(bytes.begin() + 10, bytes.begin() + 10 + static_cast<int64_t>(hlen));
    const std::string descr = t.type == dtype::bf16 ? "'<u2'" : t.type == dtype::fp8_e5m2 ? "'|u1'"
                              : t.type == dtype::i64 ? "'<i8'" : "";
    if (!descr.empty()) CHECK(header.find("'descr': " + descr) != std::string::npos);
    CHECK(header.back() == '\n');
    REQUIRE(bytes.size() == 10 + hlen + t.bytes.size());
    CHECK(std::equal(t.bytes.begin(), t.bytes.end(), bytes.begin() + 10 + static_cast<int64_t>(hlen)));
  }
  CHECK(files + 1 == static_cast<int>(meta.at("tensors").size()));  // and q_out.expected.rope
  CHECK(read_all(dir + "/positions.npy").size() > 0);
  const std::vector<uint8_t> pos = read_all(dir + "/positions.npy");
  CHECK(std::string(pos.begin() + 10, pos.end()).find("'shape': (3,)") != std::string::npos);
}

TEST_CASE("golden: truncated and corrupted files give arg_error naming the file") {
  const problem p = parse_problem("tq=2 ts=2 tk=2 h=2 dn=8 dr=4 p=16 bs=2 nb=2 cache=fp8_e4m3fn k_scale=0.5");
  run_pair r = run_reference(p);
  const std::string good = temp_path("good.safetensors");
  const std::string bad = temp_path("bad.safetensors");
  write_golden(good, r.before, r.after);
  const std::vector<uint8_t> bytes = read_all(good);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[static_cast<size_t>(i)];
  REQUIRE(header_len + 8 < bytes.size());

  SUBCASE("missing file") {
    const std::string msg = load_error(temp_path("does_not_exist.safetensors"));
    CHECK(msg.find("does_not_exist.safetensors") != std::string::npos);
  }
  SUBCASE("truncated at many lengths") {
    for (size_t len : {size_t{0}, size_t{3}, size_t{7}, size_t{8}, size_t{9}, size_t{8 + header_len / 2},
                       size_t{8 + header_len - 1}, size_t{8 + header_len}, size_t{8 + header_len + 1},
                       bytes.size() / 2 + header_len / 2, bytes.size() - 1}) {
      INFO("length " << len);
      write_all(bad, std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<int64_t>(len)));
      const std::string msg = load_error(bad);
      CHECK(msg.find(bad) == 0);
    }
    write_all(bad, std::vector<uint8_t>(bytes.begin(), bytes.begin() + 8));
    CHECK(load_error(bad).find("header length") != std::string::npos);
    write_all(bad, std::vector<uint8_t>(bytes.begin(), bytes.begin() + 4));
    CHECK(load_error(bad).find("at least 8 bytes") != std::string::npos);
    write_all(bad, std::vector<uint8_t>(bytes.begin(), bytes.end() - 1));
    CHECK(load_error(bad).find("data_offsets") != std::string::npos);
  }
  SUBCASE("every header byte flipped: an error or a harmless change, never a crash") {
    int errors = 0, loads = 0;
    for (size_t i = 0; i < 8 + header_len; i += (i < 8 ? 1 : 3)) {  // every length byte, every 3rd JSON byte
      std::vector<uint8_t> b = bytes;
      b[i] ^= (i % 2 ? 0x01 : 0x40);
      write_all(bad, b);
      const std::string msg = load_error(bad);
      if (msg.empty()) ++loads;
      else {
        ++errors;
        CHECK(msg.find(bad) == 0);
      }
    }
    MESSAGE(errors << " flips rejected, " << loads << " harmless (whitespace, version strings)");
    CHECK(errors > static_cast<int>(header_len) / 6);
    // a huge length
    std::vector<uint8_t> b = bytes;
    b[7] = 0x7f;
    write_all(bad, b);
    CHECK(load_error(bad).find("header length") != std::string::npos);
  }
  SUBCASE("edited headers") {
    auto expect = [&](auto edit, const char* needle) {
      edit_header(good, bad, edit);
      const std::string msg = load_error(bad);
      INFO(msg);
      CHECK(msg.find(bad) == 0);
      CHECK(msg.find(needle) != std::string::npos);
    };
    using json = nlohmann::json;
    edit_header(good, bad, [](json&) {});
    CHECK(load_error(bad).empty());  // the editor itself keeps a valid file
    expect([](json& h) { h["q_nope"]["data_offsets"][1] = 1u << 30; }, "data_offsets");
    expect([](json& h) { h["q_nope"]["data_offsets"][0] = 5; }, "data_offsets");
    expect([](json& h) { h["q_nope"]["data_offsets"] = json::array({-1, 3}); }, "data_offsets");
    expect([](json& h) { h["q_nope"]["dtype"] = "F32"; }, "dtype");
    expect([](json& h) { h["q_nope"]["dtype"] = 7; }, "dtype");
    expect([](json& h) { h["cache.expected"]["dtype"] = "U8"; }, "dtype");
    expect([](json& h) { h["q_nope"]["shape"] = json::array({2, 2, 7}); }, "data_offsets");
    expect([](json& h) { h["q_nope"]["shape"] = json::array({2, -2, 8}); }, "shape");
    expect([](json& h) { h["q_nope"]["shape"] = json::array({1u << 31, 1u << 31, 8}); }, "shape");
    expect([](json& h) { h["q_nope"]["shape"] = json::array({4, 1, 8}); }, "shape");
    // a tensor's entry removed leaves its bytes unindexed: refused by the reader (no holes)
    expect([](json& h) { h.erase("kv_c"); }, "data_offsets");
    expect([](json& h) { h["extra"] = h["kv_c"]; auto d = json::parse(h["__metadata__"]["dtypes"].get<std::string>()); d["extra"] = "bf16"; h["__metadata__"]["dtypes"] = d.dump(); }, "data_offsets");  // overlaps kv_c
    expect([](json& h) { h.erase("__metadata__"); }, "__metadata__");
    expect([](json& h) { h["__metadata__"]["format"] = "other"; }, "format");
    expect([](json& h) { h["__metadata__"]["contract_version"] = "2"; }, "contract_version");
    expect([](json& h) { h["__metadata__"]["repro"] = "tq=2 bogus=1"; }, "repro");
    expect([](json& h) { h["__metadata__"]["repro"] = "tq=3 ts=2"; }, "repro");
    expect([](json& h) { h["__metadata__"]["dtypes"] = "{"; }, "dtypes");
    expect([](json& h) { h["__metadata__"]["dtypes"] = "{\"q_nope\": \"f64\"}"; }, "dtypes");
    expect([](json& h) { h["__metadata__"]["repro"] = 5; }, "__metadata__");
    expect([](json& h) { h = json::array({1, 2}); }, "header");
    // repro that disagrees with the tensors (different heads)
    expect([&](json& h) {
      problem q = p;
      q.heads = 1;
      h["__metadata__"]["repro"] = q.to_repro();
    }, "shape");
  }
}

TEST_CASE("golden: format version 2 leaves out what it rebuilds; version 1 files still read") {
  using json = nlohmann::json;
  auto header_of = [](const std::string& path) {
    const std::vector<uint8_t> b = read_all(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | b[static_cast<size_t>(i)];
    return json::parse(b.begin() + 8, b.begin() + 8 + static_cast<int64_t>(n));
  };
  SUBCASE("the small form and --store-all rebuild the same case") {
    std::vector<problem> problems;
    for (uint64_t i = 0; i < 30; ++i) problems.push_back(random_problem(77, i, 24));
    problems.push_back(parse_problem("tq=6 ts=6 tk=6 h=2 dn=8 dr=4 p=16 bs=8 nb=1 pad_slots=2 pad_q=skipped"));
    problems.push_back(parse_problem("tq=2 ts=2 tk=2 h=2 dn=8 dr=4 p=16 bs=4 nb=1 qo=fp8_e4m3fn q_scale=2"));
    int concat = 0, whole = 0;
    for (const problem& p : problems) {
      INFO(p.to_repro());
      run_pair r = run_reference(p);
      const std::string small = temp_path("small.safetensors"), full = temp_path("full.safetensors");
      write_golden(small, r.before, r.after);
      write_golden(full, r.before, r.after, golden_write_options{true});
      const json hs = header_of(small), hf = header_of(full);
      const json ds = json::parse(hs["__metadata__"]["derived"].get<std::string>());
      CHECK(json::parse(hf["__metadata__"]["derived"].get<std::string>()).empty());
      CHECK(hf.contains("q_out.initial"));
      if (p.zero_copy) {  // q_out.initial holds q_nope in its first Dn columns: stored whole
        CHECK_FALSE(ds.contains("q_out.initial"));
        CHECK((hs.contains("q_out.initial") || p.tq * p.heads == 0));
      } else {
        CHECK(ds.at("q_out.initial") == json({{"fill_byte", 0xA5}, {"shape", {p.tq, p.heads, p.dn + p.dr}}}));
        CHECK_FALSE(hs.contains("q_out.initial"));
      }
      // q_out.expected is rebuilt from q_nope exactly when its nope columns are q_nope's bytes
      const golden_file f = make_golden(r.before, r.after);
      bool nope_is_copy = p.q_out_dtype == p.in_dtype;
      for (int64_t row = 0; nope_is_copy && row < p.tq * p.heads; ++row) {
        const size_t esz = dtype_size_bytes(p.in_dtype);
        nope_is_copy = std::memcmp(f.tensors.at("q_out.expected").bytes.data() + row * (p.dn + p.dr) * esz,
                                   f.tensors.at("q_nope").bytes.data() + row * p.dn * esz, p.dn * esz) == 0;
      }
      CHECK(ds.contains("q_out.expected") == nope_is_copy);
      CHECK(hs.contains("q_out.expected.rope") == nope_is_copy);
      CHECK(hs.contains("q_out.expected") != nope_is_copy);
      (nope_is_copy ? concat : whole) += 1;
      const golden_case a = load_golden_case(small), b = load_golden_case(full);
      CHECK(same_buffers(a.initial, b.initial));
      CHECK(same_buffers(a.expected, b.expected));
      CHECK(same_buffers(a.expected, r.after));
      CHECK(a.file.tensors.count("q_out.expected.rope") == 0);
    }
    CHECK(concat > 0);
    CHECK(whole >= 2);  // pad_q=skipped rows and an fp8 q_out keep the whole tensor
  }
  SUBCASE("version 1 files (every tensor stored, no format_version) load and replay") {
    int files = 0;
    for (const auto& entry : fs::directory_iterator(std::string(ROPEKV_SOURCE_DIR) + "/tests/data/golden-v1")) {
      const std::string path = entry.path().string();
      if (entry.path().extension() != ".safetensors") continue;
      ++files;
      INFO(path);
      CHECK_FALSE(header_of(path)["__metadata__"].contains("format_version"));
      golden_case g = load_golden_case(path);
      case_data run = g.initial.clone();
      reference_run(run.args);
      CHECK(same_buffers(run, g.expected));
    }
    CHECK(files >= 3);
  }
  SUBCASE("bad recipes and versions: arg_error naming the file and the key") {
    const problem p = parse_problem("tq=2 ts=2 tk=2 h=2 dn=8 dr=4 p=16 bs=2 nb=2");
    run_pair r = run_reference(p);
    const std::string good = temp_path("v2.safetensors"), bad = temp_path("v2bad.safetensors");
    write_golden(good, r.before, r.after);
    auto expect = [&](auto edit, const char* needle) {
      edit_header(good, bad, [&](json& h) {
        json d = json::parse(h["__metadata__"]["derived"].get<std::string>());
        edit(h, d);
        h["__metadata__"]["derived"] = d.dump();
      });
      const std::string msg = load_error(bad);
      INFO(msg);
      CHECK(msg.find(bad) == 0);
      CHECK(msg.find(needle) != std::string::npos);
    };
    edit_header(good, bad, [](json&) {});
    CHECK(load_error(bad).empty());
    expect([](json& h, json&) { h["__metadata__"]["format_version"] = "3"; }, "format_version");
    expect([](json& h, json&) { h["__metadata__"].erase("format_version"); }, "derived");
    expect([](json&, json& d) { d["q_out.initial"]["fill_byte"] = 256; }, "fill_byte");
    expect([](json&, json& d) { d["q_out.initial"]["fill_byte"] = -1; }, "fill_byte");
    expect([](json&, json& d) { d["q_out.initial"]["shape"] = {2, 2, 13}; }, "shape");
    expect([](json&, json& d) { d["q_out.initial"].erase("shape"); }, "shape");
    expect([](json&, json& d) { d["q_out.initial"]["repeat"] = 1; }, "q_out.initial");
    expect([](json&, json& d) { d["q_out.initial"] = 5; }, "q_out.initial");
    expect([](json&, json& d) { d["q_out.expected"]["concat_last"] = {"q_nope"}; }, "concat_last");
    expect([](json&, json& d) { d["q_out.expected"]["concat_last"] = {"q_nope", "nothing"}; }, "concat_last");
    expect([](json&, json& d) { d["q_out.expected"]["concat_last"] = {"q_nope", "q_out.initial"}; }, "concat_last");
    expect([](json&, json& d) { d["q_out.expected"]["concat_last"] = {"q_nope", "kv_c"}; }, "concat_last");
    expect([](json&, json& d) { d.erase("cache.initial"); }, "cache.initial");
    expect([](json&, json& d) { d["bogus.initial"] = d["q_out.initial"]; }, "bogus.initial");
    expect([](json&, json& d) { d["q_nope"] = {{"fill_byte", 1}, {"shape", {2, 2, 8}}}; }, "q_nope");
    expect([](json& h, json& d) {  // a fill only for *.initial: no small file of huge outputs
      h.erase("cache.expected");
      d["cache.expected"] = d["cache.initial"];
    }, "trailing");  // its bytes are left unindexed at the end: refused before the recipe is read
    expect([](json& h, json&) {  // a stored tensor's shape is checked before any recipe is built
      h["__metadata__"]["repro"] = "tq=2 ts=2 tk=2 h=2 dn=8 dr=4 p=16 bs=2 nb=200000";
    }, "shape");
    expect([](json&, json& d) { d = json::array({1}); }, "derived");
  }
}

namespace {

// An .npy file (v1.0) with this header dict text and these data bytes.
std::vector<uint8_t> npy_bytes(const std::string& dict, const std::vector<uint8_t>& data) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::vector<uint8_t> b = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(h.size() & 0xff),
                            static_cast<uint8_t>(h.size() >> 8)};
  for (char c : h) b.push_back(static_cast<uint8_t>(c));
  for (uint8_t c : data) b.push_back(c);
  return b;
}

std::string npy_error(const std::vector<uint8_t>& bytes) {
  const std::string path = temp_path("t.npy");
  write_all(path, bytes);
  try {
    read_npy(path);
  } catch (const arg_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("golden: npy reader reads numpy's headers and rejects bad files naming them") {
  const std::vector<uint8_t> six(24, 7);
  const file_tensor t = [&] {
    write_all(temp_path("ok.npy"), npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", six));
    return read_npy(temp_path("ok.npy"));
  }();
  CHECK(t.dtype == "<f4");
  CHECK(t.shape == std::vector<int64_t>{2, 3});
  CHECK(t.bytes == six);
  CHECK(npy_error(npy_bytes("{'descr': '<V2', 'fortran_order': False, 'shape': (12,), }", six)).empty());
  CHECK(npy_error(npy_bytes("{\"shape\": (), \"descr\": \"<i8\", \"fortran_order\": False}", std::vector<uint8_t>(8))).empty());
  CHECK(npy_error(npy_bytes("{'descr': '<u1', 'fortran_order': False, 'shape': (24,), }", six)).empty());

  const std::string bad = temp_path("t.npy");
  auto has = [&](const std::vector<uint8_t>& b, const char* needle) {
    const std::string msg = npy_error(b);
    INFO(msg);
    CHECK(msg.find(bad) == 0);
    CHECK(msg.find(needle) != std::string::npos);
  };
  const std::vector<uint8_t> good = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", six);
  // truncated anywhere: header, data
  for (size_t len : {size_t{0}, size_t{5}, size_t{9}, size_t{20}, size_t{63}, size_t{64}, good.size() - 1}) {
    INFO("length " << len);
    const std::string msg = npy_error(std::vector<uint8_t>(good.begin(), good.begin() + static_cast<int64_t>(len)));
    CHECK(msg.find(bad) == 0);
  }
  has(std::vector<uint8_t>(good.begin(), good.end() - 1), "truncated");
  has(std::vector<uint8_t>(good.begin(), good.begin() + 30), "header length");
  std::vector<uint8_t> extra = good;
  extra.push_back(0);
  has(extra, "data");
  std::vector<uint8_t> magic = good;
  magic[1] = 'X';
  has(magic, "magic");
  std::vector<uint8_t> version = good;
  version[6] = 9;
  has(version, "version");
  has(npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", six), "fortran_order");
  has(npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", six), "little-endian");
  has(npy_bytes("{'descr': '<c16', 'fortran_order': False, 'shape': (2, 3), }", six), "descr");
  has(npy_bytes("{'descr': 'O', 'fortran_order': False, 'shape': (2, 3), }", six), "descr");
  has(npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }", six), "structured");
  has(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", six), "header");
  has(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", six), "2^40");
  has(npy_bytes("{'descr': '<f4', 'fortran_order': False}", six), "shape");
  has(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", six), "header key");
  has(npy_bytes("{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3)}", six), "header");
  has(npy_bytes("not a dict", six), "header");
  // every header byte flipped: an error or a harmless change, never a crash
  for (size_t i = 0; i < good.size(); ++i) {
    std::vector<uint8_t> b = good;
    b[i] ^= 0x21;
    const std::string msg = npy_error(b);
    if (!msg.empty()) CHECK(msg.find(bad) == 0);
  }
}

TEST_CASE("golden: npy folders read back as golden files; outputs and inputs from tensor files") {
  const problem p = parse_problem("tq=2 ts=3 tk=3 h=2 dn=8 dr=4 p=16 bs=2 nb=3 layout=split inplace_q=1 cache=fp8_e4m3fnuz k_scale=0.5");
  run_pair r = run_reference(p);
  const std::string dir = temp_path("npy_back");
  std::filesystem::remove_all(dir);
  write_golden_npy(dir, r.before, r.after);
  const golden_case g = load_golden_case(dir);
  CHECK(same_buffers(g.initial, r.before));
  CHECK(same_buffers(g.expected, r.after));
  // fnuz under its safetensors name; an old file's U8 still reads
  const std::string st = temp_path("fnuz.safetensors");
  write_golden(st, r.before, r.after);
  const tensor_file tf = read_tensor_file(st);
  CHECK(tf.tensors.at("ckv_cache.expected").dtype == "F8_E4M3FNUZ");
  CHECK(file_dtype_fits("U8", dtype::fp8_e4m3fnuz));
  CHECK(file_dtype_fits("<V2", dtype::bf16));
  CHECK_FALSE(file_dtype_fits("F16", dtype::bf16));
  CHECK_FALSE(file_dtype_fits("<i4", dtype::i64));

  // the outputs of the golden file itself (names without suffix) make a passing run
  tensor_file outs;
  outs.path = "outs";
  for (const auto& [name, t] : read_golden(st).tensors) {
    if (name.find(".expected") == std::string::npos) continue;
    file_tensor ft{safetensors_dtype_name(t.type), static_cast<int64_t>(dtype_size_bytes(t.type)), t.shape, t.bytes, "outs"};
    outs.tensors[name.substr(0, name.find('.'))] = ft;
  }
  outs.tensors["junk"] = file_tensor{"F64", 8, {1}, std::vector<uint8_t>(8), "outs"};
  std::vector<std::string> ignored;
  const case_data got = case_with_outputs(g.initial, outs, &ignored);
  CHECK(ignored == std::vector<std::string>{"junk"});
  CHECK(same_buffers(got, r.after));
  tensor_file missing = outs;
  missing.tensors.erase("kpe_cache");
  CHECK_THROWS_WITH_AS(case_with_outputs(g.initial, missing, nullptr), doctest::Contains("outs: tensor kpe_cache"), arg_error);
  tensor_file wrong = outs;
  wrong.tensors["q_pe"].shape = {2, 2, 2};
  CHECK_THROWS_WITH_AS(case_with_outputs(g.initial, wrong, nullptr), doctest::Contains("tensor q_pe shape: expected [2,2,4]"), arg_error);
  wrong = outs;
  wrong.tensors["q_out"].dtype = "F32";
  CHECK_THROWS_WITH_AS(case_with_outputs(g.initial, wrong, nullptr), doctest::Contains("tensor q_out dtype"), arg_error);

  // inputs: the golden's own inputs rebuild the case exactly
  tensor_file ins;
  ins.path = "ins";
  for (const auto& [name, t] : read_golden(st).tensors)
    if (name.find('.') == std::string::npos)
      ins.tensors[name] = file_tensor{dtype_name(t.type), static_cast<int64_t>(dtype_size_bytes(t.type)), t.shape, t.bytes, "ins"};
  CHECK(same_buffers(case_with_inputs(p, ins, nullptr), r.before));
  ins.tensors.erase("positions");
  CHECK_THROWS_WITH_AS(case_with_inputs(p, ins, nullptr), doctest::Contains("ins: tensor positions"), arg_error);
}
