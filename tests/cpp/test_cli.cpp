// The CLI in-process: help, exit codes, one-line errors, run/repro, golden round trips on every
// preset, corrupted golden files, shards, report merge.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/presets.h"
#include "core/problem.h"
#include "tests/cpp/cli_run.h"

namespace ropekv {
namespace {

using test::cli;
using test::cli_result;

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

std::string last_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  return t.substr(t.rfind('\n') == std::string::npos ? 0 : t.rfind('\n') + 1);
}

std::filesystem::path temp_dir(const char* tag) {
  auto p = std::filesystem::temp_directory_path() /
           ("ropekv_test_cli_" + std::string(tag) + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace

TEST_CASE("help teaches, with examples; version") {
  cli_result r = cli({"--help"});
  CHECK(r.rc == 0);
  CHECK(r.out.find("Examples:") != std::string::npos);
  CHECK(r.out.find("ropekv fuzz") != std::string::npos);
  cli_result f = cli({"fuzz", "--help"});
  CHECK(f.rc == 0);
  CHECK(f.out.find("--shard") != std::string::npos);
  CHECK(f.out.find("--repro") != std::string::npos);
  CHECK(cli({"golden", "write", "--help"}).out.find("--format") != std::string::npos);
}

TEST_CASE("bad usage: one-line error, exit 2") {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"fuzz", "--bogus"},
           {"run", "--preset", "no-such-model"},
           {"run"},
           {"fuzz", "--backends", "ref,nope"},
           {"fuzz", "--backends", "ref"},
           {"fuzz", "--time", "soon"},
           {"fuzz", "--shard", "3/2"},
           {"fuzz", "--repro", "tq=2 ts=1"},
           {"fuzz", "--repro", "bogus_key=1"},
           {"golden", "check", "/nonexistent/file.safetensors"},
           {"nosuchcommand"},
           {}}) {
    cli_result r = cli(args);
    CAPTURE(r.err);
    CHECK(r.rc == 2);
    CHECK(lines(r.err) == 1);
    CHECK(r.err.rfind("ropekv: error: ", 0) == 0);
  }
#if !ROPEKV_HAVE_HIP
  cli_result h = cli({"fuzz", "--backends", "ref,hip"});
  CHECK(h.rc == 2);
  CHECK(h.err.find("not compiled in") != std::string::npos);
  CHECK(h.err.find("ref (alias cpu), sim") != std::string::npos);
#endif
}

TEST_CASE("info") {
  cli_result r = cli({"info"});
  CHECK(r.rc == 0);
  CHECK(r.out.find("contract version: 1") != std::string::npos);
  CHECK(r.out.find("backends compiled in: ref, sim") != std::string::npos);
}

TEST_CASE("run prints what it wrote and a repro that replays the same problem") {
  cli_result r = cli({"run", "--preset", "kimi-k2", "--tokens", "8"});
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("q_out written: 8 rows x 64 heads, 589824 bytes") != std::string::npos);
  CHECK(r.out.find("cache written: 8 entries, 9216 bytes") != std::string::npos);
  auto at = r.out.find("--repro '");
  REQUIRE(at != std::string::npos);
  std::string repro = r.out.substr(at + 9, r.out.find('\'', at + 9) - at - 9);
  CHECK(parse_problem(repro) == preset_problem("kimi-k2", 8));
  cli_result again = cli({"run", "--backend", "cpu", "--repro", repro});
  CHECK(again.rc == 0);
  CHECK(again.out.find("cache written: 8 entries, 9216 bytes") != std::string::npos);
}

