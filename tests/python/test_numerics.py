"""Numerics models from Python: a kernel doing AITER Triton's default arithmetic (R(x)*S rounded
to bf16, then one fused multiply-add rounded to bf16), emulated here independently of ropekv's
emulation (numpy frexp / rint, no ropekv conversion), is identified as `operand-products` bit for
bit, fails the default `fp32` rule, and passes with numerics="operand-products"; the sim kernel
is identified as `fp32`."""
import ml_dtypes
import numpy as np
import pytest

import ropekv
import ropekv.golden

REPRO = ("tq=4 ts=4 tk=5 h=8 dn=16 dr=64 p=64 bs=4 nb=2 in=bf16 table_dtype=bf16 qo=bf16 "
         "cache=bf16 style=gptj table=one layout=joint order=nope_first rope_table=random seed=5")
# the domain the emulating kernel below handles (the fuzz campaign keeps these keys)
PINS = ("in=bf16 table_dtype=bf16 qo=bf16 cache=bf16 style=gptj table=one layout=joint "
        "order=nope_first inplace_q=0 inplace_k=0 pad_q=computed pos_oob=error dec_out=none kh=1")


def bf16_round(v):
    """float64 -> the nearest bf16 value (ties to even), as float64: 8 significant bits."""
    m, e = np.frexp(v)
    return np.ldexp(np.rint(np.ldexp(m, 8)), e - 8)


def rope_operand_products(x, c, s):
    """gptj pairs (a, b) = (x[2i], x[2i+1]): a' = a*C + bf16(-b*S), b' = b*C + bf16(a*S), each
    sum rounded once to bf16. x [..., dr], c and s [..., dr/2], float64 holding bf16 values."""
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = bf16_round(a * c + bf16_round(-b * s))
    out[..., 1::2] = bf16_round(b * c + bf16_round(a * s))
    return out


def operand_products_kernel(tensors, problem):
    """Nope parts copied (the reference's data movement), rope parts by rope_operand_products."""
    for name, value in ropekv.reference(ropekv.make_case(problem)).items():
        tensors[name][...] = value
    dn, dr, half = problem.dn, problem.dr, problem.dr // 2
    table = tensors["cos_sin"].astype(np.float64)
    # a padding token's position may lie outside the table (it is not used): clip for the lookup
    pos = np.clip(tensors["positions"].astype(np.int64), 0, table.shape[0] - 1)
    tq, ts, bs = problem.tq, problem.ts, problem.bs
    if tq:
        c, s = table[pos[:tq], :half][:, None, :], table[pos[:tq], half:][:, None, :]
        q = rope_operand_products(tensors["q_pe"].astype(np.float64), c, s)
        tensors["q_out"][:, :, dn:] = q.astype(ml_dtypes.bfloat16)
    if ts:
        k = rope_operand_products(tensors["k_pe"][:ts].astype(np.float64),
                                  table[pos[:ts], :half], table[pos[:ts], half:])
        for t, slot in enumerate(tensors["slot_mapping"][:ts].astype(np.int64)):
            if slot >= 0:
                tensors["cache"][slot // bs, slot % bs, dn:] = k[t].astype(ml_dtypes.bfloat16)


def test_bf16_round_is_round_to_nearest_even():
    # 1 + 2^-8 is the tie between 1 and 1 + 2^-7 (even: 1); 1 + 3 * 2^-8 rounds up to 1 + 2^-6
    got = bf16_round(np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -(1 + 2.0 ** -9), 3.0]))
    assert list(got) == [1.0, 1 + 2.0 ** -6, -1.0, 3.0]


def test_operand_products_kernel_is_identified_fails_fp32_and_passes_its_model():
    case = ropekv.make_case(REPRO)
    operand_products_kernel(case.tensors, case.problem)
    report = ropekv.compare(case, case.tensors)
    assert not report.passed
    q = report.numerics["q_out.rope"]
    assert q["exactly"] == ["operand-products"]
    assert "fp32" not in q["within"] and "operand-products" in q["within"]
    assert report.numerics["cache.rope"]["exactly"] == ["operand-products"]
    assert "numerics: exactly operand-products" in str(report)
    region = next(r for r in report.regions if r["name"] == "q_out.rope")
    fp32 = next(m for m in region["numerics"] if m["model"] == "fp32")
    assert fp32["outside"] == region["mismatches"] > 0 and fp32["max_ulp_to_model"] > 8
    ok = ropekv.compare(case, case.tensors, numerics="operand-products")
    assert ok.passed, str(ok)
    assert ok.numerics["q_out.rope"]["exactly"] == ["operand-products"]


