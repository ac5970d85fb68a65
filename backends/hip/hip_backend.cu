// nvcc entry point: the HIP source, compiled as CUDA through gpu_compat.h (no copy).
#include "backends/hip/hip_backend.hip"
