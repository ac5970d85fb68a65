// ropekv's own GPU compatibility header (vLLM cuda_compat.h style: wrap only what differs).
//
// The kernel source is written against HIP names. Three compilers see it:
//   - hipcc / clang -x hip (__HIP__ or __HIPCC__): <hip/hip_runtime.h>, nothing renamed;
//   - nvcc (__CUDACC__): the few HIP runtime names we use are mapped to CUDA;
//   - the host C++ simulation (ROPEKV_SIM): the device-side names the kernel body uses
//     (threadIdx, blockIdx, blockDim, gridDim, __device__, __forceinline__, the float helpers
//     and vector memory accesses) get host definitions; the sim launcher sets the index
//     variables before it calls the body.
// Kernel code uses only the ROPEKV_* macros below for float arithmetic and vector memory
// access, so the three builds execute the same operations; exceptions, the same bits by other
// instructions: the sim's 16-byte NaN test (ROPEKV_ANY_CARRY15_16X8, SSE2 on x86) and its
// 16-byte stores (non-temporal on x86: rk_store_words).
#pragma once
#include <cstdint>

#if defined(ROPEKV_SIM)
// ---------------------------------------------------------------- host simulation
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

// always_inline, as __forceinline__ on the GPU: the kernel body is one inlined function per
// (block, thread) call, so its helpers (vector loads, NaN canonicalisation, rope) are not
// out-of-line calls with constant arguments (a 16-byte rk_load_words is one 16-byte move only
// once inlined). Code generation only: the operations executed are the same.
#define ROPEKV_DEVICE inline __attribute__((always_inline))
#define ROPEKV_HOST_DEVICE inline __attribute__((always_inline))
#define ROPEKV_FORCEINLINE inline __attribute__((always_inline))
#define ROPEKV_UNROLL

struct rk_dim3 {
  uint32_t x = 1, y = 1, z = 1;
};
// Set by the sim launcher (backends/sim) for the block and thread being executed.
inline thread_local rk_dim3 threadIdx;
inline thread_local rk_dim3 blockIdx;
inline thread_local rk_dim3 blockDim;
inline thread_local rk_dim3 gridDim;

// Each operation is one IEEE binary32 operation: the sim is compiled with -ffp-contract=off,
// so a multiply is never fused into a neighbouring add; std::fmaf is the correctly rounded fma.
#define ROPEKV_FMUL_RN(a, b) ((float)(a) * (float)(b))
#define ROPEKV_FDIV_RN(a, b) ((float)(a) / (float)(b))
#define ROPEKV_FMAF(a, b, c) std::fmaf((a), (b), (c))
#define ROPEKV_DMUL_RN(a, b) ((double)(a) * (double)(b))
#define ROPEKV_DDIV_RN(a, b) ((double)(a) / (double)(b))
#define ROPEKV_DFMA_RN(a, b, c) std::fma((double)(a), (double)(b), (double)(c))
// An approximate fp32 reciprocal (the GPUs' one-instruction, 1-ulp reciprocal): the correctly
// rounded one here. Only for code whose result does not depend on which approximation it gets.
#define ROPEKV_FRCP_APPROX(a) (1.0f / (float)(a))

