// dtype list: names, sizes, parsing, and float format parameters checked against the code space.
#include <doctest/doctest.h>

#include <cmath>
#include <set>
#include <string>

#include "core/convert.h"
#include "core/dtype.h"
#include "core/error.h"

using namespace ropekv;

TEST_CASE("dtype: names are unique and parse back; sizes are the element sizes") {
  std::set<std::string> names;
  for (dtype t : all_dtypes) {
    const std::string n = dtype_name(t);
    CHECK(names.insert(n).second);
    CHECK(parse_dtype(n, "--dtype") == t);
  }
  CHECK(names.size() == 10);
  CHECK(dtype_size_bytes(dtype::f32) == 4);
  CHECK(dtype_size_bytes(dtype::f16) == 2);
  CHECK(dtype_size_bytes(dtype::bf16) == 2);
  CHECK(dtype_size_bytes(dtype::fp8_e4m3fnuz) == 1);
  CHECK(dtype_size_bytes(dtype::i64) == 8);
  CHECK(dtype_size_bytes(dtype::i32) == 4);
  CHECK(dtype_size_bytes(dtype::u8) == 1);
  CHECK(dtype_is_float(dtype::bf16));
  CHECK(!dtype_is_float(dtype::u8));
  CHECK(dtype_is_fp8(dtype::fp8_e5m2fnuz));
  CHECK(!dtype_is_fp8(dtype::u8));
  CHECK(!dtype_is_fp8(dtype::f16));
}

TEST_CASE("dtype: an unknown name is an arg_error naming the argument and listing valid names") {
  try {
    parse_dtype("fp8", "--cache-dtype");
    FAIL("no exception");
  } catch (const arg_error& e) {
    CHECK(e.arg() == "--cache-dtype");
    CHECK(e.got() == "'fp8'");
    for (dtype t : all_dtypes) CHECK(e.expected().find(dtype_name(t)) != std::string::npos);
    CHECK(std::string(e.what()).find("--cache-dtype: expected one of f32, f16") == 0);
  }
  CHECK_THROWS_AS(parse_dtype("", "x"), arg_error);
  CHECK_THROWS_AS(parse_dtype("BF16", "x"), arg_error);  // names are case-sensitive
  CHECK_THROWS_AS(float_format_of(dtype::i32), arg_error);
  CHECK_THROWS_AS(dtype_name(static_cast<dtype>(200)), ropekv::error);  // loud default
  CHECK_THROWS_AS(dtype_size_bytes(static_cast<dtype>(200)), ropekv::error);
  CHECK_THROWS_AS(float_format_of(static_cast<dtype>(200)), ropekv::error);
}

TEST_CASE("dtype: float_format parameters agree with the decoded code space") {
  for (dtype t : all_dtypes) {
    if (!dtype_is_float(t)) continue;
    CAPTURE(dtype_name(t));
    const float_format& f = float_format_of(t);
    CHECK(1 + f.exp_bits + f.man_bits == static_cast<int>(8 * dtype_size_bytes(t)));
    CHECK(f.min_subnormal == decode_to_f64(t, 1));
    CHECK(f.min_normal == decode_to_f64(t, 1u << f.man_bits));
    CHECK(f.min_normal == std::ldexp(1.0, 1 - f.bias));
    CHECK(f.min_subnormal == std::ldexp(1.0, 1 - f.bias - f.man_bits));
    if (t == dtype::f32) continue;  // 2^32 codes: checked by the anchors below
    double max = 0;
    bool any_inf = false;
    int nans = 0;
    for (uint32_t c = 0; c < (1u << (8 * dtype_size_bytes(t))); ++c) {
      const double v = decode_to_f64(t, c);
      if (std::isnan(v)) { ++nans; continue; }
      if (std::isinf(v)) { any_inf = true; continue; }
      max = std::fmax(max, v);
    }
    CHECK(f.max_finite == max);
    CHECK(f.has_inf == any_inf);
    CHECK(f.fnuz == (nans == 1));
    CHECK(f.nan_all_ones_mantissa_only == (nans == 2));
  }
  CHECK(float_format_of(dtype::fp8_e4m3fn).max_finite == 448.0);
  CHECK(float_format_of(dtype::fp8_e4m3fnuz).max_finite == 240.0);
  CHECK(float_format_of(dtype::fp8_e4m3fnuz).bias == 8);
  CHECK(float_format_of(dtype::fp8_e5m2).max_finite == 57344.0);
  CHECK(float_format_of(dtype::fp8_e5m2fnuz).max_finite == 57344.0);
  CHECK(float_format_of(dtype::fp8_e5m2fnuz).bias == 16);
  CHECK(float_format_of(dtype::f32).max_finite == static_cast<double>(3.4028234663852886e38f));
  CHECK(float_format_of(dtype::bf16).max_finite == decode_to_f64(dtype::bf16, 0x7f7f));
  CHECK(float_format_of(dtype::f16).max_finite == 65504.0);
}
