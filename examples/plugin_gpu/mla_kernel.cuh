// The fused MLA op (core/SPEC.md: RoPE + paged KV-cache write + q concat) as a CUDA kernel, the
// way a user writes one: no ropekv code, only the option and dtype codes of ropekv/plugin.h.
//
// Everything here is the kernel's per-thread body, written as MLA_HD functions: with nvcc they
// are __host__ __device__ (plugin_gpu.cu wraps mla_token_thread in a __global__ kernel); with
// g++ they are plain C++ (plugin_emulated.cpp runs the same body in loops over blocks and
// threads, so CI, which has no GPU, fuzzes this very source).
//
// The grid: one block per slot-mapped token t < Ts (tokens t >= Ts are CUDA-graph padding and
// are never touched). The threads of a block stride over
//   - q:     H heads x (Dn nope copies + Dr/2 rope pairs) of q_out[t], when t's q row is computed;
//   - cache: Dn nope copies + Dr/2 rope pairs of the cache entry slot_mapping[t], when it is >= 0.
// A rope pair is one work item, so the thread that reads q_pe[t, h, a] and q_pe[t, h, b] is the
// one that writes them back (in-place rope). No thread reads what another thread writes, and
// there is no barrier: running the threads one after the other (the emulation) gives exactly
// what the GPU gives.
//
// Arithmetic (the same as examples/plugin_cpu): every operand is decoded exactly to double;
// rope is `x*C - y*S`, `y*C + x*S` in double (each product of two values of at most 24
// significant bits is exact in double, so whether the compiler contracts into an fma does not
// change a bit); then one rounding, to nearest even, into the output dtype by our own encoder
// (bit manipulation only: no libm, identical on host and device).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "ropekv/plugin.h"

#if defined(__CUDACC__)
#define MLA_HD __host__ __device__
#else
#define MLA_HD
#endif

// A dispatch on a value that supports() excluded: stop loudly, never guess.
#if defined(__CUDA_ARCH__)
#define MLA_TRAP() __trap()
#else
#define MLA_TRAP() std::abort()
#endif

// Threads per block, shared by the launch (plugin_gpu.cu) and the emulation (plugin_emulated.cpp).
constexpr int mla_block_dim = 256;

// ----------------------------------------------------------------- the kernel's arguments

// A strided view of one tensor: element (i0, i1, i2) is data[offset + i0 * stride[0] +
// i1 * stride[1] + i2 * stride[2]], counted in elements of dtype (strides of dims beyond the
// tensor's rank are 0). `offset` selects columns: the sin half of a table `one`, the rope or
// nope part of a joint cache entry.
struct mla_view {
  void* data;
  int32_t dtype;  // ROPEKV_DTYPE_*
  int64_t offset;
  int64_t stride[3];
};

// Everything the kernel reads, by value (a kernel parameter: about 600 bytes).
struct mla_params {
  mla_view q_nope;        // [Tq, H, Dn]                     f32|f16|bf16
  mla_view q_pe;          // [Tq, H, Dr]                     same dtype; written back with inplace_q
  mla_view kv_c;          // [Tk, Dn]                        f32|f16|bf16
  mla_view k_pe;          // [Tk, Dr]                        same dtype; written back with inplace_k
  mla_view positions;     // [Tk]                            i32|i64
  mla_view slot_mapping;  // [Ts]                            i32|i64; < 0: padding
  mla_view cos;           // [P, Dr/2]  table two's cos, or table one's columns [0, Dr/2)
  mla_view sin;           // [P, Dr/2]  table two's sin, or table one's columns [Dr/2, Dr)
  mla_view q_out;         // [Tq, H, Dn + Dr]                f32|f16|bf16
  mla_view nope_cache;    // [num_blocks, block_size, Dn]    split: ckv_cache; joint: the nope columns
  mla_view rope_cache;    // [num_blocks, block_size, Dr]    split: kpe_cache; joint: the rope columns
  int64_t tq, ts, heads, dn, dr, table_rows, block_size;
  int32_t rope_style, pad_q, pos_oob, inplace_q, inplace_k;
};

