// ropekv_convert_dump: a test-only tool that exposes the host conversions to the Python
// cross-check against ml_dtypes (tests/python/test_conversions.py).
//
//   ropekv_convert_dump encode <f32|f64> <dtype> <saturate|ieee> IN OUT
//       IN: little-endian float32 or float64 values; OUT: one code per value, in the dtype's
//       width (uint8 / uint16 / uint32). f32 input goes through encode_from_f32, f64 input
//       through encode_from_f64.
//   ropekv_convert_dump decode <dtype> OUT
//       OUT: float64 decode of every code 0 .. 2^bits - 1 (8- and 16-bit formats).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/convert.h"
#include "core/dtype.h"
#include "core/error.h"

using namespace ropekv;

namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error("cannot open " + path);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const void* data, size_t size_bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size_bytes));
  if (!out) throw error("cannot write " + path);
}

overflow_mode parse_mode(const std::string& s) {
  if (s == "saturate") return overflow_mode::saturate;
  if (s == "ieee") return overflow_mode::ieee;
  throw arg_error("mode", "saturate or ieee", "'" + s + "'");
}

int run(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "encode" && argc == 7) {
    const std::string in_kind = argv[2];
    const dtype t = parse_dtype(argv[3], "dtype");
    const overflow_mode mode = parse_mode(argv[4]);
    if (!dtype_is_float(t)) throw arg_error("dtype", "a float dtype", argv[3]);
    const std::vector<char> in = read_file(argv[5]);
    const size_t in_size = in_kind == "f32" ? 4 : in_kind == "f64" ? 8 : 0;
    if (in_size == 0) throw arg_error("input kind", "f32 or f64", "'" + in_kind + "'");
    if (in.size() % in_size) throw arg_error("input file", "a multiple of " + std::to_string(in_size) + " bytes", std::to_string(in.size()));
    const size_t n = in.size() / in_size;
    const size_t out_size = dtype_size_bytes(t);
    std::vector<unsigned char> out(n * out_size);
    for (size_t i = 0; i < n; ++i) {
      uint32_t code;
      if (in_size == 4) {
        float x;
        std::memcpy(&x, in.data() + 4 * i, 4);
        code = encode_from_f32(t, x, mode);
      } else {
        double x;
        std::memcpy(&x, in.data() + 8 * i, 8);
        code = encode_from_f64(t, x, mode);
      }
      store_bits(t, out.data() + out_size * i, code);
    }
    write_file(argv[6], out.data(), out.size());
    return 0;
  }
  if (cmd == "decode" && argc == 4) {
    const dtype t = parse_dtype(argv[2], "dtype");
    if (!dtype_is_float(t) || dtype_size_bytes(t) > 2)
      throw arg_error("dtype", "an 8- or 16-bit float dtype", argv[2]);
    const uint32_t n = 1u << (8 * dtype_size_bytes(t));
    std::vector<double> out(n);
    for (uint32_t c = 0; c < n; ++c) out[c] = decode_to_f64(t, c);
    write_file(argv[3], out.data(), out.size() * sizeof(double));
    return 0;
  }
  std::fprintf(stderr,
               "usage: ropekv_convert_dump encode <f32|f64> <dtype> <saturate|ieee> IN OUT\n"
               "       ropekv_convert_dump decode <dtype> OUT\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const arg_error& e) {
    std::fprintf(stderr, "ropekv_convert_dump: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ropekv_convert_dump: %s\n", e.what());
    return 1;
  }
}
