// Builds one problem, runs ropekv's reference on it and checks two output values computed here
// independently: a q_out nope element (a copy of q_nope) and a q_out rope element (gptj pair
// rotation). Exit code 0 when both match, 1 otherwise.
#include <cmath>
#include <cstdio>

#include "backends/cpu/cpu_backend.h"
#include "core/case_data.h"
#include "core/problem.h"
#include "ropekv/version.h"

namespace {

float at(const ropekv::tensor_view& v, std::initializer_list<int64_t> idx) {
  return static_cast<const float*>(v.data)[v.offset_elems(idx)];
}

}  // namespace

int main() {
  static_assert(ROPEKV_CONTRACT_VERSION == ropekv::contract_version, "version.h vs core/op.h");
  std::printf("ropekv %s, op contract %d\n", ROPEKV_VERSION_STRING, ROPEKV_CONTRACT_VERSION);
  // f32 everywhere so that both checks are plain float arithmetic.
  ropekv::problem p = ropekv::parse_problem(
      "tq=2 ts=2 tk=2 h=2 dn=8 dr=4 p=16 bs=4 nb=1 in=f32 table_dtype=f32 qo=f32 cache=f32 "
      "style=gptj layout=joint table=one seed=7");
  ropekv::case_data c = ropekv::make_case(p);
  ropekv::reference_run(c.args);
  const ropekv::op_args& a = c.args;

  const int64_t t = 1, h = 1, i = 1;  // token, head, rope pair
  // nope: q_out[t, h, 3] == q_nope[t, h, 3]
  const float nope_got = at(a.q_out, {t, h, 3});
  const float nope_want = at(a.q_nope, {t, h, 3});
  // rope, gptj pair i = (2i, 2i + 1): a' = a*C - b*S with C = cos_sin[pos, i], S = cos_sin[pos, Dr/2 + i]
  const int64_t pos = static_cast<const int64_t*>(a.positions.data)[a.positions.offset_elems({t})];
  const double x = at(a.q_pe, {t, h, 2 * i}), y = at(a.q_pe, {t, h, 2 * i + 1});
  const double cs = at(a.cos_sin, {pos, i}), sn = at(a.cos_sin, {pos, p.dr / 2 + i});
  const float rope_want = static_cast<float>(x * cs - y * sn);
  const float rope_got = at(a.q_out, {t, h, p.dn + 2 * i});

  bool ok = true;
  if (nope_got != nope_want) {
    std::printf("q_out[1, 1, 3]: expected %.9g (q_nope), got %.9g\n", nope_want, nope_got);
    ok = false;
  }
  // one rounding of the double value vs the reference's single rounding: equal up to a tie
  if (std::fabs(rope_got - rope_want) > std::fabs(rope_want) * 1.2e-7f) {
    std::printf("q_out[1, 1, dn + 2]: expected %.9g (a*C - b*S), got %.9g\n", rope_want, rope_got);
    ok = false;
  }
  std::printf("q_out nope %.9g == %.9g, rope %.9g ~ %.9g: %s\n", nope_got, nope_want, rope_got,
              rope_want, ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
