// Golden files (docs/golden-format.md): one safetensors file per case with the inputs, the
// outputs before the call and the outputs the reference produced; or a folder of .npy files plus
// meta.json. Own minimal safetensors / npy writer and reader (no third-party code).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/case_data.h"
#include "core/problem.h"

namespace ropekv {

// One logical, contiguous (row-major) tensor of a golden file.
struct golden_tensor {
  dtype type = dtype::u8;        // the exact ropekv dtype (from the `dtypes` metadata)
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;    // numel * dtype_size_bytes(type) bytes
  int64_t numel() const;
};

struct golden_file {
  problem prob;                                   // parsed from the `repro` metadata
  std::map<std::string, std::string> metadata;    // every __metadata__ entry
  std::map<std::string, golden_tensor> tensors;   // name -> tensor (names as in the format doc)
};

// The tensors a golden file of `prob` holds, with their dtype and shape (docs/golden-format.md).
struct golden_tensor_spec {
  std::string name;
  dtype type;
  std::vector<int64_t> shape;
};
std::vector<golden_tensor_spec> golden_tensor_specs(const problem& prob);

// The file's tensors taken from two runs of one case: inputs and `.initial` outputs from
// `before` (the case as made, before the call), `.expected` outputs from `after` (the case after
// the reference ran). Both must hold the same problem.
golden_file make_golden(const case_data& before, const case_data& after);

// Writes a safetensors file (8-byte little-endian header length, JSON header, data).
void write_golden(const std::string& path, const case_data& before, const case_data& after);
void write_golden(const std::string& path, const golden_file& file);

// Writes `dir`/<tensor name>.npy (.npy v1.0; f32 '<f4', f16 '<f2', bf16 as '<u2' bits, fp8 as
// '|u1' bits, i32 '<i4', i64 '<i8') plus `dir`/meta.json (metadata, dtypes, shapes). Creates dir.
void write_golden_npy(const std::string& dir, const case_data& before, const case_data& after);

// Reads and checks a safetensors golden file. Anything wrong (truncated, bad header length, bad
// JSON, offsets out of range, unknown dtype, a tensor missing or whose dtype/shape disagrees with
// the repro) throws arg_error naming the file and what is wrong. Never reads out of bounds.
golden_file read_golden(const std::string& path);

// A case ready to run: `initial` is make_case(repro) with its inputs and outputs overwritten by
// the file's tensors (strides, padding and poison rebuilt from the repro); `expected` is a copy of
// it whose outputs (q_out, cache(s), and q_pe / k_pe when in place) hold the file's `.expected`
// tensors: compare a backend's run of `initial` against it.
struct golden_case {
  golden_file file;
  case_data initial;
  case_data expected;
};
golden_case load_golden_case(const std::string& path);

// safetensors dtype name of a ropekv dtype ("F32", "BF16", "F8_E4M3", fnuz formats "U8", ...).
const char* safetensors_dtype_name(dtype t);

}  // namespace ropekv
