"""The Python lock file: every PyPI package the project installs is pinned exactly, so a fresh
machine gets what CI tested. The lock is tests/python/requirements.txt (made by
scripts/lock_python.sh from requirements.in)."""
import re
from importlib import metadata
import sys

import pytest

from conftest import REPO_ROOT

REQ_DIR = REPO_ROOT / "tests" / "python"
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[0-9][A-Za-z0-9.+!_-]*)$")
# The interpreter's own installer (ensurepip), the one package the project does not install.
BOOTSTRAP = {"pip"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_lines(path):
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if line:
            yield number, line


def lock_files():
    return sorted(REQ_DIR.glob("requirements*.txt"))


def read_pins(path):
    """{canonical name: version} of a lock file; fails naming the first line that is no exact pin."""
    pins = {}
    for number, line in requirement_lines(path):
        m = PIN.match(line)
        assert m, (f"{path.name}:{number}: '{line}' is not an exact pin (expected NAME==VERSION; "
                   f"refresh with bash scripts/lock_python.sh)")
        name = canonical(m["name"])
        assert name not in pins, f"{path.name}:{number}: {m['name']} is pinned twice"
        pins[name] = m["version"]
    return pins


def test_there_is_one_lock():
    assert [p.name for p in lock_files()] == ["requirements.txt"]


@pytest.mark.parametrize("path", lock_files(), ids=lambda p: p.name)
def test_every_line_is_an_exact_pin(path):
    assert read_pins(path), f"{path.name} pins nothing"


def test_every_direct_requirement_is_locked():
    pins = read_pins(REQ_DIR / "requirements.txt")
    direct = [canonical(line) for _, line in requirement_lines(REQ_DIR / "requirements.in")]
    missing = [name for name in direct if name not in pins]
    assert not missing, f"requirements.in names {missing}, which the lock does not pin"


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="not running in a venv made from the lock")
def test_the_venv_holds_exactly_the_lock():
    """Completeness: every distribution in this venv (dependencies included) is pinned, at the
    version installed. An unpinned transitive dependency shows up here."""
    pins = read_pins(REQ_DIR / "requirements.txt")
    installed = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions()}
    unpinned = {n: v for n, v in installed.items()
                if n not in BOOTSTRAP and n != "ropekv" and pins.get(n) != v}
    assert not unpinned, (f"installed but not pinned at that version: {unpinned}; "
                          f"refresh with bash scripts/lock_python.sh")
