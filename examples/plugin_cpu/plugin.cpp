// A user's kernel for the fused MLA op as a ropekv plugin: plain C++ written from core/SPEC.md,
// host memory, no ropekv code. It covers the common subset (f32 / f16 / bf16 inputs, tables and
// outputs, both cache layouts, in-place rope) and says "not supported: ..." for the rest (fp8
// outputs).
//
//   -DPLUGIN_PLANTED_BUG: the last rope pair of q reads the previous pair's cos / sin (a bug for
//                         ropekv fuzz to find and shrink)
//   -DPLUGIN_CRASH:       raises SIGSEGV on cases with Ts == 5 (for `ropekv fuzz --isolate`)
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ropekv/plugin.h"

namespace {

// ----------------------------------------------------------------- 16-bit float conversions

struct format16 {
  int exp_bits, man_bits, bias;
};
constexpr format16 f16_format{5, 10, 15};
constexpr format16 bf16_format{8, 7, 127};

double decode16(format16 f, uint16_t bits) {
  const bool neg = bits >> 15;
  const int e = (bits >> f.man_bits) & ((1 << f.exp_bits) - 1);
  const int m = bits & ((1 << f.man_bits) - 1);
  double v;
  if (e == (1 << f.exp_bits) - 1) {
    v = m ? NAN : INFINITY;
  } else if (e == 0) {
    v = std::ldexp(m, 1 - f.bias - f.man_bits);
  } else {
    v = std::ldexp(m + (1 << f.man_bits), e - f.bias - f.man_bits);
  }
  return neg ? -v : v;
}

// v rounded once, to nearest even, into the 16-bit format (overflow: inf; NaN: quiet NaN, sign kept).
uint16_t encode16(format16 f, double v) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const uint16_t exp_all = static_cast<uint16_t>(((1 << f.exp_bits) - 1) << f.man_bits);
  if (std::isnan(v)) return sign | exp_all | static_cast<uint16_t>(1 << (f.man_bits - 1));
  double a = std::fabs(v);
  if (std::isinf(a)) return sign | exp_all;
  if (a == 0) return sign;
  int e2;
  std::frexp(a, &e2);  // a = m * 2^e2, m in [0.5, 1)
  int ex = e2 - 1;     // a in [2^ex, 2^(ex + 1))
  const int emin = 1 - f.bias, emax = (1 << f.exp_bits) - 2 - f.bias;
  if (ex < emin) ex = emin;  // subnormal range: the quantum of the smallest normal binade
  double n = std::nearbyint(std::ldexp(a, f.man_bits - ex));  // exact scaling, one rounding (nearest even)
  if (n >= std::ldexp(1.0, f.man_bits + 1)) {  // rounded up into the next binade
    n /= 2;
    ++ex;
  }
  if (ex > emax) return sign | exp_all;
  const uint32_t ni = static_cast<uint32_t>(n);
  if (ni < (1u << f.man_bits)) return sign | static_cast<uint16_t>(ni);  // subnormal
  return sign | static_cast<uint16_t>(((ex + f.bias) << f.man_bits) | (ni - (1u << f.man_bits)));
}

// ----------------------------------------------------------------- strided element access

bool is_16bit_or_f32(int32_t code) {
  return code == ROPEKV_DTYPE_F32 || code == ROPEKV_DTYPE_F16 || code == ROPEKV_DTYPE_BF16;
}

int64_t offset(const ropekv_tensor& t, int64_t i0, int64_t i1 = 0, int64_t i2 = 0) {
  const int64_t idx[3] = {i0, i1, i2};
  int64_t off = 0;
  for (int d = 0; d < t.rank && d < 3; ++d) off += idx[d] * t.strides[d];
  return off;
}

double load(const ropekv_tensor& t, int64_t off) {
  switch (t.dtype) {
    case ROPEKV_DTYPE_F32: return static_cast<const float*>(t.data)[off];
    case ROPEKV_DTYPE_F16: return decode16(f16_format, static_cast<const uint16_t*>(t.data)[off]);
    case ROPEKV_DTYPE_BF16: return decode16(bf16_format, static_cast<const uint16_t*>(t.data)[off]);
    default: std::abort();  // supports() admits only these three
  }
}

