// The `ropekv._ropekv` extension: a thin nanobind layer over core, harness and the backends the
// CLI knows (tools/backends_registry.h). It converts (problem strings, host memory as numpy
// arrays of bits, reports as dicts) and calls the library; the decisions live in C++ (harness,
// core) or in the shared CLI code. The reference and the sim run with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "core/backend.h"
#include "backends/cpu/cpu_backend.h"
#include "core/case_data.h"
#include "core/compare.h"
#include "core/error.h"
#include "core/golden.h"
#include "core/problem.h"
#include "harness/fuzz.h"
#include "harness/golden_io.h"
#include "tools/backends_registry.h"
#include "tools/cli.h"
#if ROPEKV_HAVE_HIP
#include "backends/hip/hip_backend.h"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace ropekv {
namespace {

// One tensor of a call as the Python side rebuilds it: name, ropekv dtype name, shape, strides
// (elements), index of the memory region holding it, byte offset of element 0 in that region.
using tensor_spec = std::tuple<std::string, std::string, std::vector<int64_t>, std::vector<int64_t>,
                               int64_t, int64_t>;

std::vector<tensor_spec> tensor_specs(const op_args& args, const std::vector<memory_region>& regions) {
  std::vector<tensor_spec> out;
  for (const auto& [name, v] : named_tensors(args)) {
    if (!v->present()) continue;
    const auto* p = static_cast<const uint8_t*>(v->data);
    const auto [lo, hi] = v->extent_bytes();  // bytes the view touches, relative to p
    int64_t region = -1, offset = 0;
    for (size_t i = 0; i < regions.size(); ++i) {
      const auto* base = static_cast<const uint8_t*>(regions[i].base);
      const auto* end = base + regions[i].size_bytes;
      if (hi == lo) {  // an empty view (k_pe of Tk = 0 rows may point past its buffer)
        region = 0;
        break;
      }
      if (p + lo >= base && p + hi <= end) {
        region = static_cast<int64_t>(i);
        offset = p - base;
        break;
      }
    }
    if (region < 0) throw error(std::string("tensor '") + name + "' lies in no memory region");
    out.emplace_back(name, dtype_name(v->type), std::vector<int64_t>(v->shape.begin(), v->shape.begin() + v->rank),
                     std::vector<int64_t>(v->strides_elems.begin(), v->strides_elems.begin() + v->rank),
                     region, offset);
  }
  return out;
}

// The regions as writable 1-D uint8 numpy arrays (no copy). `owner` keeps them alive; without
// one they are valid only during the call that handed them out.
std::vector<nb::object> region_arrays(const std::vector<memory_region>& regions, nb::handle owner) {
  std::vector<nb::object> out;
  for (const memory_region& r : regions) {
    const size_t shape[1] = {r.size_bytes};
    nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> a(r.base, 1, shape, owner);
    // without an owner, rv_policy::reference: a view of the run's memory, not a copy
    out.push_back(owner.is_valid() ? a.cast() : a.cast(nb::rv_policy::reference));
  }
  return out;
}

// The report as the CLI's JSON has it (harness region_report_json), plus the text.
nb::dict report_dict(const case_report& r) {
  nlohmann::json regions = nlohmann::json::array();
  for (const region_report& g : r.regions) regions.push_back(region_report_json(g));
  nb::dict d;
  d["repro"] = r.repro;
  d["outcome"] = std::string(outcome_name(r.outcome));
  d["message"] = r.message;
  d["text"] = format_case_report(r, true);
  d["regions"] = nb::module_::import_("json").attr("loads")(regions.dump());
  return d;
}

// A user's kernel as a backend: run_host hands the call's memory to a Python function, which
// rebuilds the tensors, calls the kernel (moving data to its framework and device and back) and
// returns "" or the kernel's "unsupported" reason. Every other Python exception propagates as
// an error (the harness reports the case ERRORED with its text).
// A Python callable shared by the registry's factory and the backends it makes: copies of a
// shared_ptr need no GIL; the last one takes the GIL to drop the reference.
using py_callable = std::shared_ptr<PyObject>;
py_callable hold(nb::object f) {
  return py_callable(f.release().ptr(), [](PyObject* o) {
    if (!Py_IsInitialized()) return;
    nb::gil_scoped_acquire gil;
    Py_DECREF(o);
  });
}

class python_backend final : public backend {
 public:
  python_backend(std::string name, py_callable call) : name_(std::move(name)), call_(std::move(call)) {}
  std::string name() const override { return name_; }
  std::string unsupported_reason(const op_args&) const override { return {}; }
  void set_case_repro(const std::string& repro) override { repro_ = repro; }
  void run_host(const op_args& args, const std::vector<memory_region>& regions) override {
    std::string why;
    {
      nb::gil_scoped_acquire gil;
      nb::object r = nb::handle(call_.get())(region_arrays(regions, nb::handle()), tensor_specs(args, regions), repro_);
      why = nb::cast<std::string>(r);
    }
    if (!why.empty()) throw unsupported_error(why);
  }

