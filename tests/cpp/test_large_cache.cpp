// Caches of more than 2^31 (and 2^32) elements are addressed with 64-bit offsets by the
// reference and by the sim (the HIP kernel body on the CPU). vLLM narrows cache strides to a
// 32-bit int; a kernel that does so writes the wrong entry here.
//
// The cache is an address range reserved with mmap(MAP_NORESERVE) and never committed: only the
// few entries the test checks (and their neighbours) are poisoned, i.e. touched. After the runs
// mincore() proves that neither validate() nor a backend walked the cache (they may touch only
// the written rows' pages). Each written row must be byte-for-byte the row the reference writes
// for the same tokens into a small cache; the nope part of a bf16 row is also checked directly
// against kv_c (a copy); the neighbouring entries, and the padding between blocks of the split
// rope cache, must still hold the poison.
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/sim/sim_backend.h"
#include "core/case_data.h"
#include "core/convert.h"
#include "core/problem.h"

using namespace ropekv;

namespace {

constexpr int64_t two_31 = int64_t{1} << 31;
constexpr int64_t two_32 = int64_t{1} << 32;

// An address range of `bytes`, readable and writable, committed page by page on first touch.
class reservation {
 public:
  explicit reservation(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
      err_ = errno;
      return;
    }
    base_ = static_cast<uint8_t*>(p);
    // Transparent huge pages would commit 2 MiB per touched entry; keep it to 4 KiB pages.
    (void)madvise(base_, bytes_, MADV_NOHUGEPAGE);
  }
  ~reservation() {
    if (base_) munmap(base_, bytes_);
  }
  reservation(const reservation&) = delete;
  reservation& operator=(const reservation&) = delete;

  uint8_t* data() const { return base_; }
  size_t size_bytes() const { return bytes_; }
  std::string error() const { return std::strerror(err_); }
  // Pages of the range that are resident (touched, read or written).
  int64_t resident_pages() const {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> vec((bytes_ + page - 1) / page);
    if (mincore(base_, bytes_, vec.data()) != 0) return -1;
    int64_t n = 0;
    for (unsigned char v : vec) n += v & 1;
    return n;
  }

 private:
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  int err_ = 0;
};

// One cache part of the large case: where its rows live and how wide they are.
struct part {
  const char* name;
  uint8_t* base;        // data pointer of the large tensor
  int64_t block_stride_elems, entry_stride_elems, block_size;
  int64_t row_elems;    // Dn + Dr (joint), Dn (ckv) or Dr (kpe)
  size_t elem_bytes;
  size_t reserved_bytes;
  const uint8_t* small_base;  // the same part of the small case (contiguous, slots 0..)
  int64_t small_row_stride_elems;

  int64_t offset_elems(int64_t slot) const {
    return (slot / block_size) * block_stride_elems + (slot % block_size) * entry_stride_elems;
  }
  size_t row_bytes() const { return static_cast<size_t>(row_elems) * elem_bytes; }
};

// The window around a slot's row that the test poisons and checks: one row width (at least 256
// bytes) on each side, clipped to the reservation.
std::pair<size_t, size_t> window_of(const part& p, int64_t slot) {
  const size_t off = static_cast<size_t>(p.offset_elems(slot)) * p.elem_bytes;
  const size_t w = std::max<size_t>(p.row_bytes(), 256);
  const size_t lo = off >= w ? off - w : 0;
  const size_t hi = std::min(p.reserved_bytes, off + p.row_bytes() + w);
  return {lo, hi};
}

struct large_setup {
  const char* name;
  problem prob;                      // the small problem (num_blocks 1): same tokens and data
  std::vector<int64_t> large_slots;  // slot per token in the large cache (-1 padding)
  std::vector<int64_t> small_slots;  // the same tokens' slots in the small cache
};

