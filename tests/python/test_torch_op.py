"""The PyTorch op torch.ops.ropekv.mla_rope_cache_concat on CPU tensors (the reference): its
schema (torch.library.opcheck), its results against ropekv.compare, its errors (nothing written),
torch.compile through its fake implementation, and a fuzz campaign over it."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ropekv  # noqa: E402
import ropekv.torch as rkt  # noqa: E402

OP = torch.ops.ropekv.mla_rope_cache_concat

REPROS = [
    "tq=4 ts=4 tk=4 h=8 dn=64 dr=16 bs=16 nb=1",
    "tq=3 ts=5 tk=6 h=4 dn=32 dr=8 bs=4 nb=3 in=f16 qo=f16 cache=f16 pad_slots=2 pad_q=skipped inplace_q=1 inplace_k=1",
    "tq=2 ts=2 tk=3 h=2 dn=16 dr=8 bs=8 nb=1 layout=split style=neox table=two in=f32 qo=f32 cache=f32 q_layout=head_major",
    "tq=2 ts=2 tk=2 h=2 dn=16 dr=8 bs=8 nb=1 order=rope_first kv_layout=fused row_pad=3 entry_pad=5 block_pad=7 pos_oob=clamp",
    # kv heads (core/SPEC.md "kv heads"): kv_c / k_pe [Tk, KH, D], caches [nb, KH, bs, D]; seed 6
    # lays the split caches out as vLLM's [nb, bs, KH, D] (a permuted view)
    "tq=3 ts=4 tk=5 h=8 kh=2 dn=32 dr=16 bs=16 nb=2 inplace_k=1 seed=4",
    "tq=2 ts=3 tk=3 h=6 kh=3 dn=16 dr=8 bs=4 nb=2 layout=split entry_pad=2 seed=6",
]


def options(p):
    return dict(k_scale=p.k_scale, q_scale=p.q_scale, style=p.style, order=p.order,
                scale_conv=p.scale_conv, pad_q=p.pad_q, pos_oob=p.pos_oob,
                inplace_q=bool(p.inplace_q), inplace_k=bool(p.inplace_k))


def outputs(case, t):
    names = [n for n in ("q_out", "cache", "ckv_cache", "kpe_cache") if n in t]
    names += ["q_pe"] if case.problem.inplace_q else []
    names += ["k_pe"] if case.problem.inplace_k else []
    return {n: t[n] for n in names}


@pytest.mark.parametrize("repro", REPROS)
def test_op_matches_the_reference_and_passes_opcheck(repro):
    case = ropekv.make_case(repro)
    t = case.to_torch("cpu")
    OP(*(t.get(n) for n in rkt._NAMES), **options(case.problem))
    ropekv.compare(case, outputs(case, t), bitwise=True).assert_ok()
    t = case.to_torch("cpu")
    result = torch.library.opcheck(OP, tuple(t.get(n) for n in rkt._NAMES), options(case.problem))
    assert set(result.values()) == {"SUCCESS"}, result


def test_op_fp8_cache_with_tensor_scales():
    case = ropekv.make_case("tq=2 ts=3 tk=3 h=4 dn=32 dr=16 bs=4 nb=1 cache=fp8_e4m3fn qo=fp8_e5m2 "
                            "k_scale=0.25 q_scale=2 scale_conv=reciprocal")
    t = case.to_torch("cpu")
    rkt.call(t, k_scale=torch.tensor([0.25]), q_scale=torch.tensor(2.0), scale_conv="reciprocal")
    ropekv.compare(case, outputs(case, t), bitwise=True).assert_ok()
    with pytest.raises(ValueError, match=r"k_scale: expected a 1-element float32 tensor, got shape \[2\]"):
        rkt.call(case.to_torch("cpu"), k_scale=torch.tensor([0.25, 0.5]))


def test_op_reads_scale_tensors_when_it_runs():
    # scales=tensor: the case holds k_scale / q_scale as [1] f32 tensors; the op reads them.
    case = ropekv.make_case("tq=3 ts=3 tk=4 h=4 dn=32 dr=16 bs=4 nb=1 cache=fp8_e4m3fn qo=fp8_e5m2 "
                            "k_scale=0.37 q_scale=3 scales=tensor")
    t = case.to_torch("cpu")
    assert t["k_scale"].dtype == torch.float32 and list(t["k_scale"].shape) == [1]
    rkt.kernel(t, case.problem)
    ropekv.compare(case, outputs(case, t), bitwise=True).assert_ok()
    # the same tensors changed after the case was built: the op follows the tensors
    other = ropekv.make_case("tq=3 ts=3 tk=4 h=4 dn=32 dr=16 bs=4 nb=1 cache=fp8_e4m3fn qo=fp8_e5m2 "
                             "k_scale=0.5 q_scale=0.125")
    t = case.to_torch("cpu")
    t["k_scale"].fill_(0.5)
    t["q_scale"].fill_(0.125)
    rkt.call(t)  # scales from the dict's tensors
    ropekv.compare(other, outputs(other, t), bitwise=True).assert_ok()
    # opcheck compares outputs with float arithmetic that fp8 tensors lack: a 16-bit case whose
    # scale tensors are passed (checked, unused)
    t = ropekv.make_case(REPROS[0] + " scales=tensor").to_torch("cpu")
    result = torch.library.opcheck(OP, tuple(t.get(n) for n in rkt._NAMES),
                                   dict(k_scale_tensor=t["k_scale"], q_scale_tensor=t["q_scale"]))
    assert set(result.values()) == {"SUCCESS"}, result


def test_op_scale_tensor_errors_name_the_argument_and_write_nothing():
    case = ropekv.make_case("tq=2 ts=2 tk=2 h=2 dn=16 dr=8 bs=4 nb=1 cache=fp8_e4m3fn scales=tensor")
    t = case.to_torch("cpu")
    with pytest.raises(ValueError, match="k_scale.dtype: expected f32, got f16"):
        rkt.call(t, k_scale=t["k_scale"].to(torch.float16))
    with pytest.raises(ValueError, match=r"k_scale\[0\]: expected finite and > 0, got 0"):
        rkt.call(t, k_scale=torch.zeros(1))
    with pytest.raises(ValueError, match="q_scale: expected a float or a tensor"):
        OP(*(t.get(n) for n in rkt._NAMES), q_scale=2.0, q_scale_tensor=t["q_scale"])
    untouched(case, t)


def test_fuzz_the_cpu_op_with_scale_tensors():
    s = ropekv.fuzz(rkt.kernel, cases=60, seed=5, framework="torch", max_tokens=8, pin={"scales": "tensor"})
    s.assert_ok()
    # the op takes no fp8_ds_mla cache: those cases (5% of the draws) are skipped, nothing else
    skipped = [c for c in s.cases if c["outcome"] == "SKIPPED"]
    assert s.passed_cases + s.skipped == 60 and s.passed_cases >= 50
    assert all("layout=fp8_ds_mla" in c["repro"] for c in skipped), skipped


def untouched(case, t):
    for name in ("q_out", "cache"):
        assert (t[name].view(torch.uint8) == 0xA5).all(), f"{name} was written by a failed call"


def test_op_errors_name_the_argument_and_write_nothing():
    case = ropekv.make_case(REPROS[0])
    t = case.to_torch("cpu")
    bad = dict(t, q_out=t["q_out"][:, :, :-1])  # one column short
    with pytest.raises(ValueError, match=r"q_out.*expected.*got"):
        rkt.call(bad)
    untouched(case, t)
    bad = dict(t, slot_mapping=t["slot_mapping"].to(torch.int16))
    with pytest.raises(ValueError, match="slot_mapping: expected one of the dtypes"):
        rkt.call(bad)
    untouched(case, t)
    bad = dict(t, slot_mapping=torch.full_like(t["slot_mapping"], 1 << 20))  # slot past the cache
    with pytest.raises(ValueError, match="slot"):
        rkt.call(bad)
    untouched(case, t)
    with pytest.raises(ValueError, match="style: expected one of gptj, neox, got 'rope'"):
        rkt.call(t, style="rope")
    with pytest.raises(ValueError, match="k_scale"):
        rkt.call(t, k_scale=float("nan"))
    untouched(case, t)


def test_op_under_torch_compile_uses_the_fake_implementation():
    case = ropekv.make_case(REPROS[0])
    t = case.to_torch("cpu")

    def f(q_nope, q_pe, kv_c, k_pe, positions, slots, cos_sin, q_out, cache):
        OP(q_nope, q_pe, kv_c, k_pe, positions, slots, cos_sin, None, None, q_out, cache, None, None)
        return q_out.sum()

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    compiled(t["q_nope"], t["q_pe"], t["kv_c"], t["k_pe"], t["positions"], t["slot_mapping"],
             t["cos_sin"], t["q_out"], t["cache"])
    ropekv.compare(case, outputs(case, t)).assert_ok()


def test_fuzz_the_cpu_op():
    s = ropekv.fuzz(rkt.kernel, cases=300, seed=3, framework="torch", max_tokens=16)
    s.assert_ok()
    # the op takes no fp8_ds_mla cache: those cases (5% of the draws) are skipped, nothing else
    skipped = [c for c in s.cases if c["outcome"] == "SKIPPED"]
    assert s.passed_cases + s.skipped == 300 and s.passed_cases >= 270
    assert all("layout=fp8_ds_mla" in c["repro"] for c in skipped), skipped


def test_op_takes_kv_heads_from_the_tensor_shapes():
    """KH > 1 (AITER's form): the op reads KH off kv_c / k_pe / the cache; a cache in vLLM's
    [nb, bs, KH, D] memory passed as its [nb, KH, bs, D] permutation gives the same bytes."""
    case = ropekv.make_case("tq=3 ts=4 tk=4 h=8 kh=4 dn=32 dr=16 bs=8 nb=2 seed=4")
    t = case.to_torch("cpu")
    assert t["kv_c"].shape == (4, 4, 32) and t["cache"].shape == (2, 4, 8, 48)
    rkt.call(t)
    ropekv.compare(case, outputs(case, t), bitwise=True).assert_ok()
    vllm = torch.full((2, 8, 4, 48), -7.0, dtype=t["cache"].dtype)  # [nb, bs, KH, D]
    t2 = dict(case.to_torch("cpu"), cache=vllm.permute(0, 2, 1, 3))
    rkt.call(t2)
    assert torch.equal(t2["cache"].view(torch.int16)[t["cache"].view(torch.int16) != -23131],
                       t["cache"].view(torch.int16)[t["cache"].view(torch.int16) != -23131])
    bad = dict(case.to_torch("cpu"), kv_c=case.to_torch("cpu")["kv_c"][:, :3])  # KH = 3 of H = 8
    with pytest.raises(ValueError, match=r"kv_c.shape\[1\]: expected a divisor of H = 8"):
        rkt.call(bad)


def test_fuzz_the_cpu_op_with_kv_heads():
    s = ropekv.fuzz(rkt.kernel, cases=40, seed=7, framework="torch", max_tokens=8, pin={"kh": "2"})
    s.assert_ok()
    skipped = [c for c in s.cases if c["outcome"] == "SKIPPED"]
    assert all("layout=fp8_ds_mla" in c["repro"] for c in skipped), skipped
    assert s.passed_cases >= 35 and all(" kh=2 " in c["repro"] for c in s.cases)
