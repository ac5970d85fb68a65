"""The `ropekv` Python package (python/ropekv): Problem, random_problem, make_case, reference,
compare, Case.to_torch, fuzz, ropekv.testing and `python -m ropekv fuzz --kernel`.

Every test states what the package must do. The kernels are tiny numpy / torch (CPU) functions:
a correct one copies the reference's outputs into the tensors it is handed, the broken ones
write into the wrong slot, past q_out's end, raise, or decline the problem. Small problems
(max_tokens <= 16) and few cases keep the file fast.

Run: ROPEKV_BIN=build/ropekv build/venv/bin/python -m pytest -q tests/python/test_package.py
"""
import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import ropekv
import ropekv.testing as rt

HERE = Path(__file__).resolve().parent

# A small problem with every output kind written: 4 slot-mapped tokens into 8 cache slots.
SMALL = "tq=3 ts=4 tk=5 h=2 dn=16 dr=8 nb=2 bs=4 seed=7"
SMALL_SPLIT = SMALL + " layout=split"
# Every stride and layout option away from its default.
PADDED = ("tq=3 ts=4 tk=5 h=2 dn=16 dr=8 nb=2 bs=4 cache=fp8_e4m3fn qo=fp8_e5m2 layout=split "
          "kv_layout=fused q_layout=head_major row_pad=3 entry_pad=2 block_pad=5 table=two "
          "table_pad=1 inplace_q=1 inplace_k=1 seed=3")

UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
MANTISSA_BITS = {"f32": 23, "f16": 10, "bf16": 7, "fp8_e4m3fn": 3, "fp8_e4m3fnuz": 3,
                 "fp8_e5m2": 2, "fp8_e5m2fnuz": 2}
CACHES = ("cache", "ckv_cache", "kpe_cache")


# ------------------------------------------------------------------------------------ helpers
def bits(a):
    """The bit patterns of a numpy array (a contiguous unsigned-int copy of the same shape)."""
    a = np.ascontiguousarray(a)
    return a.view(UINT[a.dtype.itemsize])


def dtype_name(dt):
    for k, v in ropekv.NUMPY_DTYPES.items():
        if v == dt:
            return k
    raise KeyError(dt)


def assert_pristine(case):
    """`case` holds exactly what make_case built: every tensor bit-identical to a fresh case of
    the same problem, and intact guards."""
    fresh = ropekv.make_case(case.problem)
    assert case.tensors.keys() == fresh.tensors.keys()
    for name, want in fresh.tensors.items():
        np.testing.assert_array_equal(bits(case.tensors[name]), bits(want), err_msg=name)
    assert case.guard_report() == ""


def failing_regions(report):
    return sorted(g["name"] for g in report.regions if g["mismatches"])


def json_failing_regions(case_record):
    return sorted(g["name"] for g in case_record["regions"] if g["mismatches"])


def written_slots(case):
    p = case.problem
    return [int(s) for s in case.tensors["slot_mapping"][: p.ts] if s >= 0]


def torch_dtypes():
    torch = pytest.importorskip("torch")
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
            "fp8_e4m3fn": torch.float8_e4m3fn, "fp8_e4m3fnuz": torch.float8_e4m3fnuz,
            "fp8_e5m2": torch.float8_e5m2, "fp8_e5m2fnuz": torch.float8_e5m2fnuz,
            "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8}


def to_torch(a):
    """A numpy array (ml_dtypes included) as a CPU torch tensor of the same dtype and bits."""
    torch = pytest.importorskip("torch")
    a = np.ascontiguousarray(a)
    signed = {1: (np.uint8, torch.uint8), 2: (np.int16, torch.int16), 4: (np.int32, torch.int32),
              8: (np.int64, torch.int64)}[a.dtype.itemsize]
    t = torch.from_numpy(a.view(signed[0]).copy())
    return t.view(torch_dtypes()[dtype_name(a.dtype)])


def torch_bits(t):
    torch = pytest.importorskip("torch")
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(ints).numpy().view(UINT[t.element_size()])


