// The one place that knows every backend: names -> factories. tools/ only (core knows none).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "core/backend.h"

namespace ropekv {

// Canonical names of the backends compiled into this binary, best last among the non-reference
// ones: "ref", "sim", and "hip" when built with ROPEKV_HAVE_HIP. Test backends come after.
std::vector<std::string> compiled_backend_names();

// "cpu" -> "ref"; other names unchanged. Throws arg_error("backend", <what is compiled in>, name)
// for a name that is unknown or known but not compiled in (hip without a GPU build).
std::string canonical_backend_name(std::string_view name);
backend_factory find_backend(std::string_view name);

// The best non-reference backend compiled in: hip > sim.
std::string default_other_backend();

// For tests only (the CLI never calls it): makes `name` resolvable by find_backend, so that
// cli_main can be driven with a deliberately broken backend. Replaces an earlier registration.
void register_test_backend(const std::string& name, backend_factory factory);
void unregister_test_backend(const std::string& name);

}  // namespace ropekv
