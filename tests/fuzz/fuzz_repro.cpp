// libFuzzer target: the repro-string parser. Any input either parses or throws ropekv::error;
// a parsed problem prints a repro that parses back to the same problem and prints identically.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/problem.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ropekv::problem p;
  try {
    p = ropekv::parse_problem(text);
  } catch (const ropekv::error&) {
    return 0;
  }
  const std::string printed = p.to_repro();
  const ropekv::problem back = ropekv::parse_problem(printed);
  if (back != p || back.to_repro() != printed) {
    std::fprintf(stderr, "round trip broke:\n  input:   %s\n  printed: %s\n  again:   %s\n",
                 text.c_str(), printed.c_str(), back.to_repro().c_str());
    std::abort();
  }
  return 0;
}
