// libFuzzer target: the safetensors golden-file reader. Any byte string either reads as a
// golden file or throws ropekv::error; it never crashes or reads out of bounds (ASan).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "core/golden.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir ? dir : "/tmp") + "/ropekv-fuzz-golden-" + std::to_string(getpid()) +
           ".safetensors";
  }();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    ropekv::golden_file g = ropekv::read_golden(path);
    (void)g;
  } catch (const ropekv::error&) {
  }
  return 0;
}
