#include "backends/plugin/plugin_backend.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/validate.h"

namespace ropekv {

// The ABI's codes are fixed numbers (include/ropekv/plugin.h); the conversions below are explicit
// switches, so a reordering of ropekv's enums cannot change what a plugin reads. These asserts tie
// the two where they agree today (a failing one means: check the switches, never renumber the ABI).
static_assert(ROPEKV_DTYPE_F32 == static_cast<int>(dtype::f32) && ROPEKV_DTYPE_U8 == static_cast<int>(dtype::u8),
              "dtype enum and plugin ABI codes diverged: update plugin_dtype_code");
static_assert(ROPEKV_ROPE_NEOX == static_cast<int>(rope_style::neox) &&
                  ROPEKV_LAYOUT_SPLIT == static_cast<int>(cache_layout::split) &&
                  ROPEKV_LAYOUT_SHUFFLED == static_cast<int>(cache_layout::shuffled) &&
                  ROPEKV_ORDER_ROPE_FIRST == static_cast<int>(row_order::rope_first) &&
                  ROPEKV_SCALE_RECIPROCAL == static_cast<int>(scale_conv::reciprocal) &&
                  ROPEKV_PAD_Q_SKIPPED == static_cast<int>(pad_q::skipped) &&
                  ROPEKV_POS_OOB_CLAMP == static_cast<int>(pos_oob::clamp) &&
                  ROPEKV_TABLE_TWO == static_cast<int>(table_kind::two),
              "option enums and plugin ABI codes diverged: update to_plugin_args");

int32_t plugin_dtype_code(dtype t) {
  switch (t) {
    case dtype::f32: return ROPEKV_DTYPE_F32;
    case dtype::f16: return ROPEKV_DTYPE_F16;
    case dtype::bf16: return ROPEKV_DTYPE_BF16;
    case dtype::fp8_e4m3fn: return ROPEKV_DTYPE_FP8_E4M3FN;
    case dtype::fp8_e4m3fnuz: return ROPEKV_DTYPE_FP8_E4M3FNUZ;
    case dtype::fp8_e5m2: return ROPEKV_DTYPE_FP8_E5M2;
    case dtype::fp8_e5m2fnuz: return ROPEKV_DTYPE_FP8_E5M2FNUZ;
    case dtype::i32: return ROPEKV_DTYPE_I32;
    case dtype::i64: return ROPEKV_DTYPE_I64;
    case dtype::u8: return ROPEKV_DTYPE_U8;
    default: throw error(fmt::format("plugin_dtype_code: dtype {} has no plugin ABI code", static_cast<int>(t)));
  }
}

dtype dtype_of_plugin_code(int32_t code, const char* arg_name) {
  for (dtype t : all_dtypes)
    if (plugin_dtype_code(t) == code) return t;
  throw arg_error(arg_name, "a ROPEKV_DTYPE_* code 0..9", std::to_string(code));
}

namespace {

int32_t code_of(rope_style v) {
  switch (v) {
    case rope_style::gptj: return ROPEKV_ROPE_GPTJ;
    case rope_style::neox: return ROPEKV_ROPE_NEOX;
    default: throw error("to_plugin_args: rope_style without an ABI code");
  }
}
int32_t code_of(table_kind v) {
  switch (v) {
    case table_kind::one: return ROPEKV_TABLE_ONE;
    case table_kind::two: return ROPEKV_TABLE_TWO;
    default: throw error("to_plugin_args: table_kind without an ABI code");
  }
}
int32_t code_of(cache_layout v) {
  switch (v) {
    case cache_layout::joint: return ROPEKV_LAYOUT_JOINT;
    case cache_layout::split: return ROPEKV_LAYOUT_SPLIT;
    case cache_layout::shuffled: return ROPEKV_LAYOUT_SHUFFLED;
    default: throw error("to_plugin_args: cache_layout without an ABI code");
  }
}
int32_t code_of(row_order v) {
  switch (v) {
    case row_order::nope_first: return ROPEKV_ORDER_NOPE_FIRST;
    case row_order::rope_first: return ROPEKV_ORDER_ROPE_FIRST;
    default: throw error("to_plugin_args: row_order without an ABI code");
  }
}
int32_t code_of(scale_conv v) {
  switch (v) {
    case scale_conv::divide: return ROPEKV_SCALE_DIVIDE;
    case scale_conv::reciprocal: return ROPEKV_SCALE_RECIPROCAL;
    default: throw error("to_plugin_args: scale_conv without an ABI code");
  }
}
int32_t code_of(pad_q v) {
  switch (v) {
    case pad_q::computed: return ROPEKV_PAD_Q_COMPUTED;
    case pad_q::skipped: return ROPEKV_PAD_Q_SKIPPED;
    default: throw error("to_plugin_args: pad_q without an ABI code");
  }
}
int32_t code_of(pos_oob v) {
  switch (v) {
    case pos_oob::error: return ROPEKV_POS_OOB_ERROR;
    case pos_oob::clamp: return ROPEKV_POS_OOB_CLAMP;
    default: throw error("to_plugin_args: pos_oob without an ABI code");
  }
}

ropekv_tensor to_plugin_tensor(const tensor_view& v) {
  ropekv_tensor t;
  std::memset(&t, 0, sizeof t);
  if (!v.present()) return t;  // absent: data NULL, rank 0
  t.data = v.data;
  t.dtype = plugin_dtype_code(v.type);
  t.rank = v.rank;
  for (int d = 0; d < v.rank; ++d) {
    t.sizes[d] = v.shape[static_cast<size_t>(d)];
    t.strides[d] = v.strides_elems[static_cast<size_t>(d)];
  }
  t.device = v.on_device ? ROPEKV_DEVICE_GPU : ROPEKV_DEVICE_HOST;
  return t;
}

// A message the plugin wrote into a buffer of ours: up to the first NUL, never past the end.
std::string read_message(const std::vector<char>& buf) {
  return std::string(buf.data(), strnlen(buf.data(), buf.size()));
}

class plugin_backend final : public backend {
 public:
  plugin_backend(const std::string& path, device_mirror_factory gpu) : path_(path), gpu_(std::move(gpu)) {
    const std::string arg = "plugin " + path;
    dlerror();
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
      const char* e = dlerror();
      throw arg_error(arg, "a loadable shared library", e ? std::string("'") + e + "'" : "dlopen failed");
    }
    auto sym = [&](const char* name, bool required) -> void* {
      dlerror();
      void* p = dlsym(handle_, name);
      if (!p && required) {
        throw arg_error(arg, fmt::format("a ropekv plugin exporting {} (include/ropekv/plugin.h)", name),
                        fmt::format("a library without {}", name));
      }
      return p;
    };
    auto abi = reinterpret_cast<ropekv_plugin_abi_version_fn>(sym(ROPEKV_PLUGIN_SYMBOL_ABI_VERSION, true));
    supports_ = reinterpret_cast<ropekv_plugin_supports_fn>(sym(ROPEKV_PLUGIN_SYMBOL_SUPPORTS, true));
    run_ = reinterpret_cast<ropekv_plugin_run_fn>(sym(ROPEKV_PLUGIN_SYMBOL_RUN, true));
    auto device = reinterpret_cast<ropekv_plugin_device_fn>(sym(ROPEKV_PLUGIN_SYMBOL_DEVICE, false));
    const int v = abi();
    if (v != ROPEKV_PLUGIN_ABI_VERSION) {
      throw arg_error(arg, fmt::format("plugin ABI version {} (ropekv_plugin_abi_version())", ROPEKV_PLUGIN_ABI_VERSION),
                      std::to_string(v));
    }
    device_ = device ? device() : ROPEKV_DEVICE_HOST;
    if (device_ != ROPEKV_DEVICE_HOST && device_ != ROPEKV_DEVICE_GPU) {
      throw arg_error(arg, "ropekv_plugin_device() returning ROPEKV_DEVICE_HOST (0) or ROPEKV_DEVICE_GPU (1)",
                      std::to_string(device_));
    }
    // The library is never unloaded (dlclose while a plugin's threads or atexit handlers still
    // exist crashes): handle_ is kept for the process's life.
  }

