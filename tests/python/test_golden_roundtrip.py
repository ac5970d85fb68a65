"""The golden round trip as a kernel engineer does it: outputs written with safetensors.torch (fnuz
dtypes included) or as an npy folder, compared with `ropekv golden compare` and with
ropekv.golden.compare; your own inputs -> `golden write --inputs` -> `golden check`; npy golden
folders read back; fnuz written under safetensors' own names; a preset's table kept small."""
import json
import struct
import subprocess

import numpy as np
import pytest

import ropekv
import ropekv.golden as golden
from conftest import REPO_ROOT

torch = pytest.importorskip("torch")
from safetensors.torch import load_file as torch_load, save_file as torch_save  # noqa: E402

# fp8 fnuz q_out and cache: torch has both dtypes, safetensors >= 0.6 names them
FNUZ = "tq=3 ts=4 tk=4 h=2 dn=16 dr=8 p=32 bs=4 nb=2 qo=fp8_e5m2fnuz cache=fp8_e4m3fnuz k_scale=0.5 q_scale=2 seed=5"
SPLIT_INPLACE = "tq=2 ts=3 tk=3 h=2 dn=8 dr=4 p=16 bs=2 nb=3 layout=split inplace_q=1 inplace_k=1 in=f32 seed=6"


def run(binary, *args):
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=300)


def header_of(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n])


@pytest.fixture
def fnuz_golden(ropekv_bin, tmp_path):
    path = tmp_path / "g.safetensors"
    p = run(ropekv_bin, "golden", "write", "--repro", FNUZ, "--out", str(path))
    assert p.returncode == 0, p.stderr
    return path


def test_fnuz_written_under_safetensors_names_and_torch_loads_them(fnuz_golden):
    h = header_of(fnuz_golden)
    assert h["cache.expected"]["dtype"] == "F8_E4M3FNUZ"
    assert h["q_out.expected"]["dtype"] == "F8_E5M2FNUZ"
    t = torch_load(str(fnuz_golden))
    assert t["cache.expected"].dtype == torch.float8_e4m3fnuz
    assert t["q_out.expected"].dtype == torch.float8_e5m2fnuz
    # the old U8 files still read (written before ropekv used the fnuz names)
    old = REPO_ROOT / "tests" / "data" / "golden-v1" / "fp8-e4m3fnuz-reciprocal.safetensors"
    assert header_of(old)["cache.expected"]["dtype"] == "U8"
    golden.load(old)


def test_compare_torch_safetensors_outputs_cli_and_python(ropekv_bin, fnuz_golden, tmp_path):
    t = torch_load(str(fnuz_golden))
    good = {"q_out": t["q_out.expected"], "cache": t["cache.expected"], "note": torch.zeros(3)}
    good_path = tmp_path / "yours.safetensors"
    torch_save(good, str(good_path))  # no metadata, torch's own fnuz dtypes
    p = run(ropekv_bin, "golden", "compare", str(fnuz_golden), "--got", str(good_path))
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stdout.startswith("ignored: note\n")
    assert p.stdout.strip().splitlines()[-1] == "1 passed, 0 failed"
    r = golden.compare(fnuz_golden, good_path)
    r.assert_ok()
    assert r.ignored == ["note"]
    golden.compare(golden.load(fnuz_golden), good).assert_ok()  # a dict of torch tensors

    # one flipped bit in the nope part of q_out [t=1, h=0, dim=3]
    bits = t["q_out.expected"].clone().view(torch.uint8)
    bits[1, 0, 3] ^= 0x01
    bad = {"q_out": bits.view(torch.float8_e5m2fnuz), "cache": t["cache.expected"]}
    bad_path = tmp_path / "bad.safetensors"
    torch_save(bad, str(bad_path))
    p = run(ropekv_bin, "golden", "compare", str(fnuz_golden), "--got", str(bad_path),
            "--json", str(tmp_path / "rec.json"))
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stdout.strip().splitlines()[-1] == "0 passed, 1 failed"
    line = [l for l in p.stdout.splitlines() if "token=1 head=0 dim=3" in l]
    assert line and " reference " in line[0] and " yours " in line[0], p.stdout
    assert " expected " not in line[0]
    assert "q_out.nope" in p.stdout
    rec = json.loads((tmp_path / "rec.json").read_text())
    assert rec["outcome"] == "FAILED" and rec["got"] == str(bad_path)
    for source in (bad_path, bad):
        r = golden.compare(fnuz_golden, source)
        assert not r.passed
        nope = [g for g in r.regions if g["name"] == "q_out.nope"][0]
        assert nope["mismatches"] == 1
        assert "reference" in str(r) and "yours" in str(r)


