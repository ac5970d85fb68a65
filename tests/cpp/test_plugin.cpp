// The plugin ABI (include/ropekv/plugin.h) and the plugin backend (backends/plugin): fixed codes
// tied to ropekv's enums, the descriptor of a case, loading errors (missing symbol, another ABI
// version), a plugin that says "no" (SKIPPED) or fails (ERRORED), the planted-bug example plugin
// found and shrunk, the crashing one under --isolate.
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>

#include "backends/plugin/plugin_backend.h"
#include "core/case_data.h"
#include "core/error.h"
#include "harness/fuzz.h"
#include "ropekv/version.h"
#include "tools/backends_registry.h"
#include "tests/cpp/cli_run.h"

namespace ropekv {
namespace {

std::string example_plugin(const char* name) {
  return std::string(ROPEKV_BINARY_DIR) + "/examples/plugin_cpu/lib" + name + ".so";
}
std::string test_plugin(const char* flavour) {
  return std::string(ROPEKV_BINARY_DIR) + "/tests/plugins/libtest_plugin_" + flavour + ".so";
}

using test::cli;
using test::cli_result;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("plugin ABI: fixed codes, one per ropekv value") {
  static_assert(ROPEKV_CONTRACT_VERSION == contract_version, "ropekv/version.h vs core/op.h");
  // the numbers written in the header (never renumbered) and ropekv's dtypes, both ways
  const std::pair<dtype, int> codes[] = {
      {dtype::f32, 0},          {dtype::f16, 1},          {dtype::bf16, 2}, {dtype::fp8_e4m3fn, 3},
      {dtype::fp8_e4m3fnuz, 4}, {dtype::fp8_e5m2, 5},     {dtype::fp8_e5m2fnuz, 6},
      {dtype::i32, 7},          {dtype::i64, 8},          {dtype::u8, 9}};
  CHECK(std::size(codes) == std::size(all_dtypes));
  for (auto [t, code] : codes) {
    CAPTURE(dtype_name(t));
    CHECK(plugin_dtype_code(t) == code);
    CHECK(dtype_of_plugin_code(code, "dtype") == t);
  }
  CHECK_THROWS_WITH_AS(dtype_of_plugin_code(10, "q_out.dtype"), "q_out.dtype: expected a ROPEKV_DTYPE_* code 0..9, got 10",
                       arg_error);
}

TEST_CASE("plugin ABI: the descriptor of a case carries sizes, element strides and options") {
  problem p = parse_problem("tq=2 ts=3 tk=4 h=3 dn=8 dr=4 p=16 bs=4 nb=2 layout=split table=two style=neox "
                            "q_layout=head_major row_pad=2 pad_q=skipped pos_oob=clamp k_scale=0.5");
  case_data c = make_case(p);
  ropekv_plugin_args a = to_plugin_args(c.args);
  CHECK(a.struct_size == sizeof(ropekv_plugin_args));
  CHECK(a.abi_version == ROPEKV_PLUGIN_ABI_VERSION);
  CHECK(a.q_nope.rank == 3);
  CHECK(a.q_nope.sizes[1] == 3);
  for (int d = 0; d < 3; ++d) CHECK(a.q_nope.strides[d] == c.args.q_nope.strides_elems[static_cast<size_t>(d)]);
  CHECK(a.q_nope.data == c.args.q_nope.data);
  CHECK(a.q_nope.device == ROPEKV_DEVICE_HOST);
  CHECK(a.cache.data == nullptr);
  CHECK(a.cache.rank == 0);
  CHECK(a.cos_sin.data == nullptr);
  CHECK(a.cos.sizes[1] == 2);
  CHECK(a.kpe_cache.sizes[2] == 4);
  CHECK(a.cache_layout == ROPEKV_LAYOUT_SPLIT);
  CHECK(a.table_kind == ROPEKV_TABLE_TWO);
  CHECK(a.rope_style == ROPEKV_ROPE_NEOX);
  CHECK(a.pad_q == ROPEKV_PAD_Q_SKIPPED);
  CHECK(a.pos_oob == ROPEKV_POS_OOB_CLAMP);
  CHECK(a.k_scale == 0.5f);
}

TEST_CASE("plugin backend: loading errors name the library and what is missing") {
  // not a library at all
  std::string missing = "/nonexistent/libnothing.so";
  CHECK_THROWS_AS(make_plugin_backend(missing), arg_error);
  try {
    make_plugin_backend(missing);
  } catch (const arg_error& e) {
    CHECK(e.arg() == "plugin " + missing);
    CHECK(e.expected() == "a loadable shared library");
  }
  // a library without ropekv_plugin_run
  std::string no_run = test_plugin("no_run");
  CHECK_THROWS_WITH_AS(make_plugin_backend(no_run),
                       ("plugin " + no_run + ": expected a ropekv plugin exporting ropekv_plugin_run "
                        "(include/ropekv/plugin.h), got a library without ropekv_plugin_run").c_str(),
                       arg_error);
  // built against another ABI version
  std::string abi99 = test_plugin("abi99");
  CHECK_THROWS_WITH_AS(make_plugin_backend(abi99),
                       ("plugin " + abi99 + ": expected plugin ABI version 1 (ropekv_plugin_abi_version()), got 99").c_str(),
                       arg_error);
  // the CLI: one line, exit 2
  cli_result r = cli({"fuzz", "--backends", "ref,plugin:" + abi99, "--cases", "1"});
  CHECK(r.rc == 2);
  CHECK(has(r.err, "expected plugin ABI version 1"));
  cli_result empty = cli({"fuzz", "--backends", "ref,plugin:", "--cases", "1"});
  CHECK(empty.rc == 2);
  CHECK(has(empty.err, "backend: expected plugin:PATH with the path of a plugin library, got 'plugin:'"));
}

TEST_CASE("plugin backend: a plugin's no is SKIPPED, its error is ERRORED with the message") {
  cli_result no = cli({"fuzz", "--backends", "ref,plugin:" + test_plugin("says_no"), "--cases", "5", "--max-tokens", "4"});
  CAPTURE(no.out);
  CHECK(no.rc == 0);
  CHECK(has(no.out, "0 passed, 0 failed, 5 skipped"));
  CHECK(has(no.out, "not supported: this test plugin runs nothing"));
  cli_result err = cli({"fuzz", "--backends", "ref,plugin:" + test_plugin("run_error"), "--cases", "3", "--max-tokens",
                        "4", "--no-shrink"});
  CAPTURE(err.out);
  CHECK(err.rc == 1);
  CHECK(has(err.out, "ropekv_plugin_run returned 1: workspace of"));
  CHECK(has(err.out, "replay: ropekv fuzz --backends ref,plugin:" + test_plugin("run_error") + " --repro '"));
}

namespace {
// A device_mirror whose "device" is host memory: it marks every view on_device, hands a stream
// handle of its own, and counts the runs (the plugin backend's GPU path without a GPU).
struct fake_mirror final : device_mirror {
  std::string no_gpu;
  int* runs;
  fake_mirror(std::string why, int* counter) : no_gpu(std::move(why)), runs(counter) {}
  std::string unavailable_reason() const override { return no_gpu; }
  void run(const op_args& host_args, const std::vector<memory_region>& regions,
           const std::function<void(const op_args&, void*)>& launch) override {
    ++*runs;
    op_args d = host_args;
    for (const auto& [name, view] : named_tensors(d)) const_cast<tensor_view*>(view)->on_device = true;
    launch(d, reinterpret_cast<void*>(uintptr_t{0x1234}));
  }
};
}  // namespace

TEST_CASE("plugin backend: a GPU plugin runs through the device mirror, or is not supported without one") {
  const std::string gpu = test_plugin("gpu");
  case_data c = make_case(parse_problem("tq=1 ts=1 tk=1 h=2 dn=8 dr=4 p=8 bs=4 nb=2"));
  // no GPU backend in this ropekv: every case is not supported, saying why
  auto none = make_plugin_backend(gpu);
  CHECK(has(none->unsupported_reason(c.args), "not supported: the plugin wants GPU memory and this ropekv has no GPU backend"));
  CHECK(has(none->device_description(), "GPU memory"));
  // a GPU backend that sees no GPU
  int runs = 0;
  auto blind = make_plugin_backend(gpu, [&] { return std::make_unique<fake_mirror>("hip: no GPU visible", &runs); });
  CHECK(blind->unsupported_reason(c.args) == "not supported: the plugin wants GPU memory: hip: no GPU visible");
  CHECK_THROWS_AS(blind->run_host(c.args, c.regions()), unsupported_error);
  CHECK(runs == 0);
  // with a device: supports() sees GPU tensors; run() gets the mirror's device views and stream
  auto dev = make_plugin_backend(gpu, [&] { return std::make_unique<fake_mirror>("", &runs); });
  CHECK(dev->unsupported_reason(c.args) == "");
  CHECK_THROWS_WITH_AS(dev->run_host(c.args, c.regions()),
                       doctest::Contains("run saw q_out.device=1 kv_c.device=1 stream=0x1234"), error);
  CHECK(runs == 1);
}

TEST_CASE("plugin backend: the example plugin passes, its planted bug is found and shrunk") {
  cli_result good = cli({"fuzz", "--backends", "ref,plugin:" + example_plugin("plugin"), "--cases", "200", "--max-tokens", "8"});
  CAPTURE(good.out);
  CHECK(good.rc == 0);
  CHECK(has(good.out, " passed, 0 failed"));
  cli_result bug = cli({"fuzz", "--backends", "ref,plugin:" + example_plugin("plugin_bug"), "--cases", "200",
                        "--max-tokens", "8", "--max-failures", "1", "--shrink-time", "10s"});
  CAPTURE(bug.out);
  CHECK(bug.rc == 1);
  CHECK(has(bug.out, "FAILED"));
  CHECK(has(bug.out, "shrunk ("));
  CHECK(has(bug.out, "ropekv fuzz --backends ref,plugin:" + example_plugin("plugin_bug") + " --repro 'tq=1 "));
}

TEST_CASE("plugin backend: kv heads (rank-3 k rows, rank-4 caches) are not supported, never a silent pass") {
  auto be = make_plugin_backend(example_plugin("plugin"));
  case_data one = make_case(parse_problem("tq=2 ts=2 tk=2 h=4 dn=16 dr=8 p=16 bs=4 nb=1"));
  CHECK(be->unsupported_reason(one.args).empty());
  case_data two = make_case(parse_problem("tq=2 ts=2 tk=2 h=4 kh=2 dn=16 dr=8 p=16 bs=4 nb=1"));
  CHECK(has(be->unsupported_reason(two.args), "not supported: kv heads (KH = 2"));
  cli_result r = cli({"fuzz", "--backends", "ref,plugin:" + example_plugin("plugin"), "--cases", "20", "--max-tokens", "8",
                      "--pin", "kh=2"});
  CAPTURE(r.out);
  CHECK(r.rc == 0);
  CHECK(has(r.out, "0 passed, 0 failed, 20 skipped"));
}

TEST_CASE("plugin backend: a crashing plugin under --isolate is an ERRORED case, the campaign finishes") {
  cli_result r = cli({"fuzz", "--backends", "ref,plugin:" + example_plugin("plugin_crash"), "--cases", "40",
                      "--max-tokens", "8", "--isolate", "--shrink-time", "5s"});
  CAPTURE(r.out);
  CHECK(r.rc == 1);
  CHECK(has(r.out, "crashed: SIGSEGV"));
  CHECK(has(r.out, "--isolate --repro '"));
  CHECK(has(r.out, "errored (counted as failed below)"));
  CHECK(has(r.out, "backends ref vs plugin:" + example_plugin("plugin_crash") + ", seed 1, shard 0/1, 40 cases"));
}

}  // namespace ropekv
