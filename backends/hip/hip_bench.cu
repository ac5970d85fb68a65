// nvcc entry point for the bench timing code: the HIP source, included (no copy).
#include "backends/hip/hip_bench.hip"