  std::string name() const override { return "plugin:" + path_; }

  std::string unsupported_reason(const op_args& args) const override {
    if (args.options.layout == cache_layout::fp8_ds_mla) {
      // The plugin ABI has no layout code for it (nor a field for its tile scale rule).
      return "not supported: the fp8_ds_mla cache layout";
    }
    if (args.kv_c.rank == 3 || args.cache.rank == 4 || args.ckv_cache.rank == 4 || args.kpe_cache.rank == 4) {
      // The plugin ABI documents [Tk, D] k rows and [num_blocks, block_size, D] caches (one kv head).
      return fmt::format("not supported: kv heads (KH = {}; the plugin ABI takes one kv head: [Tk, D] rows, "
                         "rank-3 caches)", kv_head_count(args.kv_c));
    }
    if (has_decode_outputs(args)) {
      // The plugin ABI has no fields for decode_q_pe_out, k_pe_out, q_nope_zeros_out.
      return "not supported: decode outputs";
    }
    if (args.k_scale_tensor.present() || args.q_scale_tensor.present()) {
      // The plugin ABI passes the scales as floats only.
      return "not supported: scales as tensors (the plugin ABI takes k_scale and q_scale as floats)";
    }
    if (device_ == ROPEKV_DEVICE_GPU) {
      // A GPU plugin runs on device copies of the case (the GPU backend's device_mirror).
      if (!gpu_) {
        return "not supported: the plugin wants GPU memory and this ropekv has no GPU backend "
               "(configure with -DROPEKV_GPU=nvidia or amd)";
      }
      const std::string no_gpu = mirror().unavailable_reason();
      if (!no_gpu.empty()) return "not supported: the plugin wants GPU memory: " + no_gpu;
    }
    const ropekv_plugin_args pa = plugin_view(args);
    std::vector<char> why(512, '\0');
    const int ok = supports_(&pa, why.data(), why.size());
    if (ok == 1) return {};
    std::string msg = read_message(why);
    if (ok != 0) msg = fmt::format("ropekv_plugin_supports returned {} (expected 0 or 1){}", ok, msg.empty() ? "" : ": " + msg);
    if (msg.empty()) msg = "the plugin gave no reason";
    return msg.rfind("not supported", 0) == 0 ? msg : "not supported: " + msg;
  }

