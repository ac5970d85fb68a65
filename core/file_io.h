// Files ropekv writes (reports, golden cases, bench JSON): never half a file, never a silent
// failure.
#pragma once
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

// Checks, without creating anything, that `path` can be written later: not a directory, and its
// folder exists and is writable. arg_error naming `arg` otherwise.
void check_writable_path(const std::string& path, const std::string& arg);
// The same for a folder ropekv will create if missing (fuzz --dump): an existing writable
// folder, or a missing one whose parent folder exists and is writable.
void check_writable_folder(const std::string& path, const std::string& arg);

}  // namespace ropekv