 private:
  std::string name_;
  py_callable call_;
  std::string repro_;
};

// A tensor handed over by pointer (the PyTorch op): name, data pointer, dtype name, shape,
// strides in elements.
using raw_tensor = std::tuple<std::string, uintptr_t, std::string, std::vector<int64_t>, std::vector<int64_t>>;

op_args args_of_pointers(const std::vector<raw_tensor>& tensors, const std::string& options, double k_scale,
                         double q_scale, bool on_device) {
  op_args a;
  for (const auto& [name, ptr, dtype_text, shape, strides] : tensors) {
    tensor_view* v = nullptr;
    for (const auto& [n, view] : named_tensors(a))
      if (name == n) v = const_cast<tensor_view*>(view);
    if (!v) throw arg_error("tensors", "golden tensor names (q_nope, ..., kpe_cache, k_scale, q_scale, decode_q_pe_out, k_pe_out, q_nope_zeros_out)", "'" + name + "'");
    if (shape.size() != strides.size() || shape.size() > static_cast<size_t>(max_rank))
      throw arg_error(name, "a shape and strides of one rank <= 4", "another");
    v->type = parse_dtype(dtype_text, name.c_str());
    v->rank = static_cast<int>(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) {
      v->shape[d] = shape[d];
      v->strides_elems[d] = strides[d];
    }
    v->data = reinterpret_cast<void*>(ptr);
    v->on_device = on_device;
  }
  // options: "key=value ..." with the repro keys of op_options
  const problem opt = pin_problem(problem{}, options);
  a.options = opt.opt;
  a.k_scale = static_cast<float>(k_scale);
  a.q_scale = static_cast<float>(q_scale);
  return a;
}

// Host memory regions covering the views (the reference reads views only).
std::vector<memory_region> regions_of(const op_args& a) {
  std::vector<memory_region> out;
  for (const auto& [name, v] : named_tensors(a)) {
    if (!v->present()) continue;
    const auto [lo, hi] = v->extent_bytes();
    out.push_back({static_cast<uint8_t*>(v->data) + lo, static_cast<size_t>(hi - lo)});
  }
  return out;
}

// One case compared from Python: every rope region is identified (which numerics models its
// values match bit for bit, which bounds they meet).
compare_options compare_opts(int64_t max_ulp, bool strict, bool bitwise,
                             const std::string& numerics = "fp32") {
  return make_compare_options(max_ulp, strict, bitwise, numerics, true, "max_ulp", "numerics");
}

}  // namespace
}  // namespace ropekv

