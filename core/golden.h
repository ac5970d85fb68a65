// Golden files (docs/golden-format.md): one safetensors file per case with the inputs, the
// outputs before the call and the outputs the reference produced; or a folder of .npy files plus
// meta.json. Own minimal safetensors / npy writer and reader (no third-party code). The readers
// also take tensor files of any writer (safetensors.torch / numpy, np.save) for `golden compare`
// (your outputs) and `golden write --inputs` (your inputs).
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

// A derived tensor checked but not built (golden_from_tensor_file with defer_derived): a fill
// byte, or the stored tensors whose last dimensions it concatenates.
struct derived_recipe {
  int fill_byte = -1;
  std::vector<std::string> concat;
};

struct golden_file {
  problem prob;                                   // parsed from the `repro` metadata
  std::map<std::string, std::string> metadata;    // every __metadata__ entry
  std::map<std::string, golden_tensor> tensors;   // name -> tensor (names as in the format doc)
  std::map<std::string, derived_recipe> deferred; // defer_derived only: tensors not built
};

// The golden file format version this build writes (`format_version` metadata); it reads 1 and
// 2. Version 2 need not store a tensor a recipe of its `derived` metadata rebuilds exactly (an
// output's poisoned `.initial`, the copied nope columns of `q_out.expected`).
inline constexpr int golden_format_version = 2;

struct golden_write_options {
  bool store_all = false;  // true: every tensor stored as itself, no `derived` recipes
};

// The tensors of a golden case of `prob` (stored or derived in the file), with their dtype and
// shape (docs/golden-format.md).
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
void write_golden(const std::string& path, const case_data& before, const case_data& after,
                  const golden_write_options& opt = {});
void write_golden(const std::string& path, const golden_file& file, const golden_write_options& opt = {});

// Writes `dir`/<tensor name>.npy (.npy v1.0; f32 '<f4', f16 '<f2', bf16 as '<u2' bits, fp8 as
// '|u1' bits, i32 '<i4', i64 '<i8') plus `dir`/meta.json (metadata, dtypes, shapes). Creates dir.
void write_golden_npy(const std::string& dir, const case_data& before, const case_data& after,
                      const golden_write_options& opt = {});

// A tensor as a file holds it, before it is matched with a golden tensor: `dtype` is the file's
// name for it (safetensors "BF16", "F8_E4M3FNUZ", "U8", ...; npy descr "<f4", "<u2", "|u1",
// "<V2", ...; or a ropekv dtype name "bf16", ... for tensors handed over from Python).
struct file_tensor {
  std::string dtype;
  int64_t elem_size = 0;       // bytes per element
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // numel * elem_size bytes, row-major
  std::string source;          // where it came from, for messages ("out.safetensors", "dir/q_out.npy")
};
struct tensor_file {
  std::string path;
  std::map<std::string, std::string> metadata;   // safetensors __metadata__ (may be empty)
  std::map<std::string, file_tensor> tensors;
};

// Reads every tensor of a safetensors file (no metadata needed) or of a folder of .npy files
// (NAME.npy -> tensor NAME; meta.json, when there, as metadata). Anything malformed throws
// arg_error naming the file and what is wrong; never reads out of bounds.
tensor_file read_tensor_file(const std::string& path);

// Reads one .npy file (format 1.0, 2.0 or 3.0, C order, little-endian or byte types).
file_tensor read_npy(const std::string& path);

// True when a file dtype name (safetensors, npy descr or ropekv name) can hold ropekv dtype t:
// its own names, and raw bits of the same size where the writer has no such type (bf16 as
// '<u2' or ml_dtypes' '<V2'; any fp8 as U8, '|u1' or '|V1'; fnuz also as old files' U8).
bool file_dtype_fits(const std::string& file_dtype, dtype t);

// `spec` filled from a file tensor: arg_error naming `what` (e.g. "out.safetensors: tensor
// q_out") with expected vs got when the dtype or shape disagrees.
golden_tensor golden_tensor_from_file(const file_tensor& ft, const golden_tensor_spec& spec,
                                      const std::string& what);

// The outputs a kernel writes for `prob`: q_out, cache or ckv_cache + kpe_cache, and q_pe / k_pe
// when in place (golden names without the `.expected` suffix), with their dtype and shape.
std::vector<golden_tensor_spec> golden_output_specs(const problem& prob);
// The inputs: q_nope q_pe kv_c k_pe positions slot_mapping, cos_sin or cos + sin.
std::vector<golden_tensor_spec> golden_input_specs(const problem& prob);

// `initial` with `outputs`' tensors (golden_output_specs names) scattered in: the run to compare
// with the golden's expected outputs. A missing output, wrong dtype or shape throws arg_error
// naming the tensor; names that are not outputs are appended to *ignored.
case_data case_with_outputs(const case_data& initial, const tensor_file& outputs,
                            std::vector<std::string>* ignored);
// make_case(prob) with `inputs`' tensors (golden_input_specs names) scattered in; the same errors.
case_data case_with_inputs(const problem& prob, const tensor_file& inputs,
                           std::vector<std::string>* ignored);

// Reads and checks a golden file: safetensors, or a folder written by write_golden_npy; format
// version 1 or 2, derived tensors rebuilt (the result holds every tensor of golden_tensor_specs).
// Anything wrong (truncated, bad header length, bad JSON, offsets out of range, unknown dtype, a
// tensor missing or whose dtype/shape disagrees with the repro, a bad recipe) throws arg_error
// naming the file and what is wrong. Never reads out of bounds.
golden_file read_golden(const std::string& path);
// The checks of read_golden on tensors already read (a safetensors file or an npy folder).
golden_file golden_from_tensor_file(const tensor_file& tf);
// The same, moving the bytes out of `tf` (no copy). defer_derived: derived tensors are checked
// but not built; their recipes go to `deferred` and the stored parts a concat reads stay in
// `tensors` (load_golden_case builds them in place).
golden_file golden_from_tensor_file(tensor_file&& tf, bool defer_derived);

// A case ready to run: `initial` is make_case(repro) with its inputs and outputs overwritten by
// the file's tensors (strides, padding and poison rebuilt from the repro); `expected` is a copy of
// it whose outputs (q_out, cache(s), and q_pe / k_pe when in place) hold the file's `.expected`
// tensors: compare a backend's run of `initial` against it.
// `file` keeps the problem and metadata; its tensors, once in the case, are freed (file.tensors is
// empty), so a case is held once, not twice.
struct golden_case {
  golden_file file;
  case_data initial;
  case_data expected;
};
golden_case load_golden_case(const std::string& path);

// The problem of a golden file (safetensors, or an npy folder's meta.json) and the bytes of its
// tensor data, from its header alone (no tensor is read): for a memory budget before the file is
// loaded. False when the header cannot be read or holds no valid repro (read_golden then says
// what is wrong).
bool peek_golden_problem(const std::string& path, problem* prob, int64_t* data_bytes);

// safetensors dtype name of a ropekv dtype ("F32", "BF16", "F8_E4M3", "F8_E4M3FNUZ", ...).
const char* safetensors_dtype_name(dtype t);

}  // namespace ropekv
