// ropekv: one CLI with subcommands. The commands live in tools/cli.cpp (a library, so tests can
// drive them in-process).
#include "tools/cli.h"

int main(int argc, char** argv) { return ropekv::cli_main(argc, argv); }
