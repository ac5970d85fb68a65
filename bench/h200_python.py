"""The Python package and its PyTorch op on one NVIDIA GPU (run by bench/h200_python.sh):
torch.library.opcheck of the CUDA op, ropekv.fuzz over the CUDA op vs the reference, the op
inside a captured CUDA graph (inputs and slots changed between replays), and the plain-PyTorch
example fuzzed on the GPU. Prints one closing line per part and writes a JSON summary."""
import json
import os
import sys
import time

import torch

import ropekv
import ropekv.torch as rkt

OUT = os.environ.get("OUT", ".")
CASES = int(os.environ.get("ROPEKV_GPU_CASES", "5000"))
summary = {"ropekv_version": ropekv.__version__, "commit": ropekv._c.commit,
           "has_gpu": ropekv._c.has_gpu, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0)}
print(json.dumps(summary))
assert ropekv._c.has_gpu, "this ropekv was built without the GPU backend"
dev = torch.device("cuda")

# 1. opcheck on CUDA tensors (bf16 and f16 caches; torch's own checker cannot compare fp8)
results = {}
for repro in ["tq=4 ts=4 tk=4 h=16 dn=512 dr=64 bs=16 nb=1",
              "tq=3 ts=5 tk=6 h=8 dn=512 dr=64 bs=16 nb=2 in=f16 qo=f16 cache=f16 pad_slots=1 inplace_q=1",
              "tq=2 ts=2 tk=2 h=4 dn=512 dr=64 bs=16 nb=1 layout=split style=neox table=two"]:
    case = ropekv.make_case(repro)
    t = case.to_torch(dev)
    p = case.problem
    kwargs = dict(k_scale=p.k_scale, q_scale=p.q_scale, style=p.style, order=p.order,
                  scale_conv=p.scale_conv, pad_q=p.pad_q, pos_oob=p.pos_oob,
                  inplace_q=bool(p.inplace_q), inplace_k=bool(p.inplace_k))
    r = torch.library.opcheck(torch.ops.ropekv.mla_rope_cache_concat,
                              tuple(t.get(n) for n in rkt._NAMES), kwargs)
    results[repro] = r
    print("opcheck", repro.split(" dn")[0], r)
summary["opcheck_cuda"] = results
assert all(v == "SUCCESS" for r in results.values() for v in r.values())

# 2. ropekv.fuzz over the CUDA op (both profiles) vs the reference
for profile, n in (("aligned16", CASES), ("any", max(CASES // 2, 1))):
    t0 = time.time()
    s = ropekv.fuzz(rkt.kernel, cases=n, seed=20261201, profile=profile, framework="torch",
                    device="cuda", max_tokens=256, json=os.path.join(OUT, f"fuzz-op-{profile}.json"))
    summary[f"fuzz_op_{profile}"] = {"passed": s.passed_cases, "failed": s.failed,
                                     "errored": s.errored, "skipped": s.skipped,
                                     "seconds": round(time.time() - t0, 1)}
    print(f"fuzz-op-{profile}: {s.passed_cases} passed, {s.failed + s.errored} failed, "
          f"{s.skipped} skipped")
    assert s.passed, str(s)

# 3. the op inside a captured CUDA graph: replays after the inputs and slots change
case = ropekv.make_case("tq=32 ts=32 tk=32 h=128 dn=512 dr=64 bs=64 nb=2 cache=fp8_e4m3fn")
t = case.to_torch(dev)
other = ropekv.make_case(str(case.problem.replace(seed=99)))
t2 = other.to_torch(dev)
p = case.problem
stream = torch.cuda.Stream()
stream.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(stream):  # warm-up outside the graph
    rkt.call(t, k_scale=p.k_scale, q_scale=p.q_scale)
torch.cuda.current_stream().wait_stream(stream)
fresh = case.to_torch(dev)
for name in ("q_out", "cache"):
    t[name].copy_(fresh[name])
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    rkt.call(t, k_scale=p.k_scale, q_scale=p.q_scale)
g.replay()
torch.cuda.synchronize()
ropekv.compare(case, {"q_out": t["q_out"], "cache": t["cache"]}).assert_ok()
# new inputs (another seed: other values, positions and slots) copied into the captured buffers
for name in ("q_nope", "q_pe", "kv_c", "k_pe", "positions", "slot_mapping", "cos_sin", "q_out", "cache"):
    t[name].copy_(t2[name])
g.replay()
torch.cuda.synchronize()
ropekv.compare(other, {"q_out": t["q_out"], "cache": t["cache"]}).assert_ok()
summary["cuda_graph"] = "passed: captured op replayed, then replayed on new inputs and slots"
print("cuda-graph: 2 passed, 0 failed")

# 4. the plain-PyTorch example on the GPU
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples", "pytorch_unfused"))
import mla_rope_cache  # noqa: E402
s = ropekv.fuzz(mla_rope_cache.mla_rope_cache_concat, cases=1000, seed=3, framework="torch",
                device="cuda", max_tokens=64)
summary["fuzz_example_cuda"] = {"passed": s.passed_cases, "failed": s.failed, "errored": s.errored}
print(f"fuzz-example-cuda: {s.passed_cases} passed, {s.failed + s.errored} failed")

with open(os.path.join(OUT, "python-summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
print("h200_python: all passed" if s.passed else "h200_python: FAILED")