MLA_HD inline int64_t mla_at(const mla_view& v, int64_t i0, int64_t i1 = 0, int64_t i2 = 0) {
  return v.offset + i0 * v.stride[0] + i1 * v.stride[1] + i2 * v.stride[2];
}

// ----------------------------------------------------------------- bits <-> floating point

MLA_HD inline uint64_t mla_bits_of(double v) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(v));
#else
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
#endif
}

MLA_HD inline double mla_double_of(uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(b));
#else
  double v;
  std::memcpy(&v, &b, sizeof v);
  return v;
#endif
}

MLA_HD inline uint32_t mla_bits_of(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
#endif
}

MLA_HD inline float mla_float_of(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
#endif
}

// Number of significant bits of x > 0.
MLA_HD inline int mla_bit_length(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return 64 - __clzll(static_cast<long long>(x));
#else
  return 64 - __builtin_clzll(x);
#endif
}

// 2^k as a double, for k in [-1022, 1023] (a normal double: just the exponent field).
MLA_HD inline double mla_pow2(int k) { return mla_double_of(static_cast<uint64_t>(k + 1023) << 52); }

// f32 -> double. Exact; a NaN keeps its sign (built by hand: a conversion instruction may give
// the canonical, positive NaN, and the contract moves a NaN with its sign).
MLA_HD inline double mla_decode_f32(float f) {
  const uint32_t b = mla_bits_of(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) {
    return mla_double_of((static_cast<uint64_t>(b >> 31) << 63) | 0x7ff8000000000000ull);
  }
  return static_cast<double>(f);
}