TEST_CASE("golden write then check round-trips on every preset, on ref and sim") {
  auto dir = temp_dir("golden");
  for (const model_preset& m : model_presets()) {
    CAPTURE(m.name);
    std::string path = (dir / (m.name + ".safetensors")).string();
    cli_result w = cli({"golden", "write", "--preset", m.name, "--tokens", "3", "--out", path});
    REQUIRE(w.rc == 0);
    for (const char* b : {"ref", "sim"}) {
      cli_result c = cli({"golden", "check", path, "--backend", b});
      INFO(c.out, c.err);
      CHECK(c.rc == 0);
      CHECK(last_line(c.out) == "1 passed, 0 failed");
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("golden write --random and --format npy") {
  auto dir = temp_dir("random");
  cli_result w = cli({"golden", "write", "--random", "3", "--seed", "5", "--max-tokens", "4", "--out",
                      (dir / "r").string()});
  REQUIRE(w.rc == 0);
  for (int i = 0; i < 3; ++i) {
    std::string p = (dir / "r" / ("case-000" + std::to_string(i) + ".safetensors")).string();
    cli_result c = cli({"golden", "check", p, "--backend", "sim"});
    INFO(c.out, c.err);
    CHECK(c.rc == 0);
  }
  cli_result n = cli({"golden", "write", "--repro", "tq=2 ts=2 tk=2 h=2 p=32", "--format", "npy", "--out",
                      (dir / "npy").string()});
  CHECK(n.rc == 0);
  CHECK(std::filesystem::exists(dir / "npy" / "meta.json"));
  CHECK(std::filesystem::exists(dir / "npy" / "q_out.expected.rope.npy"));  // nope columns: q_nope's
  CHECK(std::filesystem::exists(dir / "npy" / "cache.expected.npy"));
  cli_result all = cli({"golden", "write", "--repro", "tq=2 ts=2 tk=2 h=2 p=32", "--format", "npy", "--store-all",
                        "--out", (dir / "npy-all").string()});
  CHECK(all.rc == 0);
  CHECK(std::filesystem::exists(dir / "npy-all" / "q_out.expected.npy"));
  CHECK(std::filesystem::exists(dir / "npy-all" / "q_out.initial.npy"));
  CHECK(cli({"golden", "check", (dir / "npy").string(), "--backend", "ref"}).rc == 0);
  CHECK(cli({"golden", "check", (dir / "npy-all").string(), "--backend", "ref"}).rc == 0);
  CHECK(cli({"golden", "write", "--preset", "kimi-k2", "--format", "hdf5", "--out", "x"}).rc == 2);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a truncated or corrupted golden file: one-line error, exit 2") {
  auto dir = temp_dir("corrupt");
  std::string good = (dir / "good.safetensors").string();
  REQUIRE(cli({"golden", "write", "--repro", "tq=2 ts=3 tk=3 h=2 dn=16 dr=8 p=32 bs=4 nb=2", "--out", good}).rc == 0);
  std::ifstream in(good, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() > 64);
  auto write = [&](const std::string& name, const std::string& content) {
    std::string p = (dir / name).string();
    std::ofstream(p, std::ios::binary) << content;
    return p;
  };
  std::vector<std::string> bad = {
      write("empty.safetensors", ""),
      write("short.safetensors", bytes.substr(0, 5)),
      write("trunc_header.safetensors", bytes.substr(0, 40)),
      write("trunc_data.safetensors", bytes.substr(0, bytes.size() - 7)),
      write("huge_len.safetensors", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + bytes.substr(8)),
  };
  std::string flipped = bytes;
  flipped[12] = '#';  // breaks the JSON header
  bad.push_back(write("bad_json.safetensors", flipped));
  for (const std::string& p : bad) {
    cli_result r = cli({"golden", "check", p, "--backend", "ref"});
    CAPTURE(p);
    CAPTURE(r.err);
    CHECK(r.rc == 2);
    CHECK(lines(r.err) == 1);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("shard parsing, auto from the environment") {
  int64_t k = -1, n = -1;
  parse_shard("2/5", &k, &n);
  CHECK(k == 2);
  CHECK(n == 5);
  ::setenv("JOB_COMPLETION_INDEX", "3", 1);
  ::unsetenv("SLURM_ARRAY_TASK_ID");
  parse_shard("auto/4", &k, &n);
  CHECK(k == 3);
  ::setenv("SLURM_ARRAY_TASK_ID", "7", 1);
  ::setenv("SLURM_ARRAY_TASK_MIN", "6", 1);
  parse_shard("auto/4", &k, &n);
  CHECK(k == 1);
  ::unsetenv("SLURM_ARRAY_TASK_ID");
  ::unsetenv("SLURM_ARRAY_TASK_MIN");
  ::unsetenv("JOB_COMPLETION_INDEX");
  CHECK_THROWS_AS(parse_shard("auto/4", &k, &n), arg_error);
  CHECK_THROWS_AS(parse_shard("4/4", &k, &n), arg_error);
  CHECK_THROWS_AS(parse_shard("x/4", &k, &n), arg_error);
  CHECK(parse_duration_s("2m", "--time") == 120);
  CHECK(parse_duration_s("1.5", "--time") == 1.5);
  CHECK_THROWS_AS(parse_duration_s("-3s", "--time"), arg_error);
}

TEST_CASE("fuzz --json and report merge through the CLI; closing line") {
  auto dir = temp_dir("merge");
  std::string j0 = (dir / "s0.json").string(), j1 = (dir / "s1.json").string(), jm = (dir / "m.json").string();
  cli_result a = cli({"fuzz", "--backends", "ref,ref", "--cases", "12", "--max-tokens", "8", "--seed", "3",
                      "--shard", "0/2", "--json", j0});
  cli_result b = cli({"fuzz", "--backends", "ref,ref", "--cases", "12", "--max-tokens", "8", "--seed", "3",
                      "--shard", "1/2", "--json", j1});
  CHECK(a.rc == 0);
  CHECK(b.rc == 0);
  CHECK(last_line(a.out).find(" passed, 0 failed") != std::string::npos);
  cli_result m = cli({"report", "merge", j0, j1, "--json", jm});
  INFO(m.out, m.err);
  CHECK(m.rc == 0);
  CHECK(last_line(m.out).rfind("12 passed, 0 failed", 0) == 0);
  CHECK(std::filesystem::exists(jm));
  CHECK(cli({"report", "merge", j0, j0}).rc == 2);  // the same shard twice
  std::filesystem::remove_all(dir);
}

TEST_CASE("error messages are one printable line: a binary file's bytes quoted as \\xNN") {
  auto dir = temp_dir("binary");
  const std::string bin = (dir / "not.json").string(), utf8 = (dir / "r\xc3\xa9sum\xc3\xa9.json").string();
  {
    std::ofstream f(bin, std::ios::binary);
    f << "\xb0\x01\n\x02";
    std::ofstream g(utf8, std::ios::binary);
    g << "\xff";
  }
  cli_result r = cli({"report", "merge", bin});
  INFO(r.err);
  CHECK(r.rc == 2);
  CHECK(r.err.find("\\xb0") != std::string::npos);
  for (size_t i = 0; i + 1 < r.err.size(); ++i) {
    const auto c = static_cast<unsigned char>(r.err[i]);
    CHECK((c >= 0x20 && c < 0x7f));
  }
  CHECK(r.err.back() == '\n');
  CHECK(r.err.find('\n') == r.err.size() - 1);
  cli_result u = cli({"report", "merge", utf8});  // a UTF-8 file name stays as it is
  INFO(u.err);
  CHECK(u.rc == 2);
  CHECK(u.err.find("r\xc3\xa9sum\xc3\xa9.json") != std::string::npos);
  CHECK(u.err.find("\\xff") != std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace ropekv
