// Golden files from the harness' side: failure dumps of `fuzz --dump` and `golden check`.
#pragma once
#include <string>

#include "core/case_data.h"
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

}  // namespace ropekv