  void run_host(const op_args& args, const std::vector<memory_region>& regions) override {
    validate(args);  // a failed call writes nothing; the plugin only sees valid calls
    std::string why = unsupported_reason(args);
    if (!why.empty()) throw unsupported_error(why);
    if (device_ == ROPEKV_DEVICE_GPU) {
      mirror().run(args, regions, [this](const op_args& device_args, void* stream) { call_run(device_args, stream); });
    } else {
      call_run(args, nullptr);
    }
  }

  std::string device_description() const override {
    return fmt::format("plugin {} ({} memory, ABI {})", path_, device_ == ROPEKV_DEVICE_GPU ? "GPU" : "host",
                       ROPEKV_PLUGIN_ABI_VERSION);
  }

 private:
  // The args as the plugin sees them in supports(): for a GPU plugin every present tensor says
  // ROPEKV_DEVICE_GPU; its data pointer is then the host copy's (same alignment modulo 256 as
  // the device copy run() gets), never to be dereferenced.
  ropekv_plugin_args plugin_view(const op_args& args) const {
    ropekv_plugin_args pa = to_plugin_args(args);
    if (device_ == ROPEKV_DEVICE_GPU) {
      for (ropekv_tensor* t : {&pa.q_nope, &pa.q_pe, &pa.kv_c, &pa.k_pe, &pa.positions, &pa.slot_mapping,
                               &pa.cos_sin, &pa.cos, &pa.sin, &pa.q_out, &pa.cache, &pa.ckv_cache, &pa.kpe_cache})
        if (t->rank > 0) t->device = ROPEKV_DEVICE_GPU;
    }
    return pa;
  }

