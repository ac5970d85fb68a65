// Memory budgets (core/memory_budget.h): the bytes of every buffer from the problem alone, equal
// to what make_case allocates; the copies each command keeps; saturation; --max-memory parsing.
#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "cli_run.h"
#include "harness/fuzz.h"
#include "core/case_data.h"
#include "core/error.h"
#include "core/memory_budget.h"
#include "core/problem.h"
#include "tools/cli.h"

using namespace ropekv;

namespace {

// What a made case actually holds: raw bytes (guards included) plus host_buffer's alignment slack.
std::map<std::string, int64_t> allocated(const case_data& c) {
  std::map<std::string, int64_t> out;
  for (const auto& [name, b] : c.buffers)
    out[name] = static_cast<int64_t>(b.raw_size_bytes() + host_buffer::alignment_bytes - 1);
  return out;
}

int64_t item_bytes(const memory_need& n, const std::string& name) {
  for (const memory_item& it : n.items)
    if (it.name == name) return it.bytes;
  return -1;
}

}  // namespace

TEST_CASE("memory budget: a small problem checked by hand") {
  // bf16 inputs, q_out and cache, i64 indices, table one, layout joint
  const problem p = parse_problem("tq=2 ts=3 tk=3 h=2 dn=16 dr=8 p=16 bs=4 nb=2 seed=3");
  const std::map<std::string, int64_t> data = {
      {"q_nope", 2 * 2 * 16 * 2}, {"q_pe", 2 * 2 * 8 * 2}, {"kv_c", 3 * 16 * 2},        {"k_pe", 3 * 8 * 2},
      {"positions", 3 * 8},       {"slot_mapping", 3 * 8}, {"cos_sin", 16 * 8 * 2},     {"q_out", 2 * 2 * 24 * 2},
      {"cache", 2 * 4 * 24 * 2}};
  const int64_t overhead = 2 * 256 + 63;  // guards before and after, alignment slack
  std::map<std::string, int64_t> got;
  for (const case_buffer_size& b : case_buffer_sizes(p)) {
    got[b.name] = b.data_bytes;
    CHECK(b.alloc_bytes == b.data_bytes + overhead);
    CHECK(b.output == (b.name == "q_out" || b.name == "cache"));
  }
  CHECK(got == data);
  int64_t sum = 0;
  for (const auto& [name, bytes] : data) sum += bytes + overhead;
  const memory_need run = case_memory_need(p, memory_use::run);
  CHECK(run.total_bytes == sum);
  CHECK(run.items.size() == data.size());
  CHECK(run.items.front().name == "cache");  // biggest first
  // fuzz: inputs shared by the runs, outputs once per backend, one mask bit per output byte
  const memory_need fuzz = case_memory_need(p, memory_use::fuzz);
  CHECK(item_bytes(fuzz, "q_out") == 2 * (192 + overhead));
  CHECK(item_bytes(fuzz, "q_nope") == 128 + overhead);
  CHECK(item_bytes(fuzz, "compare masks") == (192 / 8 + 1) + (384 / 8 + 1));
  CHECK(fuzz.total_bytes == sum + (192 + overhead) + (384 + overhead) + (192 / 8 + 1) + (384 / 8 + 1));
  const memory_need check = case_memory_need(p, memory_use::golden_check, 1000);
  CHECK(item_bytes(check, "golden file tensors") == 1000);
  CHECK(item_bytes(check, "cache") == 2 * (384 + overhead));
  CHECK(item_bytes(case_memory_need(p, memory_use::golden_write), "q_out") == 2 * (192 + overhead));
}

TEST_CASE("memory budget: equal to what make_case allocates, on random problems") {
  for (uint64_t i = 0; i < 60; ++i) {
    const problem p = random_problem(11, i, 16);
    INFO(p.to_repro());
    const case_data c = make_case(p);
    std::map<std::string, int64_t> want = allocated(c), got;
    for (const case_buffer_size& b : case_buffer_sizes(p)) {
      got[b.name] = b.alloc_bytes;
      CHECK(b.data_bytes == static_cast<int64_t>(c.buffers.at(b.name).size_bytes()));
      CHECK(b.output == is_output_buffer(p, b.name));
    }
    CHECK(got == want);
    int64_t sum = 0;
    for (const auto& [name, bytes] : want) sum += bytes;
    CHECK(case_memory_need(p, memory_use::run).total_bytes == sum);
    // a run's copy shares the inputs and owns the outputs
    const case_data run = c.clone_outputs();
    for (const auto& [name, b] : c.buffers)
      CHECK(run.buffers.at(name).shares_memory_with(b) == !is_output_buffer(p, name));
  }
}

TEST_CASE("memory budget: sizes saturate, never wrap, and the refusal names --max-memory") {
  problem p = parse_problem("tq=1 ts=1 tk=1");
  p.tq = int64_t{1} << 40;  // beyond check_problem's bounds: the budget must still not wrap
  p.heads = int64_t{1} << 30;
  const memory_need n = case_memory_need(p, memory_use::fuzz);
  CHECK(n.total_bytes == INT64_MAX);
  CHECK(item_bytes(n, "q_nope") == INT64_MAX);
  try {
    check_memory(n, memory_limit{int64_t{1} << 30, "--max-memory"}, "use fewer tokens");
    FAIL("no error");
  } catch (const arg_error& e) {
    CHECK(e.arg() == "--max-memory");
    CHECK(std::string(e.what()).find("more than 8 EiB") != std::string::npos);
    CHECK(std::string(e.what()).find("q_nope") != std::string::npos);
  }
  // a 4 TiB kv_c budget, below the limit of int64
  problem big = parse_problem("tq=1 ts=1 tk=1");
  big.tk = int64_t{1} << 30;
  big.dn = 2048 - 64;
  const memory_need b = case_memory_need(big, memory_use::run);
  CHECK(item_bytes(b, "kv_c") == (int64_t{1} << 30) * 1984 * 2 + 575);
  CHECK(b.items.front().name == "kv_c");
  CHECK_NOTHROW(check_memory(b, memory_limit{INT64_MAX, "x"}, ""));
  CHECK(default_memory_limit().bytes > 0);
}