def test_compare_npy_folder_outputs_and_raw_u8_bits(ropekv_bin, fnuz_golden, tmp_path):
    g = golden.load(fnuz_golden)
    d = tmp_path / "outs"
    d.mkdir()
    # raw bits as numpy uint8 (np.save writes '|u1'): accepted for any fp8 dtype
    np.save(d / "q_out.npy", g.expected["q_out"].view(np.uint8))
    np.save(d / "cache.npy", g.expected["cache"].view(np.uint8))
    p = run(ropekv_bin, "golden", "compare", str(fnuz_golden), "--got", str(d))
    assert p.returncode == 0, (p.stdout, p.stderr)
    golden.compare(fnuz_golden, d).assert_ok()
    flipped = g.expected["cache"].view(np.uint8).copy()
    flipped[0, 0, 3] ^= 0x01  # block 0, entry 0, feature 3: a nope byte (exact; dn = 16)
    np.save(d / "cache.npy", flipped)
    p = run(ropekv_bin, "golden", "compare", str(fnuz_golden), "--got", str(d))
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "block=0 entry=0 feature=3" in p.stdout or "byte=" in p.stdout, p.stdout
    assert "cache." in p.stdout and "reference" in p.stdout and "yours" in p.stdout
    assert not golden.compare(fnuz_golden, d).passed


def test_compare_ml_dtypes_bfloat16_saved_by_numpy(ropekv_bin, tmp_path):
    """np.save of an ml_dtypes bfloat16 array writes descr '<V2': read as bf16 bits."""
    path = tmp_path / "bf16.safetensors"
    assert run(ropekv_bin, "golden", "write", "--repro", "tq=2 ts=2 tk=2 h=2 dn=8 dr=4 p=16 bs=4 nb=1",
               "--out", str(path)).returncode == 0
    g = golden.load(path)
    d = tmp_path / "outs"
    d.mkdir()
    for name, arr in g.expected.items():
        np.save(d / f"{name}.npy", arr)
    assert b"'<V2'" in (d / "q_out.npy").read_bytes()[:128]
    p = run(ropekv_bin, "golden", "compare", str(path), "--got", str(d))
    assert p.returncode == 0, (p.stdout, p.stderr)


