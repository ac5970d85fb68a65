// dtype names, sizes, parsing and the exact bit-layout parameters of every float format.
#include "core/dtype.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace ropekv {

namespace {

[[noreturn]] void bad_dtype(const char* where, dtype t) {
  throw error(std::string(where) + ": invalid dtype value " +
              std::to_string(static_cast<int>(t)));
}

std::string valid_dtype_names() {
  std::string names = "one of ";
  bool first = true;
  for (dtype t : all_dtypes) {
    if (!first) names += ", ";
    names += dtype_name(t);
    first = false;
  }
  return names;
}

// exp_bits, man_bits, bias, has_inf, fnuz, nan_all_ones_mantissa_only, max, min_normal, min_sub
constexpr float_format f32_format{8, 23, 127, true, false, false,
                                  0x1.fffffep127, 0x1p-126, 0x1p-149};
constexpr float_format f16_format{5, 10, 15, true, false, false, 65504.0, 0x1p-14, 0x1p-24};
constexpr float_format bf16_format{8, 7, 127, true, false, false, 0x1.fep127, 0x1p-126, 0x1p-133};
// OCP e4m3fn: no inf, NaN only S.1111.111, max = 1.75 * 2^8 = 448.
constexpr float_format e4m3fn_format{4, 3, 7, false, false, true, 448.0, 0x1p-6, 0x1p-9};
// e4m3fnuz: bias 8, single NaN 0x80, no -0, max = 1.875 * 2^7 = 240.
constexpr float_format e4m3fnuz_format{4, 3, 8, false, true, false, 240.0, 0x1p-7, 0x1p-10};
// e5m2: IEEE-like, inf and NaNs, max = 1.75 * 2^15 = 57344.
constexpr float_format e5m2_format{5, 2, 15, true, false, false, 57344.0, 0x1p-14, 0x1p-16};
// e5m2fnuz: bias 16, single NaN 0x80, no -0, no inf, max = 1.75 * 2^15 = 57344.
constexpr float_format e5m2fnuz_format{5, 2, 16, false, true, false, 57344.0, 0x1p-15, 0x1p-17};

}  // namespace

const char* dtype_name(dtype t) {
  switch (t) {
#define ROPEKV_X(name, size, is_float) \
  case dtype::name:                    \
    return #name;
    ROPEKV_DTYPE_LIST(ROPEKV_X)
#undef ROPEKV_X
  }
  bad_dtype("dtype_name", t);
}

size_t dtype_size_bytes(dtype t) {
  switch (t) {
#define ROPEKV_X(name, size, is_float) \
  case dtype::name:                    \
    return size;
    ROPEKV_DTYPE_LIST(ROPEKV_X)
#undef ROPEKV_X
  }
  bad_dtype("dtype_size_bytes", t);
}

bool dtype_is_float(dtype t) {
  switch (t) {
#define ROPEKV_X(name, size, is_float) \
  case dtype::name:                    \
    return is_float;
    ROPEKV_DTYPE_LIST(ROPEKV_X)
#undef ROPEKV_X
  }
  bad_dtype("dtype_is_float", t);
}

bool dtype_is_fp8(dtype t) { return dtype_is_float(t) && dtype_size_bytes(t) == 1; }

dtype parse_dtype(std::string_view text, const char* arg_name) {
  for (dtype t : all_dtypes) {
    if (text == dtype_name(t)) return t;
  }
  throw arg_error(arg_name ? arg_name : "dtype", valid_dtype_names(),
                  "'" + std::string(text) + "'");
}

const float_format& float_format_of(dtype t) {
  switch (t) {
    case dtype::f32: return f32_format;
    case dtype::f16: return f16_format;
    case dtype::bf16: return bf16_format;
    case dtype::fp8_e4m3fn: return e4m3fn_format;
    case dtype::fp8_e4m3fnuz: return e4m3fnuz_format;
    case dtype::fp8_e5m2: return e5m2_format;
    case dtype::fp8_e5m2fnuz: return e5m2fnuz_format;
    case dtype::i32:
    case dtype::i64:
    case dtype::u8:
      throw arg_error("dtype", "a float dtype (f32, f16, bf16, fp8_*)", dtype_name(t));
  }
  bad_dtype("float_format_of", t);
}

}  // namespace ropekv
