#include "harness/isolate.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"

namespace ropekv {
namespace {

// What the child reports, then (kind ok, run_host) every region's bytes in order.
enum class child_kind : uint32_t { ok = 0, unsupported = 1, failed = 2 };

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes; false at an early end of the stream.
bool read_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

std::string signal_text(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? fmt::format("SIG{} (signal {})", abbrev, sig) : fmt::format("signal {}", sig);
}

class isolated_backend final : public backend {
 public:
  explicit isolated_backend(std::unique_ptr<backend> inner) : inner_(std::move(inner)) {}

  std::string name() const override { return inner_->name(); }

  // A child that crashes here is not a "not supported": the call says "supported" and the
  // next run_host reports the crash (the case is ERRORED, never silently SKIPPED).
  std::string unsupported_reason(const op_args& args) const override {
    std::string why;
    try {
      in_child(
          [&]() -> std::string { return inner_->unsupported_reason(args); }, nullptr,
          [&](const std::string& text) { why = text; });
    } catch (const unsupported_error&) {
      throw;
    } catch (const std::exception& e) {
      pending_failure_ = std::string(e.what()) + " (in unsupported_reason)";
      return {};
    }
    return why;
  }

  void run_host(const op_args& args, const std::vector<memory_region>& regions) override {
    if (!pending_failure_.empty()) {
      std::string f = std::move(pending_failure_);
      pending_failure_.clear();
      throw error(f);
    }
    in_child(
        [&]() -> std::string {
          inner_->run_host(args, regions);
          return {};
        },
        &regions, [](const std::string&) {});
  }

  void set_case_repro(const std::string& repro) override { inner_->set_case_repro(repro); }
  std::string last_variant() const override { return inner_->last_variant(); }
  std::string device_description() const override { return inner_->device_description(); }

 private:
  // Runs `work` in a child. On success: `regions` (when given) receive the child's bytes and
  // `done` the string work returned. Child exceptions are rethrown here; a crash is an error.
  template <class Work, class Done>
  void in_child(Work work, const std::vector<memory_region>* regions, Done done) const {
    int fds[2];
    if (::pipe(fds) != 0) throw error(fmt::format("--isolate: pipe failed: {}", std::strerror(errno)));
    std::fflush(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      throw error(fmt::format("--isolate: fork failed: {}", std::strerror(errno)));
    }
    if (pid == 0) {  // child: run, report, _exit (no destructors, no atexit handlers of the parent)
      ::close(fds[0]);
      // a crash kills the child by its signal: not through the parent's handlers (a test
      // framework's crash report, a sanitizer's) that would print as if the parent had crashed
      for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, SIG_DFL);
      child_kind kind = child_kind::ok;
      std::string text;
      try {
        text = work();
      } catch (const unsupported_error& e) {
        kind = child_kind::unsupported;
        text = e.what();
      } catch (const std::exception& e) {
        kind = child_kind::failed;
        text = e.what();
      } catch (...) {
        kind = child_kind::failed;
        text = "a non-standard exception";
      }
      const uint64_t len = text.size();
      bool ok = write_all(fds[1], &kind, sizeof kind) && write_all(fds[1], &len, sizeof len) &&
                write_all(fds[1], text.data(), text.size());
      if (ok && kind == child_kind::ok && regions) {
        for (const memory_region& r : *regions) ok = ok && write_all(fds[1], r.base, r.size_bytes);
      }
      ::_exit(ok ? 0 : 3);
    }
    ::close(fds[1]);
    child_kind kind{};
    uint64_t len = 0;
    std::string text;
    bool complete = read_all(fds[0], &kind, sizeof kind) && read_all(fds[0], &len, sizeof len);
    if (complete) {
      text.resize(len);
      complete = read_all(fds[0], text.data(), len);
    }
    // the bytes go into a staging copy first: a child that dies half-way writes nothing here
    std::vector<std::vector<uint8_t>> staged;
    if (complete && kind == child_kind::ok && regions) {
      for (const memory_region& r : *regions) {
        staged.emplace_back(r.size_bytes);
        complete = complete && read_all(fds[0], staged.back().data(), r.size_bytes);
      }
    }
    ::close(fds[0]);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(status)) throw error(fmt::format("{} crashed: {}", name(), signal_text(WTERMSIG(status))));
    if (!complete || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      throw error(fmt::format("{} exited with status {} before reporting its result", name(),
                              WIFEXITED(status) ? WEXITSTATUS(status) : -1));
    }
    if (kind == child_kind::unsupported) throw unsupported_error(text);
    if (kind == child_kind::failed) throw error(text);
    if (kind != child_kind::ok) throw error(fmt::format("--isolate: bad child report kind {}", static_cast<uint32_t>(kind)));
    if (regions) {
      for (size_t i = 0; i < regions->size(); ++i) std::memcpy((*regions)[i].base, staged[i].data(), staged[i].size());
    }
    done(text);
  }

  std::unique_ptr<backend> inner_;
  mutable std::string pending_failure_;  // a crash of the last unsupported_reason call
};

}  // namespace

std::unique_ptr<backend> make_isolated_backend(std::unique_ptr<backend> inner) {
  return std::make_unique<isolated_backend>(std::move(inner));
}

}  // namespace ropekv
