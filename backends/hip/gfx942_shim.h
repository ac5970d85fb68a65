// gfx942 compile-check shim (clang-19, -nogpulib): Debian's ROCm device libraries have no
// gfx942 build, so the few ockl functions that HIP's threadIdx/blockIdx/blockDim use are
// defined here from clang builtins. Only for the compile check (kernel_check.hip), never for a
// binary that runs. Force-included after the HIP runtime header.
#pragma once
#include <hip/hip_runtime.h>

extern "C" __device__ __attribute__((const)) size_t __ockl_get_local_id(uint dim) {
  return dim == 0 ? __builtin_amdgcn_workitem_id_x()
                  : dim == 1 ? __builtin_amdgcn_workitem_id_y() : __builtin_amdgcn_workitem_id_z();
}
extern "C" __device__ __attribute__((const)) size_t __ockl_get_group_id(uint dim) {
  return dim == 0 ? __builtin_amdgcn_workgroup_id_x()
                  : dim == 1 ? __builtin_amdgcn_workgroup_id_y() : __builtin_amdgcn_workgroup_id_z();
}
extern "C" __device__ __attribute__((const)) size_t __ockl_get_local_size(uint dim) {
  return dim == 0 ? __builtin_amdgcn_workgroup_size_x()
                  : dim == 1 ? __builtin_amdgcn_workgroup_size_y() : __builtin_amdgcn_workgroup_size_z();
}
// gridDim (unused by the kernels today; defined for completeness): work-groups per dimension =
// ceil(grid size / group size).
extern "C" __device__ __attribute__((const)) size_t __ockl_get_num_groups(uint dim) {
  const uint grid = dim == 0 ? __builtin_amdgcn_grid_size_x()
                             : dim == 1 ? __builtin_amdgcn_grid_size_y() : __builtin_amdgcn_grid_size_z();
  const uint group = static_cast<uint>(__ockl_get_local_size(dim));
  return (grid + group - 1) / group;
}
