// The GPU backend: the fused kernel of backends/hip/kernel.h compiled by hipcc (AMD) or nvcc
// (NVIDIA, through gpu_compat.h). Host-only header: no GPU headers leak to its users.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/op.h"

namespace ropekv {

// Always returns a backend; without a usable GPU its unsupported_reason() says
// "not supported: hip: <why>" for every case.
std::unique_ptr<backend> make_hip_backend();
// The GPU's device_mirror (core/backend.h): a plugin that wants GPU memory runs through it.
// Creating one touches no device; its first run does.
std::unique_ptr<device_mirror> make_hip_device_mirror();
// "" when a GPU can be used, else why not (no device, driver error).
std::string hip_unavailable_reason();

// Raw device API: every view of `device_args` points into device memory (on_device = true).
// Validates shapes, dtypes, strides, overlaps and scales on the host (validate(args, false));
// slot and position VALUES are not read on the host. On the device, a slot >= num_blocks *
// block_size is not written (treated as padding for the cache) and, with pos_oob = error, a
// used token whose position is outside [0, P) writes nothing at all; no out-of-bounds access
// happens either way, but no error is reported: check values on the host (validate with
// check_values) when they can be wrong. Launches on `stream` (a hipStream_t / cudaStream_t;
// null = default stream), without host synchronisation or allocation: capturable in a graph.
// Ts == 0 launches nothing. Throws unsupported_error for a case the kernel does not cover and
// ropekv::error when the launch fails.
void hip_launch(const op_args& device_args, void* stream);

// `host_args` with every present view moved from its host region into a device mirror: region i
// lies at dev + offsets[i] (the views keep their offsets inside their region); on_device set.
// arg_error naming the view when one lies outside every region.
op_args rebase_to_device(const op_args& host_args, const std::vector<memory_region>& regions,
                         const std::vector<size_t>& offsets, char* dev);

// Name of the kernel variant hip_launch would run for these args.
std::string hip_variant(const op_args& args);

}  // namespace ropekv
