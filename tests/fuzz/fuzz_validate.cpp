// libFuzzer target: the problem validator, and the reference behind it. Builds op_args with
// fuzzer-chosen dtypes, ranks, shapes, strides, offsets, options and scales over one arena whose
// bytes (slots, positions, data) also come from the input. validate() must either throw
// ropekv::error or accept; an accepted call runs the reference, which must stay inside the
// output views (ASan) and leave every byte outside the outputs' extents unchanged.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/validate.h"

namespace {

struct byte_reader {
  const uint8_t* data;
  size_t size;
  size_t pos = 0;
  uint8_t u8() { return pos < size ? data[pos++] : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(u8()) << (8 * i);
    return v;
  }
  int64_t small(int64_t lo, int64_t hi) { return lo + u8() % (hi - lo + 1); }
};

constexpr size_t arena_bytes = 1 << 16;
alignas(64) uint8_t arena[arena_bytes];

// A view of `shape` (row-major, innermost padded by a fuzzer-chosen amount), with its dtype, rank
// and one stride sometimes perturbed, placed at a fuzzer-chosen offset; absent when it does not fit.
ropekv::tensor_view make(byte_reader& in, ropekv::dtype want, std::vector<int64_t> shape) {
  using namespace ropekv;
  tensor_view v;
  const uint8_t mode = in.u8();
  v.type = (mode & 7) == 0 ? all_dtypes[in.u8() % std::size(all_dtypes)] : want;
  if ((mode & 0x38) == 0x08 && !shape.empty()) shape.pop_back();
  if ((mode & 0x38) == 0x10) shape.push_back(in.small(1, 3));
  if ((mode & 0xc0) == 0x40 && !shape.empty()) shape[in.u8() % shape.size()] += in.small(-1, 2);
  v.rank = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.shape[d] = shape[d];
    v.strides_elems[d] = stride;
    stride *= std::max<int64_t>(shape[d], 1) + (d == v.rank - 1 ? in.small(0, 3) : 0);
  }
  if ((in.u8() & 15) == 0 && v.rank > 0) v.strides_elems[in.u8() % v.rank] = in.small(0, 9);
  const size_t elem = dtype_size_bytes(v.type);
  const size_t offset = (in.u32() % arena_bytes) & ~(((in.u8() & 3) == 0) ? 0 : (elem - 1));
  v.data = arena + offset;
  auto [lo, hi] = v.extent_bytes();
  if (lo < 0 || offset + hi > arena_bytes) return tensor_view{};
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ropekv;
  byte_reader in{data, size};
  const int64_t tq = in.small(0, 4), ts = tq + in.small(0, 2), tk = ts + in.small(0, 2);
  const int64_t h = in.small(1, 3), dn = in.small(1, 12), dr = 2 * in.small(0, 4) + (in.u8() == 7);
  const int64_t p = in.small(1, 6), nb = in.small(1, 3), bs = in.small(1, 4);
  const uint8_t opts = in.u8();
  const dtype floats[] = {dtype::f32, dtype::f16, dtype::bf16};
  const dtype outs[] = {dtype::f32, dtype::bf16, dtype::fp8_e4m3fn, dtype::fp8_e4m3fnuz,
                        dtype::fp8_e5m2, dtype::fp8_e5m2fnuz};
  const dtype in_t = floats[in.u8() % 3], tab_t = floats[in.u8() % 3];
  const dtype out_t = outs[in.u8() % 6], cache_t = outs[in.u8() % 6];
  const dtype idx_t = (in.u8() & 1) ? dtype::i32 : dtype::i64;

  op_args a;
  a.options.style = (opts & 1) ? rope_style::neox : rope_style::gptj;
  a.options.layout = (opts & 2) ? cache_layout::split : cache_layout::joint;
  a.options.order = (opts & 4) ? row_order::rope_first : row_order::nope_first;
  a.options.scale = (opts & 8) ? scale_conv::reciprocal : scale_conv::divide;
  a.options.padding = (opts & 16) ? pad_q::skipped : pad_q::computed;
  a.options.positions = (opts & 32) ? pos_oob::clamp : pos_oob::error;
  a.options.inplace_q = opts & 64;
  a.options.inplace_k = opts & 128;
  uint32_t ks = in.u32(), qs = in.u32();
  if ((ks >> 24) != 0xff) ks = 0x3f800000u + (ks & 0x00ffffffu);  // mostly sane scales
  if ((qs >> 24) != 0xff) qs = 0x3f000000u + (qs & 0x00ffffffu);
  std::memcpy(&a.k_scale, &ks, 4);
  std::memcpy(&a.q_scale, &qs, 4);

  a.q_nope = make(in, in_t, {tq, h, dn});
  a.q_pe = make(in, in_t, {tq, h, dr});
  a.kv_c = make(in, in_t, {tk, dn});
  a.k_pe = make(in, in_t, {tk, dr});
  a.positions = make(in, idx_t, {tk});
  a.slot_mapping = make(in, idx_t, {ts});
  if (in.u8() & 1) {
    a.cos_sin = make(in, tab_t, {p, dr});
  } else {
    a.cos = make(in, tab_t, {p, dr / 2});
    a.sin = make(in, tab_t, {p, dr / 2});
  }
  a.q_out = make(in, out_t, {tq, h, dn + dr});
  if (a.options.layout == cache_layout::joint) {
    a.cache = make(in, cache_t, {nb, bs, dn + dr});
  } else {
    a.ckv_cache = make(in, cache_t, {nb, bs, dn});
    a.kpe_cache = make(in, cache_t, {nb, bs, dr});
  }
  // The rest of the input fills the arena: slot and position values, data.
  std::memset(arena, 0, arena_bytes);
  if (in.pos < size) {
    const size_t rest = size - in.pos;
    for (size_t i = 0; i < arena_bytes; ++i) arena[i] = data[in.pos + i % rest];
  }

  try {
    validate(a);
  } catch (const error&) {
    return 0;
  }
  static std::vector<uint8_t> before;
  before.assign(arena, arena + arena_bytes);
  reference_run(a);
  // Bytes outside every output's extent must be unchanged.
  std::vector<char> writable(arena_bytes, 0);
  auto mark = [&](const tensor_view& v) {
    if (!v.present()) return;
    auto [lo, hi] = v.extent_bytes();
    const size_t base = static_cast<uint8_t*>(v.data) - arena;
    for (int64_t b = lo; b < hi; ++b) writable[base + b] = 1;
  };
  mark(a.q_out);
  mark(a.cache);
  mark(a.ckv_cache);
  mark(a.kpe_cache);
  if (a.options.inplace_q) mark(a.q_pe);
  if (a.options.inplace_k) mark(a.k_pe);
  for (size_t i = 0; i < arena_bytes; ++i) {
    if (!writable[i] && arena[i] != before[i]) {
      std::fprintf(stderr, "reference wrote arena byte %zu outside every output\n", i);
      std::abort();
    }
  }
  return 0;
}
