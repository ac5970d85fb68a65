// Tensor views (offsets, extents, shapes), guarded host buffers and poison helpers.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/tensor.h"

using namespace ropekv;

TEST_CASE("tensor: contiguous views get row-major strides, offsets and extents") {
  float storage[2 * 3 * 4];
  const tensor_view v = make_view(dtype::f32, storage, {2, 3, 4});  // [2, 3, 4]
  CHECK(v.rank == 3);
  CHECK(v.strides_elems[0] == 12);
  CHECK(v.strides_elems[1] == 4);
  CHECK(v.strides_elems[2] == 1);
  CHECK(v.numel() == 24);
  CHECK(v.offset_elems({0, 0, 0}) == 0);
  CHECK(v.offset_elems({1, 2, 3}) == 23);
  CHECK(v.offset_elems({1, 0, 2}) == 14);
  CHECK(v.extent_bytes() == std::make_pair<int64_t, int64_t>(0, 96));
  CHECK(v.shape_string() == "[2, 3, 4]");
  CHECK(v.innermost_contiguous());
  CHECK(v.present());
}

TEST_CASE("tensor: strided views (padded rows, head-major, column slice)") {
  // kv_c as a column slice of a [T, 576] bf16 buffer: [T=5, 512] with row stride 576.
  uint16_t buf[5 * 576];
  const tensor_view kv_c = make_view(dtype::bf16, buf, {5, 512}, {576, 1});  // [5, 512]
  CHECK(kv_c.offset_elems({4, 511}) == 4 * 576 + 511);
  CHECK(kv_c.extent_bytes().second == (4 * 576 + 511 + 1) * 2);
  const tensor_view k_pe = make_view(dtype::bf16, buf + 512, {5, 64}, {576, 1});  // [5, 64]
  CHECK(k_pe.extent_bytes().second == (4 * 576 + 63 + 1) * 2);
  // Head-major q_nope [T=3, H=2, D=8] stored as [H, T, D].
  float q[2 * 3 * 8];
  const tensor_view qn = make_view(dtype::f32, q, {3, 2, 8}, {8, 24, 1});  // [3, 2, 8]
  CHECK(qn.offset_elems({2, 1, 7}) == 2 * 8 + 24 + 7);
  CHECK(qn.extent_bytes().second == 48 * 4);
  // Broadcast-like stride 0 is allowed: every row aliases row 0.
  const tensor_view b = make_view(dtype::f32, q, {4, 8}, {0, 1});  // [4, 8]
  CHECK(b.offset_elems({3, 5}) == 5);
  CHECK(b.extent_bytes().second == 32);
  // Large strides do not overflow: offsets are int64.
  const tensor_view big = make_view(dtype::fp8_e4m3fn, nullptr, {70000, 64, 576},
                                    {int64_t{64} * 1024, 1024, 1});  // [70000, 64, 576]
  CHECK(big.offset_elems({69999, 63, 575}) == int64_t{69999} * 65536 + 63 * 1024 + 575);
  CHECK(big.extent_bytes().second > (int64_t{1} << 32));
}

TEST_CASE("tensor: empty, absent and invalid views") {
  const tensor_view absent;
  CHECK(!absent.present());
  CHECK(absent.numel() == 0);
  CHECK(absent.extent_bytes() == std::make_pair<int64_t, int64_t>(0, 0));
  float x[4];
  const tensor_view empty = make_view(dtype::f32, x, {0, 4});  // [0, 4]
  CHECK(empty.numel() == 0);
  CHECK(empty.extent_bytes() == std::make_pair<int64_t, int64_t>(0, 0));
  CHECK(empty.shape_string() == "[0, 4]");
  CHECK_THROWS_AS(make_view(dtype::f32, x, {1, 1, 1, 1, 1}), arg_error);
  CHECK_THROWS_AS(make_view(dtype::f32, x, {2, 2}, {2}), arg_error);
  CHECK_THROWS_AS(make_view(dtype::f32, x, {2, 2}, {-2, 1}), arg_error);
  CHECK_THROWS_AS(make_view(dtype::f32, x, {-1}), arg_error);
  const tensor_view v = make_view(dtype::f32, x, {2, 2});  // [2, 2]
  CHECK_THROWS_AS(v.offset_elems({1}), arg_error);
  CHECK_THROWS_AS(v.offset_elems({2, 0}), arg_error);
  CHECK_THROWS_AS(v.offset_elems({0, -1}), arg_error);
  try {
    v.offset_elems({0, 2});
    FAIL("no exception");
  } catch (const arg_error& e) {
    CHECK(e.arg() == "index[1]");
    CHECK(e.got() == "2");
  }
}

TEST_CASE("tensor: host_buffer is aligned, zeroed, and guarded on both sides") {
  for (size_t size : {size_t{0}, size_t{1}, size_t{63}, size_t{4096}}) {
    host_buffer b(size);
    CAPTURE(size);
    CHECK(reinterpret_cast<uintptr_t>(b.data()) % 64 == 0);
    CHECK(b.size_bytes() == size);
    CHECK(b.guard_bytes() == host_buffer::default_guard_bytes);
    CHECK(b.raw() + b.guard_bytes() == b.data());
    CHECK(b.raw_size_bytes() == size + 2 * b.guard_bytes());
    CHECK(count_not_poison(b.data(), size, 0) == 0);
    CHECK(b.guards_intact());
    CHECK(b.guard_report() == "guards intact");
    CHECK(count_not_poison(b.raw(), b.guard_bytes(), guard_byte) == 0);
    // Writing the whole data region leaves the guards intact.
    fill_poison(b.data(), size);
    CHECK(b.guards_intact());
  }
}

TEST_CASE("tensor: a write one byte past the end (or before the start) is caught and located") {
  host_buffer b(100);
  b.data()[100] = 0;  // one byte past the end
  CHECK(!b.guards_intact());
  const std::string r = b.guard_report();
  CHECK(r.find("back guard damaged") != std::string::npos);
  CHECK(r.find("first damaged byte at offset 100") != std::string::npos);
  CHECK(r.find("front") == std::string::npos);

  host_buffer c(16);
  c.data()[-1] = 1;
  c.data()[-3] = 1;
  c.data()[16 + 7] = 0;
  const std::string r2 = c.guard_report();
  CHECK(r2.find("front guard damaged: first damaged byte at offset -3, last at -1 (2 of") !=
        std::string::npos);
  CHECK(r2.find("back guard damaged: first damaged byte at offset 23") != std::string::npos);

  // Moving keeps the data and guards; the moved-from buffer is empty.
  host_buffer d = std::move(c);
  CHECK(c.size_bytes() == 0);
  CHECK(c.guards_intact());
  CHECK(d.size_bytes() == 16);
  CHECK(!d.guards_intact());
}

TEST_CASE("tensor: poison fill and count") {
  uint8_t buf[64];
  fill_poison(buf, sizeof buf);
  CHECK(count_not_poison(buf, sizeof buf) == 0);
  CHECK(buf[0] == poison_byte);
  buf[5] = 0;
  buf[63] = poison_byte ^ 1;
  CHECK(count_not_poison(buf, sizeof buf) == 2);
  CHECK(count_not_poison(buf, 5) == 0);
  fill_poison(buf, 8, 0x11);
  CHECK(count_not_poison(buf, 8, 0x11) == 0);
  CHECK(count_not_poison(buf, sizeof buf, 0x11) == 56);
  CHECK(poison_byte != 0);
  CHECK(poison_byte != guard_byte);
}
