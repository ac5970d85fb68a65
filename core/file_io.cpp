// Atomic file writes and up-front writability checks. See core/file_io.h.
#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include <fmt/format.h>

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

// The temporary file being written now ("" when none), for remove_pending_temp_file in a signal
// handler: a fixed buffer, so that the handler reads no std::string.
char pending_temp[4096] = {};

void set_pending_temp(const std::string& path) {
  if (path.size() >= sizeof(pending_temp)) return;
  pending_temp[0] = '\0';
  std::memcpy(pending_temp + 1, path.c_str() + 1, path.size());  // the first byte last: the
  pending_temp[0] = path.empty() ? '\0' : path[0];                // handler sees all or nothing
}

// Writes every chunk to `target`, fsyncs a regular file (so a rename after it never installs
// a file whose bytes are not on disk), and closes it.
struct write_stopped {};  // thrown by the sink after a failed write, caught in write_all

write_failure write_all(const std::string& target, const std::function<void(const chunk_sink&)>& produce,
                        bool truncate) {
  errno = 0;
  const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC | (truncate ? O_CREAT | O_TRUNC : 0), 0644);
  if (fd < 0) return {"a writable file", reason("cannot open")};
  write_failure failed;
  const chunk_sink sink = [&](std::string_view c) {
    const char* p = c.data();
    size_t left = c.size();
    while (left > 0) {
      errno = 0;
      const ssize_t n = ::write(fd, p, std::min<size_t>(left, size_t{1} << 30));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        failed = write_failure{"a complete write", reason("write failed")};
        throw write_stopped{};
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
  };
  try {
    produce(sink);
  } catch (const write_stopped&) {
    ::close(fd);
    return failed;
  } catch (...) {
    ::close(fd);
    throw;
  }
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::fsync(fd) != 0) {
    const write_failure w{"a complete write", reason("fsync failed")};
    ::close(fd);
    return w;
  }
  if (::close(fd) != 0) return {"a complete write", reason("close failed")};
  return {};
}

}  // namespace

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& chunks,
                       const std::string& arg) {
  write_file_atomic_stream(
      path,
      [&](const chunk_sink& sink) {
        for (std::string_view c : chunks) sink(c);
      },
      arg);
}

void write_file_atomic_stream(const std::string& path, const std::function<void(const chunk_sink&)>& produce,
                              const std::string& arg) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) fail(path, arg, "a file path", "a directory");
    const write_failure w = write_all(path, produce, false);  // a device or FIFO: no rename over it
    if (!w.expected.empty()) fail(path, arg, w.expected, w.why);
    return;
  }
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  set_pending_temp(tmp);
  write_failure w;
  try {
    w = write_all(tmp, produce, true);
  } catch (...) {  // the producer failed (e.g. out of memory): no temporary file left behind
    std::remove(tmp.c_str());
    set_pending_temp("");
    throw;
  }
  if (!w.expected.empty()) {
    std::remove(tmp.c_str());
    set_pending_temp("");
    fail(path, arg, w.expected, w.why);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::remove(tmp.c_str());
  set_pending_temp("");
  if (ec) fail(path, arg, "a file that can be renamed into place", ec.message());
}

void remove_pending_temp_file() noexcept {
  if (pending_temp[0] != '\0') ::unlink(pending_temp);
}

void check_new_output(const std::string& path, bool force, const std::string& arg) {
  struct stat st {};
  if (force || ::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    std::error_code ec;
    if (std::filesystem::is_empty(path, ec) && !ec) return;
    fail(path, arg, "a new or empty folder (--force replaces it whole)", "a folder with files in it");
  }
  if (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode))
    fail(path, arg, "a path that does not exist yet (--force replaces it)", "an existing file");
  // a device or FIFO (/dev/null, /dev/stdout) is written to, not replaced
}

