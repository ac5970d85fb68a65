#pragma once
#include <string>
#include <vector>

namespace ropekv {
// Runs the CLI; returns the process exit code (0 ok, 1 test failure, 2 bad usage/input).
int cli_main(int argc, char** argv);
// Same, from a vector of arguments (argv[0] excluded), for in-process tests.
int cli_main(const std::vector<std::string>& args);
}  // namespace ropekv
