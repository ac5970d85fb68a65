// `ropekv fuzz --jobs N`: the campaign as N local worker processes, one shard each (the CLI's
// cmd_fuzz_jobs merges their reports).
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace ropekv {

// The largest report file read (`report merge` refuses a larger one unread): report files are
// read with core/file_io's read_small_file(path, max_report_bytes, "", report_file_messages()).
constexpr int64_t max_report_bytes = int64_t{64} << 20;

// The processors online (at least 1): `--jobs` takes 1..4 times this.
int64_t online_cpus();

// `args` without the options named (each as "--name VALUE" or "--name=VALUE").
std::vector<std::string> without_options(const std::vector<std::string>& args,
                                         const std::vector<std::string>& names);

// A new, empty temporary folder (in $TMPDIR, else /tmp), removed with its content when the
// object is destroyed.
class temp_folder {
 public:
  explicit temp_folder(const std::string& prefix);
  ~temp_folder();
  temp_folder(const temp_folder&) = delete;
  temp_folder& operator=(const temp_folder&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct worker_end {
  int status = 0;          // as waitpid reports it
  std::string last_error;  // the last line the worker wrote to stderr ("" if none)
  // It exited as a campaign does (0: passed; 1: failures), so its report was written.
  bool finished() const;
};

struct workers_run {
  std::vector<worker_end> workers;  // worker i ran shard i/N
  int signal = 0;                   // SIGINT or SIGTERM forwarded to the workers; 0 when none came
  int64_t first_failed = -1;        // the first worker that ended unfinished (the others were then
                                    // stopped with SIGTERM); -1 when none did
};

// Runs `count` workers: worker i is this executable (/proc/self/exe) with `args` followed by
// `--shard i/count --json <folder>/shard-i.json`, in its own process group (SIGINT and SIGTERM
// reach it once: this process forwards them), ended with SIGTERM if this process dies, stdin
// from /dev/null. Their stdout and stderr lines go to `out` and `err` as they come, each line
// prefixed "[shard i/count] ". A worker that ends unfinished (crashed, killed, an error) stops
// the others (SIGTERM): the campaign has failed. Returns when every worker has ended.
workers_run run_workers(const std::vector<std::string>& args, int64_t count, const std::string& folder,
                        std::ostream& out, std::ostream& err);

// The report file worker `index` writes in `folder`.
std::string worker_report_path(const std::string& folder, int64_t index);

// "exit code 2", "killed by signal 11 (Segmentation fault)".
std::string describe_wait_status(int status);

}  // namespace ropekv
