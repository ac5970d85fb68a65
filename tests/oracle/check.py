"""Checks golden cases against the numpy oracle, byte for byte.

    python -m oracle.check FILE_OR_DIR...     (run from tests/, or with tests/ on PYTHONPATH)

For every `*.expected` tensor the oracle recomputes it from the case's inputs and `*.initial`
tensors and requires every byte to be identical. The one allowed exception is a documented
double-rounding tie of core/SPEC.md: the file holds the contract's double evaluation, the
oracle's exact value differs, and the double evaluation landed exactly on a midpoint of the
output format. Such elements are reported as ties, never silently passed.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import numpy as np

from .oracle import expected_outputs, load_golden, parse_repro

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass
class Element:
    tensor: str
    index: tuple
    got: float
    want: float
    got_bits: str
    want_bits: str
    double_eval: float | None = None

    def __str__(self):
        s = (f"{self.tensor}{list(self.index)}: file {self.got!r} ({self.got_bits}) "
             f"oracle {self.want!r} ({self.want_bits})")
        if self.double_eval is not None:
            s += f" double-eval {self.double_eval!r}"
        return s


@dataclass
class CaseResult:
    path: str
    repro: str = ""
    compared_bytes: int = 0
    mismatches: list = field(default_factory=list)   # Element
    mismatch_count: int = 0
    ties: list = field(default_factory=list)         # Element: documented double-rounding ties
    problems: list = field(default_factory=list)     # str: missing/extra tensors, load errors

    @property
    def ok(self):
        return not self.mismatches and not self.problems

    def report(self, max_elements=8):
        lines = [f"{self.path}: {'OK' if self.ok else 'FAILED'} ({self.compared_bytes} bytes)",
                 f"  repro: {self.repro}"]
        lines += [f"  problem: {p}" for p in self.problems]
        if self.mismatch_count:
            lines.append(f"  {self.mismatch_count} mismatching elements, first ones:")
            lines += [f"    {e}" for e in self.mismatches[:max_elements]]
        if self.ties:
            lines.append(f"  {len(self.ties)} documented double-rounding ties (allowed):")
            lines += [f"    {e}" for e in self.ties[:max_elements]]
        return "\n".join(lines)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(_UINT[a.dtype.itemsize])


def _element(name, idx, got, want, dbl):
    w = _bits(want)
    return Element(name, tuple(int(i) for i in idx), float(got[idx]), float(want[idx]),
                   f"0x{int(_bits(got)[idx]):0{2 * got.dtype.itemsize}x}",
                   f"0x{int(w[idx]):0{2 * want.dtype.itemsize}x}",
                   None if dbl is None else float(dbl[idx]))


def check_golden(path, max_listed=32) -> CaseResult:
    res = CaseResult(path=os.fspath(path))
    try:
        meta, tensors = load_golden(path)
    except Exception as e:  # noqa: BLE001 - report any unreadable file as a problem
        res.problems.append(f"cannot load: {e}")
        return res
    res.repro = meta.get("repro", "")
    if meta.get("format") not in (None, "ropekv-golden"):
        res.problems.append(f"metadata format: expected ropekv-golden, got {meta.get('format')}")
    if str(meta.get("contract_version", "1")) != "1":
        res.problems.append(f"contract_version: expected 1, got {meta.get('contract_version')}")
    try:
        params = parse_repro(res.repro)
        want = expected_outputs(params, tensors)
    except Exception as e:  # noqa: BLE001
        res.problems.append(f"oracle: {type(e).__name__}: {e}")
        return res
    in_file = {n for n in tensors if n.endswith(".expected")}
    for n in sorted(set(want) - in_file):
        res.problems.append(f"tensor {n} expected by the oracle is missing from the file")
    for n in sorted(in_file - set(want)):
        res.problems.append(f"tensor {n} in the file is not an output of this problem")
    dbl = None
    for name in sorted(set(want) & in_file):
        got, exp = tensors[name], want[name]
        if got.dtype != exp.dtype or got.shape != exp.shape:
            res.problems.append(f"{name}: file {got.dtype}{got.shape} vs oracle "
                                f"{exp.dtype}{exp.shape}")
            continue
        res.compared_bytes += got.nbytes
        diff = _bits(got) != _bits(exp)
        if not diff.any():
            continue
        if dbl is None:
            dbl = expected_outputs(params, tensors, evaluation="double")
        d = dbl[name]
        # a documented tie: the file equals the double evaluation, which differs from exact
        tie = diff & (_bits(got) == _bits(d))
        for idx in list(zip(*np.nonzero(tie)))[:max_listed]:
            res.ties.append(_element(name, idx, got, exp, d))
        bad = diff & ~tie
        res.mismatch_count += int(bad.sum())
        for idx in list(zip(*np.nonzero(bad)))[: max(0, max_listed - len(res.mismatches))]:
            res.mismatches.append(_element(name, idx, got, exp, d))
    return res


def golden_files(paths):
    for p in paths:
        if os.path.isdir(p) and not os.path.exists(os.path.join(p, "meta.json")):
            for n in sorted(os.listdir(p)):
                q = os.path.join(p, n)
                if n.endswith(".safetensors") or os.path.exists(os.path.join(q, "meta.json")):
                    yield q
        else:
            yield p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m oracle.check FILE_OR_DIR...", file=sys.stderr)
        return 2
    failed = total = 0
    for f in golden_files(argv):
        r = check_golden(f)
        total += 1
        failed += not r.ok
        if not r.ok or r.ties:
            print(r.report())
    print(f"{total - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
