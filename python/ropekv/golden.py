"""Golden files (docs/golden-format.md) from Python: a case's inputs, its outputs before the call
(`*.initial`, poisoned) and the expected outputs, in safetensors (or a folder of .npy files).

    g = ropekv.golden.load("data/golden/deepseek-v3-fp8-cache.safetensors")
    g.problem, g.case.tensors, g.expected["cache"], g.metadata["repro"]
    ropekv.golden.save("mine.safetensors", case)                 # expected = the reference's
    ropekv.golden.save("theirs.safetensors", case, my_outputs)   # expected = your outputs
"""
from typing import Any, Dict, Mapping, Optional

import numpy as _np

from . import Case, Problem, _c, _outputs_of, _pristine, _to_numpy_bits


class Golden:
    """One golden case: `problem`, `case` (the inputs and the outputs before the call, as
    make_case lays them out: run your kernel on case.tensors), `expected` (numpy arrays of the
    outputs by name), `metadata` (every __metadata__ entry of the file)."""

    def __init__(self, initial, expected, metadata: Dict[str, str]):
        self.case = Case(initial)
        self.problem: Problem = self.case.problem
        self.metadata = dict(metadata)
        exp = Case(expected)
        self.expected: Dict[str, _np.ndarray] = {k: v.copy() for k, v in _outputs_of(exp).items()}

    def __repr__(self) -> str:
        return f"<ropekv.golden.Golden {self.problem}>"


def load(path: str) -> Golden:
    """Reads and checks a golden file (ValueError naming the file and what is wrong)."""
    initial, expected, metadata = _c.load_golden(str(path))
    return Golden(initial, expected, metadata)


def save(path: str, case: Case, outputs: Optional[Mapping[str, Any]] = None,
         format: str = "safetensors") -> None:
    """Writes the golden file of `case`'s problem: its inputs and poisoned outputs, and as
    `*.expected` either the reference's outputs (outputs=None) or yours (numpy or torch, by name,
    with the case's shapes and dtypes, as for ropekv.compare). format: safetensors or npy (a
    folder)."""
    before = _pristine(case)
    after = before.clone()
    if outputs is None:
        _c.run_backend("ref", after._data)
    else:
        names = _outputs_of(before)
        unknown = sorted(set(outputs) - set(names))
        missing = sorted(set(names) - set(outputs))
        if unknown or missing:
            raise ValueError(f"outputs: expected exactly {sorted(names)}, got {sorted(outputs)}")
        for name in names:
            want = after.tensors[name]
            want[...] = _to_numpy_bits(name, outputs[name], want)
    _c.write_golden(str(path), before._data, after._data, format)
