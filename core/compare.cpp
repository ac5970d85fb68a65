// Region-by-region comparison of two runs of one case (see core/compare.h, core/SPEC.md).
// Cache addressing here is written from SPEC.md on purpose: it is a third, independent reading
// of the contract next to the reference's and the kernels'.
#include "core/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>

#include "core/cache_map.h"
#include "core/convert.h"
#include "core/error.h"

namespace ropekv {

const char* ulp_bucket_label(int bucket) {
  static const char* const labels[ulp_bucket_count] = {
      "0", "1", "2", "3-4", "5-8", "9-16", "17-32", "33-64", "65-128", "129-256", "257-512",
      "513-1024", ">1024", "nan"};
  if (bucket < 0 || bucket >= ulp_bucket_count) {
    throw error(fmt::format("ulp_bucket_label: bucket {} out of range", bucket));
  }
  return labels[bucket];
}

int ulp_bucket_of(int64_t ulp) {
  if (ulp == ulp_distance_nan) return ulp_bucket_count - 1;
  if (ulp <= 2) return static_cast<int>(std::max<int64_t>(ulp, 0));
  int bucket = 3;
  int64_t hi = 4;
  while (ulp > hi && bucket < ulp_bucket_count - 2) {
    hi *= 2;
    ++bucket;
  }
  return bucket;
}

const char* region_rule_name(region_rule r) {
  switch (r) {
    case region_rule::exact: return "exact";
    case region_rule::rope: return "rope";
    case region_rule::bytes: return "bytes";
    default: throw error(fmt::format("region_rule_name: bad value {}", static_cast<int>(r)));
  }
}

const char* outcome_name(case_outcome o) {
  switch (o) {
    case case_outcome::passed: return "PASSED";
    case case_outcome::failed: return "FAILED";
    case case_outcome::errored: return "ERRORED";
    case case_outcome::skipped: return "SKIPPED";
    case case_outcome::mistrusted: return "MISTRUSTED";
    default: throw error(fmt::format("outcome_name: bad value {}", static_cast<int>(o)));
  }
}

compare_options make_compare_options(int64_t max_ulp, bool strict, bool bitwise, std::string_view numerics,
                                     bool identify_always, const char* max_ulp_arg, const char* numerics_arg) {
  if (max_ulp < 0) throw arg_error(max_ulp_arg, ">= 0", std::to_string(max_ulp));
  compare_options c;
  c.max_ulp = max_ulp;
  c.strict = strict;
  c.bitwise = bitwise;
  c.numerics = parse_numerics_model(numerics, numerics_arg);
  c.identify_always = identify_always;
  return c;
}

namespace {

const uint8_t* element_ptr(const tensor_view& v, std::initializer_list<int64_t> idx) {
  int64_t off = 0;
  int k = 0;
  for (int64_t i : idx) off += i * v.strides_elems[k++];
  return static_cast<const uint8_t*>(v.data) + off * static_cast<int64_t>(dtype_size_bytes(v.type));
}

int64_t read_index(const tensor_view& v, int64_t i) {
  uint64_t bits = load_bits(v.type, element_ptr(v, {i}));
  switch (v.type) {
    case dtype::i32: return static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(bits)));
    case dtype::i64: return static_cast<int64_t>(bits);
    default: throw arg_error(v.rank ? "index tensor" : "index tensor", "i32 or i64", dtype_name(v.type));
  }
}

double read_value(const tensor_view& v, std::initializer_list<int64_t> idx) {
  return decode_to_f64(v.type, static_cast<uint32_t>(load_bits(v.type, element_ptr(v, idx))));
}

int64_t table_position(const op_args& args, int64_t t) {
  const tensor_view& table = args.cos_sin.present() ? args.cos_sin : args.cos;
  int64_t rows = table.shape[0];
  int64_t p = read_index(args.positions, t);
  if (p < 0 || p >= rows) {
    if (args.options.positions != pos_oob::clamp) {
      throw arg_error("positions", fmt::format("values in [0, {})", rows), std::to_string(p));
    }
    p = std::clamp<int64_t>(p, 0, rows - 1);
  }
  return p;
}

void cos_sin_at(const op_args& args, int64_t p, int64_t i, double* c, double* s) {
  if (args.cos_sin.present()) {
    int64_t half = args.cos_sin.shape[1] / 2;
    *c = read_value(args.cos_sin, {p, i});
    *s = read_value(args.cos_sin, {p, half + i});
  } else {
    *c = read_value(args.cos, {p, i});
    *s = read_value(args.sin, {p, i});
  }
}

// Pair index, partner element and whether j is the first element of its pair.
void pair_of(rope_style style, int64_t dr, int64_t j, int64_t* i, int64_t* partner, bool* first) {
  switch (style) {
    case rope_style::gptj:
      *i = j / 2;
      *first = (j % 2) == 0;
      *partner = *first ? j + 1 : j - 1;
      return;
    case rope_style::neox:
      *i = j % (dr / 2);
      *first = j < dr / 2;
      *partner = *first ? j + dr / 2 : j - dr / 2;
      return;
    default: throw error(fmt::format("pair_of: bad rope_style {}", static_cast<int>(style)));
  }
}

}  // namespace

rope_operands q_rope_operands(const op_args& args, int64_t t, int64_t h, int64_t j) {
  int64_t dr = args.q_pe.shape[2];
  int64_t i, partner;
  bool first;
  pair_of(args.options.style, dr, j, &i, &partner, &first);
  rope_operands o{};
  o.x = read_value(args.q_pe, {t, h, j});
  double pv = read_value(args.q_pe, {t, h, partner});
  o.partner = first ? -pv : pv;
  cos_sin_at(args, table_position(args, t), i, &o.c, &o.s);
  return o;
}