// Vector accesses of 4, 8 or 16 bytes. A GPU faults (or silently misbehaves) on a misaligned
// vector access; the sim aborts loudly instead, so alignment logic is tested on the CPU.
[[noreturn]] __attribute__((noinline, cold)) inline void rk_sim_misaligned(const void* p, int bytes,
                                                                           const char* what) {
  std::fprintf(stderr, "ropekv sim: misaligned %d-byte vector %s at %p\n", bytes, what, p);
  std::abort();
}
inline __attribute__((always_inline)) void rk_sim_check_align(const void* p, int bytes, const char* what) {
  if (__builtin_expect((reinterpret_cast<uintptr_t>(p) & static_cast<uintptr_t>(bytes - 1)) != 0, 0)) {
    rk_sim_misaligned(p, bytes, what);
  }
}
inline __attribute__((always_inline)) void rk_load_words(const void* p, int bytes, uint32_t* w) {
  rk_sim_check_align(p, bytes, "load");
  std::memcpy(w, p, static_cast<size_t>(bytes));
}
// Stored word by word (the same bytes): the words are mostly just computed in registers (NaN
// canonicalisation, packing), and one 16-byte move would read them back from the stack, where
// they were spilled as 4- and 8-byte stores: a wider load over narrower stores is not
// forwarded and waits for them to retire (~45% of the sim's time at deepseek-v3-tp8 x 4096).
// On x86 a 16-byte store is one non-temporal store of the four words (assembled in a register):
// the outputs are written once and not read again by the launch, so they skip the read for
// ownership that an ordinary store costs (deepseek-v3-tp8 x 4096, 2 threads: 13.8-14.2 ->
// 9.1-9.6 ms). Non-temporal stores are weakly ordered between threads: each OpenMP thread of the
// grid loop ends its share with rk_sim_store_fence, before the region's barrier; its own later
// loads see them in program order.
inline __attribute__((always_inline)) void rk_store_words(void* p, int bytes, const uint32_t* w) {
  rk_sim_check_align(p, bytes, "store");
#if defined(__SSE2__)
  if (bytes == 16) {
    _mm_stream_si128(static_cast<__m128i*>(p), _mm_set_epi32(static_cast<int>(w[3]), static_cast<int>(w[2]),
                                                            static_cast<int>(w[1]), static_cast<int>(w[0])));
    return;
  }
#endif
  for (int i = 0; i < bytes / 4; ++i) std::memcpy(static_cast<char*>(p) + 4 * i, w + i, 4);
}
// Orders this thread's rk_store_words stores before what follows (the grid loop calls it at the
// end of each OpenMP thread's share, before the region's barrier).
inline void rk_sim_store_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}
// A store with an L2 keep hint (see the GPU section): a plain store in the simulation.
inline __attribute__((always_inline)) void rk_store_words_keep_l2(void* p, int bytes, const uint32_t* w) {
  rk_store_words(p, bytes, w);
}
// Programmatic dependent launch (see the GPU section): nothing to wait for in the simulation.
inline void rk_pdl_wait() {}
inline void rk_pdl_trigger() {}

#else
// ---------------------------------------------------------------- real GPU compilers
#if defined(__CUDACC__) && !defined(__HIP__)
#include <cuda_runtime.h>
// HIP runtime names used by backends/hip, mapped to CUDA.
#define hipStream_t cudaStream_t
#define hipError_t cudaError_t
#define hipSuccess cudaSuccess
#define hipMalloc cudaMalloc
#define hipFree cudaFree
#define hipMemcpy cudaMemcpy
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemcpyHostToDevice cudaMemcpyHostToDevice
#define hipMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define hipStreamSynchronize cudaStreamSynchronize
#define hipDeviceSynchronize cudaDeviceSynchronize
#define hipGetLastError cudaGetLastError
#define hipGetErrorString cudaGetErrorString
#define hipGetDevice cudaGetDevice
#define hipGetDeviceCount cudaGetDeviceCount
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipDeviceProp_t cudaDeviceProp
#define hipDriverGetVersion cudaDriverGetVersion
#define hipRuntimeGetVersion cudaRuntimeGetVersion
// timing (backends/hip/hip_bench.hip)
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipMemset cudaMemset
#define hipMemGetInfo cudaMemGetInfo
#define hipStreamCreate cudaStreamCreate
#define hipStreamDestroy cudaStreamDestroy
#define hipEvent_t cudaEvent_t
#define hipEventCreate cudaEventCreate
#define hipEventDestroy cudaEventDestroy
#define hipEventRecord cudaEventRecord
#define hipEventSynchronize cudaEventSynchronize
#define hipEventElapsedTime cudaEventElapsedTime
#define hipGraph_t cudaGraph_t
#define hipGraphExec_t cudaGraphExec_t
#define hipStreamBeginCapture cudaStreamBeginCapture
#define hipStreamEndCapture cudaStreamEndCapture
#define hipStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
#define hipGraphInstantiateWithFlags cudaGraphInstantiateWithFlags
#define hipGraphLaunch cudaGraphLaunch
#define hipGraphExecDestroy cudaGraphExecDestroy
#define hipGraphDestroy cudaGraphDestroy
#else
#include <hip/hip_runtime.h>
#endif

