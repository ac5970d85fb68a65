// Test-only tool for tests/python/test_presets.py: writes a preset's YaRN inv_freq and cos|sin
// table as raw little-endian float32.
//   ropekv_yarn_dump <preset> <dr> <rows> <out_inv_freq.bin> <out_table.bin>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "core/presets.h"

namespace {
bool write_floats(const char* path, const std::vector<float>& v) {
  std::FILE* f = std::fopen(path, "wb");
  if (!f) return false;
  const size_t n = std::fwrite(v.data(), sizeof(float), v.size(), f);
  return std::fclose(f) == 0 && n == v.size();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s <preset> <dr> <rows> <inv_freq.bin> <table.bin>\n", argv[0]);
    return 2;
  }
  try {
    const ropekv::model_preset& m = ropekv::find_preset(argv[1]);
    const int64_t dr = std::stoll(argv[2]);
    const int64_t rows = std::stoll(argv[3]);
    if (!write_floats(argv[4], ropekv::yarn_inv_freq_f32(m.yarn, dr)) ||
        !write_floats(argv[5], ropekv::yarn_cos_sin_f32(m.yarn, dr, rows))) {
      std::fprintf(stderr, "cannot write output\n");
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
