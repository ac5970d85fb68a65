// Tensor views, guarded host buffers and poison helpers.
#include "core/tensor.h"

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/memory_budget.h"

namespace ropekv {

std::vector<int64_t> read_indices(const tensor_view& v, int64_t n) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  const int64_t stride = v.strides_elems[0];
  switch (v.type) {
    case dtype::i32: {
      const int32_t* p = static_cast<const int32_t*>(v.data);
      for (int64_t i = 0; i < n; ++i) {
        int32_t x;
        std::memcpy(&x, p + i * stride, sizeof x);
        out[static_cast<size_t>(i)] = x;
      }
      break;
    }
    case dtype::i64: {
      const int64_t* p = static_cast<const int64_t*>(v.data);
      for (int64_t i = 0; i < n; ++i) std::memcpy(&out[static_cast<size_t>(i)], p + i * stride, sizeof(int64_t));
      break;
    }
    default:
      throw error(fmt::format("read_indices: dtype {} is not an index dtype", dtype_name(v.type)));
  }
  return out;
}

int64_t tensor_view::numel() const {
  if (!present()) return 0;
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

int64_t tensor_view::offset_elems(std::initializer_list<int64_t> idx) const {
  if (static_cast<int64_t>(idx.size()) != rank) {
    throw arg_error("index", std::to_string(rank) + " coordinates for shape " + shape_string(),
                    std::to_string(idx.size()) + " coordinates");
  }
  int64_t offset = 0;
  int d = 0;
  for (int64_t i : idx) {
    if (i < 0 || i >= shape[d]) {
      throw arg_error("index[" + std::to_string(d) + "]",
                      "a value in [0, " + std::to_string(shape[d]) + ")", std::to_string(i));
    }
    offset += i * strides_elems[d];
    ++d;
  }
  return offset;
}

std::pair<int64_t, int64_t> tensor_view::extent_bytes() const {
  if (!present() || numel() == 0) return {0, 0};
  int64_t lo_elems = 0, hi_elems = 0;  // offsets of the lowest and highest element
  for (int d = 0; d < rank; ++d) {
    const int64_t span = (shape[d] - 1) * strides_elems[d];
    if (span < 0) lo_elems += span; else hi_elems += span;
  }
  const int64_t elem = static_cast<int64_t>(dtype_size_bytes(type));
  return {lo_elems * elem, (hi_elems + 1) * elem};
}

std::string tensor_view::shape_string() const {
  std::string s = "[";
  for (int d = 0; d < rank; ++d) {
    if (d) s += ", ";
    s += std::to_string(shape[d]);
  }
  return s + "]";
}

tensor_view make_view(dtype t, void* data, std::initializer_list<int64_t> shape,
                      std::initializer_list<int64_t> strides_elems) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank > max_rank) {
    throw arg_error("shape", "rank <= " + std::to_string(max_rank), "rank " + std::to_string(rank));
  }
  if (strides_elems.size() != 0 && static_cast<int64_t>(strides_elems.size()) != rank) {
    throw arg_error("strides", std::to_string(rank) + " strides (or none for contiguous)",
                    std::to_string(strides_elems.size()) + " strides");
  }
  tensor_view v;
  v.type = t;
  v.rank = static_cast<int>(rank);
  v.data = data;
  int d = 0;
  for (int64_t n : shape) {
    if (n < 0) {
      throw arg_error("shape[" + std::to_string(d) + "]", "a size >= 0", std::to_string(n));
    }
    v.shape[d++] = n;
  }
  if (strides_elems.size() != 0) {
    d = 0;
    for (int64_t s : strides_elems) {
      if (s < 0) {
        throw arg_error("strides[" + std::to_string(d) + "]", "a stride >= 0", std::to_string(s));
      }
      v.strides_elems[d++] = s;
    }
  } else {
    int64_t s = 1;
    for (d = v.rank - 1; d >= 0; --d) {
      v.strides_elems[d] = s;
      s *= v.shape[d];
    }
  }
  return v;
}

int64_t host_buffer::allocation_bytes(int64_t size_bytes, int64_t guard_bytes) {
  return sat_add(sat_add(size_bytes, sat_mul(2, guard_bytes)), static_cast<int64_t>(alignment_bytes) - 1);
}

host_buffer::host_buffer(size_t size_bytes, size_t guard_bytes)
    : size_bytes_(size_bytes), guard_bytes_(guard_bytes) {
  constexpr size_t align = alignment_bytes;
  storage_ = std::make_shared<std::vector<uint8_t>>(size_bytes + 2 * guard_bytes + align - 1, guard_byte);
  const auto base = reinterpret_cast<uintptr_t>(storage_->data()) + guard_bytes;
  lead_bytes_ = (align - base % align) % align;
  std::memset(data(), 0, size_bytes);
}

namespace {
struct damage {
  int64_t first = 0, last = 0;
  size_t count = 0;
};
damage scan(const uint8_t* p, size_t n, int64_t offset_of_p) {
  damage d;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != guard_byte) {
      if (d.count == 0) d.first = offset_of_p + static_cast<int64_t>(i);
      d.last = offset_of_p + static_cast<int64_t>(i);
      ++d.count;
    }
  }
  return d;
}
}  // namespace

bool host_buffer::guards_intact() const {
  const uint8_t* p = data();
  return scan(p - guard_bytes_, guard_bytes_, 0).count == 0 &&
         scan(p + size_bytes_, guard_bytes_, 0).count == 0;
}

std::string host_buffer::guard_report() const {
  const uint8_t* p = data();
  const int64_t g = static_cast<int64_t>(guard_bytes_);
  const damage front = scan(p - guard_bytes_, guard_bytes_, -g);
  const damage back = scan(p + size_bytes_, guard_bytes_, static_cast<int64_t>(size_bytes_));
  if (front.count == 0 && back.count == 0) return "guards intact";
  std::string s;
  const auto describe = [&](const char* side, const damage& d) {
    if (d.count == 0) return;
    if (!s.empty()) s += "; ";
    s += std::string(side) + " guard damaged: first damaged byte at offset " +
         std::to_string(d.first) + ", last at " + std::to_string(d.last) + " (" +
         std::to_string(d.count) + " of " + std::to_string(guard_bytes_) +
         " guard bytes), offsets relative to data() of " + std::to_string(size_bytes_) + " bytes";
  };
  describe("front", front);
  describe("back", back);
  return s;
}

void fill_poison(void* data, size_t size_bytes, uint8_t pattern) {
  if (size_bytes) std::memset(data, pattern, size_bytes);
}

size_t count_not_poison(const void* data, size_t size_bytes, uint8_t pattern) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t n = 0;
  for (size_t i = 0; i < size_bytes; ++i) n += p[i] != pattern;
  return n;
}

}  // namespace ropekv