#define ROPEKV_DEVICE __device__ __forceinline__
#define ROPEKV_HOST_DEVICE __host__ __device__ __forceinline__
#define ROPEKV_FORCEINLINE __forceinline__
#define ROPEKV_UNROLL _Pragma("unroll")

// Explicit round-to-nearest operations: no compiler may contract or reassociate them.
#define ROPEKV_FMUL_RN(a, b) __fmul_rn((a), (b))
#define ROPEKV_FDIV_RN(a, b) __fdiv_rn((a), (b))
#define ROPEKV_FMAF(a, b, c) __fmaf_rn((a), (b), (c))
#define ROPEKV_DMUL_RN(a, b) __dmul_rn((a), (b))
#define ROPEKV_DDIV_RN(a, b) __ddiv_rn((a), (b))
#define ROPEKV_DFMA_RN(a, b, c) __fma_rn((double)(a), (double)(b), (double)(c))
// An approximate fp32 reciprocal, max error 1 ulp for a normal input (CUDA rcp.approx.ftz.f32,
// AMD v_rcp_f32). Only for code whose result does not depend on which approximation it gets.
#if defined(__CUDACC__) && !defined(__HIP__)
__device__ __forceinline__ float rk_frcp_approx(float a) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}
#else
__device__ __forceinline__ float rk_frcp_approx(float a) { return __builtin_amdgcn_rcpf(a); }
#endif
#define ROPEKV_FRCP_APPROX(a) rk_frcp_approx((float)(a))

__device__ __forceinline__ void rk_load_words(const void* p, int bytes, uint32_t* w) {
  if (bytes == 16) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
  } else if (bytes == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x; w[1] = v.y;
  } else {
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  }
}
__device__ __forceinline__ void rk_store_words(void* p, int bytes, const uint32_t* w) {
  if (bytes == 16) {
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  } else if (bytes == 8) {
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  } else {
    *reinterpret_cast<uint32_t*>(p) = w[0];
  }
}

// rk_store_words with an L2 evict_last policy (CUDA, sm_80+: createpolicy + st.global.L2::cache_hint),
// for stores that fill only part of a 32-byte sector whose other part another thread writes
// later (the shuffled cache's 16-byte runs of random slots): the hint keeps the half-written
// sector in L2 until its partner arrives instead of letting streaming traffic evict it (a
// read-modify-write to memory). Same bytes stored; HIP and older CUDA targets: a plain store.
__device__ __forceinline__ void rk_store_words_keep_l2(void* p, int bytes, const uint32_t* w) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint64_t keep;
  // Not volatile: the policy is a pure value, so the compiler may create it once per thread
  // and reuse it for every store instead of once per store.
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
  if (bytes == 16) {
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(w[0]), "r"(w[1]),
                 "r"(w[2]), "r"(w[3]), "l"(keep)
                 : "memory");
  } else if (bytes == 8) {
    asm volatile("st.global.L2::cache_hint.v2.u32 [%0], {%1, %2}, %3;" ::"l"(p), "r"(w[0]), "r"(w[1]), "l"(keep)
                 : "memory");
  } else {
    asm volatile("st.global.L2::cache_hint.u32 [%0], %1, %2;" ::"l"(p), "r"(w[0]), "l"(keep) : "memory");
  }
#else
  rk_store_words(p, bytes, w);
#endif
}

