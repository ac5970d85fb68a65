/* ropekv plugin ABI: a user's kernel for the fused MLA op (core/SPEC.md, "RoPE + paged KV-cache
 * write + q concat") in a shared library that ropekv loads by path (`--backends ref,plugin:PATH`,
 * `golden check --backend plugin:PATH`, `bench --backend plugin:PATH`) and judges against its
 * reference.
 *
 * Plain C (C99 and C++). Rules (docs/cpp.md, "The plugin ABI"):
 * - Every code below is a fixed number written here; codes are never renumbered or reused. New
 *   codes get new numbers; a change that breaks a plugin bumps ROPEKV_PLUGIN_ABI_VERSION.
 * - Sizes and strides are int64 and counted in ELEMENTS of the tensor's dtype, not bytes.
 * - ropekv owns every tensor's memory; a plugin must not free, keep or write outside the output
 *   tensors (q_out, the cache(s), and q_pe / k_pe with the in-place options). ropekv poisons
 *   outputs and checks guard bytes around every buffer: it never trusts the plugin about what it
 *   wrote.
 * - The `why` / `msg` buffers belong to ropekv; write a NUL-terminated message of at most
 *   `size` bytes (truncate) and keep no pointer to them.
 * - ropekv calls one loaded plugin from one thread at a time; the plugin may use threads of its
 *   own inside a call but must have finished writing when ropekv_plugin_run returns (a GPU
 *   plugin: the work may be queued on `stream`; ropekv synchronises the stream).
 */
#ifndef ROPEKV_PLUGIN_H
#define ROPEKV_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define ROPEKV_PLUGIN_EXTERN_C extern "C"
#else
#define ROPEKV_PLUGIN_EXTERN_C
#endif
#if defined(_WIN32)
#define ROPEKV_PLUGIN_EXPORT ROPEKV_PLUGIN_EXTERN_C __declspec(dllexport)
#else
#define ROPEKV_PLUGIN_EXPORT ROPEKV_PLUGIN_EXTERN_C __attribute__((visibility("default")))
#endif

/* The version of this header's structs and entry points; ropekv_plugin_abi_version() returns it. */
#define ROPEKV_PLUGIN_ABI_VERSION 1

/* Maximum tensor rank. */
#define ROPEKV_PLUGIN_MAX_RANK 4

/* dtype codes (ropekv_tensor.dtype). */
#define ROPEKV_DTYPE_F32 0
#define ROPEKV_DTYPE_F16 1
#define ROPEKV_DTYPE_BF16 2
#define ROPEKV_DTYPE_FP8_E4M3FN 3
#define ROPEKV_DTYPE_FP8_E4M3FNUZ 4
#define ROPEKV_DTYPE_FP8_E5M2 5
#define ROPEKV_DTYPE_FP8_E5M2FNUZ 6
#define ROPEKV_DTYPE_I32 7
#define ROPEKV_DTYPE_I64 8
#define ROPEKV_DTYPE_U8 9

/* device kinds (ropekv_tensor.device, ropekv_plugin_device()). */
#define ROPEKV_DEVICE_HOST 0
#define ROPEKV_DEVICE_GPU 1

/* option codes (ropekv_plugin_args). */
#define ROPEKV_ROPE_GPTJ 0 /* pairs (2i, 2i + 1) */
#define ROPEKV_ROPE_NEOX 1 /* pairs (i, i + Dr/2) */
#define ROPEKV_TABLE_ONE 0 /* cos_sin [P, Dr]: Dr/2 cos then Dr/2 sin */
#define ROPEKV_TABLE_TWO 1 /* cos [P, Dr/2] and sin [P, Dr/2] */
#define ROPEKV_LAYOUT_JOINT 0 /* cache [num_blocks, block_size, Dn + Dr] */
#define ROPEKV_LAYOUT_SPLIT 1 /* ckv_cache [.., Dn] and kpe_cache [.., Dr] */
#define ROPEKV_LAYOUT_SHUFFLED 2 /* cache [num_blocks, block_size, Dn + Dr], AITER's 16-entry tiles (core/SPEC.md) */
#define ROPEKV_ORDER_NOPE_FIRST 0
#define ROPEKV_ORDER_ROPE_FIRST 1
#define ROPEKV_SCALE_DIVIDE 0     /* v / scale */
#define ROPEKV_SCALE_RECIPROCAL 1 /* v * fp32(1 / scale) */
#define ROPEKV_PAD_Q_COMPUTED 0   /* q rows of padding tokens (slot < 0) are written */
#define ROPEKV_PAD_Q_SKIPPED 1    /* ... are left as they were */
#define ROPEKV_POS_OOB_ERROR 0
#define ROPEKV_POS_OOB_CLAMP 1

/* return codes of ropekv_plugin_run. */
#define ROPEKV_PLUGIN_OK 0
#define ROPEKV_PLUGIN_ERROR 1       /* failed; msg says why: the case is ERRORED */
#define ROPEKV_PLUGIN_UNSUPPORTED 2 /* learned only now that it does not cover the case, nothing
                                       written: the case is SKIPPED */

/* A strided view of memory that ropekv owns. An absent optional tensor has data == NULL and
 * rank == 0. */
