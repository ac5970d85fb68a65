#include "tools/fuzz_jobs.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>

#include "core/error.h"

namespace ropekv {

int64_t online_cpus() {
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int64_t>(n) : 1;
}

std::vector<std::string> without_options(const std::vector<std::string>& args,
                                         const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    bool drop = false;
    for (const std::string& n : names) {
      if (args[i] == n) {
        drop = true;
        ++i;  // and its value
        break;
      }
      if (args[i].rfind(n + "=", 0) == 0) {
        drop = true;
        break;
      }
    }
    if (!drop) out.push_back(args[i]);
  }
  return out;
}

temp_folder::temp_folder(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
  if (!::mkdtemp(pattern.data())) {
    throw arg_error("TMPDIR", "a writable folder for temporary files", fmt::format("{} ({})", pattern, std::strerror(errno)));
  }
  path_ = pattern;
}

temp_folder::~temp_folder() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string worker_report_path(const std::string& folder, int64_t index) {
  return fmt::format("{}/shard-{}.json", folder, index);
}

bool worker_end::finished() const { return WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 1); }

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return fmt::format("killed by signal {} ({}){}", sig, name ? name : "?", WCOREDUMP(status) ? ", core dumped" : "");
  }
  return fmt::format("wait status {:#x}", status);
}

namespace {

// What the signal handler reads: the workers to forward SIGINT / SIGTERM to.
volatile sig_atomic_t forwarded_signal = 0;
pid_t* volatile worker_pids = nullptr;
volatile sig_atomic_t worker_count = 0;

extern "C" void forward_to_workers(int sig) {
  forwarded_signal = sig;
  pid_t* pids = worker_pids;
  const int n = worker_count;
  for (int i = 0; i < n; ++i)
    if (pids[i] > 0) ::kill(pids[i], sig);
}

// One pipe from a worker: its stdout or its stderr, cut into prefixed lines.
struct worker_stream {
  int fd = -1;
  size_t worker = 0;
  bool is_err = false;
  std::string partial;
};

}  // namespace

