// Placeholder until the subcommands land (issue #2/#4).
#include "tools/cli.h"

#include <cstdio>

namespace ropekv {
int cli_main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return cli_main(args);
}
int cli_main(const std::vector<std::string>& args) {
  std::fprintf(stderr, "ropekv: not built yet\n");
  return 2;
}
}  // namespace ropekv