void store(const ropekv_tensor& t, int64_t off, double v) {
  switch (t.dtype) {
    case ROPEKV_DTYPE_F32: static_cast<float*>(t.data)[off] = static_cast<float>(v); return;  // one rounding
    case ROPEKV_DTYPE_F16: static_cast<uint16_t*>(t.data)[off] = encode16(f16_format, v); return;
    case ROPEKV_DTYPE_BF16: static_cast<uint16_t*>(t.data)[off] = encode16(bf16_format, v); return;
    default: std::abort();
  }
}

int64_t load_index(const ropekv_tensor& t, int64_t i) {
  const int64_t off = i * t.strides[0];
  return t.dtype == ROPEKV_DTYPE_I32 ? static_cast<const int32_t*>(t.data)[off]
                                     : static_cast<const int64_t*>(t.data)[off];
}

void say(char* buf, size_t size, const char* text) {
  if (size) std::snprintf(buf, size, "%s", text);
}

// ----------------------------------------------------------------- the op

struct rope_ctx {
  const ropekv_plugin_args* a;
  int64_t dr, half;
  // cos / sin of pair i at table row p
  double c(int64_t p, int64_t i) const {
    return a->table_kind == ROPEKV_TABLE_ONE ? load(a->cos_sin, offset(a->cos_sin, p, i))
                                             : load(a->cos, offset(a->cos, p, i));
  }
  double s(int64_t p, int64_t i) const {
    return a->table_kind == ROPEKV_TABLE_ONE ? load(a->cos_sin, offset(a->cos_sin, p, half + i))
                                             : load(a->sin, offset(a->sin, p, i));
  }
  // Rotates the row src (element j at src_off + j) into dst (element j at dst_off + j): each
  // element x*C + R(x)*S in double (both products exact), rounded once into dst's dtype.
  // With `inplace`, the rotated values also go back into src (rounded into src's dtype).
  void rotate(const ropekv_tensor& src, int64_t src_off, const ropekv_tensor& dst, int64_t dst_off,
              int64_t p, bool is_q, bool inplace) const {
    for (int64_t i = 0; i < half; ++i) {
      const int64_t ja = a->rope_style == ROPEKV_ROPE_GPTJ ? 2 * i : i;
      const int64_t jb = a->rope_style == ROPEKV_ROPE_GPTJ ? 2 * i + 1 : i + half;
      int64_t col = i;
#ifdef PLUGIN_PLANTED_BUG
      if (is_q && half > 1 && i == half - 1) col = i - 1;  // off by one: the previous pair's angle
#endif
      const double x = load(src, src_off + ja), y = load(src, src_off + jb);
      const double cc = c(p, col), ss = s(p, col);
      const double ra = x * cc - y * ss, rb = y * cc + x * ss;
      store(dst, dst_off + ja, ra);
      store(dst, dst_off + jb, rb);
      if (inplace) {
        store(src, src_off + ja, ra);
        store(src, src_off + jb, rb);
      }
    }
  }
};

}  // namespace

ROPEKV_PLUGIN_EXPORT int ropekv_plugin_abi_version(void) { return ROPEKV_PLUGIN_ABI_VERSION; }

ROPEKV_PLUGIN_EXPORT int ropekv_plugin_device(void) { return ROPEKV_DEVICE_HOST; }

ROPEKV_PLUGIN_EXPORT int ropekv_plugin_supports(const ropekv_plugin_args* a, char* why, size_t why_size) {
  if (!is_16bit_or_f32(a->q_nope.dtype) || !is_16bit_or_f32(a->kv_c.dtype)) {
    say(why, why_size, "not supported: inputs other than f32, f16, bf16");
    return 0;
  }
  if (a->table_kind == ROPEKV_TABLE_ONE ? !is_16bit_or_f32(a->cos_sin.dtype) : !is_16bit_or_f32(a->cos.dtype)) {
    say(why, why_size, "not supported: a table other than f32, f16, bf16");
    return 0;
  }
  if (!is_16bit_or_f32(a->q_out.dtype)) {
    say(why, why_size, "not supported: fp8 q_out");
    return 0;
  }
  if (a->cache_layout == ROPEKV_LAYOUT_SHUFFLED) {
    say(why, why_size, "not supported: the shuffled cache layout");
    return 0;
  }
  const ropekv_tensor& cache = a->cache_layout == ROPEKV_LAYOUT_JOINT ? a->cache : a->ckv_cache;
  if (!is_16bit_or_f32(cache.dtype)) {
    say(why, why_size, "not supported: fp8 cache");
    return 0;
  }
  return 1;
}