def test_one_flipped_bit_is_no_longer_that_model():
    case = ropekv.make_case(REPRO)
    operand_products_kernel(case.tensors, case.problem)
    q = case.tensors["q_out"].view(np.uint16)
    q[1, 2, case.problem.dn + 5] ^= 1
    report = ropekv.compare(case, case.tensors, numerics="operand-products")
    assert report.numerics["q_out.rope"]["exactly"] == []
    assert "operand-products" in report.numerics["q_out.rope"]["within"]


@pytest.mark.parametrize("repro", [REPRO, REPRO.replace("qo=bf16 cache=bf16", "qo=f32 cache=fp8_e4m3fn k_scale=0.5"),
                                   REPRO.replace("in=bf16 table_dtype=bf16", "in=f16 table_dtype=f32")
                                   .replace("style=gptj", "style=neox")])
def test_sim_kernel_is_identified_as_fp32(repro):
    case = ropekv.make_case(repro)
    report = ropekv.compare(case, ropekv.reference(case, backend="sim"))
    assert report.passed, str(report)
    for region in ("q_out.rope", "cache.rope"):
        assert report.numerics[region]["within"][0] == "fp32", report.numerics
        assert "fp32" in report.numerics[region]["exactly"], str(report)


def test_fuzz_with_the_claimed_model_passes_and_the_default_names_the_model(capfd):
    s = ropekv.fuzz(operand_products_kernel, cases=25, seed=3, pin=PINS, max_tokens=12,
                    numerics="operand-products")
    assert s.passed and s.passed_cases == 25 - s.skipped > 0, str(s)
    assert s.report["config"]["numerics"] == "operand-products"
    capfd.readouterr()
    bad = ropekv.fuzz(operand_products_kernel, cases=25, seed=3, pin=PINS, max_tokens=12,
                      shrink=False, max_failures=1)
    out = capfd.readouterr().out
    assert bad.failed == 1 and bad.report["config"]["numerics"] == "fp32"
    assert "numerics: exactly operand-products" in out
    failed = bad.cases[0]
    rope = next(r for r in failed["regions"] if r["name"] in ("q_out.rope", "cache.rope") and r["mismatches"])
    assert rope["numerics_summary"].startswith("exactly operand-products")
    assert "--numerics" not in failed["replay"]


def test_unknown_numerics_name_lists_the_models():
    case = ropekv.make_case(REPRO)
    with pytest.raises(ValueError, match="numerics: expected one of fp32, operand-products, operand-dtype, got 'bf16'"):
        ropekv.compare(case, ropekv.reference(case), numerics="bf16")


def test_golden_compare_and_cli_take_numerics(tmp_path, ropekv_bin):
    import subprocess
    import torch
    from safetensors.torch import save_file
    golden = tmp_path / "g.safetensors"
    ropekv.golden.save(golden, ropekv.make_case(REPRO))
    g = ropekv.golden.load(golden)
    operand_products_kernel(g.case.tensors, g.problem)
    outputs = {"q_out": g.case.tensors["q_out"], "cache": g.case.tensors["cache"]}
    default = ropekv.golden.compare(g, outputs)
    assert not default.passed and default.numerics["q_out.rope"]["exactly"] == ["operand-products"]
    assert ropekv.golden.compare(g, outputs, numerics="operand-products").passed
    mine = tmp_path / "mine.safetensors"
    save_file({k: torch.from_numpy(np.ascontiguousarray(v).view(np.int16)).view(torch.bfloat16)
               for k, v in outputs.items()}, str(mine))
    run = lambda *extra: subprocess.run([ropekv_bin, "golden", "compare", str(golden), "--got", str(mine), *extra],
                                        capture_output=True, text=True)
    bad, good = run(), run("--numerics", "operand-products")
    assert bad.returncode == 1 and "numerics: exactly operand-products[bf16]" in bad.stdout, bad.stdout
    assert good.returncode == 0, good.stdout + good.stderr
    strict = run("--numerics", "operand-products", "--strict")  # strict: no allowance at all
    assert strict.returncode == 1
    assert f"replay: ropekv golden compare {golden} --got {mine} --strict --numerics operand-products" in strict.stdout
