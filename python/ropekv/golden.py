"""Golden files (docs/golden-format.md) from Python: a case's inputs, its outputs before the call
(`*.initial`, poisoned) and the expected outputs, in safetensors (or a folder of .npy files).

    g = ropekv.golden.load("data/golden/deepseek-v3-fp8-cache.safetensors")
    g.problem, g.case.tensors, g.expected["cache"], g.metadata["repro"]
    ropekv.golden.save("mine.safetensors", case)                 # expected = the reference's
    ropekv.golden.save("theirs.safetensors", case, my_outputs)   # expected = your outputs
    ropekv.golden.compare(g, {"q_out": q_out, "cache": cache}).assert_ok()   # yours vs the file's
    ropekv.golden.compare("dsv3.safetensors", "my_outputs.safetensors")      # a path: any writer
    ropekv.golden.write_from_inputs("mine.safetensors", problem, "my_inputs.safetensors")
"""
import os as _os
from typing import Any, Dict, Mapping, Optional, Union

import numpy as _np

from . import Case, Problem, Report, _c, _dtype_name, _outputs_of, _pristine, _to_numpy_bits, _torch_name


class Golden:
    """One golden case: `problem`, `case` (the inputs and the outputs before the call, as
    make_case lays them out: run your kernel on case.tensors), `expected` (numpy arrays of the
    outputs by name), `metadata` (every __metadata__ entry of the file)."""

    def __init__(self, initial, expected, metadata: Dict[str, str], path: str = ""):
        self._initial = initial.clone()  # untouched by a kernel run in place on case.tensors
        self._expected = expected
        self._path = path
        self.case = Case(initial, self._initial)  # ropekv.compare / reference start from the file's state
        self.problem: Problem = self.case.problem
        self.metadata = dict(metadata)
        exp = Case(expected)
        self.expected: Dict[str, _np.ndarray] = {k: v.copy() for k, v in _outputs_of(exp).items()}

    def __repr__(self) -> str:
        return f"<ropekv.golden.Golden {self.problem}>"


def load(path: str) -> Golden:
    """Reads and checks a golden file: safetensors, or an npy folder (ValueError naming the file
    and what is wrong)."""
    initial, expected, metadata = _c.load_golden(str(path))
    return Golden(initial, expected, metadata, str(path))


def save(path: str, case: Case, outputs: Optional[Mapping[str, Any]] = None,
         format: str = "safetensors", store_all: bool = False) -> None:
    """Writes the golden file of `case`'s problem: its inputs and poisoned outputs, and as
    `*.expected` either the reference's outputs (outputs=None) or yours (numpy or torch, by name,
    with the case's shapes and dtypes, as for ropekv.compare). format: safetensors or npy (a
    folder). store_all: store every tensor as itself rather than leave out what the file's
    `derived` metadata rebuilds (docs/golden-format.md)."""
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
    _c.write_golden(str(path), before._data, after._data, format, store_all)


def _tensor_entries(tensors: Mapping[str, Any]):
    """(name, dtype, shape, bytes) per tensor, numpy or torch on any device: the dtype as a
    ropekv name where it is one, else numpy's descr ('<f4', '|u1', '<V2'); C++ checks them."""
    out = []
    for name, value in tensors.items():
        if type(value).__module__.startswith("torch"):
            import torch
            t = value.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size())
            if ints is None:
                raise ValueError(f"{name}: expected a tensor of 1, 2, 4 or 8-byte elements, got {t.dtype}")
            arr = t.contiguous().view(ints).numpy()
            dtype = _torch_name(t.dtype)
        else:
            arr = _np.asarray(value)
            dtype = _dtype_name(arr.dtype)
            if dtype == str(arr.dtype):  # not a ropekv dtype: numpy's own name of it
                dtype = arr.dtype.str
        out.append((str(name), dtype, [int(d) for d in arr.shape],
                    _np.ascontiguousarray(arr).tobytes()))
    return out


def _source(value: Union[str, "_os.PathLike", Mapping[str, Any]]):
    if isinstance(value, (str, _os.PathLike)):
        return _os.fspath(value)
    return _tensor_entries(value)


def compare(golden: Union[str, "_os.PathLike", Golden], outputs: Union[str, "_os.PathLike", Mapping[str, Any]],
            max_ulp: int = 1, strict: bool = False, bitwise: bool = False,
            numerics: str = "fp32") -> Report:
    """Compares your kernel's outputs with a golden file's expected ones, as `ropekv golden
    compare` does: `golden` a path or a Golden; `outputs` a path (safetensors from any writer, or
    an npy folder) or a dict of numpy / torch arrays, holding q_out, cache (joint) or ckv_cache +
    kpe_cache (split), and q_pe / k_pe when in place, logical and contiguous, by golden name
    without suffix. Other names are ignored (report.ignored lists them). A missing output, a
    wrong dtype or shape: ValueError naming the tensor. The report says "reference" and
    "yours". `numerics` (fp32, operand-products, operand-dtype): the rope arithmetic your outputs
    claim; report.numerics says which models they match bit for bit (core/SPEC.md)."""
    g = golden if isinstance(golden, Golden) else load(golden)
    d, ignored = _c.compare_golden(g._initial, g._expected, _source(outputs), max_ulp, strict, bitwise, numerics)
    where = g._path or "golden"
    got = _os.fspath(outputs) if isinstance(outputs, (str, _os.PathLike)) else "outputs"
    r = Report(d, f"ropekv.golden.compare({where!r}, {got!r})")
    r.ignored = list(ignored)
    return r


def write_from_inputs(path: Union[str, "_os.PathLike"], problem: Union[str, Problem],
                      inputs: Union[str, "_os.PathLike", Mapping[str, Any]], format: str = "safetensors",
                      store_all: bool = False) -> None:
    """Writes the golden file of your own inputs: `problem` (a Problem or repro string) says the
    shapes, dtypes and options; `inputs` (a path: safetensors or npy folder, or a dict of numpy /
    torch arrays) holds q_nope q_pe kv_c k_pe positions slot_mapping and cos_sin (or cos, sin)
    with exactly those shapes and dtypes (ValueError naming the tensor, expected vs got). The
    outputs start poisoned as make_case lays them out; *.expected is the reference's run."""
    _c.write_golden_from_inputs(_os.fspath(path), str(Problem(problem)), _source(inputs), format, store_all)
