// Golden files from the harness' side (see harness/golden_io.h).
#include <fmt/format.h>

#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/golden.h"
#include "harness/golden_io.h"

namespace ropekv {

std::string got_dump_path(const std::string& path) {
  const std::string ext = ".safetensors";
  if (path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0) {
    return path.substr(0, path.size() - ext.size()) + ".got" + ext;
  }
  return path + ".got";
}

void write_failure_dump(const std::string& path, const case_data& initial, const case_data& a,
                        const case_data& b, const std::string& backend_a,
                        const std::string& backend_b) {
  std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  // The golden format holds exactly the tensors the repro implies, so the two runs go to two
  // files of the same case: `.expected` tensors from run a, and from run b.
  for (bool is_b : {false, true}) {
    golden_file file = make_golden(initial, is_b ? b : a);
    file.metadata["backend_a"] = backend_a;
    file.metadata["backend_b"] = backend_b;
    file.metadata["expected_from"] = is_b ? backend_b : backend_a;
    file.metadata["note"] = is_b ? "fuzz failure: the *.expected tensors hold what backend_b wrote"
                                 : "fuzz failure: the *.expected tensors hold what backend_a wrote";
    write_golden(is_b ? got_dump_path(path) : path, file);
  }
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
  // Memory: the run shares the initial inputs (their checksum is checked after it) and owns its
  // outputs; the initial poisoned outputs are dropped (their pattern is known).
  g.initial.drop_poison_outputs();  // first: the run then makes its outputs anew
  case_data run = g.initial.clone_outputs();
  std::map<std::string, uint64_t> sums;
  for (const auto& [name, buf] : g.initial.buffers)
    if (run.buffers.at(name).shares_memory_with(buf)) sums[name] = buffer_checksum(buf);
  try {
    b.set_case_repro(rec.report.repro);
    b.run_host(run.args, run.regions());
  } catch (const unsupported_error& e) {
    rec.report.outcome = case_outcome::skipped;
    rec.report.message = b.name() + ": " + e.what();
    return rec;
  } catch (const std::exception& e) {
    rec.report.outcome = case_outcome::errored;
    rec.report.message = fmt::format("backend {} threw: {}", b.name(), e.what());
    return rec;
  }
  rec.variant_b = b.last_variant();
  // A backend that wrote into its inputs keeps what it wrote; the initial case and the expected
  // run get the file's inputs again (a failing case only: the comparison then says where).
  std::vector<std::string> changed;
  for (const auto& [name, sum] : sums)
    if (buffer_checksum(g.initial.buffers.at(name)) != sum) changed.push_back(name);
  if (!changed.empty()) {
    golden_case again = load_golden_case(path);
    for (const std::string& name : changed) {
      host_buffer pristine = std::move(again.initial.buffers.at(name));
      if (g.expected.buffers.at(name).shares_memory_with(g.initial.buffers.at(name)))
        g.expected.replace_buffer(name, pristine.share());
      g.initial.replace_buffer(name, std::move(pristine));
    }
  }
  rec.report = compare_runs(g.initial, g.expected, run, cmp);
  return rec;
}

golden_compare_result compare_golden_outputs(const golden_case& g, const tensor_file& outputs,
                                             const compare_options& cmp) {
  golden_compare_result r;
  const case_data got = case_with_outputs(g.initial, outputs, &r.ignored);
  r.rec.report = compare_runs(g.initial, g.expected, got, cmp);
  r.rec.report.expected_label = "reference";
  r.rec.report.got_label = "yours";
  return r;
}

golden_compare_result compare_golden_outputs(const std::string& golden_path, const std::string& outputs_path,
                                             const compare_options& cmp) {
  const golden_case g = load_golden_case(golden_path);
  return compare_golden_outputs(g, read_tensor_file(outputs_path), cmp);
}

void write_reference_golden(const std::string& path, const std::string& format, const case_data& before,
                            backend& ref, const golden_write_options& opt) {
  if (format != "safetensors" && format != "npy") throw arg_error("format", "safetensors or npy", "'" + format + "'");
  case_data after = before.clone_outputs();  // the inputs shared, checked after the run
  std::map<std::string, uint64_t> sums;
  for (const auto& [name, buf] : before.buffers)
    if (after.buffers.at(name).shares_memory_with(buf)) sums[name] = buffer_checksum(buf);
  ref.set_case_repro(before.prob.to_repro());
  ref.run_host(after.args, after.regions());
  for (const auto& [name, sum] : sums)
    if (buffer_checksum(before.buffers.at(name)) != sum)
      throw error(fmt::format("golden write: the reference wrote into its input {}", name));
  if (format == "safetensors") {
    std::filesystem::path fp(path);
    if (fp.has_parent_path()) std::filesystem::create_directories(fp.parent_path());
    write_golden(path, before, after, opt);
  } else {
    write_golden_npy(path, before, after, opt);
  }
}

}  // namespace ropekv
