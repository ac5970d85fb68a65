#include "tools/backends_registry.h"

#include <map>
#include <mutex>

#include "backends/cpu/cpu_backend.h"
#include "backends/plugin/plugin_backend.h"
#include "backends/sim/sim_backend.h"
#include "core/error.h"
#include "tools/bench.h"
#if ROPEKV_HAVE_HIP
#include "backends/hip/hip_backend.h"
#endif

namespace ropekv {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
struct registered_backend {
  backend_factory factory;
  std::string replay_prefix;
};
// Backends registered at run time: a Python kernel (the Python package), test backends.
std::map<std::string, registered_backend>& test_backends() {
  static std::map<std::string, registered_backend> m;
  return m;
}

std::string compiled_list() {
  std::string s;
  for (const std::string& n : compiled_backend_names()) {
    s += (s.empty() ? "" : ", ") + n;
    if (n == "ref") s += " (alias cpu)";
  }
  return "one of " + s + ", plugin:PATH (a shared library, include/ropekv/plugin.h)";
}

// "plugin:PATH": a user's kernel in a shared library. PATH as given (the replay line repeats it).
constexpr std::string_view plugin_prefix = "plugin:";
bool is_plugin_name(std::string_view name) { return name.substr(0, plugin_prefix.size()) == plugin_prefix; }

}  // namespace

std::vector<std::string> compiled_backend_names() {
  std::vector<std::string> names = {"ref", "sim"};
#if ROPEKV_HAVE_HIP
  names.push_back("hip");
#endif
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const auto& [name, f] : test_backends()) names.push_back(name);
  return names;
}

std::string canonical_backend_name(std::string_view name) {
  if (name == "cpu" || name == "ref") return "ref";
  if (name == "sim") return "sim";
  if (is_plugin_name(name)) {
    if (name.size() == plugin_prefix.size())
      throw arg_error("backend", "plugin:PATH with the path of a plugin library", "'" + std::string(name) + "'");
    return std::string(name);
  }
  if (name == "hip") {
#if ROPEKV_HAVE_HIP
    return "hip";
#else
    throw arg_error("backend", compiled_list(),
                    "'hip', which is not compiled in (configure with -DROPEKV_GPU=nvidia or amd)");
#endif
  }
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    if (test_backends().count(std::string(name))) return std::string(name);
  }
  throw arg_error("backend", compiled_list(), "'" + std::string(name) + "'");
}

backend_factory find_backend(std::string_view name) {
  std::string canon = canonical_backend_name(name);
  if (canon == "ref") return [] { return make_cpu_backend(); };
  if (canon == "sim") return [] { return make_sim_backend(); };
  if (is_plugin_name(canon)) {
    std::string path = canon.substr(plugin_prefix.size());
#if ROPEKV_HAVE_HIP
    return [path] { return make_plugin_backend(path, make_hip_device_mirror); };
#else
    return [path] { return make_plugin_backend(path); };
#endif
  }
#if ROPEKV_HAVE_HIP
  if (canon == "hip") return [] { return make_hip_backend(); };
#endif
  std::lock_guard<std::mutex> lock(registry_mutex());
  return test_backends().at(canon).factory;
}

std::string default_other_backend() {
#if ROPEKV_HAVE_HIP
  return "hip";
#else
  return "sim";
#endif
}

void register_backend(const std::string& name, backend_factory factory, const std::string& replay_prefix) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  test_backends()[name] = registered_backend{std::move(factory), replay_prefix};
}

void register_test_backend(const std::string& name, backend_factory factory) {
  register_backend(name, std::move(factory), "");
}

void unregister_test_backend(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  test_backends().erase(name);
}

fuzz_options with_registry(fuzz_options opt) {
  if (!opt.factory_a) opt.factory_a = find_backend(opt.backend_a);
  if (!opt.factory_b) opt.factory_b = find_backend(opt.backend_b);
  if (!opt.apply_variant) opt.apply_variant = set_kernel_variant;
  if (opt.replay_prefix.empty()) {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto it = test_backends().find(opt.backend_b);
    if (it != test_backends().end()) opt.replay_prefix = it->second.replay_prefix;
  }
  return opt;
}

}  // namespace ropekv