void install_folder(const std::string& tmp_dir, const std::string& dir, const std::string& arg) {
  std::error_code ec;
  struct stat st {};
  std::string aside;
  if (::lstat(dir.c_str(), &st) == 0) {
    // an empty folder is replaced by rename(2) itself; anything else is moved aside first
    if (!(S_ISDIR(st.st_mode) && std::filesystem::is_empty(dir, ec) && !ec)) {
      aside = dir + ".old." + std::to_string(::getpid());
      std::filesystem::rename(dir, aside, ec);
      if (ec) {
        std::filesystem::remove_all(tmp_dir, ec);
        fail(dir, arg, "a folder that can be replaced", ec.message());
      }
    }
  }
  std::filesystem::rename(tmp_dir, dir, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove_all(tmp_dir, ec);
    if (!aside.empty()) std::filesystem::rename(aside, dir, ec);  // put the old one back
    fail(dir, arg, "a folder that can be renamed into place", why);
  }
  if (!aside.empty()) std::filesystem::remove_all(aside, ec);
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

namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

std::string human_bytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (uint64_t{1} << 30)) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (bytes >= (uint64_t{1} << 20)) return fmt::format("{:.1f} MiB", b / (1 << 20));
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", b / 1024);
  return fmt::format("{} bytes", bytes);
}

input_file::input_file(const std::string& path) : path_(path) {
  errno = 0;
  // O_NONBLOCK: opening a FIFO without a writer must not wait for one
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) throw arg_error(path, "a readable file", reason("cannot open"));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string kind = ::fstat(fd_, &st) != 0 ? reason("fstat failed") : kind_of(st.st_mode);
    ::close(fd_);
    fd_ = -1;
    throw arg_error(path, "a regular file", kind);
  }
  size_bytes_ = static_cast<uint64_t>(st.st_size);
}

input_file::~input_file() {
  if (fd_ >= 0) ::close(fd_);
}

void input_file::read_at(uint64_t offset, void* dst, uint64_t n, const std::string& what) const {
  const std::string arg = what.empty() ? path_ : path_ + ": " + what;
  if (offset > size_bytes_ || n > size_bytes_ - offset)
    throw arg_error(arg, fmt::format("bytes {} .. {} within the file", offset, offset + n),
                    fmt::format("a file of {} bytes", size_bytes_));
  auto* out = static_cast<char*>(dst);
  constexpr uint64_t piece = uint64_t{64} << 20;
  while (n > 0) {
    errno = 0;
    const ssize_t got = ::pread(fd_, out, static_cast<size_t>(std::min(n, piece)), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      throw arg_error(arg, fmt::format("{} more bytes at offset {}", n, offset),
                      got < 0 ? reason("a read error") : std::string("the end of the file (it shrank while read)"));
    out += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
}

small_file_messages report_file_messages() {
  small_file_messages m;
  m.what = "a report";
  m.unreadable = "a readable regular file (a fuzz report)";
  m.exact_bytes = true;
  return m;
}

std::string read_small_file(const std::string& path, uint64_t max_bytes, const std::string& arg,
                            const small_file_messages& msg) {
  auto fail_arg = [&](const std::string& expected, const std::string& got) -> void {
    if (arg.empty()) throw arg_error(path, expected, got);
    throw arg_error(arg, expected, "'" + path + "' (" + got + ")");
  };
  const auto size_text = [&](uint64_t bytes) {
    return msg.exact_bytes ? fmt::format("{} bytes", bytes) : human_bytes(bytes);
  };
  std::optional<input_file> f;
  try {
    f.emplace(path);
  } catch (const arg_error& e) {
    if (!msg.unreadable.empty()) fail_arg(msg.unreadable, e.got());
    if (!arg.empty() && e.arg() != arg) fail_arg(e.expected(), e.got());
    throw;
  }
  if (f->size() > max_bytes)
    fail_arg(fmt::format("{} of at most {}", msg.what, size_text(max_bytes)), size_text(f->size()));
  std::string text(static_cast<size_t>(f->size()), '\0');
  try {
    f->read_at(0, text.data(), f->size());
  } catch (const arg_error& e) {
    if (arg.empty() || e.arg() == arg) throw;
    fail_arg(e.expected(), e.got());
  }
  return text;
}

}  // namespace ropekv
