// parse_problem's arg_error, for the repro-string tests.
#pragma once
#include <string>

#include "core/error.h"
#include "core/problem.h"

// Runs parse_problem and returns the arg_error's argument ("" when it did not throw); `message`,
// when given, gets the error's whole text (argument, expected, got).
inline std::string parse_error_arg(const std::string& repro, std::string* message = nullptr) {
  try {
    ropekv::parse_problem(repro);
  } catch (const ropekv::arg_error& e) {
    if (message) *message = e.what();
    return e.arg();
  }
  return "";
}