def schema_validator():
    """validate() of test_golden_cli.py (a hand-written JSON-schema subset; no jsonschema here)."""
    spec = importlib.util.spec_from_file_location("_ropekv_golden_cli_checks", HERE / "test_golden_cli.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.validate


@pytest.fixture(scope="module")
def report_schema(repo_root):
    schema = json.loads((repo_root / "docs" / "report-schema.json").read_text())
    validate = schema_validator()
    return lambda report: validate(report, schema, schema["$defs"])


# ------------------------------------------------------------------------------------ kernels
def copy_kernel(tensors, problem):
    """Correct: the reference's outputs of the same problem, written in place."""
    for name, value in ropekv.reference(ropekv.make_case(problem)).items():
        tensors[name][...] = value


def torch_copy_kernel(tensors, problem):
    """Correct, on torch tensors (framework='torch')."""
    for name, value in ropekv.reference(ropekv.make_case(problem)).items():
        tensors[name].copy_(to_torch(value))


def unsupported_kernel(tensors, problem):
    raise ropekv.Unsupported("why: not my domain")


def big_heads_unsupported_kernel(tensors, problem):
    if problem.h > 8:
        raise ropekv.Unsupported("h > 8")
    copy_kernel(tensors, problem)


def raising_kernel(tensors, problem):
    raise RuntimeError("kaboom 42 from the kernel")


def guard_kernel(tensors, problem):
    """Correct outputs, plus one byte written just past q_out's buffer (into its guard)."""
    copy_kernel(tensors, problem)
    q = tensors["q_out"]
    buffer_bytes = q.shape[0] * q.strides[0]  # q_out is token-major: [Tq][H][row]
    raw = np.lib.stride_tricks.as_strided(q.view(np.uint8), shape=(buffer_bytes + 1,), strides=(1,))
    raw[buffer_bytes] ^= 0xFF


def buggy_kernel(tensors, problem):
    """Off by one slot: token t's cache entry goes to slot s + 1 instead of s."""
    ref = ropekv.reference(ropekv.make_case(problem))
    for name, value in ref.items():
        if name not in CACHES:
            tensors[name][...] = value
    n = problem.nb * problem.bs
    for s in tensors["slot_mapping"][: problem.ts]:
        s = int(s)
        if s < 0:
            continue
        s2 = (s + 1) % n
        for name in CACHES:
            if name in ref:
                tensors[name][s2 // problem.bs, s2 % problem.bs] = ref[name][s // problem.bs, s % problem.bs]


SEEN = []


def recording_unsupported_kernel(tensors, problem):
    SEEN.append(problem)
    raise ropekv.Unsupported("recorded")


KMOD_NAME = "ropekv_pkgtest_kmod"
KMOD_SOURCE = '''
import ropekv
NOT_CALLABLE = 3

def good(tensors, problem):
    for name, value in ropekv.reference(ropekv.make_case(problem)).items():
        tensors[name][...] = value

def buggy(tensors, problem):
    ref = ropekv.reference(ropekv.make_case(problem))
    for name, value in ref.items():
        if name not in ("cache", "ckv_cache", "kpe_cache"):
            tensors[name][...] = value
    n = problem.nb * problem.bs
    for s in tensors["slot_mapping"][: problem.ts]:
        s = int(s)
        if s >= 0:
            s2 = (s + 1) % n
            for name in ("cache", "ckv_cache", "kpe_cache"):
                if name in ref:
                    tensors[name][s2 // problem.bs, s2 % problem.bs] = ref[name][s // problem.bs, s % problem.bs]
'''


@pytest.fixture(scope="module")
def kmod_dir(tmp_path_factory):
    """A folder holding the kernel module KMOD_NAME (importable in-process and by subprocesses)."""
    d = tmp_path_factory.mktemp("kmod")
    (d / f"{KMOD_NAME}.py").write_text(KMOD_SOURCE)
    sys.path.insert(0, str(d))
    try:
        yield d
    finally:
        sys.path.remove(str(d))
        sys.modules.pop(KMOD_NAME, None)


def run_module(kmod_dir, *args, cwd):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(kmod_dir)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return subprocess.run([sys.executable, "-m", "ropekv", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)


# ----------------------------------------------------------------------------------- Problem
ROUNDTRIP_REPROS = [
    "",
    "tq=4 ts=4 tk=4 h=16 cache=fp8_e4m3fn",
    SMALL,
    PADDED,
    "k_scale=0.1 q_scale=3.0000001 amp=1e-3 scale_conv=reciprocal",
    "tq=0 ts=0 tk=0 h=1 dn=1 dr=2 p=1 bs=1 nb=1",
] + [str(ropekv.random_problem(seed, i, "any", 16)) for seed in (1, 9) for i in range(15)]


@pytest.mark.parametrize("repro", ROUNDTRIP_REPROS)
def test_problem_str_roundtrips(repro):
    p = ropekv.Problem(repro)
    q = ropekv.Problem(str(p))
    assert q == p and str(q) == str(p) and hash(q) == hash(p)
    assert ropekv.Problem(p) == p
    assert str(p) in repr(p)
    # the canonical repro lists every key once, in the canonical order
    assert [t.partition("=")[0] for t in str(p).split()] == list(p.fields())


def test_problem_canonicalises_any_order_and_spacing():
    a = ropekv.Problem("  h=3   tq=1 dn=8 ")
    b = ropekv.Problem("dn=8 tq=1 h=3")
    assert a == b and str(a) == str(b)
    assert ropekv.Problem() == ropekv.Problem("")
    assert ropekv.Problem("h=3") != ropekv.Problem("h=4")
    assert ropekv.Problem("h=3") != "h=3"


def test_problem_fields_are_typed_and_a_copy():
    p = ropekv.Problem(PADDED)
    f = p.fields()
    assert f["tq"] == 3 and type(f["tq"]) is int
    assert f["row_pad"] == 3 and type(f["row_pad"]) is int
    assert f["inplace_q"] == 1 and type(f["inplace_q"]) is int
    assert type(f["k_scale"]) is float and type(f["amp"]) is float
    assert f["cache"] == "fp8_e4m3fn" and f["layout"] == "split"
    f["tq"] = 99
    assert p.tq == 3 and p.fields()["tq"] == 3


def test_problem_attributes_and_aliases():
    p = ropekv.Problem("tq=2 ts=3 tk=4 h=5 bs=6 nb=7 p=8 in=f16 cache=fp8_e5m2 qo=f32 k_scale=0.5")
    assert (p.tq, p.ts, p.tk, p.h, p.bs, p.nb, p.p) == (2, 3, 4, 5, 6, 7, 8)
    assert p.heads == p.h == 5
    assert p.block_size == p.bs == 6
    assert p.num_blocks == p.nb == 7
    assert p.table_rows == p.p == 8
    assert p.in_dtype == getattr(p, "in") == "f16"
    assert p.cache_dtype == p.cache == "fp8_e5m2"
    assert p.q_out_dtype == p.qo == "f32"
    assert p.k_scale == 0.5 and p.layout == "joint"
    for key, value in p.fields().items():
        assert getattr(p, key) == value
    assert not hasattr(p, "no_such_key")
    with pytest.raises(AttributeError, match="no_such_key"):
        p.no_such_key


def test_problem_is_immutable():
    p = ropekv.Problem(SMALL)
    with pytest.raises(AttributeError):
        p.tq = 1
    assert p.tq == 3


@pytest.mark.parametrize("text, key", [
    ("foo=1", "foo"),
    ("h=abc", "h"),
    ("cache=fp9", "cache"),
    ("in=f8", "in"),
    ("dr=3", "dr"),
    ("h=0", "h"),
    ("layout=diagonal", "layout"),
    ("k_scale=0", "k_scale"),
    ("q_scale=-1", "q_scale"),
    ("tq=5 ts=3 tk=5", "tq"),
])
def test_problem_bad_key_or_value_raises_naming_it(text, key):
    with pytest.raises(ValueError) as e:
        ropekv.Problem(text)
    assert re.search(rf"(^|\W){re.escape(key)}(\W|$)", str(e.value)), str(e.value)


def test_problem_malformed_token_raises():
    with pytest.raises(ValueError, match="h"):
        ropekv.Problem("h")


def test_problem_replace_changes_only_the_keys_given():
    p = ropekv.Problem(SMALL)
    for keys in ({"h": 1}, {"style": "neox"}, {"seed": 11}, {"amp": 0.5}, {"cache": "fp8_e5m2"},
                 {"tq": 1}, {"row_pad": 4, "q_layout": "head_major"}, {"in": "f32"}):
        q = p.replace(**keys)
        changed = {k for k, v in q.fields().items() if p.fields()[k] != v}
        assert changed == set(keys), (keys, changed)
        for k, v in keys.items():
            assert getattr(q, k) == v
        assert ropekv.Problem(str(q)) == q
    assert str(p) == str(ropekv.Problem(SMALL))  # the original is unchanged


def test_problem_replace_bool_is_one():
    p = ropekv.Problem(SMALL)
    assert p.replace(inplace_q=True) == p.replace(inplace_q=1)
    assert p.replace(inplace_q=True).inplace_q == 1
    assert p.replace(inplace_q=True).replace(inplace_q=False) == p


@pytest.mark.parametrize("index", range(40))
def test_problem_replace_keeps_derived_sizes_consistent(index):
    p = ropekv.random_problem(2, index, "any", 16)
    for keys in ({"tq": 1, "ts": 1, "tk": 1}, {"ts": 0}, {"tk": 16}, {"bs": 1}, {"h": 1},
                 {"dn": 8}, {"dr": 2}, {"pad_slots": 0}, {"layout": "split"}, {"table": "two"}):
        q = p.replace(**keys)
        for k, v in keys.items():
            assert getattr(q, k) == v, (keys, str(q))
        assert q.tq <= q.ts <= q.tk, str(q)
        assert 0 <= q.pad_slots <= q.ts, str(q)
        assert q.nb * q.bs >= q.ts - q.pad_slots, str(q)
        ropekv.make_case(q)  # a valid problem


def test_problem_replace_rejects_bad_keys_and_values():
    p = ropekv.Problem(SMALL)
    with pytest.raises(ValueError, match="dr"):
        p.replace(dr=3)
    with pytest.raises(ValueError, match="cache"):
        p.replace(cache="fp9")
    with pytest.raises(ValueError, match="bogus"):
        p.replace(bogus=1)
    assert p == ropekv.Problem(SMALL)


def test_problem_replace_accepts_the_attribute_aliases():
    p = ropekv.Problem(SMALL)
    assert p.replace(heads=4) == p.replace(h=4)
    assert p.replace(in_dtype="f32") == p.replace(**{"in": "f32"})
    assert p.replace(block_size=2, num_blocks=4) == p.replace(bs=2, nb=4)


# ------------------------------------------------------------------------------ random_problem
PIN = {"dn": 64, "dr": 16, "cache": "fp8_e4m3fn", "inplace_q": True, "layout": "split", "k_scale": 0.5}
PIN_TEXT = "dn=64 dr=16 cache=fp8_e4m3fn inplace_q=1 layout=split k_scale=0.5"


def test_random_problem_is_deterministic():
    for i in range(20):
        a = ropekv.random_problem(5, i, "any", 12)
        b = ropekv.random_problem(seed=5, index=i, profile="any", max_tokens=12)
        assert a == b and isinstance(a, ropekv.Problem)
    assert len({str(ropekv.random_problem(5, i, "any", 12)) for i in range(20)}) == 20
    assert ropekv.random_problem(5, 0, "any", 12) != ropekv.random_problem(6, 0, "any", 12)


def test_random_problem_respects_max_tokens():
    for i in range(100):
        p = ropekv.random_problem(3, i, "any", 8)
        assert p.tq <= p.ts <= p.tk <= 8, str(p)


def test_random_problem_pins_hold_and_the_rest_varies():
    draws = [ropekv.random_problem(4, i, "any", 12, PIN) for i in range(100)]
    for p in draws:
        assert (p.dn, p.dr, p.cache, p.inplace_q, p.layout, p.k_scale) == (64, 16, "fp8_e4m3fn", 1, "split", 0.5), str(p)
    for key in ("tq", "h", "bs", "in", "qo", "style", "table", "q_layout", "kv_layout", "seed"):
        assert len({getattr(p, key) for p in draws}) > 1, f"{key} never varies under the pins"


def test_random_problem_pins_as_dict_and_as_string_agree():
    for i in range(30):
        a = ropekv.random_problem(4, i, "any", 12, PIN)
        b = ropekv.random_problem(4, i, "any", 12, PIN_TEXT)
        assert a == b
    assert ropekv.random_problem(4, 0, "any", 12, {}) == ropekv.random_problem(4, 0, "any", 12)
    assert ropekv.random_problem(4, 0, "any", 12, "") == ropekv.random_problem(4, 0, "any", 12)


def test_random_problem_aligned16_profile():
    for i in range(100):
        p = ropekv.random_problem(1, i, "aligned16", 12)
        assert p.in_dtype in ("bf16", "f16"), str(p)
        assert p.qo == p.in_dtype or p.qo.startswith("fp8"), str(p)
        assert p.dn % 8 == 0 and p.row_pad % 8 == 0 and p.entry_pad % 8 == 0, str(p)
        assert (p.inplace_q, p.inplace_k) == (0, 0), str(p)


@pytest.mark.parametrize("pin, key", [
    ("dr=3", "dr"), ({"h": 0}, "h"), ({"cache": "fp9"}, "cache"), ("foo=1", "foo"),
    ({"k_scale": -1.0}, "k_scale"), ("layout=diag", "layout"), ("tq=5 ts=3", "tq"),
])
def test_random_problem_impossible_pin_raises_naming_the_key(pin, key):
    with pytest.raises(ValueError) as e:
        ropekv.random_problem(1, 0, "any", 8, pin)
    assert re.search(rf"(^|\W){re.escape(key)}(\W|$)", str(e.value)), str(e.value)


def test_random_problem_bad_profile_raises():
    with pytest.raises(ValueError, match="profile"):
        ropekv.random_problem(1, 0, "bogus", 8)


@pytest.mark.parametrize("seed, profile, pin", [
    (1, "any", None),
    (7, "any", PIN),
    (3, "aligned16", None),
    (3, "aligned16", {"cache": "fp8_e5m2", "h": 4}),
])
def test_random_problem_is_what_the_fuzz_campaign_draws(seed, profile, pin):
    """Case i of `fuzz` (the CLI's campaign code) is random_problem(seed, i, profile, max_tokens,
    pin): a kernel that declines every problem gets each case listed (SKIPPED) with its repro."""
    n = 30
    s = ropekv.fuzz(unsupported_kernel, cases=n, seed=seed, profile=profile, pin=pin, max_tokens=10)
    assert s.skipped == n and len(s.cases) == n
    for c in s.cases:
        assert ropekv.Problem(c["repro"]) == ropekv.random_problem(seed, c["index"], profile, 10, pin)
    assert sorted(c["index"] for c in s.cases) == list(range(n))


def test_sometimes_impossible_pins_left_out_consistently():
    """A pin that suits only some draws: random_problem raises exactly where the campaign skips
    the case, and ropekv.testing.problems leaves exactly those out."""
    pin = "nb=1 bs=1"
    n = 40
    ok = []
    for i in range(n):
        try:
            p = ropekv.random_problem(1, i, "any", 8, pin)
            assert (p.nb, p.bs) == (1, 1)
            ok.append(i)
        except ValueError as e:
            assert "nb" in str(e)
    assert 0 < len(ok) < n  # the premise: some indices suit the pin, others do not
    s = ropekv.fuzz(copy_kernel, cases=n, max_tokens=8, pin=pin)
    assert s.passed and s.failed == 0 and s.errored == 0
    assert s.passed_cases == len(ok) and s.skipped == n - len(ok)
    assert sorted(c["index"] for c in s.cases if c["outcome"] == "SKIPPED") == sorted(set(range(n)) - set(ok))
    params = rt.problems(cases=n, seed=1, max_tokens=8, pin=pin)
    assert [p.id for p in params] == [f"case{i}" for i in ok]
    assert [p.values[0] for p in params] == [ropekv.random_problem(1, i, "any", 8, pin) for i in ok]


# ---------------------------------------------------------------------------------- make_case
def test_make_case_tensor_names_joint_one_table():
    c = ropekv.make_case(SMALL)
    assert set(c.tensors) == {"q_nope", "q_pe", "kv_c", "k_pe", "positions", "slot_mapping",
                              "cos_sin", "q_out", "cache"}
    assert c.problem == ropekv.Problem(SMALL)


def test_make_case_tensor_names_split_two_tables():
    c = ropekv.make_case(SMALL_SPLIT + " table=two")
    assert set(c.tensors) == {"q_nope", "q_pe", "kv_c", "k_pe", "positions", "slot_mapping",
                              "cos", "sin", "q_out", "ckv_cache", "kpe_cache"}


def test_make_case_takes_problem_or_string_and_rejects_bad_repro():
    a = ropekv.make_case(ropekv.Problem(SMALL))
    b = ropekv.make_case(SMALL)
    assert a.problem == b.problem
    with pytest.raises(ValueError, match="dr"):
        ropekv.make_case("dr=3")


@pytest.mark.parametrize("dtypes", [
    "in=bf16 table_dtype=bf16 qo=bf16 cache=bf16 pos=i64 slot=i64",
    "in=f32 table_dtype=f16 qo=fp8_e4m3fn cache=fp8_e5m2 pos=i32 slot=i32",
    "in=f16 table_dtype=f32 qo=fp8_e4m3fnuz cache=fp8_e5m2fnuz pos=i64 slot=i32",
    "in=bf16 table_dtype=bf16 qo=f16 cache=f32 pos=i32 slot=i64 table=two layout=split",
])
def test_make_case_dtypes(dtypes):
    c = ropekv.make_case(SMALL + " " + dtypes)
    p = c.problem
    t = c.tensors
    want = {"q_nope": p.in_dtype, "q_pe": p.in_dtype, "kv_c": p.in_dtype, "k_pe": p.in_dtype,
            "positions": p.pos, "slot_mapping": p.slot, "q_out": p.qo}
    for name in ("cos_sin", "cos", "sin"):
        if name in t:
            want[name] = p.table_dtype
    for name in CACHES:
        if name in t:
            want[name] = p.cache
    assert set(want) == set(t)
    ml = {"bf16": ml_dtypes.bfloat16, "fp8_e4m3fn": ml_dtypes.float8_e4m3fn,
          "fp8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "fp8_e5m2": ml_dtypes.float8_e5m2,
          "fp8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz, "f32": np.float32, "f16": np.float16,
          "i32": np.int32, "i64": np.int64}
    for name, dt in want.items():
        assert t[name].dtype == np.dtype(ml[dt]) == ropekv.NUMPY_DTYPES[dt], name


@pytest.mark.parametrize("repro", [SMALL, SMALL_SPLIT + " table=two", PADDED])
def test_make_case_shapes(repro):
    c = ropekv.make_case(repro)
    p = c.problem
    t = c.tensors
    shapes = {"q_nope": (p.tq, p.h, p.dn), "q_pe": (p.tq, p.h, p.dr), "kv_c": (p.tk, p.dn),
              "k_pe": (p.tk, p.dr), "positions": (p.tk,), "slot_mapping": (p.ts,),
              "cos_sin": (p.p, p.dr), "cos": (p.p, p.dr // 2), "sin": (p.p, p.dr // 2),
              "q_out": (p.tq, p.h, p.dn + p.dr), "cache": (p.nb, p.bs, p.dn + p.dr),
              "ckv_cache": (p.nb, p.bs, p.dn), "kpe_cache": (p.nb, p.bs, p.dr)}
    for name, arr in t.items():
        assert arr.shape == shapes[name], name


def elem_strides(a):
    return tuple(s // a.itemsize for s in a.strides)


@pytest.mark.parametrize("q_layout", ["token_major", "head_major"])
@pytest.mark.parametrize("kv_layout", ["separate", "fused"])
@pytest.mark.parametrize("layout", ["joint", "split"])
@pytest.mark.parametrize("pads", [(0, 0, 0, 0), (3, 2, 5, 1)])
def test_make_case_strides(q_layout, kv_layout, layout, pads):
    row, entry, block, table = pads
    c = ropekv.make_case(f"{SMALL} q_layout={q_layout} kv_layout={kv_layout} layout={layout} table=two "
                         f"row_pad={row} entry_pad={entry} block_pad={block} table_pad={table}")
    p = c.problem
    t = c.tensors
    T, H, dn, dr = p.tq, p.h, p.dn, p.dr
    for a in t.values():
        assert a.strides[-1] == a.itemsize  # innermost contiguous
    if q_layout == "token_major":
        assert elem_strides(t["q_nope"])[:2] == (H * (dn + row), dn + row)
        assert elem_strides(t["q_pe"])[:2] == (H * (dr + row), dr + row)
    else:  # memory [H, T, D] viewed as [T, H, D]
        assert elem_strides(t["q_nope"])[:2] == (dn + row, T * (dn + row))
        assert elem_strides(t["q_pe"])[:2] == (dr + row, T * (dr + row))
    assert elem_strides(t["q_out"])[:2] == (H * (dn + dr + row), dn + dr + row)
    if kv_layout == "fused":
        assert elem_strides(t["kv_c"])[0] == elem_strides(t["k_pe"])[0] == dn + dr + row
    else:
        assert elem_strides(t["kv_c"])[0] == dn + row and elem_strides(t["k_pe"])[0] == dr + row
    assert elem_strides(t["cos"])[0] == elem_strides(t["sin"])[0] == dr // 2 + table
    if layout == "joint":
        e = dn + dr + entry
        assert elem_strides(t["cache"])[:2] == (p.bs * e + block, e)
    else:
        e1, e2 = dn + entry, dr + entry
        assert elem_strides(t["ckv_cache"])[:2] == (p.bs * e1 + block, e1)
        assert elem_strides(t["kpe_cache"])[:2] == (p.bs * e2 + block, e2)


def full_buffer(view, span_elems):
    """The `span_elems` elements of memory from view's first element (padding included)."""
    u = view.view(UINT[view.itemsize])  # as_strided cannot take ml_dtypes arrays
    return np.lib.stride_tricks.as_strided(u, shape=(span_elems,), strides=(u.itemsize,))


@pytest.mark.parametrize("repro", [SMALL, PADDED, SMALL_SPLIT + " qo=f32 cache=fp8_e5m2fnuz entry_pad=3 block_pad=1 row_pad=2"])
def test_make_case_outputs_poisoned_including_padding(repro):
    c = ropekv.make_case(repro)
    p = c.problem
    t = c.tensors
    outs = {"q_out": p.tq * elem_strides(t["q_out"])[0]}
    for name in CACHES:
        if name in t:
            outs[name] = p.nb * elem_strides(t[name])[0]
    for name, span in outs.items():
        raw = full_buffer(t[name], span).view(np.uint8)
        assert raw.size == span * t[name].itemsize
        assert (raw == 0xA5).all(), name
        assert (bits(t[name]).view(np.uint8) != 0).all(), name  # never zeros
    # inputs hold data, not poison or zeros
    for name in ("q_nope", "q_pe", "kv_c", "k_pe"):
        b = bits(t[name]).view(np.uint8)
        assert (b != 0xA5).any() and (b != 0).any(), name
    assert c.guard_report() == ""


def test_make_case_inputs_are_deterministic_and_seeded():
    a, b = ropekv.make_case(PADDED), ropekv.make_case(PADDED)
    for name in a.tensors:
        np.testing.assert_array_equal(bits(a.tensors[name]), bits(b.tensors[name]), err_msg=name)
    c = ropekv.make_case(ropekv.Problem(PADDED).replace(seed=4))
    assert not np.array_equal(bits(a.tensors["q_nope"]), bits(c.tensors["q_nope"]))


@pytest.mark.parametrize("pad_at", ["head", "middle", "tail", "spread"])
def test_make_case_slot_mapping(pad_at):
    c = ropekv.make_case(f"tq=4 ts=6 tk=7 h=1 dn=8 dr=4 bs=4 nb=2 pad_slots=2 pad_at={pad_at} seed=5")
    p = c.problem
    slots = [int(s) for s in c.tensors["slot_mapping"]]
    assert sum(s == -1 for s in slots) == p.pad_slots == 2
    real = [s for s in slots if s >= 0]
    assert len(set(real)) == len(real) == p.ts - p.pad_slots
    assert all(0 <= s < p.nb * p.bs for s in real)
    if pad_at == "head":
        assert slots[:2] == [-1, -1]
    if pad_at == "tail":
        assert slots[-2:] == [-1, -1]


@pytest.mark.parametrize("repro", [SMALL + " kv_layout=fused", PADDED])
def test_make_case_fused_kv_views_share_memory(repro):
    c = ropekv.make_case(repro)
    kv_c, k_pe = c.tensors["kv_c"], c.tensors["k_pe"]
    p = c.problem
    # one buffer, interleaved rows: [kv_c[t] | k_pe[t] | row padding] (no element in common)
    assert np.may_share_memory(kv_c, k_pe) and not np.shares_memory(kv_c, k_pe)
    assert kv_c.strides == k_pe.strides
    addr = lambda a: a.__array_interface__["data"][0]
    assert addr(k_pe) - addr(kv_c) == p.dn * kv_c.itemsize  # k_pe: the columns after kv_c's
    sep = ropekv.make_case(ropekv.Problem(repro).replace(kv_layout="separate"))
    assert not np.may_share_memory(sep.tensors["kv_c"], sep.tensors["k_pe"])
    # every other tensor of the case has a buffer of its own
    names = list(c.tensors)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if {a, b} != {"kv_c", "k_pe"}:
                assert not np.may_share_memory(c.tensors[a], c.tensors[b]), (a, b)


# --------------------------------------------------------------------------------- reference
@pytest.mark.parametrize("dec_out, names", [("qzk", {"decode_q_pe_out", "q_nope_zeros_out", "k_pe_out"}),
                                            ("k", {"k_pe_out"}), ("none", set())])
def test_reference_returns_the_decode_outputs_a_problem_passes(dec_out, names):
    p = ropekv.Problem(SMALL + f" dec_out={dec_out}" + (" dec=2" if dec_out == "qzk" else ""))
    assert p.dec == (2 if dec_out == "qzk" else 0)  # an int, like the other sizes
    case = ropekv.make_case(p)
    ref = ropekv.reference(case)
    assert set(ref) == {"q_out", "cache"} | names
    if "decode_q_pe_out" in names:
        # rows t < N: the rotated q_pe, the same values as q_out's rope columns (bf16, no scale)
        assert np.array_equal(bits(ref["decode_q_pe_out"]), bits(ref["q_out"][:2, :, p.dn:]))
        assert not bits(ref["q_nope_zeros_out"]).any()
    # a kernel that leaves a decode output unwritten fails on it
    def no_decode_kernel(tensors, problem):
        for name, value in ropekv.reference(ropekv.make_case(problem)).items():
            if name not in names:
                tensors[name][...] = value
    s = ropekv.fuzz(no_decode_kernel, repro=str(p), shrink=False)
    assert s.passed == (not names), str(s)


# --------------------------------------------------------------------------------- reference
@pytest.mark.parametrize("repro", [SMALL, SMALL_SPLIT, PADDED])
def test_reference_returns_copies_and_leaves_case_unchanged(repro):
    case = ropekv.make_case(repro)
    ref = ropekv.reference(case)
    p = case.problem
    want = {"q_out"} | {n for n in CACHES if n in case.tensors}
    if p.inplace_q:
        want.add("q_pe")
    if p.inplace_k:
        want.add("k_pe")
    assert set(ref) == want
    for name, arr in ref.items():
        assert arr.shape == case.tensors[name].shape and arr.dtype == case.tensors[name].dtype
        assert not np.shares_memory(arr, case.tensors[name]), name
    assert_pristine(case)
    # the reference wrote q_out (no poison left) and the written cache entries
    assert (bits(ref["q_out"]).view(np.uint8) != 0xA5).any()
    again = ropekv.reference(case)
    for name in ref:
        np.testing.assert_array_equal(bits(again[name]), bits(ref[name]), err_msg=name)
    # mutating the returned arrays does not reach the case
    ref["q_out"][...] = 0
    assert_pristine(case)


@pytest.mark.parametrize("repro", [SMALL, SMALL_SPLIT, PADDED])
@pytest.mark.parametrize("backend", ["ref", "sim"])
def test_compare_passes_on_reference_outputs(repro, backend):
    case = ropekv.make_case(repro)
    r = ropekv.compare(case, ropekv.reference(case, backend=backend))
    assert r.passed and r.outcome == "PASSED", str(r)
    assert r.repro == str(case.problem)
    assert failing_regions(r) == []
    assert {"q_out.nope", "q_out.rope", "guards"} <= {g["name"] for g in r.regions}
    r.assert_ok()
    assert_pristine(case)


def test_compare_bitwise_of_reference_with_itself():
    case = ropekv.make_case(SMALL)
    assert ropekv.compare(case, ropekv.reference(case), bitwise=True, strict=True, max_ulp=0).passed


def flip(arr, index, mask):
    """XORs `mask` into the bits of arr[index] (arr: a contiguous array, changed in place)."""
    u = arr.view(UINT[arr.dtype.itemsize])
    u[index] ^= mask


def big_index(arr, start=0):
    """An index of arr (last axis from `start`) whose value is >= 0.25 in magnitude: far from
    zero, so a flipped mantissa bit is many ULPs and far beyond the fp32 allowance."""
    vals = np.abs(arr[..., start:].astype(np.float64))
    idx = [int(i) for i in np.argwhere(vals >= 0.25)[0]]
    idx[-1] += start
    return tuple(idx)


def assert_fails_in(case, outputs, region, **kw):
    r = ropekv.compare(case, outputs, **kw)
    assert not r.passed and r.outcome == "FAILED"
    assert failing_regions(r) == [region], str(r)
    text = str(r)
    assert region in text and f"first: {region}" in text
    assert r.replay and r.replay in text and "replay: " in text
    with pytest.raises(AssertionError) as e:
        r.assert_ok()
    assert r.replay in str(e.value) and region in str(e.value)
    assert_pristine(case)
    return r


def test_compare_flipped_nope_bit_in_q_out_fails():
    case = ropekv.make_case(SMALL)
    out = ropekv.reference(case)
    flip(out["q_out"], (1, 1, 3), 1)
    r = assert_fails_in(case, out, "q_out.nope")
    assert str(case.problem) in r.replay


def test_compare_rope_ulp_rule():
    case = ropekv.make_case(SMALL)
    dn = case.problem.dn
    ref = ropekv.reference(case)
    idx = big_index(ref["q_out"], dn)
    one_ulp = {k: v.copy() for k, v in ref.items()}
    flip(one_ulp["q_out"], idx, 1)
    assert ropekv.compare(case, one_ulp).passed  # 1 ULP is within --max-ulp 1
    assert_fails_in(case, one_ulp, "q_out.rope", max_ulp=0)
    assert_fails_in(case, one_ulp, "q_out.rope", bitwise=True)
    far = {k: v.copy() for k, v in ref.items()}
    flip(far["q_out"], idx, 1 << (MANTISSA_BITS[case.problem.qo] - 1))  # top mantissa bit: many ULPs
    r = assert_fails_in(case, far, "q_out.rope")
    region = next(g for g in r.regions if g["name"] == "q_out.rope")
    assert region["mismatches"] == 1 and region["max_ulp"] > 1


@pytest.mark.parametrize("repro, nope, rope", [
    (SMALL, "cache.nope", "cache.rope"),
    (SMALL_SPLIT, "ckv_cache.nope", "kpe_cache.rope"),
    (SMALL + " cache=fp8_e4m3fn", "cache.nope", "cache.rope"),
])
def test_compare_flipped_bit_in_cache_fails(repro, nope, rope):
    case = ropekv.make_case(repro)
    p = case.problem
    ref = ropekv.reference(case)
    s = written_slots(case)[0]
    b, e = s // p.bs, s % p.bs
    out = {k: v.copy() for k, v in ref.items()}
    name = "cache" if "cache" in out else "ckv_cache"
    flip(out[name], (b, e, 2), 1)
    assert_fails_in(case, out, nope)
    # a rope feature, far off
    out = {k: v.copy() for k, v in ref.items()}
    name, first_rope = ("cache", p.dn) if "cache" in out else ("kpe_cache", 0)
    vals = np.abs(ref[name][b, e, first_rope:first_rope + p.dr].astype(np.float64))
    f = first_rope + int(np.argmax(vals))
    flip(out[name], (b, e, f), 1 << (MANTISSA_BITS[p.cache] - 1))
    assert_fails_in(case, out, rope)


@pytest.mark.parametrize("repro", [SMALL, SMALL_SPLIT])
def test_compare_write_outside_the_written_entries_fails(repro):
    case = ropekv.make_case(repro)
    p = case.problem
    free = sorted(set(range(p.nb * p.bs)) - set(written_slots(case)))
    assert free
    s = free[0]
    for name in [n for n in CACHES if n in case.tensors]:
        out = ropekv.reference(case)
        out[name][s // p.bs, s % p.bs, 0] = out["q_out"][0, 0, 0]
        assert_fails_in(case, out, f"{name}.untouched")


def test_compare_write_into_a_skipped_q_row_fails():
    case = ropekv.make_case("tq=4 ts=4 tk=4 h=2 dn=8 dr=4 bs=4 nb=1 pad_slots=2 pad_at=head pad_q=skipped seed=2")
    out = ropekv.reference(case)
    assert (bits(out["q_out"][0]).view(np.uint8) == 0xA5).all()  # token 0 is padding: row skipped
    out["q_out"][0, 0, 0] = out["q_out"][3, 0, 0]
    assert_fails_in(case, out, "q_out.untouched")


def test_compare_in_place_q_pe_and_k_pe():
    case = ropekv.make_case(SMALL + " inplace_q=1 inplace_k=1")
    ref = ropekv.reference(case)
    assert ropekv.compare(case, ref).passed
    out = {k: v.copy() for k, v in ref.items()}
    flip(out["q_pe"], big_index(out["q_pe"]), 1 << 6)
    assert_fails_in(case, out, "q_pe.inplace")
    out = {k: v.copy() for k, v in ref.items()}
    flip(out["k_pe"], big_index(out["k_pe"][:1]), 1 << 6)  # token 0 has a slot: rotated in place
    assert_fails_in(case, out, "k_pe.inplace")


def test_compare_missing_outputs_are_an_error():
    """An output left out of `outputs` is a ValueError naming it, never a pass."""
    case = ropekv.make_case(SMALL)
    ref = ropekv.reference(case)
    with pytest.raises(ValueError, match=r"outputs: expected every output .* got no \['cache'\]"):
        ropekv.compare(case, {"q_out": ref["q_out"]})
    with pytest.raises(ValueError, match=r"got no \['q_out'\]"):
        ropekv.compare(case, {"cache": ref["cache"]})
    assert_pristine(case)


def test_compare_takes_strided_numpy_outputs():
    case = ropekv.make_case(SMALL)
    ref = ropekv.reference(case)
    wide = np.zeros(ref["q_out"].shape[:2] + (ref["q_out"].shape[2] + 5,), dtype=ref["q_out"].dtype)
    wide[..., : ref["q_out"].shape[2]] = ref["q_out"]
    assert ropekv.compare(case, {**ref, "q_out": wide[..., : ref["q_out"].shape[2]]}).passed


@pytest.mark.parametrize("repro", [SMALL, PADDED, SMALL_SPLIT + " qo=fp8_e4m3fnuz cache=fp8_e5m2fnuz"])
def test_compare_takes_torch_outputs(repro):
    pytest.importorskip("torch")
    case = ropekv.make_case(repro)
    ref = ropekv.reference(case)
    touts = {k: to_torch(v) for k, v in ref.items()}
    assert ropekv.compare(case, touts).passed
    # a strided torch view of the right shape works too
    q = ref["q_out"]
    wide = np.zeros(q.shape[:2] + (q.shape[2] + 3,), dtype=q.dtype)
    wide[..., : q.shape[2]] = q
    view = to_torch(wide)[..., : q.shape[2]]
    assert not view.is_contiguous()
    assert ropekv.compare(case, {**touts, "q_out": view}).passed
    # a flipped nope bit in a torch output is found like a numpy one
    bad = ref["q_out"].copy()
    flip(bad, (0, 0, 0), 1)
    assert_fails_in(case, {**touts, "q_out": to_torch(bad)}, "q_out.nope")


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_compare_wrong_shape_dtype_or_name_raises(framework):
    case = ropekv.make_case(SMALL + " qo=fp8_e5m2")
    ref = ropekv.reference(case)
    conv = to_torch if framework == "torch" else (lambda a: a)
    outs = {k: conv(v) for k, v in ref.items()}
    with pytest.raises(ValueError) as e:
        ropekv.compare(case, {**outs, "q_out": conv(ref["q_out"][:2])})
    msg = str(e.value)
    assert "q_out" in msg and "shape" in msg and "[3, 2, 24]" in msg and "[2, 2, 24]" in msg, msg
    with pytest.raises(ValueError) as e:
        ropekv.compare(case, {**outs, "cache": conv(ref["cache"][:, :, :-1])})
    assert "cache" in str(e.value) and "[2, 4, 24]" in str(e.value) and "[2, 4, 23]" in str(e.value)
    with pytest.raises(ValueError) as e:
        ropekv.compare(case, {**outs, "q_out": conv(ref["q_out"].astype(np.float32))})
    msg = str(e.value)
    assert "q_out" in msg and "dtype" in msg and "fp8_e5m2" in msg and "float32" in msg, msg
    # fp8 of another flavour, same size: still the wrong dtype
    other = ref["q_out"].astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError) as e:
        ropekv.compare(case, {**outs, "q_out": conv(other)})
    assert "q_out" in str(e.value) and "fp8_e5m2" in str(e.value) and "e4m3" in str(e.value)
    with pytest.raises(ValueError) as e:
        ropekv.compare(case, {**outs, "q_outt": outs["q_out"]})
    assert "q_outt" in str(e.value)
    with pytest.raises(ValueError) as e:  # q_pe is an output only with inplace_q
        ropekv.compare(case, {**outs, "q_pe": conv(case.tensors["q_pe"].copy())})
    assert "q_pe" in str(e.value)
    assert_pristine(case)


def test_compare_negative_max_ulp_raises():
    case = ropekv.make_case(SMALL)
    with pytest.raises(ValueError, match="max_ulp"):
        ropekv.compare(case, ropekv.reference(case), max_ulp=-1)


def test_compare_documented_in_place_workflow_passes():
    case = ropekv.make_case(SMALL)
    copy_kernel(case.tensors, case.problem)
    ropekv.compare(case, case.tensors).assert_ok()


def test_compare_in_place_workflow_catches_a_stray_write():
    case = ropekv.make_case(SMALL)
    p = case.problem
    copy_kernel(case.tensors, p)
    s = sorted(set(range(p.nb * p.bs)) - set(written_slots(case)))[0]
    case.tensors["cache"][s // p.bs, s % p.bs, 0] = 1.0
    # the same outputs judged against a pristine case of the problem do fail (the premise)
    outputs = {n: case.tensors[n] for n in ("q_out", "cache")}
    assert "cache.untouched" in failing_regions(ropekv.compare(ropekv.make_case(p), outputs))
    r = ropekv.compare(case, outputs)
    assert not r.passed and "cache.untouched" in failing_regions(r)


def test_case_clone_is_an_independent_copy():
    case = ropekv.make_case(PADDED)
    twin = case.clone()
    assert twin.problem == case.problem
    for name, a in case.tensors.items():
        np.testing.assert_array_equal(bits(twin.tensors[name]), bits(a), err_msg=name)
        assert not np.may_share_memory(twin.tensors[name], a), name
    twin.tensors["q_out"][...] = 0
    twin.tensors["kv_c"][...] = 0
    assert_pristine(case)


# ----------------------------------------------------------------------------------- to_torch
@pytest.mark.parametrize("repro", [SMALL, PADDED, SMALL_SPLIT + " qo=fp8_e4m3fnuz cache=fp8_e5m2fnuz in=f32 pos=i32"])
def test_to_torch_same_layout_and_values_new_memory(repro):
    torch = pytest.importorskip("torch")
    case = ropekv.make_case(repro)
    tt = case.to_torch("cpu")
    tdt = torch_dtypes()
    assert set(tt) == set(case.tensors)
    for name, a in case.tensors.items():
        t = tt[name]
        assert isinstance(t, torch.Tensor) and t.device.type == "cpu"
        assert t.dtype == tdt[dtype_name(a.dtype)], name
        assert tuple(t.shape) == a.shape, name
        assert t.stride() == elem_strides(a), name
        np.testing.assert_array_equal(torch_bits(t), bits(a), err_msg=name)
    # new memory: writing the torch tensors changes nothing of the case
    for t in tt.values():
        t.untyped_storage().fill_(0)
    assert_pristine(case)
    # and a second call gives fresh copies again
    tt2 = case.to_torch("cpu")
    np.testing.assert_array_equal(torch_bits(tt2["q_nope"]), bits(case.tensors["q_nope"]))


@pytest.mark.parametrize("repro", [SMALL + " kv_layout=fused", PADDED])
def test_to_torch_fused_kv_shares_one_storage(repro):
    pytest.importorskip("torch")
    case = ropekv.make_case(repro)
    tt = case.to_torch("cpu")
    kv_c, k_pe = tt["kv_c"], tt["k_pe"]
    assert kv_c.untyped_storage().data_ptr() == k_pe.untyped_storage().data_ptr()
    assert k_pe.data_ptr() - kv_c.data_ptr() == case.problem.dn * kv_c.element_size()
    k_pe[0, 0] = 1.0  # seen through the shared storage, not through kv_c's elements
    assert kv_c.untyped_storage().data_ptr() == k_pe.untyped_storage().data_ptr()
    others = [n for n in tt if n not in ("kv_c", "k_pe")]
    ptrs = {tt[n].untyped_storage().data_ptr() for n in others}
    assert len(ptrs) == len(others)  # every other tensor has its own storage


# --------------------------------------------------------------------------------------- fuzz
def test_fuzz_correct_kernel_passes_and_writes_the_cli_report(tmp_path, report_schema):
    path = tmp_path / "r.json"
    s = ropekv.fuzz(copy_kernel, cases=100, seed=3, max_tokens=12, json=str(path))
    assert s.passed and s.exit_code == 0, str(s)
    assert (s.passed_cases, s.failed, s.errored, s.skipped) == (100, 0, 0, 0)
    s.assert_ok()
    report = json.loads(path.read_text())
    assert report == s.report
    report_schema(report)
    assert report["format"] == "ropekv-fuzz-report"
    assert report["counts"] == {"passed": 100, "failed": 0, "errored": 0, "skipped": 0,
                                "mistrusted": 0, "total": 100}
    assert report["config"]["backends"] == ["ref", f"python:{__name__}:copy_kernel"]
    assert (report["config"]["cases"], report["config"]["seed"], report["config"]["max_tokens"]) == (100, 3, 12)
    assert report["summary"] == "100 passed, 0 failed"
    assert str(s).splitlines()[-1] == "100 passed, 0 failed"
    assert report["cases"] == []


def test_fuzz_torch_framework():
    pytest.importorskip("torch")
    s = ropekv.fuzz(torch_copy_kernel, cases=20, seed=2, max_tokens=8, framework="torch")
    assert s.passed and s.passed_cases == 20, str(s)


def test_fuzz_bad_arguments_raise():
    with pytest.raises(ValueError, match="framework"):
        ropekv.fuzz(copy_kernel, cases=2, framework="jax")
    with pytest.raises(ValueError):
        ropekv.fuzz(copy_kernel, cases=2, max_tokens=8, pin="foo=1")


def test_fuzz_repro_runs_exactly_that_problem():
    SEEN.clear()
    p = ropekv.Problem(PADDED)
    s = ropekv.fuzz(recording_unsupported_kernel, repro=p)
    assert s.skipped == 1 and s.report["counts"]["total"] == 1
    assert SEEN == [p]
    assert ropekv.fuzz(copy_kernel, repro=str(p)).passed_cases == 1


def test_fuzz_kernel_sees_pinned_problems():
    SEEN.clear()
    ropekv.fuzz(recording_unsupported_kernel, cases=15, max_tokens=8, pin=PIN)
    assert len(SEEN) == 15
    for p in SEEN:
        assert (p.dn, p.dr, p.cache, p.layout) == (64, 16, "fp8_e4m3fn", "split")
        assert p.tk <= 8


def test_fuzz_unsupported_counts_skipped_not_failed():
    s = ropekv.fuzz(unsupported_kernel, cases=12, max_tokens=8)
    assert s.skipped == 12 and s.failed == 0 and s.errored == 0 and s.passed_cases == 0
    assert s.passed and s.exit_code == 0  # a skip is not a failure
    assert all(c["outcome"] == "SKIPPED" and c["message"].endswith("why: not my domain") for c in s.cases)
    assert sum(s.report["skip_reasons"].values()) == 12
    assert all(k.endswith("why: not my domain") for k in s.report["skip_reasons"])
    assert s.report["summary"] == "0 passed, 0 failed, 12 skipped"


def test_fuzz_partly_unsupported_kernel():
    n = 40
    s = ropekv.fuzz(big_heads_unsupported_kernel, cases=n, seed=6, max_tokens=8)
    big = sum(ropekv.random_problem(6, i, "any", 8).h > 8 for i in range(n))
    assert 0 < big < n
    assert s.skipped == big and s.passed_cases == n - big and s.failed == s.errored == 0, str(s)
    assert s.passed


def test_fuzz_raising_kernel_is_errored_with_the_exception_text():
    s = ropekv.fuzz(raising_kernel, cases=3, max_tokens=8, shrink=False)
    assert s.errored == 3 and s.failed == 0 and s.passed_cases == 0
    assert not s.passed and s.exit_code == 1
    for c in s.cases:
        assert c["outcome"] == "ERRORED"
        assert "RuntimeError" in c["message"] and "kaboom 42 from the kernel" in c["message"]
    with pytest.raises(AssertionError, match="kaboom 42"):
        s.assert_ok()


def test_fuzz_write_past_q_out_into_the_guard_is_caught():
    s = ropekv.fuzz(guard_kernel, cases=4, max_tokens=8, pin="tq=2", shrink=False)
    assert s.failed == 4 and s.errored == 0 and not s.passed, str(s)
    for c in s.cases:
        assert c["outcome"] == "FAILED"
        assert json_failing_regions(c) == ["guards"], c
        assert "guards" in c["message"]


def test_fuzz_buggy_kernel_fails_with_a_shrunk_repro():
    prefix = f"python -m ropekv fuzz --kernel {__name__}:buggy_kernel"
    s = ropekv.fuzz(buggy_kernel, cases=6, seed=1, max_tokens=8, shrink_time="10s")
    assert s.failed > 0 and not s.passed and s.exit_code == 1
    failed = [c for c in s.cases if c["outcome"] == "FAILED"]
    assert len(failed) == s.failed
    for c in failed:
        assert any(r.endswith(".nope") or r.endswith(".untouched") for r in json_failing_regions(c)), c
        assert c["replay"].startswith(prefix + " --repro '")
        assert c["shrunk_repro"], c
        small, big = ropekv.Problem(c["shrunk_repro"]), ropekv.Problem(c["repro"])
        assert small.tk <= big.tk and small.h <= big.h and small.dn <= big.dn
        assert c["shrunk_replay"].startswith(prefix + " --repro '")
        assert str(small) in c["shrunk_replay"]
    # the shrunk repro replays as a failure
    again = ropekv.fuzz(buggy_kernel, repro=failed[0]["shrunk_repro"], shrink=False)
    assert again.failed == 1
    with pytest.raises(AssertionError) as e:
        s.assert_ok()
    text = str(e.value)
    assert re.search(r"^  replay: " + re.escape(prefix) + " --repro '", text, re.M), text
    assert "shrunk: " + prefix in text


def test_fuzz_max_failures_stops_early():
    s = ropekv.fuzz(buggy_kernel, cases=30, max_tokens=8, max_failures=1, shrink=False)
    assert s.failed == 1 and s.report["counts"]["total"] < 30


def test_fuzz_report_equals_the_cli_one(kmod_dir, tmp_path):
    """fuzz(kernel) and `python -m ropekv fuzz --kernel MOD:FN` run the same campaign: same
    config (backend named python:MOD:FN), same counts."""
    kmod = importlib.import_module(KMOD_NAME)
    a = tmp_path / "a.json"
    s = ropekv.fuzz(kmod.good, cases=10, seed=4, max_tokens=8, json=str(a))
    assert s.passed
    b = tmp_path / "b.json"
    p = run_module(kmod_dir, "fuzz", "--kernel", f"{KMOD_NAME}:good", "--cases", "10", "--seed", "4",
                   "--max-tokens", "8", "--json", str(b), cwd=tmp_path)
    assert p.returncode == 0, (p.stdout, p.stderr)
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    assert ra["config"] == rb["config"]
    assert ra["counts"] == rb["counts"] and ra["summary"] == rb["summary"]


def test_report_merge_of_cli_kernel_shards(ropekv_bin, kmod_dir, tmp_path, report_schema):
    paths = []
    for k in range(2):
        path = tmp_path / f"shard-{k}.json"
        p = run_module(kmod_dir, "fuzz", "--kernel", f"{KMOD_NAME}:good", "--cases", "12", "--seed", "5",
                       "--max-tokens", "8", "--shard", f"{k}/2", "--json", str(path), cwd=tmp_path)
        assert p.returncode == 0, (p.stdout, p.stderr)
        paths.append(str(path))
    merged = tmp_path / "all.json"
    m = subprocess.run([ropekv_bin, "report", "merge", *paths, "--json", str(merged)],
                       capture_output=True, text=True, timeout=120)
    assert m.returncode == 0, (m.stdout, m.stderr)
    report = json.loads(merged.read_text())
    report_schema(report)
    assert report["counts"]["total"] == report["counts"]["passed"] == 12
    assert sorted(sh["index"] for sh in report["shards"]) == [0, 1]
    # the unsharded in-process campaign counts the same
    kmod = importlib.import_module(KMOD_NAME)
    s = ropekv.fuzz(kmod.good, cases=12, seed=5, max_tokens=8)
    assert s.report["counts"] == report["counts"]
    assert s.report["config"] == report["config"]


def test_report_merge_takes_a_fuzz_report(ropekv_bin, tmp_path):
    path = tmp_path / "r.json"
    ropekv.fuzz(buggy_kernel, cases=8, max_tokens=8, shrink=False, json=str(path))
    m = subprocess.run([ropekv_bin, "report", "merge", str(path), "--json", str(tmp_path / "m.json")],
                       capture_output=True, text=True, timeout=120)
    assert m.returncode == 1, (m.stdout, m.stderr)  # exit 1: the campaign has failures
    merged = json.loads((tmp_path / "m.json").read_text())
    original = json.loads(path.read_text())
    assert merged["counts"] == original["counts"]
    assert [c["repro"] for c in merged["cases"]] == [c["repro"] for c in original["cases"]]


def test_report_merge_of_fuzz_shards(ropekv_bin, tmp_path):
    if "shard" not in inspect.signature(ropekv.fuzz).parameters:
        pytest.skip("ropekv.fuzz() has no shard option (shards come from `python -m ropekv fuzz --shard`)")
    paths = []
    for k in range(2):
        path = tmp_path / f"s{k}.json"
        ropekv.fuzz(copy_kernel, cases=10, max_tokens=8, shard=f"{k}/2", json=str(path))
        paths.append(str(path))
    m = subprocess.run([ropekv_bin, "report", "merge", *paths, "--json", str(tmp_path / "m.json")],
                       capture_output=True, text=True, timeout=120)
    assert m.returncode == 0, (m.stdout, m.stderr)
    assert json.loads((tmp_path / "m.json").read_text())["counts"]["total"] == 10


# ------------------------------------------------------------------------------ ropekv.testing
@pytest.mark.parametrize("problem", rt.problems(cases=4, seed=11, max_tokens=8))
def test_testing_check_passes_a_correct_kernel(problem):
    assert isinstance(problem, ropekv.Problem)
    rt.check(copy_kernel, problem)


@pytest.mark.parametrize("problem", rt.problems(cases=3, seed=12, max_tokens=8, pin={"layout": "split"}))
def test_testing_check_passes_a_correct_torch_kernel(problem):
    pytest.importorskip("torch")
    assert problem.layout == "split"
    rt.check(torch_copy_kernel, problem, framework="torch")


def test_testing_problems_are_the_campaign():
    params = rt.problems(cases=6, seed=11, max_tokens=8, pin="dn=32")
    assert [p.id for p in params] == [f"case{i}" for i in range(6)]
    assert [p.values[0] for p in params] == [ropekv.random_problem(11, i, "any", 8, "dn=32") for i in range(6)]


def test_testing_check_fails_a_buggy_kernel_with_the_shrunk_replay():
    p = ropekv.Problem("tq=2 ts=3 tk=3 h=2 dn=8 dr=4 bs=2 nb=3 seed=9")
    with pytest.raises(AssertionError) as e:
        rt.check(buggy_kernel, p, shrink_time="5s")
    text = str(e.value)
    assert f"python -m ropekv fuzz --kernel {__name__}:buggy_kernel --repro" in text
    assert "shrunk: " in text


def test_testing_check_skips_an_unsupported_problem():
    with pytest.raises(pytest.skip.Exception, match="why: not my domain"):
        rt.check(unsupported_kernel, SMALL)


def test_testing_check_errors_on_a_raising_kernel():
    with pytest.raises(AssertionError, match="kaboom 42"):
        rt.check(raising_kernel, SMALL)


# ------------------------------------------------------------------------ python -m ropekv fuzz
def test_module_cli_fuzz_passes(kmod_dir, tmp_path):
    p = run_module(kmod_dir, "fuzz", "--kernel", f"{KMOD_NAME}:good", "--cases", "20", "--max-tokens", "8",
                   cwd=tmp_path)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stdout.strip().splitlines()[-1] == "20 passed, 0 failed"


def test_module_cli_fuzz_buggy_kernel_fails(kmod_dir, tmp_path):
    p = run_module(kmod_dir, "fuzz", "--kernel", f"{KMOD_NAME}:buggy", "--cases", "4", "--max-tokens", "8",
                   "--shrink-time", "5s", cwd=tmp_path)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert f"replay: python -m ropekv fuzz --kernel {KMOD_NAME}:buggy --repro '" in p.stdout
    assert f"python -m ropekv fuzz --kernel {KMOD_NAME}:buggy --repro" in p.stdout.split("shrunk", 1)[1]
    assert re.fullmatch(r"\d+ passed, [1-9]\d* failed", p.stdout.strip().splitlines()[-1])


BAD_KERNEL_SPECS = ["nocolon", f"{KMOD_NAME}:", ":good", "no_such_module_ropekv_xyz:good",
                    f"{KMOD_NAME}:nosuch", f"{KMOD_NAME}:NOT_CALLABLE"]


@pytest.mark.parametrize("spec", BAD_KERNEL_SPECS)
def test_module_cli_bad_kernel_spec(kmod_dir, tmp_path, spec):
    p = run_module(kmod_dir, "fuzz", "--kernel", spec, "--cases", "2", "--max-tokens", "8", cwd=tmp_path)
    assert p.returncode != 0
    assert "--kernel" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "passed" not in p.stdout


def test_module_cli_rejects_backends_with_kernel(kmod_dir, tmp_path):
    p = run_module(kmod_dir, "fuzz", "--kernel", f"{KMOD_NAME}:good", "--backends", "ref,sim",
                   cwd=tmp_path)
    assert p.returncode != 0 and "--backends" in p.stderr, p.stderr


def test_module_cli_bad_fuzz_flag_is_usage_error(kmod_dir, tmp_path):
    p = run_module(kmod_dir, "fuzz", "--kernel", f"{KMOD_NAME}:good", "--no-such-flag", cwd=tmp_path)
    assert p.returncode == 2 and "--no-such-flag" in p.stderr, p.stderr


@pytest.mark.parametrize("spec", ["nocolon", "no_such_module_ropekv_xyz:good"])
def test_module_cli_bad_kernel_spec_exits_2(kmod_dir, tmp_path, spec):
    p = run_module(kmod_dir, "fuzz", "--kernel", spec, "--cases", "2", cwd=tmp_path)
    assert p.returncode == 2, p.stderr


def test_module_cli_other_subcommands_are_the_cli(kmod_dir, tmp_path):
    p = run_module(kmod_dir, "fuzz", "--backends", "ref,sim", "--cases", "3", "--max-tokens", "8", cwd=tmp_path)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stdout.strip().splitlines()[-1] == "3 passed, 0 failed"


def test_fuzz_case_timeout_reports_a_hanging_kernel_as_errored():
    import time as _time

    def hangs_on_split(t, p):
        if p.layout == "split":
            while True:
                _time.sleep(0.01)
        copy_kernel(t, p)

    s = ropekv.fuzz(hangs_on_split, cases=30, seed=2, max_tokens=8, case_timeout=0.5,
                    max_failures=1, shrink=False)
    assert s.errored == 1 and not s.passed
    case = [c for c in s.cases if c["outcome"] == "ERRORED"][0]
    assert "case_timeout=0.5" in case["message"] and ropekv.Problem(case["repro"]).layout == "split"
    assert case["replay"].startswith("python -m ropekv fuzz --kernel ")
    with pytest.raises(ValueError, match="case_timeout"):
        ropekv.fuzz(copy_kernel, cases=1, case_timeout=0)
