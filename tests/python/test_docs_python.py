"""docs/python.md runs as written: every ```python block, in order, in one namespace, in a
scratch folder (the page's examples write report.json there)."""
import os
import re

from conftest import REPO_ROOT

DOC = REPO_ROOT / "docs" / "python.md"


def python_blocks(text):
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_docs_python_md_runs(tmp_path, monkeypatch):
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) >= 6, "docs/python.md lost its examples"
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "docs_python"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/python.md block {i + 1}", "exec"), namespace)
        except Exception as e:  # name the block in the failure
            raise AssertionError(f"docs/python.md block {i + 1} failed: {e!r}\n{block}") from e
    assert os.path.exists("report.json")
