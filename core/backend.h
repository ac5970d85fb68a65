// The one backend interface that cpu (reference), sim and hip implement (ggml-style: every
// backend is compared with the reference on the same cases; "not supported" is reported).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/op.h"

namespace ropekv {

// A block of host memory that views of an op_args point into (a whole host_buffer, guards
// included). A device backend mirrors these regions, runs, and copies them back whole.
struct memory_region {
  void* base;
  size_t size_bytes;
};

class backend {
 public:
  virtual ~backend() = default;
  virtual std::string name() const = 0;
  // Why this backend cannot run these args ("" when it can). Never silently computes something
  // else: a case it does not cover is reported here.
  virtual std::string unsupported_reason(const op_args& args) const = 0;
  // Runs the op on views in host memory. `regions` cover every byte the views can touch.
  // Validates first (core/validate.h): a failed call writes nothing. A backend that learns only
  // here that it does not cover the args (a user's kernel saying so) throws unsupported_error
  // before writing anything: the harness reports the case SKIPPED, not ERRORED.
  virtual void run_host(const op_args& args, const std::vector<memory_region>& regions) = 0;
  // The repro string of the case the next run_host calls belong to (the harness says it before
  // running a case): for backends that hand the problem on, e.g. to a user's Python kernel.
  virtual void set_case_repro(const std::string& repro) {}
  // Which kernel variant ran last (for reports); "" when not meaningful.
  virtual std::string last_variant() const { return {}; }
  // One line describing the device (for `ropekv info` and bench JSON).
  virtual std::string device_description() const { return {}; }
};

using backend_factory = std::function<std::unique_ptr<backend>()>;

}  // namespace ropekv