def test_compare_errors_name_the_tensor(ropekv_bin, fnuz_golden, tmp_path):
    t = torch_load(str(fnuz_golden))
    cases = {
        "missing": ({"q_out": t["q_out.expected"]}, "tensor cache"),
        "dtype": ({"q_out": t["q_out.expected"], "cache": t["cache.expected"].float()}, "tensor cache dtype"),
        "shape": ({"q_out": t["q_out.expected"][:2].contiguous(), "cache": t["cache.expected"]},
                  "tensor q_out shape"),
    }
    for name, (tensors, needle) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        torch_save(tensors, str(path))
        p = run(ropekv_bin, "golden", "compare", str(fnuz_golden), "--got", str(path))
        assert p.returncode == 2, (name, p.stdout, p.stderr)
        assert needle in p.stderr and "expected" in p.stderr, (name, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1
        with pytest.raises(ValueError, match=needle):
            golden.compare(fnuz_golden, tensors)
    bad = tmp_path / "trunc"
    bad.mkdir()
    np.save(bad / "q_out.npy", np.zeros((3, 2, 24), np.uint8))
    (bad / "cache.npy").write_bytes((bad / "q_out.npy").read_bytes()[:100])
    p = run(ropekv_bin, "golden", "compare", str(fnuz_golden), "--got", str(bad))
    assert p.returncode == 2 and "cache.npy" in p.stderr and "truncated" in p.stderr, p.stderr


def test_inputs_round_trip_safetensors_and_npy(ropekv_bin, tmp_path):
    """Your inputs (any writer) -> golden write --inputs -> golden check --backend ref passes, and
    the golden holds exactly your inputs."""
    rng = np.random.default_rng(0)
    p = ropekv.Problem(SPLIT_INPLACE)
    tensors = {
        "q_nope": torch.from_numpy(rng.uniform(-2, 2, (2, 2, 8)).astype(np.float32)),
        "q_pe": torch.from_numpy(rng.uniform(-2, 2, (2, 2, 4)).astype(np.float32)),
        "kv_c": torch.from_numpy(rng.uniform(-2, 2, (3, 8)).astype(np.float32)),
        "k_pe": torch.from_numpy(rng.uniform(-2, 2, (3, 4)).astype(np.float32)),
        "positions": torch.tensor([3, 0, 15], dtype=torch.int64),
        "slot_mapping": torch.tensor([5, -1, 0], dtype=torch.int64),
        "cos_sin": torch.from_numpy(rng.uniform(-1, 1, (16, 4)).astype(np.float32)).to(torch.bfloat16),
    }
    src = tmp_path / "inputs.safetensors"
    torch_save(tensors, str(src))
    out = tmp_path / "mine.safetensors"
    r = run(ropekv_bin, "golden", "write", "--repro", str(p), "--inputs", str(src), "--out", str(out))
    assert r.returncode == 0, r.stderr
    r = run(ropekv_bin, "golden", "check", str(out), "--backend", "ref")
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1] == "1 passed, 0 failed", r.stdout
    back = torch_load(str(out))
    for name, t in tensors.items():
        assert torch.equal(back[name].view(torch.uint8), t.contiguous().view(torch.uint8)), name
    # the same inputs as an npy folder (bf16 table as '<u2' bits), and from Python
    d = tmp_path / "inputs_npy"
    d.mkdir()
    for name, t in tensors.items():
        arr = t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
        np.save(d / f"{name}.npy", arr)
    out2 = tmp_path / "mine_npy"
    r = run(ropekv_bin, "golden", "write", "--repro", str(p), "--inputs", str(d), "--format", "npy",
            "--out", str(out2))
    assert r.returncode == 0, r.stderr
    r = run(ropekv_bin, "golden", "check", str(out2), "--backend", "sim")
    assert r.returncode == 0, r.stdout
    out3 = tmp_path / "py.safetensors"
    golden.write_from_inputs(out3, p, tensors)
    a3, a1 = torch_load(str(out3)), torch_load(str(out))  # metadata: the commits may differ
    assert all(torch.equal(a3[k].view(torch.uint8), a1[k].view(torch.uint8)) for k in a1)
    g = golden.load(out3)
    golden.compare(g, g.expected).assert_ok()
    # a wrong dtype names the tensor, expected vs got
    wrong = dict(tensors, positions=tensors["positions"].to(torch.int32))
    with pytest.raises(ValueError, match="positions dtype: expected i64"):
        golden.write_from_inputs(tmp_path / "x.safetensors", p, wrong)
    torch_save(wrong, str(src))
    r = run(ropekv_bin, "golden", "write", "--repro", str(p), "--inputs", str(src), "--out", str(tmp_path / "y"))
    assert r.returncode == 2 and "positions dtype" in r.stderr, r.stderr