// Programmatic dependent launch (CUDA, sm_90+): a kernel launched with the programmatic
// stream serialization attribute may start while the kernel before it in the stream is still
// running; rk_pdl_wait() (griddepcontrol.wait) blocks until that kernel has completed and its
// memory is visible, so a kernel that calls it before its first global access is correct after
// any predecessor. rk_pdl_trigger() lets the next such kernel start early. HIP has no
// equivalent: both are no-ops there and rk_launch_kernel launches plainly.
__device__ __forceinline__ void rk_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void rk_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
// Whether the current device takes programmatic dependent launches (CUDA, compute 9.0+).
inline bool rk_pdl_supported() {
#if defined(__CUDACC__) && !defined(__HIP__)
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
  return major >= 9;
#else
  return false;
#endif
}
template <class... Params, class... Args>
inline hipError_t rk_launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, hipStream_t stream,
                                   bool pdl, Args... args) {
#if defined(__CUDACC__) && !defined(__HIP__)
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
#else
  (void)pdl;
  kernel<<<grid, block, 0, stream>>>(args...);
  return hipGetLastError();
#endif
}
#endif

// fp32 <-> its bits, host and device alike (both compilers' intrinsics on a device pass, a
// memcpy on the host and in the sim). kernel.h and fp8_encode.h use these.
ROPEKV_HOST_DEVICE uint32_t rk_f32_bits(float v) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __float_as_uint(v);
#else
  uint32_t b;
  __builtin_memcpy(&b, &v, 4);
  return b;
#endif
}
ROPEKV_HOST_DEVICE float rk_bits_f32(uint32_t b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __uint_as_float(b);
#else
  float v;
  __builtin_memcpy(&v, &b, 4);
  return v;
#endif
}

// The NaN test of a 16-byte chunk of 16-bit values (kernel_convert.h rk_canon_nan16x8): whether
// any of the eight 16-bit lanes of w[0..4), its sign bit cleared, plus `add` (two copies of the
// lane's addend, one per half of each word) sets the lane's bit 15. The word form runs on the
// GPUs (five 32-bit operations and a test per chunk); the sim (x86) runs the same bit operations
// as four-word SSE2 vector ones: the word form was a fifth of the sim's instructions (callgrind,
// deepseek-v3-tp8 x 512), as g++ does not vectorise it inside the inlined kernel body.
// tests/cpp/test_kernel_helpers.cpp checks that both forms agree on every lane value.
ROPEKV_HOST_DEVICE bool rk_any_carry15_words(const uint32_t* w, uint32_t add) {
  return ((((w[0] & 0x7fff7fffu) + add) | ((w[1] & 0x7fff7fffu) + add) | ((w[2] & 0x7fff7fffu) + add) |
           ((w[3] & 0x7fff7fffu) + add)) &
          0x80008000u) != 0u;
}
#if defined(ROPEKV_SIM) && defined(__SSE2__)
ROPEKV_HOST_DEVICE bool rk_any_carry15_sse2(const uint32_t* w, uint32_t add) {
  __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  v = _mm_add_epi32(_mm_and_si128(v, _mm_set1_epi32(0x7fff7fff)), _mm_set1_epi32(static_cast<int>(add)));
  v = _mm_and_si128(v, _mm_set1_epi32(static_cast<int>(0x80008000u)));
  return _mm_movemask_epi8(_mm_cmpeq_epi32(v, _mm_setzero_si128())) != 0xffff;
}
#define ROPEKV_ANY_CARRY15_16X8 rk_any_carry15_sse2
#else
#define ROPEKV_ANY_CARRY15_16X8 rk_any_carry15_words
#endif

// The halfword-wise unsigned maximum of two words (bits 0-15 and 16-31 compared separately):
// one instruction on CUDA (__vmaxu2, sm_90: a 16x2 integer max), two selects elsewhere.
ROPEKV_HOST_DEVICE uint32_t rk_max_u16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __vmaxu2(a, b);
#else
  const uint32_t lo = (a & 0xffffu) > (b & 0xffffu) ? (a & 0xffffu) : (b & 0xffffu);
  const uint32_t hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
  return lo | (hi << 16);
#endif
}
