// Memory budgets of the commands that build cases (see core/memory_budget.h).
#include "core/memory_budget.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>

#include "core/case_data.h"
#include "core/error.h"
#include "core/file_io.h"

namespace ropekv {

const char* memory_use_name(memory_use u) {
  switch (u) {
    case memory_use::run: return "run";
    case memory_use::fuzz: return "fuzz";
    case memory_use::golden_write: return "golden write";
    case memory_use::golden_check: return "golden check";
    case memory_use::bench: return "bench";
    case memory_use::bench_verify: return "bench --verify";
  }
  return "?";
}

std::string memory_need::summary(size_t max_items) const {
  std::string s;
  size_t shown = 0;
  for (const memory_item& it : items) {
    if (shown == max_items) break;
    s += fmt::format("{}{} {}{}", s.empty() ? "" : ", ", it.name, human_bytes(static_cast<uint64_t>(it.bytes)),
                     it.copies > 1 ? fmt::format(" in {} copies", it.copies) : std::string());
    ++shown;
  }
  if (items.size() > shown) s += fmt::format(", {} more", items.size() - shown);
  return s;
}

memory_need case_memory_need(const problem& prob, memory_use use, int64_t file_data_bytes) {
  memory_need need;
  int64_t mask_bytes = 0;  // compare_runs: one bit per byte of each buffer the op writes
  for (const case_buffer_size& b : case_buffer_sizes(prob)) {
    // Copies alive at once. Inputs are shared by the runs of a case (their checksum is checked
    // after each run); the poisoned outputs of the initial case are not kept where the poison is
    // known (fuzz: make_case's), only the runs' own.
    int64_t copies = 1;
    const bool inplace = b.output && (b.name == "q_pe" || b.name == "k_pe" || b.name == "kv");
    switch (use) {
      case memory_use::run: copies = 1; break;
      case memory_use::fuzz: copies = b.output ? (inplace ? 3 : 2) : 1; break;
      // the case and the reference's outputs (the file is streamed from them)
      case memory_use::golden_write: copies = b.output ? 2 : 1; break;
      // the initial case and the expected outputs (then the run's, once the initial poisoned
      // outputs are dropped), plus the file's bytes while the case is filled from them
      case memory_use::golden_check: copies = b.output ? 2 : 1; break;
      case memory_use::bench: copies = 2; break;
      case memory_use::bench_verify: copies = 5; break;
    }
    if (b.output && (use == memory_use::fuzz || use == memory_use::golden_check || use == memory_use::bench_verify))
      mask_bytes = sat_add(mask_bytes, b.data_bytes / 8 + 1);
    need.items.push_back({b.name, sat_mul(b.alloc_bytes, copies), copies});
  }
  if (mask_bytes > 0) need.items.push_back({"compare masks", mask_bytes, 1});
  if (use == memory_use::golden_write) need.items.push_back({"file write buffer", int64_t{4} << 20, 1});
  if (use == memory_use::golden_check && file_data_bytes > 0)
    need.items.push_back({"golden file tensors", file_data_bytes, 1});
  std::sort(need.items.begin(), need.items.end(), [](const memory_item& x, const memory_item& y) {
    return x.bytes != y.bytes ? x.bytes > y.bytes : x.name < y.name;
  });
  for (const memory_item& it : need.items) need.total_bytes = sat_add(need.total_bytes, it.bytes);
  return need;
}

namespace {

// A "key:   N kB" line of /proc/meminfo in bytes; -1 when absent.
int64_t meminfo_bytes(const char* key) {
  std::ifstream f("/proc/meminfo");
  std::string name, unit;
  int64_t value = 0;
  while (f >> name >> value) {
    std::getline(f, unit);
    if (name == std::string(key) + ":") return sat_mul(value, 1024);
  }
  return -1;
}

// A cgroup v2 file holding one number ("max": none); -1 when absent or unlimited.
int64_t cgroup_value(const char* path) {
  std::ifstream f(path);
  std::string text;
  if (!(f >> text) || text == "max" || text.empty() || text.size() > 19) return -1;
  int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

}  // namespace

memory_limit default_memory_limit() {
  int64_t avail = meminfo_bytes("MemAvailable");
  if (avail < 0) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    avail = pages > 0 && page > 0 ? sat_mul(pages, page) : INT64_MAX;
  }
  std::string source = "80% of available memory";
  const int64_t cg_max = cgroup_value("/sys/fs/cgroup/memory.max");
  if (cg_max >= 0) {
    const int64_t cg_cur = std::max<int64_t>(cgroup_value("/sys/fs/cgroup/memory.current"), 0);
    const int64_t cg_left = std::max<int64_t>(cg_max - cg_cur, 0);
    if (cg_left < avail) {
      avail = cg_left;
      source = "80% of the cgroup's memory.max left";
    }
  }
  return {avail / 5 * 4, source};
}

void check_memory(const memory_need& need, const memory_limit& limit, const std::string& hint) {
  if (need.total_bytes <= limit.bytes) return;
  const std::string total = need.total_bytes == INT64_MAX ? "more than 8 EiB"
                                                          : human_bytes(static_cast<uint64_t>(need.total_bytes));
  throw arg_error("--max-memory",
                  fmt::format("a case that fits in {} ({}): {}", human_bytes(static_cast<uint64_t>(limit.bytes)),
                              limit.source, hint),
                  fmt::format("one that needs {} ({})", total, need.summary()));
}

}  // namespace ropekv
