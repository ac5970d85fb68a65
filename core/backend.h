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

// Runs device code on a copy of a case: mirrors the host regions into device memory (each at
// the same address modulo 256 as on the host, so a kernel sees the same alignment), calls
// `launch` with the args rebased there (every present view on_device) and a stream, waits for
// the stream, and copies every region back whole. The GPU backend implements it; a backend that
// runs someone else's device code (a plugin) is handed one by the CLI, the one place that knows
// every backend. Errors (allocation, copies, a kernel fault found at the wait) throw ropekv::error.
class device_mirror {
 public:
  virtual ~device_mirror() = default;
  // "" when a device can be used, else why not ("hip: no GPU visible").
  virtual std::string unavailable_reason() const = 0;
  virtual void run(const op_args& host_args, const std::vector<memory_region>& regions,
                   const std::function<void(const op_args& device_args, void* stream)>& launch) = 0;
};
using device_mirror_factory = std::function<std::unique_ptr<device_mirror>()>;

}  // namespace ropekv
