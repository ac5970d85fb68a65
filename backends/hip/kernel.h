// The fused MLA kernel bodies: RoPE + paged KV-cache write + q concat (core/SPEC.md).
//
// Device code that compiles three ways (backends/hip/gpu_compat.h): hipcc, nvcc, and host C++
// for the simulation (backends/sim includes it unchanged). None of it includes anything from
// core/: the kernel carries its own conversions and cache addressing, so that the reference
// (backends/cpu, core/convert) and the kernel are independent and checked against each other.
//
// Two kernel bodies; launch_plan.h picks one per call: fast_v4 where its preconditions hold
// (rk_v4_refusal), else the general body. This header is the one include for both; the code
// lives in these files, each included here in dependency order:
//   kernel_dtype.h    rk_dtype codes, rk_size_bytes, rk_is_fp8; ROPEKV_MUTATION's default
//   kernel_convert.h  fp32 <-> f16 / bf16 / fp8 (rk_encode, rk_decode, rk_to_output, ...), 16-bit
//                     NaN canonicalisation, fp8_ds_mla tile scales (the branch-free per-format
//                     encoders they call are fp8_encode.h's)
//   kernel_cache.h    rk_paged_part / rk_paged_cache: all paged-cache address arithmetic;
//                     rk_div_u32; the fp8_ds_mla record offsets
//   kernel_params.h   rk_params and the small helpers of both bodies (index loads, scales,
//                     alignment)
//   kernel_general.h  the general body: rk_fused_body, rk_general_q, rk_write_cache,
//                     rk_write_ds_mla_entry (variant fused_v1)
//   kernel_fast.h     fast_v4: rk_fast4_body, its row functions, its fp8_ds_mla rows, rk_v4_spec
//
// Planted bugs for the mutation tests (ROPEKV_MUTATION, default 0 = correct kernel):
//   1: off-by-one in the cache entry offset (one element past the entry start),
//   2: wrong rope partner for neox (i pairs with Dr - 1 - i instead of i + Dr/2),
//   3: dropped vector tail (the last, partial chunk of a nope row is not written; fast_v4,
//      whose rows have no partial chunk: the last chunk of every nope row is not written).
// Mutation 2 acts on fast_v4 through the shared rk_rope4_f; mutation 1 through the shared
// rk_paged_cache::entry makes fast_v4's vector stores misaligned, so the plan refuses fast_v4
// and the general body carries it.
#pragma once

#include "backends/hip/kernel_dtype.h"
#include "backends/hip/kernel_convert.h"
#include "backends/hip/kernel_cache.h"
#include "backends/hip/kernel_params.h"
#include "backends/hip/kernel_general.h"
#include "backends/hip/kernel_fast.h"
