// Non-owning strided tensor views and owning host buffers with guard bytes.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace ropekv {

inline constexpr int max_rank = 4;

// A view of memory owned elsewhere. Strides are int64 and counted in elements of `type`.
// An empty view (data == nullptr, rank == 0) means "absent" for optional arguments.
struct tensor_view {
  dtype type = dtype::u8;
  int rank = 0;
  std::array<int64_t, max_rank> shape{};
  std::array<int64_t, max_rank> strides_elems{};
  void* data = nullptr;
  bool on_device = false;

  bool present() const { return data != nullptr || rank != 0; }
  int64_t numel() const;
  // Offset in elements of element `idx` (idx.size() == rank).
  int64_t offset_elems(std::initializer_list<int64_t> idx) const;
  // Byte range [lo, hi) that the view can touch relative to data; {0, 0} when empty.
  std::pair<int64_t, int64_t> extent_bytes() const;
  // Shape as "[2, 3, 4]".
  std::string shape_string() const;
  bool innermost_contiguous() const { return rank == 0 || strides_elems[rank - 1] == 1; }
};

// Builds a view; strides default to contiguous row-major.
tensor_view make_view(dtype t, void* data, std::initializer_list<int64_t> shape,
                      std::initializer_list<int64_t> strides_elems = {});

// Owning host buffer: `size_bytes` usable bytes, 64-byte aligned, with `guard_bytes` of a guard
// pattern before and after. Moves, does not copy.
class host_buffer {
 public:
  static constexpr size_t default_guard_bytes = 256;
  static constexpr size_t alignment_bytes = 64;
  // The bytes the constructor allocates for (size_bytes, guard_bytes): data, both guards and the
  // slack that aligns data(); saturating at INT64_MAX (a memory budget must not wrap).
  static int64_t allocation_bytes(int64_t size_bytes, int64_t guard_bytes);
  host_buffer() = default;
  explicit host_buffer(size_t size_bytes, size_t guard_bytes = default_guard_bytes);
  // A moved-from buffer is empty (size 0, no guards).
  host_buffer(host_buffer&& other) noexcept { *this = std::move(other); }
  host_buffer& operator=(host_buffer&& other) noexcept {
    storage_ = std::move(other.storage_);
    lead_bytes_ = other.lead_bytes_;
    size_bytes_ = other.size_bytes_;
    guard_bytes_ = other.guard_bytes_;
    other.storage_.reset();
    other.lead_bytes_ = other.size_bytes_ = other.guard_bytes_ = 0;
    return *this;
  }
  // Another handle on the same memory (no copy): the runs of one case share their inputs
  // (case_data::clone_outputs).
  host_buffer share() const {
    host_buffer b;
    b.storage_ = storage_;
    b.lead_bytes_ = lead_bytes_;
    b.size_bytes_ = size_bytes_;
    b.guard_bytes_ = guard_bytes_;
    return b;
  }
  bool shares_memory_with(const host_buffer& other) const { return storage_ && storage_ == other.storage_; }

  uint8_t* data() { return base() + lead_bytes_ + guard_bytes_; }
  const uint8_t* data() const { return base() + lead_bytes_ + guard_bytes_; }
  size_t size_bytes() const { return size_bytes_; }
  size_t guard_bytes() const { return guard_bytes_; }
  // The whole allocation, guards included (what a device mirror must copy).
  uint8_t* raw() { return base() + lead_bytes_; }
  const uint8_t* raw() const { return base() + lead_bytes_; }
  size_t raw_size_bytes() const { return size_bytes_ + 2 * guard_bytes_; }
  // True when both guard regions still hold the guard pattern.
  bool guards_intact() const;
  // "guards intact", or for each damaged side: which side, the first (lowest) and last damaged
  // offsets relative to data() (negative: before it) and the number of damaged bytes.
  std::string guard_report() const;

 private:
  uint8_t* base() const { return storage_ ? storage_->data() : nullptr; }
  std::shared_ptr<std::vector<uint8_t>> storage_;  // [lead: alignment pad] guard | data | guard
  size_t lead_bytes_ = 0;         // so that data() is 64-byte aligned
  size_t size_bytes_ = 0;
  size_t guard_bytes_ = 0;
};

// The first n items of a host index vector (positions, slot_mapping: rank 1, [>= n], i32 or
// i64), sign-extended: one dtype switch per call, not per item (validate and the reference read
// them whole). error for another dtype.
std::vector<int64_t> read_indices(const tensor_view& v, int64_t n);

// Poison: a repeating non-zero byte pattern written into outputs and caches before a run.
inline constexpr uint8_t poison_byte = 0xA5;
inline constexpr uint8_t guard_byte = 0x5A;
void fill_poison(void* data, size_t size_bytes, uint8_t pattern = poison_byte);
// Number of bytes in [data, data + size_bytes) that differ from the pattern.
size_t count_not_poison(const void* data, size_t size_bytes, uint8_t pattern = poison_byte);

}  // namespace ropekv