void set_slots(op_args& a, const std::vector<int64_t>& slots) {
  const size_t es = dtype_size_bytes(a.slot_mapping.type);
  for (size_t t = 0; t < slots.size(); ++t)
    store_bits(a.slot_mapping.type, static_cast<uint8_t*>(a.slot_mapping.data) + t * es,
               static_cast<uint64_t>(slots[t]));
}

// Builds the large parts over `res` for the layout of `p` (joint: one part; split: ckv, kpe).
// `kpe_block_stride_elems`: the split rope cache's block stride (padded so its offsets too pass
// 2^32 elements).
std::vector<part> make_parts(const problem& p, int64_t num_blocks, uint8_t* res_base, size_t res_bytes,
                             int64_t kpe_block_stride_elems, case_data& small) {
  const size_t es = dtype_size_bytes(p.cache_dtype);
  const int64_t bs = p.block_size;
  if (p.opt.layout == cache_layout::joint) {
    const int64_t w = p.dn + p.dr;
    return {part{"cache", res_base, bs * w, w, bs, w, es, res_bytes, small.buffers.at("cache").data(), w}};
  }
  const size_t ckv_bytes = static_cast<size_t>(num_blocks * bs * p.dn) * es;
  return {part{"ckv_cache", res_base, bs * p.dn, p.dn, bs, p.dn, es, ckv_bytes,
               small.buffers.at("ckv_cache").data(), p.dn},
          part{"kpe_cache", res_base + ckv_bytes, kpe_block_stride_elems, p.dr, bs, p.dr, es,
               res_bytes - ckv_bytes, small.buffers.at("kpe_cache").data(), p.dr}};
}