ROPEKV_PLUGIN_EXPORT int ropekv_plugin_run(const ropekv_plugin_args* a, void* stream, char* msg, size_t msg_size) {
  if (!ropekv_plugin_supports(a, msg, msg_size)) return ROPEKV_PLUGIN_UNSUPPORTED;
  const int64_t tq = a->q_out.sizes[0], heads = a->q_out.sizes[1];
  const int64_t ts = a->slot_mapping.sizes[0];
  const int64_t dn = a->q_nope.sizes[2], dr = a->q_pe.sizes[2];
  const int64_t rows = a->table_kind == ROPEKV_TABLE_ONE ? a->cos_sin.sizes[0] : a->cos.sizes[0];
  const bool joint = a->cache_layout == ROPEKV_LAYOUT_JOINT;
  const int64_t block_size = (joint ? a->cache : a->ckv_cache).sizes[1];
#ifdef PLUGIN_CRASH
  if (ts == 5) std::raise(SIGSEGV);  // on purpose: a kernel that crashes the process
#endif
  const rope_ctx rope{a, dr, dr / 2};
  const bool nope_first = a->row_order == ROPEKV_ORDER_NOPE_FIRST;
  // positions of used tokens must be in [0, P) (error) or are clamped
  auto position = [&](int64_t t, int64_t* p) {
    int64_t v = load_index(a->positions, t);
    if (v >= 0 && v < rows) {
      *p = v;
      return true;
    }
    if (a->pos_oob != ROPEKV_POS_OOB_CLAMP) return false;
    *p = v < 0 ? 0 : rows - 1;
    return true;
  };
  // check every used token's position before writing anything
  for (int64_t t = 0; t < ts; ++t) {
    const bool slot_ok = load_index(a->slot_mapping, t) >= 0;
    const bool q_row = t < tq && (slot_ok || a->pad_q == ROPEKV_PAD_Q_COMPUTED);
    int64_t p;
    if ((slot_ok || q_row) && !position(t, &p)) {
      if (msg_size) std::snprintf(msg, msg_size, "positions[%lld] outside [0, %lld)", static_cast<long long>(t),
                                  static_cast<long long>(rows));
      return ROPEKV_PLUGIN_ERROR;
    }
  }
  for (int64_t t = 0; t < ts; ++t) {
    const int64_t slot = load_index(a->slot_mapping, t);
    int64_t p = 0;
    // q_out[t, h] = [q_nope[t, h] | rope(q_pe[t, h])]
    if (t < tq && (slot >= 0 || a->pad_q == ROPEKV_PAD_Q_COMPUTED) && position(t, &p)) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t out = offset(a->q_out, t, h);
        const int64_t nope = offset(a->q_nope, t, h);
        for (int64_t j = 0; j < dn; ++j) store(a->q_out, out + j, load(a->q_nope, nope + j));
        rope.rotate(a->q_pe, offset(a->q_pe, t, h), a->q_out, out + dn, p, true, a->inplace_q);
      }
    }
    // cache entry slot: [kv_c[t] | rope(k_pe[t])] in the row order (joint), or nope into
    // ckv_cache and rope into kpe_cache (split)
    if (slot >= 0 && position(t, &p)) {
      const int64_t block = slot / block_size, e = slot % block_size;
      const ropekv_tensor& nope_cache = joint ? a->cache : a->ckv_cache;
      const ropekv_tensor& rope_cache = joint ? a->cache : a->kpe_cache;
      const int64_t nope_at = offset(nope_cache, block, e) + (joint && !nope_first ? dr : 0);
      const int64_t rope_at = offset(rope_cache, block, e) + (joint && nope_first ? dn : 0);
      const int64_t kv = offset(a->kv_c, t);
      for (int64_t j = 0; j < dn; ++j) store(nope_cache, nope_at + j, load(a->kv_c, kv + j));
      rope.rotate(a->k_pe, offset(a->k_pe, t), rope_cache, rope_at, p, false, a->inplace_k);
    }
  }
  return ROPEKV_PLUGIN_OK;
}
