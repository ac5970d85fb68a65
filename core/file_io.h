// Files ropekv writes (reports, golden cases, bench JSON): never half a file, never a silent
// failure.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace ropekv {

// Writes the chunks, in order, to `path`: into a temporary file beside it (path + ".tmp.<pid>"),
// then renamed over `path`, so a reader (or a crash, a full disk, a signal) never leaves half a
// file under that name. A path that exists and is not a regular file (a FIFO, /dev/stdout,
// /dev/full) is written directly. Every failure (open, write, flush, close, rename) is an
// arg_error naming `arg` (or the path when arg is empty) with the system's reason; the temporary
// file is removed.
void write_file_atomic(const std::string& path, const std::vector<std::string_view>& chunks,
                       const std::string& arg);

// The same, with the bytes made while the file is written: `produce` calls its argument with
// each chunk in order, so a large file (a golden case) is never held in memory whole. An
// exception from `produce` removes the temporary file and propagates.
using chunk_sink = std::function<void(std::string_view)>;
void write_file_atomic_stream(const std::string& path, const std::function<void(const chunk_sink&)>& produce,
                              const std::string& arg);

// Removes the temporary file write_file_atomic is writing now, if any: async-signal-safe, for a
// SIGINT/SIGTERM handler (the target itself is untouched until the rename).
void remove_pending_temp_file() noexcept;

// An output that exists already is refused unless `force`: a regular file or symlink ("expected a
// path that does not exist yet (--force replaces it), got '<path>' (an existing file)") or a
// folder with files in it. Devices and FIFOs (/dev/null) are written to, not replaced.
void check_new_output(const std::string& path, bool force, const std::string& arg);

// Moves the folder `tmp_dir` (written completely by the caller) to `dir`: an existing `dir` is
// moved aside first and removed after, so `dir` holds the old files or the new ones, never a mix
// (and a stale file of an earlier case never survives). arg_error naming `arg` on failure.
void install_folder(const std::string& tmp_dir, const std::string& dir, const std::string& arg);

// Checks, without creating anything, that `path` can be written later: not a directory, and its
// folder exists and is writable. arg_error naming `arg` otherwise.
void check_writable_path(const std::string& path, const std::string& arg);
// The same for a folder ropekv will create if missing (fuzz --dump): an existing writable
// folder, or a missing one whose parent folder exists and is writable.
void check_writable_folder(const std::string& path, const std::string& arg);

// A file ropekv reads (golden files, npy tensors, JSON reports): a regular file only. A FIFO is
// opened without blocking and refused, as are devices (/dev/zero), sockets and folders, each an
// arg_error naming the path ("expected a regular file, got a FIFO"). Reads are of known pieces at
// known offsets, so a reader checks a header against size() before it reads (or allocates) more.
class input_file {
 public:
  explicit input_file(const std::string& path);
  ~input_file();
  input_file(const input_file&) = delete;
  input_file& operator=(const input_file&) = delete;
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_bytes_; }
  // Exactly n bytes from `offset` into dst, read in pieces of at most 64 MiB; an arg_error naming
  // the path (and `what`) when the file ends first (it shrank while read) or a read fails.
  void read_at(uint64_t offset, void* dst, uint64_t n, const std::string& what = "") const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_bytes_ = 0;
};

// What read_small_file's errors say the file should be (the defaults: any small file).
struct small_file_messages {
  // a larger file: "expected <what> of at most <max_bytes>, got <its size>"
  std::string what = "a file";
  // a file input_file refuses (missing, a FIFO, a folder): "expected <unreadable>, got <why>";
  // "" keeps input_file's own ("expected a regular file, got a FIFO")
  std::string unreadable;
  // sizes as exact byte counts ("67108865 bytes") instead of human_bytes ("64 MiB")
  bool exact_bytes = false;
};
// The messages of a fuzz report (`report merge`, the workers of `fuzz --jobs`).
small_file_messages report_file_messages();

// The whole of a small regular file (a JSON report, meta.json): refused before reading when it is
// larger than max_bytes ("expected a file of at most 64 MiB, got 1.96 GiB"); a FIFO or a device is
// refused without reading or blocking on it (input_file). Errors name `arg` (the path when arg is
// empty) and say what `msg` says the file should be.
std::string read_small_file(const std::string& path, uint64_t max_bytes, const std::string& arg = "",
                            const small_file_messages& msg = {});

// "1.96 GiB", "788 kB"-style sizes for messages.
std::string human_bytes(uint64_t bytes);

}  // namespace ropekv