typedef struct ropekv_tensor {
  void* data;
  int32_t dtype;  /* ROPEKV_DTYPE_* */
  int32_t rank;   /* 0..ROPEKV_PLUGIN_MAX_RANK */
  int64_t sizes[ROPEKV_PLUGIN_MAX_RANK];
  int64_t strides[ROPEKV_PLUGIN_MAX_RANK]; /* in elements; the innermost is 1 */
  int32_t device; /* ROPEKV_DEVICE_* */
  int32_t reserved; /* 0 */
} ropekv_tensor;

/* One call of the op (core/SPEC.md notation: Tq, Ts, Tk, H, Dn, Dr, P). One kv head: calls with
 * kv heads (core/SPEC.md "kv heads": [Tk, KH, D] k rows, [num_blocks, KH, block_size, D] caches)
 * never reach a plugin; ropekv reports them as not supported. */
typedef struct ropekv_plugin_args {
  uint32_t struct_size; /* sizeof(ropekv_plugin_args) of the caller */
  int32_t abi_version;  /* ROPEKV_PLUGIN_ABI_VERSION of the caller */
  ropekv_tensor q_nope;       /* [Tq, H, Dn]        f32|f16|bf16 */
  ropekv_tensor q_pe;         /* [Tq, H, Dr]        same dtype as q_nope */
  ropekv_tensor kv_c;         /* [Tk, Dn]           f32|f16|bf16 */
  ropekv_tensor k_pe;         /* [Tk, Dr]           same dtype as kv_c */
  ropekv_tensor positions;    /* [Tk]               i32|i64 */
  ropekv_tensor slot_mapping; /* [Ts]               i32|i64; < 0: padding */
  ropekv_tensor cos_sin;      /* [P, Dr]            table one, else absent */
  ropekv_tensor cos;          /* [P, Dr/2]          table two, else absent */
  ropekv_tensor sin;          /* [P, Dr/2]          table two, else absent */
  ropekv_tensor q_out;        /* [Tq, H, Dn + Dr]   f32|f16|bf16|fp8* */
  ropekv_tensor cache;        /* [num_blocks, block_size, Dn + Dr]  layout joint or shuffled, else absent */
  ropekv_tensor ckv_cache;    /* [num_blocks, block_size, Dn]       layout split, else absent */
  ropekv_tensor kpe_cache;    /* [num_blocks, block_size, Dr]       layout split, else absent */
  int32_t rope_style;   /* ROPEKV_ROPE_* */
  int32_t table_kind;   /* ROPEKV_TABLE_* */
  int32_t cache_layout; /* ROPEKV_LAYOUT_* */
  int32_t row_order;    /* ROPEKV_ORDER_* (joint layout) */
  int32_t scale_conv;   /* ROPEKV_SCALE_* */
  int32_t pad_q;        /* ROPEKV_PAD_Q_* */
  int32_t pos_oob;      /* ROPEKV_POS_OOB_* */
  int32_t inplace_q;    /* 1: write rope(q_pe) back into q_pe */
  int32_t inplace_k;    /* 1: write rope(k_pe) back into k_pe */
  float k_scale;        /* fp8 cache only */
  float q_scale;        /* fp8 q_out only */
} ropekv_plugin_args;

/* Entry points a plugin exports (ROPEKV_PLUGIN_EXPORT). Required: abi_version, supports, run.
 * Optional: device (absent: host). */

/* Returns ROPEKV_PLUGIN_ABI_VERSION of the header the plugin was compiled with. */
typedef int (*ropekv_plugin_abi_version_fn)(void);
/* 1 when the plugin covers these args; 0 when not, with a reason in `why`
 * ("not supported: fp8 q_out"). Must not write any tensor. For a GPU plugin the tensors say
 * ROPEKV_DEVICE_GPU but point at ropekv's host copy of the case, which has the same alignment
 * modulo 256 as the device copy run() gets: read sizes, strides, dtypes and alignment, never the
 * data. */
typedef int (*ropekv_plugin_supports_fn)(const ropekv_plugin_args* args, char* why, size_t why_size);
/* Runs the op. `stream`: NULL for a host plugin; the hipStream_t / cudaStream_t for a GPU one.
 * Returns ROPEKV_PLUGIN_OK, or another ROPEKV_PLUGIN_* code with a message in `msg`. */
typedef int (*ropekv_plugin_run_fn)(const ropekv_plugin_args* args, void* stream, char* msg,
                                    size_t msg_size);
/* ROPEKV_DEVICE_HOST or ROPEKV_DEVICE_GPU: where the plugin wants its tensors. A GPU plugin
 * needs a GPU build of ropekv (hip backend): ropekv copies each case to device memory, calls
 * run() with device pointers and its stream, waits for the stream and copies the case back; its
 * slots and positions were checked on the host before. Without a GPU build or a visible GPU its
 * cases are "not supported". */
typedef int (*ropekv_plugin_device_fn)(void);

#define ROPEKV_PLUGIN_SYMBOL_ABI_VERSION "ropekv_plugin_abi_version"
#define ROPEKV_PLUGIN_SYMBOL_SUPPORTS "ropekv_plugin_supports"
#define ROPEKV_PLUGIN_SYMBOL_RUN "ropekv_plugin_run"
#define ROPEKV_PLUGIN_SYMBOL_DEVICE "ropekv_plugin_device"

#endif /* ROPEKV_PLUGIN_H */