rope_operands k_rope_operands(const op_args& args, int64_t t, int64_t j) {
  int64_t dr = args.k_pe.shape[1];
  int64_t i, partner;
  bool first;
  pair_of(args.options.style, dr, j, &i, &partner, &first);
  rope_operands o{};
  o.x = read_value(args.k_pe, {t, j});
  double pv = read_value(args.k_pe, {t, partner});
  o.partner = first ? -pv : pv;
  cos_sin_at(args, table_position(args, t), i, &o.c, &o.s);
  return o;
}

rope_element rope_element_of(const op_args& args, const rope_operands& o, dtype in, dtype out,
                             float scale) {
  rope_element e;
  e.x = o.x;
  e.partner = o.partner;
  e.c = o.c;
  e.s = o.s;
  e.in = in;
  e.table = args.cos_sin.present() ? args.cos_sin.type : args.cos.type;
  e.out = out;
  e.scale = dtype_is_fp8(out) ? scale : 1.0f;
  e.conv = args.options.scale;
  return e;
}

bool rope_element_passes(dtype t, uint32_t ref_bits, uint32_t got_bits, double allowance,
                         const compare_options& opt, int64_t* ulp, bool* used_allowance) {
  *used_allowance = false;
  *ulp = ulp_distance(t, ref_bits, got_bits);
  if (*ulp == ulp_distance_nan) return false;
  if (*ulp <= opt.max_ulp) return true;
  double ref = decode_to_f64(t, ref_bits), got = decode_to_f64(t, got_bits);
  if (!std::isfinite(ref) || !std::isfinite(got)) return false;
  if (opt.strict) return false;  // the ULP distance (representable steps) alone decides
  // max_ulp steps from ref toward got cover at least max_ulp spacings of the smaller magnitude
  const double diff = std::fabs(got - ref);
  const double ulp_tol = static_cast<double>(opt.max_ulp) * ulp_at(t, std::min(std::fabs(ref), std::fabs(got)));
  if (diff <= ulp_tol + allowance) {
    *used_allowance = true;
    return true;
  }
  return false;
}

namespace {

uint64_t poison_bits(dtype t) {
  uint64_t b = 0;
  for (size_t i = 0; i < dtype_size_bytes(t); ++i) b = (b << 8) | poison_byte;
  return b;
}

// Where a view lives: the buffer holding it and the byte offset of view.data in that buffer.
struct location {
  std::string buffer;
  int64_t offset_bytes;
};

location locate(const case_data& c, const tensor_view& v, const char* what) {
  auto p = static_cast<const uint8_t*>(v.data);
  for (const auto& [name, buf] : c.buffers) {
    if (p >= buf.data() && p <= buf.data() + buf.size_bytes()) {
      return {name, static_cast<int64_t>(p - buf.data())};
    }
  }
  throw error(fmt::format("compare: view {} is not inside any buffer of the case", what));
}

// The same view rebased into another run of the case.
tensor_view rebase(const tensor_view& v, const location& loc, const case_data& run) {
  tensor_view r = v;
  r.data = const_cast<uint8_t*>(run.buffers.at(loc.buffer).data()) + loc.offset_bytes;
  return r;
}

// The buffer of `init` holding view v, or of run `a` for an output `init` dropped (its poison is
// known: case_data::drop_poison_outputs).
location locate_in(const case_data& init, const case_data& a, const tensor_view& v, const char* what) {
  if (init.dropped.empty()) return locate(init, v, what);
  auto p = static_cast<const uint8_t*>(v.data);
  for (const auto& [name, buf] : init.buffers)
    if (p >= buf.data() && p <= buf.data() + buf.size_bytes()) return {name, static_cast<int64_t>(p - buf.data())};
  for (const auto& [name, buf] : a.buffers)
    if (init.dropped.count(name) && p >= buf.data() && p <= buf.data() + buf.size_bytes())
      return {name, static_cast<int64_t>(p - buf.data())};
  throw error(fmt::format("compare: view {} is not inside any buffer of the case", what));
}

const host_buffer& home_buffer(const case_data& init, const case_data& a, const std::string& name) {
  auto it = init.buffers.find(name);
  return it != init.buffers.end() ? it->second : a.buffers.at(name);
}

struct comparer {
  const case_data& init;
  const case_data& a;
  const case_data& b;
  const compare_options& opt;
  std::map<std::string, std::vector<uint8_t>> written;  // per buffer: bit i set = byte i may be written

  // Marks written bytes of elements of one view (found once, then by pointer arithmetic).
  struct marker {
    uint8_t* mask = nullptr;
    const uint8_t* base = nullptr;
    size_t size = 0;
    size_t elem_bytes = 0;
    void mark(const tensor_view& v_init, std::initializer_list<int64_t> idx) {
      const uint8_t* p = element_ptr(v_init, idx);
      if (p < base || p + elem_bytes > base + size) throw error("compare: written element outside its buffer");
      const size_t at = static_cast<size_t>(p - base);
      for (size_t i = at; i < at + elem_bytes; ++i) mask[i >> 3] = static_cast<uint8_t>(mask[i >> 3] | (1u << (i & 7)));
    }
  };
  marker marker_for(const tensor_view& v_init, const char* what) {
    location loc = locate_in(init, a, v_init, what);
    const host_buffer& buf = home_buffer(init, a, loc.buffer);
    auto& m = written[loc.buffer];
    if (m.empty()) m.assign(buf.size_bytes() / 8 + 1, 0);
    return marker{m.data(), buf.data(), buf.size_bytes(), dtype_size_bytes(v_init.type)};
  }