void run_large(const large_setup& s, int64_t num_blocks, int64_t kpe_block_stride_elems) {
  const problem& p = s.prob;
  REQUIRE(p.num_blocks == 1);
  REQUIRE(s.large_slots.size() == static_cast<size_t>(p.ts));

  // Reference rows: the small case, run by the reference.
  case_data small = make_case(p);
  set_slots(small.args, s.small_slots);
  REQUIRE_NOTHROW(make_cpu_backend()->run_host(small.args, small.regions()));

  // The large cache: reserve, never commit.
  const size_t es = dtype_size_bytes(p.cache_dtype);
  size_t bytes = 0;
  if (p.opt.layout == cache_layout::joint) {
    bytes = static_cast<size_t>(num_blocks * p.block_size * (p.dn + p.dr)) * es;
  } else {
    bytes = static_cast<size_t>(num_blocks * p.block_size * p.dn + num_blocks * kpe_block_stride_elems) * es;
  }
  reservation res(bytes);
  REQUIRE_MESSAGE(res.data() != nullptr, "mmap of " << bytes << " bytes (MAP_NORESERVE) failed: " << res.error());
  const std::vector<part> parts = make_parts(p, num_blocks, res.data(), bytes, kpe_block_stride_elems, small);
  for (const part& pt : parts) {
    const int64_t last = pt.offset_elems(num_blocks * p.block_size - 1) + pt.row_elems;
    CHECK(static_cast<size_t>(last) * pt.elem_bytes <= pt.reserved_bytes);
    CHECK(last > two_32);  // every part spans more than 2^32 elements
  }

  using factory = std::unique_ptr<backend> (*)();
  const std::pair<const char*, factory> backends[] = {{"ref", &make_cpu_backend}, {"sim", &make_sim_backend}};
  for (const auto& [be_name, make] : backends) {
    INFO("backend " << std::string(be_name));
    case_data c = make_case(p);  // identical inputs (same problem and seed)
    op_args a = c.args;
    set_slots(a, s.large_slots);
    const int64_t bs = p.block_size;
    if (p.opt.layout == cache_layout::joint) {
      a.cache = make_view(p.cache_dtype, parts[0].base, {num_blocks, bs, p.dn + p.dr},
                          {parts[0].block_stride_elems, parts[0].entry_stride_elems, 1});
    } else {
      a.ckv_cache = make_view(p.cache_dtype, parts[0].base, {num_blocks, bs, p.dn},
                              {parts[0].block_stride_elems, parts[0].entry_stride_elems, 1});
      a.kpe_cache = make_view(p.cache_dtype, parts[1].base, {num_blocks, bs, p.dr},
                              {parts[1].block_stride_elems, parts[1].entry_stride_elems, 1});
    }
    // Poison the windows around every written slot (and nothing else of the cache).
    for (const part& pt : parts) {
      for (int64_t slot : s.large_slots) {
        if (slot < 0) continue;
        const auto [lo, hi] = window_of(pt, slot);
        fill_poison(pt.base + lo, hi - lo);
      }
    }

    REQUIRE_NOTHROW(make()->run_host(a, {}));

    // q_out: the same bytes as the small run's.
    const host_buffer& q_large = c.buffers.at("q_out");
    const host_buffer& q_small = small.buffers.at("q_out");
    REQUIRE(q_large.size_bytes() == q_small.size_bytes());
    CHECK(std::memcmp(q_large.data(), q_small.data(), q_large.size_bytes()) == 0);

    // Each window: poison, except the written rows, which equal the small case's rows.
    for (const part& pt : parts) {
      INFO("part " << std::string(pt.name));
      for (size_t t = 0; t < s.large_slots.size(); ++t) {
        const int64_t slot = s.large_slots[t];
        if (slot < 0) continue;
        CAPTURE(slot);
        const auto [lo, hi] = window_of(pt, slot);
        std::vector<uint8_t> expected(hi - lo, poison_byte);
        for (size_t u = 0; u < s.large_slots.size(); ++u) {
          const int64_t other = s.large_slots[u];
          if (other < 0) continue;
          const size_t off = static_cast<size_t>(pt.offset_elems(other)) * pt.elem_bytes;
          const size_t r_lo = std::max(off, lo), r_hi = std::min(off + pt.row_bytes(), hi);
          if (r_lo >= r_hi) continue;
          const uint8_t* small_row =
              pt.small_base + static_cast<size_t>(s.small_slots[u] * pt.small_row_stride_elems) * pt.elem_bytes;
          std::memcpy(expected.data() + (r_lo - lo), small_row + (r_lo - off), r_hi - r_lo);
        }
        const uint8_t* got = pt.base + lo;
        size_t first_diff = expected.size();
        for (size_t i = 0; i < expected.size(); ++i) {
          if (got[i] != expected[i]) {
            first_diff = i;
            break;
          }
        }
        CHECK_MESSAGE(first_diff == expected.size(),
                      "window [" << lo << ", " << hi << ") bytes of " << pt.name << ": first difference at byte "
                                 << lo + first_diff << " (row of slot " << slot << " at byte "
                                 << pt.offset_elems(slot) * static_cast<int64_t>(pt.elem_bytes) << ")");
        // The written row is not poison (the small reference wrote real data there).
        const size_t off = static_cast<size_t>(pt.offset_elems(slot)) * pt.elem_bytes;
        CHECK(count_not_poison(pt.base + off, pt.row_bytes()) > 0);
      }
    }
    // Independent of the reference: a bf16 -> bf16 joint nope part is a copy of kv_c[t].
    if (p.opt.layout == cache_layout::joint && p.cache_dtype == p.in_dtype &&
        p.opt.order == row_order::nope_first) {
      const tensor_view& kv = small.args.kv_c;
      for (size_t t = 0; t < s.large_slots.size(); ++t) {
        if (s.large_slots[t] < 0) continue;
        const uint8_t* row = parts[0].base + parts[0].offset_elems(s.large_slots[t]) * static_cast<int64_t>(es);
        const uint8_t* src = static_cast<const uint8_t*>(kv.data) + static_cast<int64_t>(t) * kv.strides_elems[0] * static_cast<int64_t>(es);
        CHECK_MESSAGE(std::memcmp(row, src, static_cast<size_t>(p.dn) * es) == 0, "nope part of token " << t);
      }
    }
  }

  // Nothing walked the cache: resident pages are those of the poisoned windows (a few each).
  const int64_t resident = res.resident_pages();
  int64_t windows = 0;
  for (const part& pt : parts) {
    (void)pt;
    for (int64_t slot : s.large_slots) windows += slot >= 0;
  }
  MESSAGE(std::string(s.name) << ": " << (bytes >> 20) << " MiB reserved, " << resident << " pages resident after "
                 << windows << " checked windows");
  CHECK(resident >= 0);
  CHECK(resident <= 3 * windows);
}

