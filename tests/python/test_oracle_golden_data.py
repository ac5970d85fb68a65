"""Every committed golden case in data/golden/ is re-derived by the numpy oracle, byte for byte
(golden data). Needs no C++ build."""
import pytest

from oracle.check import check_golden, golden_files


def _cases(repo_root):
    d = repo_root / "data" / "golden"
    return list(golden_files([str(d)])) if d.is_dir() else []


def test_committed_golden_cases_match_oracle(repo_root):
    cases = _cases(repo_root)
    if not cases:
        pytest.skip("data/golden/ holds no golden case yet")
    results = [check_golden(c) for c in cases]
    for r in results:
        if r.ties:
            print(r.report())
    bad = [r for r in results if not r.ok]
    assert not bad, "\n".join(r.report() for r in bad)