  static void add_mismatch(region_report& r, const compare_options& opt, mismatch m) {
    ++r.mismatches;
    if (static_cast<int64_t>(r.first.size()) < opt.max_listed) r.first.push_back(std::move(m));
  }

  static void note_ulp(region_report& r, int64_t ulp) {
    r.histogram[ulp_bucket_of(ulp)]++;
    r.max_ulp = std::max(r.max_ulp, ulp);
  }
};

// A region of elements that must be written: compared between run a and run b.
struct value_region {
  region_report rep;
  dtype type;
  uint64_t poison;
  // rope regions: each numerics model's check, kept up to date element by element
  std::vector<numerics_check> checks;
  value_region(std::string name, region_rule rule, dtype t) : type(t), poison(poison_bits(t)) {
    rep.name = std::move(name);
    rep.rule = rule;
    rep.dtype_name = dtype_name(t);
  }

  // source_zero: the inputs this element is computed from are all zero.
  void count(uint32_t ref_bits, uint32_t got_bits, bool source_zero) {
    ++rep.compared;
    if (ref_bits == poison && got_bits == poison) ++rep.poison_both;
    bool ref_zero = decode_to_f64(type, ref_bits) == 0.0;
    bool got_zero = decode_to_f64(type, got_bits) == 0.0;
    if (ref_zero && got_zero) ++rep.zero_both;
    if (source_zero) ++rep.zero_inputs;
  }

  void verdict(bool ok, int64_t ulp, uint32_t ref_bits, uint32_t got_bits, double allowance,
               const compare_options& opt, const std::function<std::string()>& where) {
    comparer::note_ulp(rep, ulp);
    if (ok) return;
    mismatch m;
    m.where = where();
    m.run = "b";
    m.expected = decode_to_f64(type, ref_bits);
    m.got = decode_to_f64(type, got_bits);
    m.expected_bits = ref_bits;
    m.got_bits = got_bits;
    m.ulp = ulp;
    m.allowance = allowance;
    comparer::add_mismatch(rep, opt, std::move(m));
  }

  // Data movement: bit-identical.
  void compare_exact(uint32_t ref_bits, uint32_t got_bits, bool source_zero,
                     const compare_options& opt, const std::function<std::string()>& where) {
    count(ref_bits, got_bits, source_zero);
    // a NaN moves as a NaN of the same sign; its payload is not part of the contract
    const int sign_shift = 8 * static_cast<int>(dtype_size_bytes(type)) - 1;
    const bool same_nan = is_nan_bits(type, ref_bits) && is_nan_bits(type, got_bits) &&
                          ((ref_bits ^ got_bits) >> sign_shift & 1u) == 0;
    const bool ok = ref_bits == got_bits || same_nan;
    int64_t ulp = ok ? 0 : ulp_distance(type, ref_bits, got_bits);
    if (!ok && is_nan_bits(type, ref_bits) && is_nan_bits(type, got_bits)) ulp = ulp_distance_nan;
    if (!ok && ulp == 0) ulp = 1;  // +0 vs -0: bits differ, data movement must keep them
    verdict(ok, ulp, ref_bits, got_bits, 0, opt, where);
  }

  // Rope: within the bound of the selected numerics model (or bit-identical with --bitwise).
  void compare_rope(uint32_t ref_bits, uint32_t got_bits, const rope_element& e, bool source_zero,
                    const compare_options& opt, const std::function<std::string()>& where) {
    count(ref_bits, got_bits, source_zero);
    if (opt.identify_always) identify(e, ref_bits, got_bits, opt);
    const double allowance = rope_model_allowance(opt.numerics, e);
    int64_t ulp = 0;
    bool ok;
    if (opt.bitwise) {
      ok = ref_bits == got_bits;
      ulp = ok ? 0 : std::max<int64_t>(1, ulp_distance(type, ref_bits, got_bits));
    } else {
      bool used = false;
      ok = rope_element_passes(type, ref_bits, got_bits, allowance, opt, &ulp, &used);
      if (used) ++rep.needed_allowance;
    }
    verdict(ok, ulp, ref_bits, got_bits, allowance, opt, where);
  }

  // Which models the values of b match bit for bit, and which bounds they meet: one element
  // counted into every model's check (no element is kept).
  void identify(const rope_element& e, uint32_t ref_bits, uint32_t got_bits, const compare_options& opt) {
    compare_options loose = opt;
    loose.strict = false;
    if (checks.empty()) {
      for (numerics_model m : all_numerics_models) {
        numerics_check c;
        c.model = m;
        c.operand = model_operand_dtype(m, e.in, e.table);
        checks.push_back(c);
      }
    }
    for (numerics_check& c : checks) {
      const uint32_t model_bits = rope_model_bits(c.model, e);
      const bool both_nan = is_nan_bits(type, model_bits) && is_nan_bits(type, got_bits);
      if (model_bits != got_bits && !both_nan) {
        ++c.differ;
        int64_t d = ulp_distance(type, model_bits, got_bits);
        c.max_ulp_to_model = std::max(c.max_ulp_to_model, d == 0 ? int64_t{1} : d);
      }
      int64_t ulp = 0;
      bool used = false;
      if (!rope_element_passes(type, ref_bits, got_bits, rope_model_allowance(c.model, e), loose, &ulp, &used))
        ++c.outside;
    }
  }

