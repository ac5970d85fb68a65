// The problem descriptor (oneDNN benchdnn style): everything needed to rebuild one case, inputs
// included. It prints as a canonical repro string that parses back to the same problem.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "core/op.h"

namespace ropekv {

ROPEKV_ENUM(pad_at, head, middle, tail, spread)     // where padding slots (-1) are placed
ROPEKV_ENUM(pos_mode, random, near_end, same)       // positions: uniform, within 8 of P-1, all equal
ROPEKV_ENUM(q_storage, token_major, head_major)     // q_nope / q_pe memory order behind the view
ROPEKV_ENUM(kv_storage, separate, fused)            // kv_c, k_pe separate, or column slices of one [Tk, Dn+Dr(+pad)] buffer
ROPEKV_ENUM(scale_storage, host, tensor)            // k_scale / q_scale as host floats, or as [1] f32 tensors

struct problem {
  // sizes
  int64_t tq = 1, ts = 1, tk = 1;  // Tq <= Ts <= Tk
  int64_t heads = 128;
  int64_t kv_heads = 1;            // KH (repro key kh): a divisor of heads; > 1 makes kv_c, k_pe,
                                   // k_pe_out [Tk, KH, D] and the caches [nb, KH, bs, D] (rank 4)
  int64_t dn = 512, dr = 64;
  int64_t table_rows = 4096;       // P
  int64_t block_size = 64;
  int64_t num_blocks = 1;
  // dtypes
  dtype in_dtype = dtype::bf16;     // q_nope, q_pe, kv_c, k_pe
  dtype table_dtype = dtype::bf16;  // cos/sin
  dtype pos_dtype = dtype::i64;
  dtype slot_dtype = dtype::i64;
  dtype q_out_dtype = dtype::bf16;
  dtype cache_dtype = dtype::bf16;
  // op semantics
  table_kind table = table_kind::one;
  op_options opt;
  float k_scale = 1.0f, q_scale = 1.0f;
  scale_storage scales = scale_storage::host;  // tensor: the case passes both scales as [1] f32 tensors
  // decode outputs (core/SPEC.md "Decode outputs"), repro keys dec_out and dec: which of the
  // three optional outputs the case passes, and N (rows of decode_q_pe_out / q_nope_zeros_out)
  bool dec_q_pe = false;      // decode_q_pe_out [N, H, Dr] (dec_out letter q)
  bool dec_zeros = false;     // q_nope_zeros_out [N, H, Dn] (dec_out letter z)
  bool dec_k_pe = false;      // k_pe_out [Tk, Dr] (dec_out letter k)
  int64_t dec_tokens = 0;     // N: 0 <= N <= Tq; 0 unless decode_q_pe_out or q_nope_zeros_out is passed
  // memory layout of the case (strides are padded by these many elements)
  q_storage q_layout = q_storage::token_major;
  bool zero_copy = false;       // repro key zero_copy: q_nope is q_out's first Dn columns (core/SPEC.md
                                // "Zero-copy concat"; needs qo == in); the case has no q_nope buffer
  kv_storage kv_layout = kv_storage::separate;
  int64_t row_pad_elems = 0;    // extra elements after each innermost row of every input/q_out
  int64_t entry_pad_elems = 0;  // cache: entry stride = row width + entry_pad
  int64_t block_pad_elems = 0;  // cache: block stride = block_size * entry stride + block_pad
  int64_t table_pad_elems = 0;  // cos/sin row stride padding
  // data
  int64_t pad_slots = 0;        // number of tokens among the first Ts whose slot is -1
  pad_at pad_where = pad_at::tail;
  pos_mode positions = pos_mode::random;
  std::string rope_table = "random";  // "random" angles, or a preset name: that model's YaRN table
  double amplitude = 4.0;       // inputs uniform in [-amplitude, amplitude]
  uint64_t seed = 1;

  // Canonical repro string: "key=value" tokens separated by single spaces, every key present,
  // in a fixed order. parse_problem(to_repro()) == *this.
  std::string to_repro() const;
  bool operator==(const problem& other) const;
  bool operator!=(const problem& other) const { return !(*this == other); }
};

// Parses a repro string. Keys may come in any order and may be omitted (defaults above); an
// unknown key, a malformed value or a problem that breaks a constraint throws arg_error naming
// the key.
problem parse_problem(std::string_view repro);

// Checks the problem's own constraints (Tq <= Ts <= Tk, enough cache slots, ...); throws
// arg_error naming the field.
void check_problem(const problem& p);

// `pins`: "key=value ..." in repro syntax (`--pin`): `p` with those keys set, and the sizes the
// generator derives from them kept consistent where not pinned themselves (ts, tk within tq's
// order, pad_slots <= ts, enough cache blocks). Returns the canonical form; throws arg_error
// naming the key for a malformed pin, or the field when the pinned problem breaks a constraint.
problem pin_problem(problem p, std::string_view pins);
// Checks the syntax and values of a pin string alone (unknown key, malformed value, a key
// twice, a value that breaks its key's own range whatever the other keys are: h=0, dr=7,
// in=i32): arg_error naming "--pin" or the key. Pins that suit no problem only together (or with
// the drawn keys) surface later, as SKIPPED cases.
void check_pins(std::string_view pins);

// A random problem covering every option (the fuzzer's generator), from (seed, case_index).
// max_tokens bounds Tq/Ts/Tk (<= 4096).
problem random_problem(uint64_t seed, uint64_t case_index, int64_t max_tokens = 4096);

// The "aligned16" fuzz profile (`ropekv fuzz --profile aligned16`): `p` moved into the domain that
// vectorised GPU kernels commonly require, with everything else kept: 16-bit q/kv (f32 inputs
// become bf16 or f16, by the low bit of p.seed), q_out of q's dtype, the cache of kv's dtype
// unless it is fp8 (layout fp8_ds_mla keeps its u8 records), Dn rounded up to a multiple of 8, Dr
// up to a multiple of 8 (gptj) or 16 (neox), every padding (row, entry, block, table) rounded down
// to a multiple of 8 elements (16 for the u8 records of fp8_ds_mla: so all rows and cache entries
// start 16-byte aligned), no in-place rope. Returns the canonical form (parse_problem(to_repro())), so its
// printed repro replays it; throws arg_error naming the field when the coerced problem breaks a
// constraint. Idempotent: coerce(coerce(p)) == coerce(p).
problem coerce_aligned16(problem p);

}  // namespace ropekv
