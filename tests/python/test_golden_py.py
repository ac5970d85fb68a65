"""ropekv.golden.load / save: the golden files of data/golden read back into a case whose
expected outputs the reference reproduces; save writes the reference's outputs or yours."""
import numpy as np
import pytest

import ropekv
import ropekv.golden as golden
from conftest import REPO_ROOT

FILES = sorted((REPO_ROOT / "data" / "golden").glob("*.safetensors"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_load_every_shipped_golden_file(path):
    g = golden.load(path)
    # the file's repro parses to the case's problem (a file written before a key existed lacks it)
    assert g.problem == ropekv.Problem(g.metadata["repro"])
    assert str(ropekv.Problem(str(g.problem))) == str(g.problem)
    ropekv.compare(g.case, g.expected, bitwise=True).assert_ok()
    for name, arr in g.expected.items():
        assert arr.shape == g.case.tensors[name].shape and arr.dtype == g.case.tensors[name].dtype


def test_save_round_trip_reference_and_yours(tmp_path):
    case = ropekv.make_case("tq=3 ts=4 tk=4 h=4 dn=16 dr=8 bs=4 nb=2 cache=fp8_e5m2 pad_slots=1")
    golden.save(tmp_path / "ref.safetensors", case)
    g = golden.load(tmp_path / "ref.safetensors")
    assert g.problem == case.problem
    ropekv.compare(case, g.expected, bitwise=True).assert_ok()
    mine = {k: v.copy() for k, v in g.expected.items()}
    mine["cache"].view(np.uint8)[0, 0, 0] ^= 0x01
    golden.save(tmp_path / "mine.safetensors", case, mine)
    g2 = golden.load(tmp_path / "mine.safetensors")
    np.testing.assert_array_equal(g2.expected["cache"].view(np.uint8), mine["cache"].view(np.uint8))
    assert not ropekv.compare(case, g2.expected).passed
    golden.save(tmp_path / "npy", case, format="npy")
    assert (tmp_path / "npy" / "meta.json").exists() and (tmp_path / "npy" / "cache.expected.npy").exists()


def test_save_and_load_errors(tmp_path):
    case = ropekv.make_case("tq=1 ts=1 tk=1 h=1 dn=4 dr=2 bs=1 nb=1")
    with pytest.raises(ValueError, match="outputs: expected exactly"):
        golden.save(tmp_path / "x.safetensors", case, {"q_out": ropekv.reference(case)["q_out"]})
    with pytest.raises(ValueError, match="format"):
        golden.save(tmp_path / "x.bin", case, format="zip")
    assert not (tmp_path / "x.safetensors").exists()
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ValueError, match="junk.safetensors"):
        golden.load(tmp_path / "junk.safetensors")