NB_MODULE(_ropekv, m) {
  using namespace ropekv;
  m.doc() = "ropekv's C++ core, harness and backends (use the `ropekv` package, not this module)";
  m.attr("version") = ROPEKV_VERSION;
  m.attr("commit") = ROPEKV_GIT_COMMIT;
  m.attr("contract_version") = contract_version;
  // A case a backend does not cover (the GPU kernel's domain): NotImplementedError's subclass.
  nb::exception<unsupported_error>(m, "UnsupportedError", PyExc_NotImplementedError);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const arg_error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  m.def("parse_problem", [](const std::string& repro) { return parse_problem(repro).to_repro(); },
        "repro"_a, "The canonical repro string of a problem (ValueError naming the key when invalid)");
  m.def("pin_problem", [](const std::string& repro, const std::string& pins) {
        return pin_problem(parse_problem(repro), pins).to_repro();
      }, "repro"_a, "pins"_a);
  m.def("random_problem",
        [](uint64_t seed, uint64_t index, const std::string& profile, int64_t max_tokens,
           const std::string& pins) {
          if (!pins.empty()) check_pins(pins);
          return profile_problem(parse_fuzz_profile(profile), seed, index, max_tokens, pins).to_repro();
        },
        "seed"_a, "index"_a, "profile"_a, "max_tokens"_a, "pins"_a,
        "Case `index` of a fuzz campaign with this seed, profile and pins (its repro string)");

  nb::class_<case_data>(m, "CaseData")
      .def_prop_ro("repro", [](const case_data& c) { return c.prob.to_repro(); })
      .def("clone", [](const case_data& c) { return c.clone(); })
      .def("regions", [](nb::handle self) {
        case_data& c = nb::cast<case_data&>(self);
        return region_arrays(c.regions(), self);
      }, "The case's memory: one uint8 array per buffer, guard bytes included (views into it)")
      .def("tensor_specs", [](case_data& c) { return tensor_specs(c.args, c.regions()); },
           "(name, dtype, shape, strides in elements, region index, byte offset) per tensor")
      .def("guard_report", [](const case_data& c) {
        std::string out;
        for (const auto& [name, b] : c.buffers)
          if (!b.guards_intact()) out += (out.empty() ? "" : "; ") + name + ": " + b.guard_report();
        return out;
      }, "'' when every buffer's guard bytes are intact, else which are damaged");
  m.def("output_names", [](const std::string& repro) {
        std::vector<std::string> out;
        for (const golden_tensor_spec& s : golden_output_specs(parse_problem(repro))) out.push_back(s.name);
        return out;
      }, "repro"_a, "The tensors a kernel writes for this problem (q_out, the cache(s), decode outputs, q_pe / k_pe in place)");
  m.def("make_case", [](const std::string& repro) {
    const problem p = parse_problem(repro);
    nb::gil_scoped_release nogil;
    return make_case(p);
  }, "repro"_a, "Builds a case: inputs from the seed, outputs and caches poisoned, guards around every buffer");
  m.def("run_backend", [](const std::string& name, case_data& c) {
    std::unique_ptr<backend> be = find_backend(name)();
    {
      std::string why = be->unsupported_reason(c.args);
      if (!why.empty()) throw unsupported_error(be->name() + ": " + why);
      nb::gil_scoped_release nogil;
      be->set_case_repro(c.prob.to_repro());
      be->run_host(c.args, c.regions());
    }
    return be->last_variant();
  }, "backend"_a, "case"_a, "Runs a compiled-in backend (ref, sim, hip) on the case in place");
  m.def("compare_with_reference",
        [](const case_data& initial, const case_data& got, int64_t max_ulp, bool strict, bool bitwise,
           const std::string& numerics) {
          const compare_options cmp = compare_opts(max_ulp, strict, bitwise, numerics);
          if (got.prob != initial.prob) throw arg_error("got", "a clone of the initial case", "another problem");
          std::unique_ptr<backend> ref = find_backend("ref")();
          case_report r;
          {
            nb::gil_scoped_release nogil;
            r = compare_with_reference(initial, got, *ref, cmp);
          }
          return report_dict(r);
        },
        "initial"_a, "got"_a, "max_ulp"_a, "strict"_a, "bitwise"_a, "numerics"_a = "fp32",
        "Compares `got` (initial with a kernel's outputs) with the reference's run of `initial`");
  m.def("register_python_backend", [](const std::string& name, nb::object call, const std::string& replay_prefix) {
    py_callable held = hold(std::move(call));
    register_backend(name, [name, held] { return std::unique_ptr<backend>(new python_backend(name, held)); },
                     replay_prefix);
  }, "name"_a, "call"_a, "replay_prefix"_a);
  m.def("unregister_backend", [](const std::string& name) { unregister_test_backend(name); }, "name"_a);
  m.def("cli_main", [](const std::vector<std::string>& args) {
    nb::gil_scoped_release nogil;
    return cli_main(args);
  }, "args"_a, "The `ropekv` CLI in process (its exit code); Python kernels registered above are backends");
  m.def("run_op",
        [](const std::vector<raw_tensor>& tensors, const std::string& options, double k_scale, double q_scale,
           bool on_device, uintptr_t stream) {
          const op_args a = args_of_pointers(tensors, options, k_scale, q_scale, on_device);
          if (!on_device) {
            nb::gil_scoped_release nogil;
            reference_run(a);  // validates first: a failed call writes nothing
            return;
          }
#if ROPEKV_HAVE_HIP
          hip_launch(a, reinterpret_cast<void*>(stream));
#else
          (void)stream;
          throw arg_error("device", "a CPU tensor (this ropekv was built without a GPU backend: "
                          "pip install . -C cmake.define.ROPEKV_GPU=nvidia or amd)", "a GPU tensor");
#endif
        },
        "tensors"_a, "options"_a, "k_scale"_a, "q_scale"_a, "on_device"_a, "stream"_a,
        "The op on tensors given by pointer: host -> the reference, device -> the GPU kernel on `stream` "
        "(no sync, no allocation). Validates first; a failed call writes nothing");
  m.attr("has_gpu") =
#if ROPEKV_HAVE_HIP
      true;
#else
      false;
#endif
  m.def("write_golden", [](const std::string& path, const case_data& before, const case_data& after,
                           const std::string& format, bool store_all) {
    if (format == "safetensors") {
      write_golden(path, before, after, golden_write_options{store_all});
    } else if (format == "npy") {
      write_golden_npy(path, before, after, golden_write_options{store_all});
    } else {
      throw arg_error("format", "safetensors or npy", "'" + format + "'");
    }
  }, "path"_a, "before"_a, "after"_a, "format"_a, "store_all"_a = false,
        "Writes a golden case: inputs and *.initial from `before`, *.expected from `after`");
  m.def("load_golden", [](const std::string& path) {
    golden_case g = load_golden_case(path);
    nb::dict meta;
    for (const auto& [k, v] : g.file.metadata) meta[k.c_str()] = v;
    return nb::make_tuple(std::move(g.initial), std::move(g.expected), meta);
  }, "path"_a, "Reads a golden file: (the case before the call, the case holding *.expected, metadata)");
  // Tensors handed over from Python as (name, dtype, shape, bytes): dtype a ropekv name or a
  // numpy descr ('<f4', '|u1', '<V2'); a str instead of the list is a safetensors file or an npy
  // folder.
  using py_tensor = std::tuple<std::string, std::string, std::vector<int64_t>, nb::bytes>;
  auto tensors_of = [](const std::variant<std::string, std::vector<py_tensor>>& src, const char* what) {
    if (const auto* path = std::get_if<std::string>(&src)) return read_tensor_file(*path);
    tensor_file tf;
    tf.path = what;
    for (const auto& [name, dt, shape, bytes] : std::get<std::vector<py_tensor>>(src)) {
      file_tensor t;
      t.dtype = dt;
      t.shape = shape;
      const auto* b = static_cast<const uint8_t*>(bytes.data());
      t.bytes.assign(b, b + bytes.size());
      t.source = what;
      tf.tensors[name] = std::move(t);
    }
    return tf;
  };
  m.def("compare_golden", [tensors_of](const case_data& initial, const case_data& expected,
                                       const std::variant<std::string, std::vector<py_tensor>>& outputs,
                                       int64_t max_ulp, bool strict, bool bitwise, const std::string& numerics) {
    golden_case g;
    g.initial = initial.clone();
    g.expected = expected.clone();
    const tensor_file tf = tensors_of(outputs, "outputs");
    golden_compare_result r;
    {
      nb::gil_scoped_release nogil;
      r = compare_golden_outputs(g, tf, compare_opts(max_ulp, strict, bitwise, numerics));
    }
    return nb::make_tuple(report_dict(r.rec.report), r.ignored);
  }, "initial"_a, "expected"_a, "outputs"_a, "max_ulp"_a, "strict"_a, "bitwise"_a, "numerics"_a = "fp32",
        "Your outputs (a path or (name, dtype, shape, bytes) tensors) against a golden case: (report, ignored names)");
  m.def("write_golden_from_inputs", [tensors_of](const std::string& path, const std::string& repro,
                                                 const std::variant<std::string, std::vector<py_tensor>>& inputs,
                                                 const std::string& format, bool store_all) {
    const problem p = parse_problem(repro);
    std::vector<std::string> ignored;
    const case_data before = case_with_inputs(p, tensors_of(inputs, "inputs"), &ignored);
    std::unique_ptr<backend> ref = find_backend("ref")();
    nb::gil_scoped_release nogil;
    write_reference_golden(path, format, before, *ref, golden_write_options{store_all});
    return ignored;
  }, "path"_a, "repro"_a, "inputs"_a, "format"_a, "store_all"_a = false,
        "Writes the golden file of your inputs (a path or tensors) for the problem `repro`; returns the ignored names");
  m.def("backend_names", [] { return compiled_backend_names(); });
}