def test_preset_golden_is_small_and_table_rows_flag(ropekv_bin, tmp_path):
    small, full = tmp_path / "s.safetensors", tmp_path / "f.safetensors"
    r = run(ropekv_bin, "golden", "write", "--preset", "deepseek-v3", "--tokens", "8", "--out", str(small))
    assert r.returncode == 0 and " p=2048 " in r.stdout, r.stdout
    assert small.stat().st_size < 2_000_000
    r = run(ropekv_bin, "golden", "write", "--preset", "deepseek-v3", "--tokens", "8", "--table-rows", "0",
            "--out", str(full))
    assert r.returncode == 0 and " p=163840 " in r.stdout, r.stdout
    # rows 0..2047 are the preset's own rows
    a, b = torch_load(str(small))["cos_sin"], torch_load(str(full))["cos_sin"]
    assert a.shape[0] == 2048 and torch.equal(a.view(torch.int16), b[:2048].view(torch.int16))
    assert run(ropekv_bin, "golden", "check", str(small), "--backend", "sim").returncode == 0


def _doc_block(marker):
    text = (REPO_ROOT / "docs" / "golden-format.md").read_text()
    blocks = [b for b in text.split("```python\n")[1:] if marker in b.split("```")[0]]
    assert len(blocks) == 1, f"docs/golden-format.md: one python block with {marker!r}"
    return blocks[0].split("```")[0]


@pytest.mark.parametrize("repro", [
    "tq=3 ts=3 tk=3 h=4 dn=16 dr=8 p=32 bs=4 nb=2 cache=fp8_e4m3fn k_scale=0.5",   # q_out.expected derived
    FNUZ,                                                                          # fp8 q_out: stored whole
    SPLIT_INPLACE,
    "tq=5 ts=5 tk=5 h=2 dn=8 dr=4 p=16 bs=8 nb=1 pad_slots=2 pad_q=skipped",       # skipped rows: stored whole
])
def test_documented_rebuild_gives_every_tensor_of_store_all(ropekv_bin, tmp_path, monkeypatch, repro):
    """docs/golden-format.md's plain-safetensors rebuild of the derived tensors, run as written,
    gives exactly the tensors (names, dtypes, bytes) of the same case written with --store-all."""
    monkeypatch.chdir(tmp_path)
    assert run(ropekv_bin, "golden", "write", "--repro", repro, "--out", "dsv3.safetensors").returncode == 0
    assert run(ropekv_bin, "golden", "write", "--repro", repro, "--store-all", "--out", "all.safetensors").returncode == 0
    assert (tmp_path / "dsv3.safetensors").stat().st_size < (tmp_path / "all.safetensors").stat().st_size
    ns = {}
    exec(compile(_doc_block("derived"), "docs/golden-format.md", "exec"), ns)
    rebuilt, full = ns["t"], torch_load("all.safetensors")
    assert sorted(rebuilt) == sorted(full)
    for name in full:
        assert rebuilt[name].dtype == full[name].dtype and rebuilt[name].shape == full[name].shape, name
        assert torch.equal(rebuilt[name].view(torch.uint8), full[name].view(torch.uint8)), name
    assert header_of(tmp_path / "dsv3.safetensors")["__metadata__"]["format_version"] == "2"


def test_version_1_golden_files_still_read(ropekv_bin):
    """Files written before format version 2 (every tensor stored, no format_version) load and
    pass golden check on the reference, from the CLI and from Python."""
    for path in sorted((REPO_ROOT / "tests" / "data" / "golden-v1").glob("*.safetensors")):
        assert "format_version" not in header_of(path)["__metadata__"]
        r = run(ropekv_bin, "golden", "check", str(path), "--backend", "ref")
        assert r.returncode == 0 and r.stdout.strip().endswith("1 passed, 0 failed"), r.stdout
        g = golden.load(path)
        ropekv.compare(g.case, g.expected, bitwise=True).assert_ok()
