"""Every committed golden case (data/golden) replayed on every backend compiled in, through the
CLI (`ropekv golden check FILE --backend B`). The numpy oracle re-derives the same files in
test_oracle_golden_data.py."""
import re
import subprocess

import pytest

from conftest import REPO_ROOT

GOLDEN = sorted((REPO_ROOT / "data" / "golden").glob("*.safetensors"))


def backends_compiled_in(ropekv_bin):
    out = subprocess.run([ropekv_bin, "info"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"^backends compiled in: (.*)$", out, re.M)
    assert m, out
    return [b.strip() for b in m.group(1).split(",")]


def test_there_are_enough_golden_cases():
    assert len(GOLDEN) >= 12, [p.name for p in GOLDEN]
    for p in GOLDEN:
        assert p.stat().st_size < 1 << 20, f"{p.name} is over 1 MB"


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_case_replays_on_every_backend(ropekv_bin, path):
    backends = backends_compiled_in(ropekv_bin)
    assert "ref" in backends and "sim" in backends, backends
    for backend in backends:
        r = subprocess.run([ropekv_bin, "golden", "check", str(path), "--backend", backend],
                           capture_output=True, text=True)
        last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        assert r.returncode == 0 and last == "1 passed, 0 failed", (
            f"{path.name} on {backend}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
