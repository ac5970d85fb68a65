// Golden files from the tools' side (see tools/golden_io.h).
#include <fmt/format.h>

#include <filesystem>

#include "core/error.h"
#include "core/golden.h"
#include "tools/golden_io.h"

namespace ropekv {

void write_failure_dump(const std::string& path, const case_data& initial, const case_data& a,
                        const case_data& b, const std::string& backend_a,
                        const std::string& backend_b) {
  std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  golden_file file = make_golden(initial, a);
  golden_file got = make_golden(initial, b);
  for (auto& [name, t] : got.tensors) {
    const std::string suffix = ".expected";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      const std::string got_name = name.substr(0, name.size() - suffix.size()) + ".got";
      file.tensors[got_name] = t;
    }
  }
  // The dtypes entry must name every tensor, the added ones included.
  auto it = file.metadata.find("dtypes");
  if (it != file.metadata.end()) {
    nlohmann::json dtypes = nlohmann::json::parse(it->second);
    for (const auto& [name, t] : file.tensors) dtypes[name] = dtype_name(t.type);
    it->second = dtypes.dump();
  }
  file.metadata["backend_a"] = backend_a;
  file.metadata["backend_b"] = backend_b;
  file.metadata["note"] = "fuzz failure: *.expected from backend_a, *.got from backend_b";
  write_golden(path, file);
}

case_record check_golden_file(const std::string& path, backend& b, const compare_options& cmp) {
  golden_case g = load_golden_case(path);
  case_record rec;
  rec.report.repro = g.file.prob.to_repro();
  std::string why = b.unsupported_reason(g.initial.args);
  if (!why.empty()) {
    rec.report.outcome = case_outcome::skipped;
    rec.report.message = b.name() + ": " + why;
    return rec;
  }
  case_data run = g.initial.clone();
  try {
    b.run_host(run.args, run.regions());
  } catch (const std::exception& e) {
    rec.report.outcome = case_outcome::errored;
    rec.report.message = fmt::format("backend {} threw: {}", b.name(), e.what());
    return rec;
  }
  rec.variant_b = b.last_variant();
  rec.report = compare_runs(g.initial, g.expected, run, cmp);
  return rec;
}

}  // namespace ropekv