problem small_problem(int64_t tokens) {
  problem p;
  p.tq = 3; p.ts = tokens; p.tk = tokens; p.heads = 2; p.dn = 512; p.dr = 64;
  p.table_rows = 256; p.block_size = 64; p.num_blocks = 1;
  p.seed = 31;
  return p;
}

}  // namespace

TEST_CASE("large cache: joint bf16 cache of > 2^32 elements, i32 slots, ref and sim") {
  // [num_blocks, 64, 576] bf16, 120000 blocks: 4.42e9 elements, 8.8 GB reserved.
  constexpr int64_t num_blocks = 120000;
  constexpr int64_t w = 576;
  static_assert(num_blocks * 64 * w > two_32, "");
  const int64_t straddle_31 = two_31 / w;        // row crosses element 2^31
  const int64_t first_past_31 = straddle_31 + 1; // row starts past 2^31
  const int64_t straddle_32 = two_32 / w;        // row crosses element 2^32
  const int64_t last = num_blocks * 64 - 1;      // the cache's last entry
  CHECK(straddle_31 * w < two_31);
  CHECK((straddle_31 + 1) * w > two_31);
  CHECK(straddle_32 * w < two_32);
  CHECK((straddle_32 + 1) * w > two_32);
  large_setup s{"joint bf16", small_problem(5), {}, {}};
  s.prob.slot_dtype = dtype::i32;  // slots fit in 32 bits, their element offsets do not
  s.large_slots = {straddle_31, -1, straddle_32, last, first_past_31};
  s.small_slots = {0, -1, 1, 2, 3};
  run_large(s, num_blocks, 0);
}

TEST_CASE("large cache: split fp8 caches of > 2^32 elements, padded rope blocks, ref and sim") {
  // ckv [140000, 64, 512] fp8: 4.59e9 elements; kpe [140000, 64, 64] with block stride 32768
  // (28672 elements of padding after each block): its offsets also pass 2^32. 9.2 GB reserved.
  constexpr int64_t num_blocks = 140000;
  constexpr int64_t kpe_block_stride = 32768;
  large_setup s{"split fp8", small_problem(6), {}, {}};
  s.prob.opt.layout = cache_layout::split;
  s.prob.cache_dtype = dtype::fp8_e4m3fn;
  s.prob.k_scale = 0.75f;
  s.prob.opt.scale = scale_conv::reciprocal;
  s.prob.opt.style = rope_style::neox;
  const int64_t at_31 = two_31 / 512;       // ckv offset exactly 2^31; kpe offset exactly 2^31
  const int64_t at_32 = two_32 / 512;       // ckv offset exactly 2^32 (a 32-bit offset wraps to 0)
  const int64_t before_32 = at_32 - 1;      // last entry of a kpe block: padding follows it
  const int64_t last = num_blocks * 64 - 1;
  CHECK(at_31 % 64 == 0);
  CHECK((at_31 / 64) * kpe_block_stride == two_31);
  CHECK((at_32 / 64) * kpe_block_stride == two_32);
  s.large_slots = {at_31, at_32, -1, before_32, last, 5};
  s.small_slots = {0, 1, -1, 2, 3, 4};
  run_large(s, num_blocks, kpe_block_stride);
}
