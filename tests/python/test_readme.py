"""The README's numpy example runs as written (so the documentation cannot rot)."""
import os
import re

from conftest import REPO_ROOT


def test_readme_numpy_golden_loader_runs(capsys):
    text = (REPO_ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    numpy_block = next(b for b in blocks if "ml_dtypes" in b and "torch" not in b)
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        exec(compile(numpy_block, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    assert "rope_table=deepseek-v3" in capsys.readouterr().out


def test_readme_pytorch_golden_check_runs():
    """The README's PyTorch block runs as written (on the CPU here) and its check passes."""
    text = (REPO_ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    torch_block = next(b for b in blocks if "import torch" in b and "ropekv.compare" in b)
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        namespace = {}
        exec(compile(torch_block, "README.md", "exec"), namespace)
    finally:
        os.chdir(cwd)
    assert namespace["device"] in ("cpu", "cuda")
