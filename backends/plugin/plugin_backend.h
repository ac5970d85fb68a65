// A backend that runs a user's kernel from a shared library implementing the plugin ABI
// (include/ropekv/plugin.h). The CLI's backend name `plugin:PATH` (tools/backends_registry.cpp).
#pragma once
#include <memory>
#include <string>

#include "core/backend.h"
#include "core/op.h"
#include "ropekv/plugin.h"

namespace ropekv {

// Loads the library at `path` (dlopen; a path without '/' is searched like dlopen does) and
// checks its entry points and ABI version. Throws arg_error naming "plugin PATH" with expected
// vs got (not loadable, a symbol missing, another ABI version). The library stays loaded.
// The backend's name is "plugin:PATH". `gpu` makes the device copies a plugin that wants GPU
// memory (ropekv_plugin_device() == ROPEKV_DEVICE_GPU) runs on; without it such a plugin's
// cases are "not supported".
std::unique_ptr<backend> make_plugin_backend(const std::string& path, device_mirror_factory gpu = {});

// The ABI descriptor of `args` (every view: data, dtype code, rank, sizes, strides in elements,
// device kind). Throws error for a dtype or option without an ABI code (none today).
ropekv_plugin_args to_plugin_args(const op_args& args);
// The ABI code of a dtype / back (arg_error naming `arg_name` for a code ropekv does not know).
int32_t plugin_dtype_code(dtype t);
dtype dtype_of_plugin_code(int32_t code, const char* arg_name);

}  // namespace ropekv