  // One call of the plugin's run on `args` (host views, or device views from the mirror).
  void call_run(const op_args& args, void* stream) {
    const ropekv_plugin_args pa = to_plugin_args(args);
    std::vector<char> msg(1024, '\0');
    const int rc = run_(&pa, stream, msg.data(), msg.size());
    if (rc == ROPEKV_PLUGIN_OK) return;
    std::string text = read_message(msg);
    if (rc == ROPEKV_PLUGIN_UNSUPPORTED) {
      throw unsupported_error(text.rfind("not supported", 0) == 0 ? text : "not supported: " + text);
    }
    throw error(fmt::format("plugin {}: ropekv_plugin_run returned {}: {}", path_, rc,
                            text.empty() ? "(no message)" : text));
  }

  // The device copy of cases for a GPU plugin, made on first use (so a process that only
  // forks isolated children never touches the GPU itself).
  device_mirror& mirror() const {
    if (!mirror_) mirror_ = gpu_();
    return *mirror_;
  }

  std::string path_;
  device_mirror_factory gpu_;
  mutable std::unique_ptr<device_mirror> mirror_;
  void* handle_ = nullptr;
  ropekv_plugin_supports_fn supports_ = nullptr;
  ropekv_plugin_run_fn run_ = nullptr;
  int device_ = ROPEKV_DEVICE_HOST;
};

}  // namespace

ropekv_plugin_args to_plugin_args(const op_args& a) {
  ropekv_plugin_args p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = sizeof(ropekv_plugin_args);
  p.abi_version = ROPEKV_PLUGIN_ABI_VERSION;
  p.q_nope = to_plugin_tensor(a.q_nope);              // [Tq, H, Dn]
  p.q_pe = to_plugin_tensor(a.q_pe);                  // [Tq, H, Dr]
  p.kv_c = to_plugin_tensor(a.kv_c);                  // [Tk, Dn]
  p.k_pe = to_plugin_tensor(a.k_pe);                  // [Tk, Dr]
  p.positions = to_plugin_tensor(a.positions);        // [Tk]
  p.slot_mapping = to_plugin_tensor(a.slot_mapping);  // [Ts]
  p.cos_sin = to_plugin_tensor(a.cos_sin);            // [P, Dr]
  p.cos = to_plugin_tensor(a.cos);                    // [P, Dr/2]
  p.sin = to_plugin_tensor(a.sin);                    // [P, Dr/2]
  p.q_out = to_plugin_tensor(a.q_out);                // [Tq, H, Dn + Dr]
  p.cache = to_plugin_tensor(a.cache);                // [num_blocks, block_size, Dn + Dr]
  p.ckv_cache = to_plugin_tensor(a.ckv_cache);        // [num_blocks, block_size, Dn]
  p.kpe_cache = to_plugin_tensor(a.kpe_cache);        // [num_blocks, block_size, Dr]
  p.rope_style = code_of(a.options.style);
  p.table_kind = code_of(a.table());
  p.cache_layout = code_of(a.options.layout);
  p.row_order = code_of(a.options.order);
  p.scale_conv = code_of(a.options.scale);
  p.pad_q = code_of(a.options.padding);
  p.pos_oob = code_of(a.options.positions);
  p.inplace_q = a.options.inplace_q ? 1 : 0;
  p.inplace_k = a.options.inplace_k ? 1 : 0;
  p.k_scale = a.k_scale;
  p.q_scale = a.q_scale;
  return p;
}

std::unique_ptr<backend> make_plugin_backend(const std::string& path, device_mirror_factory gpu) {
  return std::make_unique<plugin_backend>(path, std::move(gpu));
}

}  // namespace ropekv
