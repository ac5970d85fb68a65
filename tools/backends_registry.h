// The one place that knows every backend: names -> factories. tools/ only (core knows none).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"
#include "harness/fuzz.h"

namespace ropekv {

// Canonical names of the backends compiled into this binary, best last among the non-reference
// ones: "ref", "sim", and "hip" when built with ROPEKV_HAVE_HIP. Test backends come after.
std::vector<std::string> compiled_backend_names();

// "cpu" -> "ref"; other names unchanged. Throws arg_error("backend", <what is compiled in>, name)
// for a name that is unknown or known but not compiled in (hip without a GPU build).
std::string canonical_backend_name(std::string_view name);
backend_factory find_backend(std::string_view name);

// `opt` with factory_a / factory_b resolved from backend_a / backend_b (where not set already)
// and apply_variant = the kernel-variant override of hip and sim (tools/bench.h).
fuzz_options with_registry(fuzz_options opt);

// The best non-reference backend compiled in: hip > sim.
std::string default_other_backend();

// Makes `name` resolvable by find_backend (replacing an earlier registration): a backend that
// exists only at run time, e.g. the Python package's wrapper of a user's kernel. When it is the
// tested side of a campaign, replay lines start with `replay_prefix` ("" for the CLI's own
// "ropekv fuzz --backends A,B").
void register_backend(const std::string& name, backend_factory factory, const std::string& replay_prefix);
// For tests: register_backend without a replay prefix (cli_main driven with a broken backend).
void register_test_backend(const std::string& name, backend_factory factory);
void unregister_test_backend(const std::string& name);

}  // namespace ropekv