// double -> f32, rounded once to nearest even (the conversion instruction does that on host and
// device); a NaN becomes the quiet NaN of its sign.
MLA_HD inline float mla_encode_f32(double v) {
  const uint64_t b = mla_bits_of(v);
  if ((b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull) {
    return mla_float_of((static_cast<uint32_t>(b >> 63) << 31) | 0x7fc00000u);
  }
  return static_cast<float>(v);
}

// A 16-bit IEEE-style format with kExp exponent bits and kMan mantissa bits: f16 is <5, 10>,
// bf16 is <8, 7>. Decoding is exact (every such value is a double).
template <int kExp, int kMan>
MLA_HD inline double mla_decode16(uint16_t bits) {
  constexpr int bias = (1 << (kExp - 1)) - 1;
  const uint64_t sign = static_cast<uint64_t>(bits >> 15) << 63;
  const int e = (bits >> kMan) & ((1 << kExp) - 1);
  const uint64_t m = bits & ((1u << kMan) - 1);
  if (e == (1 << kExp) - 1) {  // inf (m == 0) or NaN (made quiet, payload and sign kept)
    return mla_double_of(sign | 0x7ff0000000000000ull | (m << (52 - kMan)) | (m ? 1ull << 51 : 0));
  }
  if (e == 0) {  // zero or subnormal: m * 2^(1 - bias - kMan), exact
    const double v = static_cast<double>(m) * mla_pow2(1 - bias - kMan);
    return sign ? -v : v;
  }
  // normal: rebias the exponent, widen the mantissa
  return mla_double_of(sign | (static_cast<uint64_t>(e - bias + 1023) << 52) | (m << (52 - kMan)));
}

// v rounded once, to nearest even, into the 16-bit format <kExp, kMan>: overflow gives inf, a
// NaN gives the quiet NaN of its sign, +0 and -0 are kept. Integer arithmetic on v's bits: write
// |v| = sig * 2^lsb exactly, pick the format's spacing 2^(ex - kMan) at |v|'s binade (or the
// subnormal spacing), and round sig to a multiple of it.
template <int kExp, int kMan>
MLA_HD inline uint16_t mla_encode16(double v) {
  constexpr int bias = (1 << (kExp - 1)) - 1;
  constexpr int emin = 1 - bias, emax = (1 << kExp) - 2 - bias;
  const uint64_t b = mla_bits_of(v);
  const uint16_t sign = static_cast<uint16_t>((b >> 63) << 15);
  const uint16_t exp_all = static_cast<uint16_t>(((1 << kExp) - 1) << kMan);
  const int e = static_cast<int>((b >> 52) & 0x7ff);
  const uint64_t m = b & ((1ull << 52) - 1);
  if (e == 0x7ff) return static_cast<uint16_t>(sign | exp_all | (m ? 1u << (kMan - 1) : 0u));  // NaN, inf
  uint64_t sig;
  int lsb;
  if (e == 0) {  // double subnormal (or zero)
    if (m == 0) return sign;
    sig = m;
    lsb = -1074;
  } else {
    sig = m | (1ull << 52);
    lsb = e - 1075;
  }
  int ex = mla_bit_length(sig) - 1 + lsb;  // |v| in [2^ex, 2^(ex + 1))
  if (ex < emin) ex = emin;                // below the normals: the subnormal spacing
  // The spacing is 2^(ex - kMan); shift = how many low bits of sig lie below it. Always > 0: a
  // double carries 52 fraction bits, more than kMan, and the clamp only makes it larger.
  const int shift = ex - kMan - lsb;
  uint64_t n = 0;  // |v| / spacing, rounded to nearest even
  if (shift < 64) {  // else |v| < a quarter of the spacing (sig < 2^53): rounds to 0
    n = sig >> shift;
    const uint64_t rem = sig & ((1ull << shift) - 1), half = 1ull << (shift - 1);
    if (rem > half || (rem == half && (n & 1))) ++n;
  }
  if (n >> (kMan + 1)) {  // rounded up into the next binade: n == 2^(kMan + 1)
    n >>= 1;
    ++ex;
  }
  if (ex > emax) return static_cast<uint16_t>(sign | exp_all);           // overflow: inf
  if (n < (1ull << kMan)) return static_cast<uint16_t>(sign | n);         // subnormal (or 0)
  return static_cast<uint16_t>(sign | ((ex + bias) << kMan) | (n - (1ull << kMan)));  // normal
}

// ----------------------------------------------------------------- strided element access

// Element `off` of v, decoded exactly to double.
MLA_HD inline double mla_load(const mla_view& v, int64_t off) {
  switch (v.dtype) {
    case ROPEKV_DTYPE_F32: return mla_decode_f32(static_cast<const float*>(v.data)[off]);
    case ROPEKV_DTYPE_F16: return mla_decode16<5, 10>(static_cast<const uint16_t*>(v.data)[off]);
    case ROPEKV_DTYPE_BF16: return mla_decode16<8, 7>(static_cast<const uint16_t*>(v.data)[off]);
    default: MLA_TRAP(); return 0;  // supports() admits only these three
  }
}

// Stores x into element `off` of v, rounded once into v's dtype.
MLA_HD inline void mla_store(const mla_view& v, int64_t off, double x) {
  switch (v.dtype) {
    case ROPEKV_DTYPE_F32: static_cast<float*>(v.data)[off] = mla_encode_f32(x); return;
    case ROPEKV_DTYPE_F16: static_cast<uint16_t*>(v.data)[off] = mla_encode16<5, 10>(x); return;
    case ROPEKV_DTYPE_BF16: static_cast<uint16_t*>(v.data)[off] = mla_encode16<8, 7>(x); return;
    default: MLA_TRAP(); return;
  }
}

// Element i of a 1-D index tensor (positions, slot_mapping).
MLA_HD inline int64_t mla_load_index(const mla_view& v, int64_t i) {
  const int64_t off = mla_at(v, i);
  switch (v.dtype) {
    case ROPEKV_DTYPE_I32: return static_cast<const int32_t*>(v.data)[off];
    case ROPEKV_DTYPE_I64: return static_cast<const int64_t*>(v.data)[off];
    default: MLA_TRAP(); return -1;
  }
}

// ----------------------------------------------------------------- the op

// The table row of used token t: positions[t] when in [0, P); clamped with pos_oob = clamp.
// Returns false for an out-of-range position with pos_oob = error. The contract calls that an
// error found before anything is written, but a kernel cannot read device memory on the host
// before its launch without a costly copy and sync; so, like a real kernel, this one writes
// nothing for that token instead. ropekv validates every value on the host before it calls a
// plugin, so under ropekv this never happens (fuzzing never reaches it).
MLA_HD inline bool mla_position(const mla_params& p, int64_t t, int64_t* row) {
  const int64_t v = mla_load_index(p.positions, t);
  if (v >= 0 && v < p.table_rows) {
    *row = v;
    return true;
  }
  if (p.pos_oob != ROPEKV_POS_OOB_CLAMP || p.table_rows <= 0) return false;
  *row = v < 0 ? 0 : p.table_rows - 1;
  return true;
}

// Rope pair i of one row: src element (src_at + a) and (src_at + b), a and b by rope style, are
// rotated by the angle of table row `row`, column i, into dst at (dst_at + a), (dst_at + b).
// With `inplace`, the rotated values also go back into src (rounded into src's dtype).
MLA_HD inline void mla_rotate_pair(const mla_params& p, const mla_view& src, int64_t src_at, const mla_view& dst,
                                   int64_t dst_at, int64_t row, int64_t i, bool inplace) {
  const int64_t half = p.dr / 2;
  const int64_t ja = p.rope_style == ROPEKV_ROPE_GPTJ ? 2 * i : i;
  const int64_t jb = p.rope_style == ROPEKV_ROPE_GPTJ ? 2 * i + 1 : i + half;
  const double x = mla_load(src, src_at + ja), y = mla_load(src, src_at + jb);
  const double c = mla_load(p.cos, mla_at(p.cos, row, i)), s = mla_load(p.sin, mla_at(p.sin, row, i));
  const double ra = x * c - y * s, rb = y * c + x * s;  // products exact in double: one rounding each
  mla_store(dst, dst_at + ja, ra);
  mla_store(dst, dst_at + jb, rb);
  if (inplace) {
    mla_store(src, src_at + ja, ra);
    mla_store(src, src_at + jb, rb);
  }
}

// The body of thread `thread` (of `block_dim`) of block `block` (= token t < Ts).
MLA_HD inline void mla_token_thread(int64_t block, int64_t thread, int64_t block_dim, const mla_params& p) {
  const int64_t t = block;
  const int64_t slot = mla_load_index(p.slot_mapping, t);
  const bool write_cache = slot >= 0;
  const bool write_q = t < p.tq && (write_cache || p.pad_q == ROPEKV_PAD_Q_COMPUTED);
  if (!write_q && !write_cache) return;  // an unused token: its position is never read
  int64_t row = 0;
  if (!mla_position(p, t, &row)) return;  // out of range with pos_oob = error: see mla_position
  const int64_t half = p.dr / 2;

  // q_out[t, h] = [q_nope[t, h] | rope(q_pe[t, h])]: item i is head i / (Dn + Dr/2), then
  // nope column j < Dn or rope pair j - Dn
  if (write_q) {
    const int64_t per_head = p.dn + half;
    for (int64_t i = thread; i < p.heads * per_head; i += block_dim) {
      const int64_t h = i / per_head, j = i % per_head;
      if (j < p.dn) {
        mla_store(p.q_out, mla_at(p.q_out, t, h, j), mla_load(p.q_nope, mla_at(p.q_nope, t, h, j)));
      } else {
        mla_rotate_pair(p, p.q_pe, mla_at(p.q_pe, t, h, 0), p.q_out, mla_at(p.q_out, t, h, p.dn), row, j - p.dn,
                        p.inplace_q != 0);
      }
    }
  }

  // cache entry `slot` (block slot / block_size, entry slot % block_size) = [kv_c[t] | rope(k_pe[t])]:
  // item j is nope column j < Dn or rope pair j - Dn (the views place them: joint or split)
  if (write_cache) {
    const int64_t cache_block = slot / p.block_size, entry = slot % p.block_size;
    for (int64_t j = thread; j < p.dn + half; j += block_dim) {
      if (j < p.dn) {
        mla_store(p.nope_cache, mla_at(p.nope_cache, cache_block, entry, j), mla_load(p.kv_c, mla_at(p.kv_c, t, j)));
      } else {
        mla_rotate_pair(p, p.k_pe, mla_at(p.k_pe, t, 0), p.rope_cache, mla_at(p.rope_cache, cache_block, entry, 0),
                        row, j - p.dn, p.inplace_k != 0);
      }
    }
  }
}
