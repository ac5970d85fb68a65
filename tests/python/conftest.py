"""Shared pytest fixtures for ropekv's Python tests."""
import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# `import oracle` gives the numpy oracle package (tests/oracle).
if str(REPO_ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(REPO_ROOT / "tests"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def ropekv_bin() -> str:
    """Path of the ropekv CLI from env ROPEKV_BIN; skips the test when it is unset."""
    path = os.environ.get("ROPEKV_BIN")
    if not path:
        pytest.skip("ROPEKV_BIN is not set (point it at a built ropekv binary)")
    if not os.access(path, os.X_OK):
        pytest.fail(f"ROPEKV_BIN={path} is not an executable file")
    return path