workers_run run_workers(const std::vector<std::string>& args, int64_t count, const std::string& folder,
                        std::ostream& out, std::ostream& err) {
  const size_t n = static_cast<size_t>(count);
  // everything the children need, built before the first fork
  std::vector<std::vector<std::string>> argv_text(n);
  std::vector<std::vector<char*>> argv(n);
  std::vector<std::string> prefix(n);
  for (size_t i = 0; i < n; ++i) {
    argv_text[i].push_back("ropekv");
    argv_text[i].insert(argv_text[i].end(), args.begin(), args.end());
    for (const std::string& a : {std::string("--shard"), fmt::format("{}/{}", i, count), std::string("--json"),
                                 worker_report_path(folder, static_cast<int64_t>(i))})
      argv_text[i].push_back(a);
    for (std::string& a : argv_text[i]) argv[i].push_back(a.data());
    argv[i].push_back(nullptr);
    prefix[i] = fmt::format("[shard {}/{}] ", i, count);
  }
  std::vector<pid_t> pids(n, -1);
  std::vector<worker_stream> streams;
  workers_run result;
  result.workers.resize(n);

  // SIGINT / SIGTERM are held back while the workers start, then forwarded to every one
  sigset_t held, old_mask;
  sigemptyset(&held);
  sigaddset(&held, SIGINT);
  sigaddset(&held, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &held, &old_mask);
  struct sigaction forward{}, old_int{}, old_term{};
  forward.sa_handler = forward_to_workers;
  sigemptyset(&forward.sa_mask);
  forward.sa_flags = 0;  // no SA_RESTART: poll returns EINTR
  forwarded_signal = 0;
  worker_pids = pids.data();
  worker_count = 0;
  ::sigaction(SIGINT, &forward, &old_int);
  ::sigaction(SIGTERM, &forward, &old_term);
  std::vector<bool> ended(n, false);
  auto reap = [&](size_t i) {
    int status = 0;
    while (::waitpid(pids[i], &status, 0) < 0 && errno == EINTR) {
    }
    result.workers[i].status = status;
    ended[i] = true;
  };
  bool reaped = false;
  auto finish = [&](bool kill_workers) {
    // every worker reaped and the signal handling as it was, however this function ends
    if (reaped) return;
    reaped = true;
    for (size_t i = 0; i < n; ++i) {
      if (pids[i] <= 0 || ended[i]) continue;
      if (kill_workers) ::kill(pids[i], SIGTERM);
      reap(i);
    }
    for (worker_stream& s : streams)
      if (s.fd >= 0) ::close(s.fd);
    worker_count = 0;
    worker_pids = nullptr;
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
    ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  };
  struct on_exit {
    std::function<void()> f;
    ~on_exit() { f(); }
  } cleanup{[&] { finish(true); }};

  const pid_t parent = ::getpid();
  for (size_t i = 0; i < n; ++i) {
    int po[2], pe[2];
    if (::pipe2(po, O_CLOEXEC) != 0) throw error(fmt::format("fuzz --jobs: pipe: {}", std::strerror(errno)));
    if (::pipe2(pe, O_CLOEXEC) != 0) {
      ::close(po[0]);
      ::close(po[1]);
      throw error(fmt::format("fuzz --jobs: pipe: {}", std::strerror(errno)));
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      // the worker (async-signal-safe calls only until exec)
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(126);
      const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (null_fd < 0 || ::dup2(null_fd, 0) < 0 || ::dup2(po[1], 1) < 0 || ::dup2(pe[1], 2) < 0) ::_exit(126);
      struct sigaction dfl{};
      dfl.sa_handler = SIG_DFL;
      ::sigaction(SIGINT, &dfl, nullptr);
      ::sigaction(SIGTERM, &dfl, nullptr);
      ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
      ::execv("/proc/self/exe", argv[i].data());
      ::_exit(127);
    }
    ::close(po[1]);
    ::close(pe[1]);
    streams.push_back({po[0], i, false, {}});
    streams.push_back({pe[0], i, true, {}});
    if (pid < 0) throw error(fmt::format("fuzz --jobs: fork: {}", std::strerror(errno)));
    pids[i] = pid;
    worker_count = static_cast<sig_atomic_t>(i + 1);
  }
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);  // a signal that came meanwhile reaches all now

  auto emit = [&](worker_stream& s, bool all) {
    std::ostream& to = s.is_err ? err : out;
    size_t start = 0;
    for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string line = s.partial.substr(start, nl - start);
      to << prefix[s.worker] << line << "\n";
      if (s.is_err && !line.empty()) result.workers[s.worker].last_error = line;
    }
    s.partial.erase(0, start);
    if (all || s.partial.size() > (size_t{1} << 20)) {
      if (!s.partial.empty()) {
        to << prefix[s.worker] << s.partial << "\n";
        if (s.is_err) result.workers[s.worker].last_error = s.partial;
      }
      s.partial.clear();
    }
    to << std::flush;
  };
  std::vector<int> open_streams(n, 2);
  std::string buf(size_t{1} << 16, '\0');
  while (true) {
    std::vector<pollfd> fds;
    std::vector<worker_stream*> open;
    for (worker_stream& s : streams) {
      if (s.fd < 0) continue;
      fds.push_back({s.fd, POLLIN, 0});
      open.push_back(&s);
    }
    if (fds.empty()) break;
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      throw error(fmt::format("fuzz --jobs: poll: {}", std::strerror(errno)));
    }
    for (size_t k = 0; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      worker_stream& s = *open[k];
      const ssize_t got = ::read(s.fd, buf.data(), buf.size());
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        emit(s, true);
        ::close(s.fd);
        s.fd = -1;
        if (--open_streams[s.worker] == 0) {
          // the worker closed its output: it has ended (or is ending); a failed one fails them all
          reap(s.worker);
          if (!result.workers[s.worker].finished() && forwarded_signal == 0 && result.first_failed < 0) {
            result.first_failed = static_cast<int64_t>(s.worker);
            for (size_t i = 0; i < n; ++i)
              if (!ended[i]) ::kill(pids[i], SIGTERM);
          }
        }
        continue;
      }
      s.partial.append(buf.data(), static_cast<size_t>(got));
      emit(s, false);
    }
  }
  finish(false);
  result.signal = forwarded_signal;
  return result;
}

}  // namespace ropekv