TEST_CASE("memory budget: --max-memory sizes") {
  CHECK(parse_memory_size("1000000", "--max-memory") == 1000000);
  CHECK(parse_memory_size("512MiB", "--max-memory") == int64_t{512} << 20);
  CHECK(parse_memory_size("41.2GiB", "--max-memory") == static_cast<int64_t>(41.2 * (1 << 30)));
  CHECK(parse_memory_size("1.5kB", "--max-memory") == 1500);
  CHECK(parse_memory_size("4194304TiB", "--max-memory") == int64_t{1} << 62);
  for (const char* bad : {"", "-1", "1e3", "0x10", "abc", "5XB", "0", "4194305TiB", ".5GiB", "1.GiB", "1 GiB",
                          "99999999999999999999999", "+1"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_memory_size(bad, "--max-memory"), arg_error);
  }
  const test::cli_result r = test::cli({"run", "--repro", "tq=2 ts=3 tk=3 h=2 dn=16 dr=8 p=16 bs=4 nb=2", "--max-memory", "1KiB"});
  CHECK(r.rc == 2);
  CHECK(r.out.empty());
  CHECK(r.err.find("ropekv: error: --max-memory: expected a case that fits in 1.0 KiB (--max-memory)") == 0);
  CHECK(r.err.find("cache 959 bytes") != std::string::npos);
}

namespace {
// The reference, then one byte of a buffer flipped (an input the runs share, or an output).
class writes_after_ref : public backend {
 public:
  writes_after_ref(std::string buffer, bool at_end) : buffer_(std::move(buffer)), at_end_(at_end) {}
  std::string name() const override { return "writes-" + buffer_; }
  std::string unsupported_reason(const op_args& a) const override { return ref_->unsupported_reason(a); }
  void run_host(const op_args& args, const std::vector<memory_region>& regions) override {
    ref_->run_host(args, regions);
    for (const auto& [n, v] : named_tensors(args))
      if (buffer_ == n) {
        auto* p = static_cast<uint8_t*>(v->data);
        // kv_c: its first byte; cache: the last byte of the block padding (never written)
        p[at_end_ ? v->extent_bytes().second + 7 : 0] ^= 0x40;
      }
  }

 private:
  std::unique_ptr<backend> ref_ = make_cpu_backend();
  std::string buffer_;
  bool at_end_;
};
}  // namespace

TEST_CASE("memory budget: runs share inputs and drop the poison, and still catch every write") {
  const problem p = parse_problem("tq=2 ts=3 tk=3 h=2 dn=16 dr=8 p=16 bs=4 nb=2 block_pad=8 seed=3");
  std::unique_ptr<backend> ref = make_cpu_backend();
  SUBCASE("a clean pair passes") {
    std::unique_ptr<backend> ref2 = make_cpu_backend();
    CHECK(run_case(p, *ref, *ref2, compare_options{}).report.outcome == case_outcome::passed);
  }
  SUBCASE("backend b writes into a shared input: reported where, the inputs made again for the rest") {
    writes_after_ref bad("kv_c", false);
    const case_record r = run_case(p, *ref, bad, compare_options{});
    CHECK(r.report.outcome == case_outcome::failed);
    const region_report* g = nullptr;
    for (const region_report& x : r.report.regions)
      if (x.name == "kv_c.unchanged") g = &x;
    REQUIRE(g != nullptr);
    CHECK(g->mismatches == 1);
    REQUIRE(g->first.size() == 1);
    CHECK(g->first[0].run == "b");
    CHECK(g->first[0].where == "byte=0");
  }
  SUBCASE("backend a writes into a shared input: run b gets the inputs as made") {
    writes_after_ref bad("kv_c", false);
    const case_record r = run_case(p, bad, *ref, compare_options{});
    CHECK(r.report.outcome == case_outcome::failed);
    for (const region_report& x : r.report.regions)
      if (x.name == "kv_c.unchanged") {
        CHECK(x.mismatches == 1);
        CHECK(x.first.at(0).run == "a");
      } else if (x.name == "q_out.nope" || x.name == "cache.nope") {
        CHECK(x.mismatches == 0);  // b read the inputs unchanged
      }
  }
  SUBCASE("a write into a dropped output's padding is checked against the poison") {
    writes_after_ref bad("cache", true);
    const case_record r = run_case(p, *ref, bad, compare_options{});
    CHECK(r.report.outcome == case_outcome::failed);
    for (const region_report& x : r.report.regions)
      if (x.name == "cache.untouched") {
        CHECK(x.mismatches == 1);
        CHECK(x.first.at(0).expected_bits == poison_byte);
        CHECK(x.first.at(0).got_bits == (poison_byte ^ 0x40));
      }
  }
}