  void finish(const compare_options& opt) {
    if (rep.rule == region_rule::rope && rep.compared > 0 && opt.identify_always) rep.numerics = checks;
    checks.clear();
    if (rep.compared == 0) return;
    if (rep.poison_both * 10 >= rep.compared * 9) {
      rep.mistrusted = true;
      rep.mistrust_reason = fmt::format("{} of {} elements still hold the poison pattern in both runs",
                                        rep.poison_both, rep.compared);
    } else if (rep.zero_both * 10 >= rep.compared * 9 && rep.zero_inputs * 10 < rep.compared * 9) {
      rep.mistrusted = true;
      rep.mistrust_reason = fmt::format(
          "{} of {} elements are zero in both runs while only {} have zero inputs", rep.zero_both,
          rep.compared, rep.zero_inputs);
    }
  }
};

uint32_t bits_at(const tensor_view& v, std::initializer_list<int64_t> idx) {
  return static_cast<uint32_t>(load_bits(v.type, element_ptr(v, idx)));
}

}  // namespace

case_report compare_runs(const case_data& init, const case_data& a, const case_data& b,
                         const compare_options& opt) {
  case_report report;
  report.repro = init.prob.to_repro();
  comparer cmp{init, a, b, opt, {}};
  // An output the initial case dropped (poison known) is addressed through run a's views.
  op_args args = init.args;
  if (!init.dropped.empty()) {
    for (auto [view, a_view] : {std::pair<tensor_view*, const tensor_view*>{&args.q_out, &a.args.q_out},
                                {&args.cache, &a.args.cache}, {&args.ckv_cache, &a.args.ckv_cache},
                                {&args.kpe_cache, &a.args.kpe_cache},
                                {&args.decode_q_pe_out, &a.args.decode_q_pe_out},
                                {&args.q_nope_zeros_out, &a.args.q_nope_zeros_out},
                                {&args.k_pe_out, &a.args.k_pe_out}}) {
      if (view->present()) {
        if (init.dropped.count(locate(a, *a_view, "output").buffer)) *view = *a_view;
      }
    }
  }
  const op_options& o = args.options;

  const int64_t tq = args.q_nope.shape[0];
  const int64_t heads = args.q_nope.shape[1];
  const int64_t dn = args.q_nope.shape[2];
  const int64_t dr = args.q_pe.shape[2];
  const int64_t ts = args.slot_mapping.shape[0];
  const bool joint = args.cache.present();
  const tensor_view& cache_any = joint ? args.cache : args.ckv_cache;
  const int64_t block_size = cache_any.shape[cache_entry_dim(cache_any)];

  auto view_in = [&](const tensor_view& v, const case_data& run, const char* what) {
    return rebase(v, locate_in(init, a, v, what), run);
  };

  std::vector<int64_t> slots(static_cast<size_t>(ts));
  for (int64_t t = 0; t < ts; ++t) slots[t] = read_index(args.slot_mapping, t);

  // q_out and in-place q_pe.
  value_region q_nope_r("q_out.nope", region_rule::exact, args.q_out.type);
  value_region q_rope_r("q_out.rope", region_rule::rope, args.q_out.type);
  value_region q_inpl_r("q_pe.inplace", region_rule::rope, args.q_pe.type);
  // Decode outputs (core/SPEC.md "Decode outputs"): rows t < N of a computed q row.
  const bool dec_q = args.decode_q_pe_out.present(), dec_z = args.q_nope_zeros_out.present();
  const bool dec_k = args.k_pe_out.present();
  const int64_t n_dec = num_decode_tokens(args);
  value_region dec_q_r("decode_q_pe_out", region_rule::rope, args.q_pe.type);
  value_region dec_z_r("q_nope_zeros_out", region_rule::exact, args.q_nope.type);
  value_region dec_k_r("k_pe_out", region_rule::rope, args.k_pe.type);
  if (tq > 0) {
    tensor_view qa = view_in(args.q_out, a, "q_out"), qb = view_in(args.q_out, b, "q_out");
    tensor_view pa = view_in(args.q_pe, a, "q_pe"), pb = view_in(args.q_pe, b, "q_pe");
    comparer::marker q_mark = cmp.marker_for(args.q_out, "q_out");
    comparer::marker qpe_mark = cmp.marker_for(args.q_pe, "q_pe");
    tensor_view da, db, za, zb;
    comparer::marker dec_q_mark, dec_z_mark;
    if (dec_q && n_dec > 0) {
      da = view_in(args.decode_q_pe_out, a, "decode_q_pe_out");
      db = view_in(args.decode_q_pe_out, b, "decode_q_pe_out");
      dec_q_mark = cmp.marker_for(args.decode_q_pe_out, "decode_q_pe_out");
    }
    if (dec_z && n_dec > 0) {
      za = view_in(args.q_nope_zeros_out, a, "q_nope_zeros_out");
      zb = view_in(args.q_nope_zeros_out, b, "q_nope_zeros_out");
      dec_z_mark = cmp.marker_for(args.q_nope_zeros_out, "q_nope_zeros_out");
    }
    const float qs = q_scale_of(args);
    for (int64_t t = 0; t < tq; ++t) {
      if (o.padding == pad_q::skipped && slots[t] < 0) continue;
      const bool dec_row = t < n_dec;
      for (int64_t h = 0; h < heads; ++h) {
        if (dec_row && dec_z) {
          // The zero buffer: +0 bits in both runs (the contract's value, not only a == b).
          for (int64_t d = 0; d < dn; ++d) {
            const uint32_t ba = bits_at(za, {t, h, d}), bb = bits_at(zb, {t, h, d});
            dec_z_r.compare_exact(0u, bb, true, opt, [&] { return fmt::format("token={} head={} dim={}", t, h, d); });
            if (ba != 0u)
              dec_z_r.compare_exact(0u, ba, true, opt,
                                    [&] { return fmt::format("token={} head={} dim={} [run a]", t, h, d); });
            dec_z_mark.mark(args.q_nope_zeros_out, {t, h, d});
          }
        }
        for (int64_t d = 0; d < dn; ++d) {
          bool zero = read_value(args.q_nope, {t, h, d}) == 0.0;
          q_nope_r.compare_exact(bits_at(qa, {t, h, d}), bits_at(qb, {t, h, d}), zero, opt, [&] {
            return fmt::format("token={} head={} dim={}", t, h, d);
          });
          q_mark.mark(args.q_out, {t, h, d});
        }
        for (int64_t j = 0; j < dr; ++j) {
          rope_operands ro = q_rope_operands(args, t, h, j);
          bool zero = ro.x == 0.0 && ro.partner == 0.0;
          const rope_element e = rope_element_of(args, ro, args.q_pe.type, args.q_out.type, qs);
          q_rope_r.compare_rope(bits_at(qa, {t, h, dn + j}), bits_at(qb, {t, h, dn + j}), e, zero,
                           opt, [&] { return fmt::format("token={} head={} dim={}", t, h, dn + j); });
          q_mark.mark(args.q_out, {t, h, dn + j});
          if (o.inplace_q) {
            const rope_element e_in = rope_element_of(args, ro, args.q_pe.type, args.q_pe.type, 1.0f);
            q_inpl_r.compare_rope(bits_at(pa, {t, h, j}), bits_at(pb, {t, h, j}), e_in, zero, opt,
                             [&] { return fmt::format("token={} head={} dim={}", t, h, j); });
            qpe_mark.mark(args.q_pe, {t, h, j});
          }
          if (dec_row && dec_q) {  // rounded like an in-place value: q's dtype, no scale
            const rope_element e_d = rope_element_of(args, ro, args.q_pe.type, args.q_pe.type, 1.0f);
            dec_q_r.compare_rope(bits_at(da, {t, h, j}), bits_at(db, {t, h, j}), e_d, zero, opt,
                                 [&] { return fmt::format("token={} head={} dim={}", t, h, j); });
            dec_q_mark.mark(args.decode_q_pe_out, {t, h, j});
          }
        }
      }
    }
  }

  // Cache entries and in-place k_pe.
  // Layout fp8_ds_mla (core/SPEC.md): the u8 entry read as its parts: e4m3fn nope values and
  // f32 tile scales (both exact: amax is exact and each step is one IEEE operation), rope
  // values in k_pe's dtype (the rope rule, no scale).
  const bool ds_mla = o.layout == cache_layout::fp8_ds_mla;
  const dtype cache_t = ds_mla ? args.k_pe.type : cache_any.type;
  const float k_scale = ds_mla ? 1.0f : k_scale_of(args);
  value_region c_nope_r(joint ? "cache.nope" : "ckv_cache.nope", region_rule::exact,
                        ds_mla ? dtype::fp8_e4m3fn : cache_t);
  value_region c_rope_r(joint ? "cache.rope" : "kpe_cache.rope", region_rule::rope, cache_t);
  value_region c_scale_r("cache.scales", region_rule::exact, dtype::f32);
  value_region k_inpl_r("k_pe.inplace", region_rule::rope, args.k_pe.type);
  // kv heads (core/SPEC.md): each head's entries and k rows compared through the call restricted
  // to that head (core/cache_map.h kv_head_args: rank-2 k rows, rank-3 caches), so the walk
  // below is the one-head walk, once per head.
  const int64_t kv_heads = kv_head_count(args.kv_c);
  for (int64_t kh = 0; kh < kv_heads; ++kh) {
    const op_args hargs = kv_head_args(args, kh);
    const std::string head_note = kv_heads > 1 ? fmt::format("kv_head={} ", kh) : std::string();
    tensor_view ca, cb, ka, kb, ra, rb;
    if (joint) {
      ca = view_in(hargs.cache, a, "cache");
      cb = view_in(hargs.cache, b, "cache");
    } else {
      ca = view_in(hargs.ckv_cache, a, "ckv_cache");
      cb = view_in(hargs.ckv_cache, b, "ckv_cache");
      ra = view_in(hargs.kpe_cache, a, "kpe_cache");
      rb = view_in(hargs.kpe_cache, b, "kpe_cache");
    }
    comparer::marker nope_mark = cmp.marker_for(joint ? hargs.cache : hargs.ckv_cache, "cache");
    comparer::marker rope_mark = cmp.marker_for(joint ? hargs.cache : hargs.kpe_cache, "kpe_cache");
    comparer::marker kpe_mark, kout_mark;
    tensor_view koa, kob;
    if (ts > 0) {
      ka = view_in(hargs.k_pe, a, "k_pe");
      kb = view_in(hargs.k_pe, b, "k_pe");
      kpe_mark = cmp.marker_for(hargs.k_pe, "k_pe");
      if (dec_k) {
        koa = view_in(hargs.k_pe_out, a, "k_pe_out");
        kob = view_in(hargs.k_pe_out, b, "k_pe_out");
        kout_mark = cmp.marker_for(hargs.k_pe_out, "k_pe_out");
      }
    }
    // Where feature d of a part of slot s lives in its tensor's own index space [block, entry,
    // feature] (core/cache_map.h): the row layouts keep entries as rows; a shuffled block is one
    // run of block_size x (Dn + Dr) elements, read back as [entry', feature'].
    const paged_cache_map map = paged_cache_map::from_args(hargs);
    const bool shuffled = o.layout == cache_layout::shuffled;
    struct at3 { int64_t blk, ent, f; };
    auto physical = [&](int64_t s, bool rope, int64_t d) -> at3 {
      const int64_t blk = s / block_size;
      if (ds_mla)  // byte of the entry: nope value d, or the first byte of 16-bit rope value d
        return {blk, s % block_size, rope ? ds_mla_rope_offset_bytes + 2 * d : d};
      if (!shuffled) return {blk, s % block_size, (rope ? map.rope_feature0 : map.nope_feature0) + d};
      const int64_t off = (rope ? map.rope_offset_elems(s, 0, d) : map.nope_offset_elems(s, 0, d)) -
                          blk * map.nope_block_stride;
      return {blk, off / (dn + dr), off % (dn + dr)};
    };
    // fp8_ds_mla: `n` little-endian bytes of a u8 cache view from [blk, ent, byte0] on
    auto le_bytes = [](const tensor_view& v, const at3& x, int64_t n) {
      uint32_t bits = 0;
      for (int64_t i = 0; i < n; ++i) bits |= bits_at(v, {x.blk, x.ent, x.f + i}) << (8 * i);
      return bits;
    };
    auto where = [&](int64_t s, int64_t t, bool rope, int64_t d, const at3& x) {
      if (ds_mla)
        return head_note + fmt::format("block={} entry={} {} value={} (slot {}, token {}; byte {})", x.blk, x.ent,
                           rope ? "rope" : "nope", d, s, t, x.f);
      if (!shuffled)
        return head_note + fmt::format("block={} entry={} feature={} (slot {}, token {})", x.blk, x.ent, x.f, s, t);
      return head_note + fmt::format("block={} entry={} {} feature={} (slot {}, token {}; stored at [{}, {}, {}])",
                         x.blk, s % block_size, rope ? "rope" : "nope", d, s, t, x.blk, x.ent, x.f);
    };
    for (int64_t t = 0; t < ts; ++t) {
      const int64_t s = slots[t];
      if (s < 0) continue;
      if (ds_mla) {
        for (int64_t k = 0; k < ds_mla_tiles; ++k) {
          bool zero = true;
          for (int64_t i = 0; i < ds_mla_tile_elems; ++i) zero = zero && read_value(hargs.kv_c, {t, k * ds_mla_tile_elems + i}) == 0.0;
          const at3 x{s / block_size, s % block_size, ds_mla_scales_offset_bytes + 4 * k};
          c_scale_r.compare_exact(le_bytes(ca, x, 4), le_bytes(cb, x, 4), zero, opt, [&] {
            return fmt::format("block={} entry={} scale of tile {} (slot {}, token {}; byte {})", x.blk, x.ent, k, s,
                               t, x.f);
          });
          for (int64_t i = 0; i < 4; ++i) nope_mark.mark(hargs.cache, {x.blk, x.ent, x.f + i});
        }
      }
      for (int64_t d = 0; d < dn; ++d) {
        bool zero = read_value(hargs.kv_c, {t, d}) == 0.0;
        const at3 x = physical(s, false, d);
        const tensor_view& cv = joint ? hargs.cache : hargs.ckv_cache;
        c_nope_r.compare_exact(bits_at(ca, {x.blk, x.ent, x.f}), bits_at(cb, {x.blk, x.ent, x.f}), zero, opt,
                               [&] { return where(s, t, false, d, x); });
        nope_mark.mark(cv, {x.blk, x.ent, x.f});
      }
      for (int64_t j = 0; j < dr; ++j) {
        rope_operands ro = k_rope_operands(hargs, t, j);
        bool zero = ro.x == 0.0 && ro.partner == 0.0;
        const rope_element e = rope_element_of(hargs, ro, hargs.k_pe.type, cache_t, k_scale);
        const at3 x = physical(s, true, j);
        const tensor_view& xa = joint ? ca : ra;
        const tensor_view& xb = joint ? cb : rb;
        const int64_t nbytes = ds_mla ? 2 : 1;
        c_rope_r.compare_rope(ds_mla ? le_bytes(xa, x, 2) : bits_at(xa, {x.blk, x.ent, x.f}),
                              ds_mla ? le_bytes(xb, x, 2) : bits_at(xb, {x.blk, x.ent, x.f}), e, zero, opt,
                              [&] { return where(s, t, true, j, x); });
        for (int64_t i = 0; i < nbytes; ++i) rope_mark.mark(joint ? hargs.cache : hargs.kpe_cache, {x.blk, x.ent, x.f + i});
        if (o.inplace_k) {
          const rope_element e_in = rope_element_of(hargs, ro, hargs.k_pe.type, hargs.k_pe.type, 1.0f);
          k_inpl_r.compare_rope(bits_at(ka, {t, j}), bits_at(kb, {t, j}), e_in, zero, opt,
                           [&] { return head_note + fmt::format("token={} dim={}", t, j); });
          kpe_mark.mark(hargs.k_pe, {t, j});
        }
        if (dec_k) {  // the rows inplace_k writes, in k_pe's dtype, no scale
          const rope_element e_o = rope_element_of(hargs, ro, hargs.k_pe.type, hargs.k_pe.type, 1.0f);
          dec_k_r.compare_rope(bits_at(koa, {t, j}), bits_at(kob, {t, j}), e_o, zero, opt,
                               [&] { return head_note + fmt::format("token={} dim={}", t, j); });
          kout_mark.mark(hargs.k_pe_out, {t, j});
        }
      }
    }
  }

  std::vector<value_region*> value_regions = {&q_nope_r, &q_rope_r, &c_nope_r, &c_rope_r};
  if (ds_mla) value_regions.push_back(&c_scale_r);
  if (o.inplace_q) value_regions.push_back(&q_inpl_r);
  if (o.inplace_k) value_regions.push_back(&k_inpl_r);
  if (dec_q) value_regions.push_back(&dec_q_r);
  if (dec_z) value_regions.push_back(&dec_z_r);
  if (dec_k) value_regions.push_back(&dec_k_r);
  for (value_region* r : value_regions) {
    r->finish(opt);
    report.regions.push_back(std::move(r->rep));
  }

  // Every byte not written: untouched (outputs) or unchanged (inputs), in both runs.
  // Output buffers (core/case_data.h names); every other buffer holds inputs.
  const std::vector<std::string> output_buffers = {"q_out",           "cache",    "ckv_cache",       "kpe_cache",
                                                   "decode_q_pe_out", "k_pe_out", "q_nope_zeros_out"};
  region_report guards;
  guards.name = "guards";
  guards.rule = region_rule::bytes;
  guards.dtype_name = "u8";
  // A dropped output's initial bytes are the poison (data) and guard pattern (guards); an input
  // the runs share with the initial case is unchanged when its memory is one (run_case checks
  // its checksum after each run).
  for (const auto& [name, abuf] : a.buffers) {
    const bool dropped = init.dropped.count(name) != 0;
    if (!dropped && !init.buffers.count(name)) throw error(fmt::format("compare: buffer {} missing in the initial case", name));
    const host_buffer* ibuf_p = dropped ? nullptr : &init.buffers.at(name);
    const bool is_output =
        std::find(output_buffers.begin(), output_buffers.end(), name) != output_buffers.end();
    region_report r;
    r.name = name + (is_output ? ".untouched" : ".unchanged");
    r.rule = region_rule::bytes;
    r.dtype_name = "u8";
    auto it = cmp.written.find(name);
    const uint8_t* mask = it == cmp.written.end() ? nullptr : it->second.data();
    const uint8_t* ip = ibuf_p ? ibuf_p->data() : nullptr;  // null: every byte poison_byte
    const size_t n = ibuf_p ? ibuf_p->size_bytes() : init.dropped.at(name);
    const size_t g = ibuf_p ? ibuf_p->guard_bytes() : host_buffer::default_guard_bytes;
    auto init_byte = [&](size_t i) -> uint8_t { return ip ? ip[i] : poison_byte; };
    for (const auto* run : {&b, &a}) {
      const host_buffer& rb = run->buffers.at(name);
      if (rb.size_bytes() != n || rb.guard_bytes() != g) {
        throw error(fmt::format("compare: buffer {} differs in size between runs", name));
      }
      const char* run_name = run == &b ? "b" : "a";
      const uint8_t* rp = rb.data();
      const bool shared = ibuf_p && rb.shares_memory_with(*ibuf_p);
      if (mask == nullptr && ip && (shared || std::memcmp(rp, ip, n) == 0)) {
        r.compared += static_cast<int64_t>(n);
        r.histogram[0] += static_cast<int64_t>(n);
      } else {
        for (size_t i = 0; i < n; ++i) {
          if (mask != nullptr) {
            if ((i & 7) == 0 && mask[i >> 3] == 0xff && i + 8 <= n) {
              i += 7;
              continue;
            }
            if ((mask[i >> 3] >> (i & 7)) & 1) continue;
          }
          ++r.compared;
          const uint8_t ib = init_byte(i);
          if (rp[i] == ib) {
            r.histogram[0]++;
            continue;
          }
          comparer::note_ulp(r, ulp_distance_nan);
          comparer::add_mismatch(
              r, opt,
              mismatch{fmt::format("byte={}", i), run_name, static_cast<double>(ib),
                       static_cast<double>(rp[i]), ib, rp[i], ulp_distance_nan, 0});
        }
      }
      // Guards: raw bytes before and after the data.
      const uint8_t* iraw = ibuf_p ? ibuf_p->raw() : nullptr;  // null: every guard byte guard_byte
      const uint8_t* rraw = rb.raw();
      const size_t raw_n = n + 2 * g;
      for (size_t i = 0; i < raw_n; ++i) {
        if (i == g) i = g + n;
        if (i >= raw_n) break;
        ++guards.compared;
        const uint8_t ib = iraw ? iraw[i] : guard_byte;
        if (ib == rraw[i]) {
          guards.histogram[0]++;
          continue;
        }
        comparer::note_ulp(guards, ulp_distance_nan);
        int64_t rel = static_cast<int64_t>(i) - static_cast<int64_t>(g);
        comparer::add_mismatch(
            guards, opt,
            mismatch{fmt::format("buffer={} byte={}{}", name, rel,
                                 rel < 0 ? " (before data)" : " (after data)"),
                     run_name, static_cast<double>(ib), static_cast<double>(rraw[i]), ib,
                     rraw[i], ulp_distance_nan, 0});
      }
    }
    report.regions.push_back(std::move(r));
  }
  report.regions.push_back(std::move(guards));

  int64_t bad = 0;
  std::string first_bad, first_mistrust;
  for (const region_report& r : report.regions) {
    if (r.mismatches > 0) {
      ++bad;
      if (first_bad.empty()) first_bad = r.name;
    }
    if (r.mistrusted && first_mistrust.empty()) first_mistrust = r.name + ": " + r.mistrust_reason;
  }
  if (!opt.identify_always) {
    // a failing rope region: compare again keeping every rope element's operands, so the
    // report says which numerics models the values match (passing cases skip that cost)
    for (const region_report& r : report.regions)
      if (r.rule == region_rule::rope && r.mismatches > 0) {
        compare_options again = opt;
        again.identify_always = true;
        return compare_runs(init, a, b, again);
      }
  }
  if (bad > 0) {
    report.outcome = case_outcome::failed;
    report.message = fmt::format("{} region(s) mismatch, first: {}", bad, first_bad);
  } else if (!first_mistrust.empty()) {
    report.outcome = case_outcome::mistrusted;
    report.message = first_mistrust;
  } else {
    report.outcome = case_outcome::passed;
  }
  return report;
}

