// Atomic file writes and up-front writability checks. See core/file_io.h.
#include "core/file_io.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace ropekv {
namespace {

// arg_error naming `arg` (its got: the path and why), or the path itself when arg is empty.
[[noreturn]] void fail(const std::string& path, const std::string& arg, const std::string& expected,
                       const std::string& why) {
  if (arg.empty()) throw arg_error(path, expected, why);
  throw arg_error(arg, expected, "'" + path + "' (" + why + ")");
}

struct write_failure {
  std::string expected, why;  // empty expected: no failure
};

std::string reason(const char* fallback) { return errno ? std::strerror(errno) : fallback; }

// Writes every chunk to `target` and closes it.
write_failure write_all(const std::string& target, const std::vector<std::string_view>& chunks, bool truncate) {
  errno = 0;
  std::ofstream out(target, std::ios::binary | (truncate ? std::ios::trunc : std::ios::out));
  if (!out) return {"a writable file", reason("cannot open")};
  for (std::string_view c : chunks) out.write(c.data(), static_cast<std::streamsize>(c.size()));
  out.flush();
  if (!out) return {"a complete write", reason("write failed")};
  out.close();
  if (!out) return {"a complete write", reason("close failed")};
  return {};
}

}  // namespace

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& chunks,
                       const std::string& arg) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) fail(path, arg, "a file path", "a directory");
    const write_failure w = write_all(path, chunks, false);  // a device or FIFO: no rename over it
    if (!w.expected.empty()) fail(path, arg, w.expected, w.why);
    return;
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const write_failure w = write_all(tmp, chunks, true);
  if (!w.expected.empty()) {
    std::remove(tmp.c_str());
    fail(path, arg, w.expected, w.why);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    fail(path, arg, "a file that can be renamed into place", ec.message());
  }
}

void check_writable_path(const std::string& path, const std::string& arg) {
  if (path.empty()) throw arg_error(arg, "a file path", "''");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) fail(path, arg, "a file path", "a directory");
    if (::access(path.c_str(), W_OK) != 0) fail(path, arg, "a writable file", std::strerror(errno));
    return;
  }
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail(path, arg, "a file in an existing folder", "no folder " + dir.string());
  if (::access(dir.c_str(), W_OK) != 0) fail(path, arg, "a file in a writable folder", std::strerror(errno));
}

void check_writable_folder(const std::string& path, const std::string& arg) {
  if (path.empty()) throw arg_error(arg, "a folder path", "''");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) fail(path, arg, "a folder", "not a folder");
    if (::access(path.c_str(), W_OK) != 0) fail(path, arg, "a writable folder", std::strerror(errno));
    return;
  }
  std::filesystem::path parent = std::filesystem::path(path).lexically_normal().parent_path();
  if (parent.empty()) parent = ".";
  if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail(path, arg, "a folder that can be created", "no folder " + parent.string());
  if (::access(parent.c_str(), W_OK) != 0) fail(path, arg, "a folder that can be created", std::strerror(errno));
}

}  // namespace ropekv
