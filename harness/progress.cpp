#include "harness/progress.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace ropekv {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

double progress_interval_s() {
  constexpr double default_s = 10;
  const char* env = std::getenv("ROPEKV_PROGRESS_INTERVAL");
  if (env == nullptr) return default_s;
  const std::string text = env;
  // digits with at most one '.', nothing else: no sign, exponent, hex, inf or nan
  bool digit = false, dot = false, plain = !text.empty();
  for (char ch : text) {
    if (ch >= '0' && ch <= '9') {
      digit = true;
    } else if (ch == '.' && !dot) {
      dot = true;
    } else {
      plain = false;
    }
  }
  const double v = plain && digit ? std::strtod(text.c_str(), nullptr) : -1;
  if (!(v >= 0) || !std::isfinite(v))
    throw arg_error("ROPEKV_PROGRESS_INTERVAL", "a number of seconds >= 0 between progress lines (unset: 10)",
                    "'" + text + "'");
  return v;
}

progress_ticker::progress_ticker() : progress_ticker(progress_interval_s()) {}

progress_ticker::progress_ticker(double interval_s) : interval_s_(interval_s), last_s_(now_s()) {}

bool progress_ticker::due() {
  const double t = now_s();
  if (t - last_s_ < interval_s_) return false;
  last_s_ = t;
  return true;
}

}  // namespace ropekv
