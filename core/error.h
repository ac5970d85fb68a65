// Errors raised by ropekv. Bad input is an arg_error that names the argument and shows
// expected vs got; the CLI maps it to exit code 2.
#pragma once
#include <stdexcept>
#include <string>

namespace ropekv {

class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller's argument is wrong. what() == "<arg>: expected <expected>, got <got>".
class arg_error : public error {
 public:
  arg_error(std::string arg, std::string expected, std::string got)
      : error(arg + ": expected " + expected + ", got " + got),
        arg_(std::move(arg)), expected_(std::move(expected)), got_(std::move(got)) {}
  const std::string& arg() const { return arg_; }
  const std::string& expected() const { return expected_; }
  const std::string& got() const { return got_; }

 private:
  std::string arg_, expected_, got_;
};

// A backend cannot run this problem; reason says why ("not supported: ...").
class unsupported_error : public error {
 public:
  using error::error;
};

}  // namespace ropekv
