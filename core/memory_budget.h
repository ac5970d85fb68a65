// The memory a command needs for one case, computed from the problem before anything is
// allocated (`--max-memory`): every buffer make_case allocates (guards and strides included)
// times the copies the command keeps, and the limit it is checked against.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/problem.h"

namespace ropekv {

// Saturating arithmetic on sizes >= 0: a result past INT64_MAX is INT64_MAX, never a wrap.
inline int64_t sat_add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}
inline int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

// The commands that build cases, each with the copies of a case it keeps alive at once.
enum class memory_use : uint8_t {
  run,           // the case, the backend runs in place
  fuzz,          // the initial case and one set of outputs per backend (inputs shared)
  golden_write,  // the case and the reference's outputs (the file is streamed, not built in memory)
  golden_check,  // the file's tensors as read, the initial case, the expected outputs (the run's
                 // outputs take the place of the initial poisoned ones, dropped before the run)
  bench,         // the case and the copy each timed mode runs on
  bench_verify,  // bench --verify: those, and a fresh copy with the reference's and the backend's runs of it
};
const char* memory_use_name(memory_use u);

struct memory_item {
  std::string name;    // a case buffer ("q_out", "cache", ...) or "golden file tensors", ...
  int64_t bytes = 0;   // all copies together (allocation bytes: data, guards, alignment slack)
  int64_t copies = 1;
};

struct memory_need {
  std::vector<memory_item> items;  // biggest first (ties by name)
  int64_t total_bytes = 0;         // saturating sum of the items
  // "q_out 1.69 GiB (3 copies), q_nope 512.0 MiB, ..." : the `max_items` biggest, then "N more"
  std::string summary(size_t max_items = 4) const;
};

// What `use` needs for `prob` (no allocation; check_problem is not required: sizes saturate).
// `file_data_bytes`: golden_check only, the tensor bytes of the file (read before the case is
// built).
memory_need case_memory_need(const problem& prob, memory_use use, int64_t file_data_bytes = 0);

// The limit a case is checked against: `--max-memory`, or by default 80% of the memory
// available now (MemAvailable of /proc/meminfo, else physical memory), lowered to 80% of what a
// cgroup v2 limit (/sys/fs/cgroup/memory.max minus memory.current) leaves.
struct memory_limit {
  int64_t bytes = INT64_MAX;
  std::string source;  // "--max-memory" or "80% of available memory"
};
memory_limit default_memory_limit();

// Throws arg_error("--max-memory", ...) when `need` exceeds `limit`: one line with the total,
// the biggest items, the limit and its source, and `hint` (what makes the case smaller).
void check_memory(const memory_need& need, const memory_limit& limit, const std::string& hint);

}  // namespace ropekv
