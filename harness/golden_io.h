// Golden files from the harness' side: failure dumps of `fuzz --dump`, `golden check`, `golden
// compare` (your outputs against a golden file) and `golden write --inputs` (your inputs).
#pragma once
#include <string>
#include <vector>

#include "core/case_data.h"
#include "core/golden.h"
#include "harness/fuzz.h"

namespace ropekv {

// Writes one failing case as two golden files (docs/golden-format.md) of the same case:
// `path` with `.expected` from run a (the reference) and got_dump_path(path) (`X.got.safetensors`)
// with `.expected` from run b; metadata `backend_a`, `backend_b`, `expected_from`. Creates the
// parent folder.
std::string got_dump_path(const std::string& path);
void write_failure_dump(const std::string& path, const case_data& initial, const case_data& a,
                        const case_data& b, const std::string& backend_a,
                        const std::string& backend_b);

// Runs backend `b` on the golden file's inputs and compares with its expected outputs (the
// file's run plays run a). Throws arg_error for an unreadable or inconsistent file.
case_record check_golden_file(const std::string& path, backend& b, const compare_options& cmp);

// Your outputs against a golden case: `outputs` holds q_out, cache (joint) or ckv_cache +
// kpe_cache (split), and q_pe / k_pe when in place, by golden name without suffix, logical and
// contiguous (any writer: safetensors, npy). The compared run is the golden's initial case with
// them scattered in; the report's labels say "reference" and "yours". Tensors that are not
// outputs are listed in `ignored`. arg_error for a missing output or a wrong dtype or shape.
struct golden_compare_result {
  case_record rec;
  std::vector<std::string> ignored;
};
golden_compare_result compare_golden_outputs(const golden_case& g, const tensor_file& outputs,
                                             const compare_options& cmp);
golden_compare_result compare_golden_outputs(const std::string& golden_path, const std::string& outputs_path,
                                             const compare_options& cmp);

// Runs `ref` (the reference backend) on a clone of `before` and writes the golden file of the
// pair: format "safetensors" (a file; creates its parent folder) or "npy" (a folder).
void write_reference_golden(const std::string& path, const std::string& format, const case_data& before,
                            backend& ref, const golden_write_options& opt = {});

}  // namespace ropekv
