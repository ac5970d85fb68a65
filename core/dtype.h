// dtypes: one list from which names, sizes and parsing are derived.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ropekv {

// X(name, size_bytes, is_float)
#define ROPEKV_DTYPE_LIST(X)   \
  X(f32, 4, true)              \
  X(f16, 2, true)              \
  X(bf16, 2, true)             \
  X(fp8_e4m3fn, 1, true)       \
  X(fp8_e4m3fnuz, 1, true)     \
  X(fp8_e5m2, 1, true)         \
  X(fp8_e5m2fnuz, 1, true)     \
  X(i32, 4, false)             \
  X(i64, 8, false)             \
  X(u8, 1, false)

enum class dtype : uint8_t {
#define ROPEKV_X(name, size, is_float) name,
  ROPEKV_DTYPE_LIST(ROPEKV_X)
#undef ROPEKV_X
};

inline constexpr dtype all_dtypes[] = {
#define ROPEKV_X(name, size, is_float) dtype::name,
    ROPEKV_DTYPE_LIST(ROPEKV_X)
#undef ROPEKV_X
};

const char* dtype_name(dtype t);
size_t dtype_size_bytes(dtype t);
bool dtype_is_float(dtype t);
bool dtype_is_fp8(dtype t);
// Parses a dtype name ("bf16", "fp8_e4m3fn", ...). Throws ropekv::arg_error naming `arg_name`
// and listing the valid names when `text` is unknown.
dtype parse_dtype(std::string_view text, const char* arg_name);

// Bit layout of a floating-point format (f32, f16, bf16, the four fp8 formats).
struct float_format {
  int exp_bits;
  int man_bits;
  int bias;        // exponent bias
  bool has_inf;    // IEEE-style inf (f32, f16, bf16, fp8_e5m2)
  bool fnuz;       // single NaN 0x80, no negative zero (e4m3fnuz, e5m2fnuz)
  bool nan_all_ones_mantissa_only;  // e4m3fn: only S.1111.111 is NaN
  double max_finite;
  double min_normal;
  double min_subnormal;
};
// Throws ropekv::arg_error for a non-float dtype.
const float_format& float_format_of(dtype t);

}  // namespace ropekv
