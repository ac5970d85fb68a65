// `ropekv fuzz --isolate`: a backend run in a forked child process, so that a kernel that
// crashes (a user's plugin dereferencing a bad pointer) costs one ERRORED case, not the campaign.
#pragma once
#include <memory>

#include "core/backend.h"

namespace ropekv {

// Wraps `inner`: every unsupported_reason and run_host call runs in a child process (fork). The
// child's writes come back through a pipe, region by region (`regions` cover every byte a run
// can write); its exceptions come back as the same kind (unsupported_error stays unsupported).
// A child that dies by a signal makes the call throw error("<name> crashed: SIGSEGV (signal 11)"),
// one that exits without reporting throws error("<name> exited with status N"). POSIX only.
// The child must not need threads that the parent started (OpenMP pools do not survive fork):
// isolate the backend under test, not the reference.
std::unique_ptr<backend> make_isolated_backend(std::unique_ptr<backend> inner);

}  // namespace ropekv