std::string numerics_summary(const region_report& r) {
  if (r.numerics.empty()) return "";
  std::string exactly, within, outside;
  for (const numerics_check& c : r.numerics) {
    const std::string name = numerics_check_name(c);
    if (c.differ == 0) exactly += (exactly.empty() ? "" : ", ") + name;
    if (c.outside == 0) {
      within += (within.empty() ? "" : ", ") + name;
    } else {
      outside += fmt::format("{}{} ({} of {})", outside.empty() ? "" : ", ", name, c.outside,
                             r.compared);
    }
  }
  std::string out = exactly.empty() ? "exactly no model" : "exactly " + exactly;
  out += within.empty() ? "; within no model's bound" : "; within " + within;
  if (!outside.empty()) out += "; outside " + outside;
  return out;
}

std::string numerics_check_name(const numerics_check& c) {
  if (c.model == numerics_model::fp32) return numerics_model_name(c.model);
  return fmt::format("{}[{}]", numerics_model_name(c.model), dtype_name(c.operand));
}

std::string numerics_identity(const region_report& r) {
  if (r.numerics.empty()) return "";
  const numerics_check* exact = nullptr;
  const numerics_check* within = nullptr;
  for (const numerics_check& c : r.numerics) {  // all_numerics_models order: tightest first
    if (c.differ == 0 && !exact) exact = &c;
    if (c.outside == 0 && !within) within = &c;
  }
  const numerics_check& fp32 = r.numerics.front();
  if (fp32.differ == 0) return "exactly fp32";
  if (fp32.outside == 0) return exact ? "within fp32, exactly " + numerics_check_name(*exact) : "within fp32";
  if (exact) return "exactly " + numerics_check_name(*exact);
  if (within) return "within " + numerics_check_name(*within);
  return "outside every model";
}

