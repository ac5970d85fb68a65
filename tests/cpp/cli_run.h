// The CLI run in-process for tests: exit code and both streams of one command line.
#pragma once
#include <sstream>
#include <string>
#include <vector>

#include "tools/cli.h"

namespace ropekv::test {

struct cli_result {
  int rc;
  std::string out, err;
};

inline cli_result cli(std::vector<std::string> args) {
  std::ostringstream out, err;
  const int rc = cli_main(args, out, err);
  return {rc, out.str(), err.str()};
}

}  // namespace ropekv::test
