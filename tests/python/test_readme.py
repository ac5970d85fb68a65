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