std::string format_case_report(const case_report& r, bool verbose) {
  std::string out = fmt::format("{} {}", outcome_name(r.outcome), r.repro);
  if (!r.message.empty()) out += fmt::format("\n  {}", r.message);
  for (const region_report& g : r.regions) {
    if (!verbose && g.mismatches == 0 && !g.mistrusted) continue;
    out += fmt::format("\n  {:<22} [{}, {}] {} compared, {} mismatches", g.name,
                       region_rule_name(g.rule), g.dtype_name, g.compared, g.mismatches);
    if (g.rule != region_rule::bytes) {
      out += g.max_ulp == ulp_distance_nan ? std::string(", max ulp nan")
                                           : fmt::format(", max ulp {}", g.max_ulp);
    }
    if (g.rule == region_rule::rope) out += fmt::format(", {} needed the allowance", g.needed_allowance);
    if (g.rule != region_rule::bytes) {
      std::string hist;
      for (int k = 0; k < ulp_bucket_count; ++k) {
        if (g.histogram[k] == 0) continue;
        hist += fmt::format("{}{}:{}", hist.empty() ? "" : " ", ulp_bucket_label(k), g.histogram[k]);
      }
      out += fmt::format("\n    ulp histogram: {}", hist);
    }
    if (!g.numerics.empty()) out += fmt::format("\n    numerics: {}", numerics_summary(g));
    if (g.mistrusted) out += fmt::format("\n    MISTRUSTED: {}", g.mistrust_reason);
    const int hex_digits = g.rule == region_rule::bytes ? 2 : static_cast<int>(2 * dtype_size_bytes(parse_dtype(g.dtype_name, "dtype")));
    for (const mismatch& m : g.first) {
      out += fmt::format("\n    {}{}: {} {:.9g} (0x{:0{}x}) {} {:.9g} (0x{:0{}x})", m.where,
                         m.run == "a" ? " [run a]" : "", r.expected_label, m.expected, m.expected_bits,
                         hex_digits, r.got_label, m.got, m.got_bits, hex_digits);
      if (g.rule != region_rule::bytes) {
        out += m.ulp == ulp_distance_nan ? std::string(", ulp nan") : fmt::format(", {} ulp", m.ulp);
      }
      if (g.rule == region_rule::rope) out += fmt::format(", allowance {:.3g}", m.allowance);
    }
    if (g.mismatches > static_cast<int64_t>(g.first.size())) {
      out += fmt::format("\n    ... {} more", g.mismatches - static_cast<int64_t>(g.first.size()));
    }
  }
  return out;
}

}  // namespace ropekv
