"""ropekv: the exact reference, the ULP comparison and the differential fuzzer of the fused
RoPE + paged KV-cache write + q concat op of MLA attention, for *your* kernel.

    import ropekv
    p = ropekv.Problem("tq=4 ts=4 tk=4 h=16 cache=fp8_e4m3fn")
    case = ropekv.make_case(p)                 # poisoned outputs, guard bytes, numpy views
    my_kernel(case.tensors, p)                 # yours: writes q_out and the cache in place
    ropekv.compare(case, case.tensors).assert_ok()
    ropekv.fuzz(my_kernel, cases=2000).assert_ok()

docs/python.md documents every name. The arithmetic, the comparison, the shrinker and the
reports are the C++ library's (the same code as the `ropekv` CLI); this package converts.
"""
from __future__ import annotations

import json as _json
import os as _os
import sys as _sys
import tempfile as _tempfile
from typing import Any, Callable, Dict, Mapping, Optional, Union

import ml_dtypes as _mld
import numpy as _np

from . import _ropekv as _c

__version__ = _c.version
__all__ = ["Problem", "random_problem", "Case", "make_case", "run", "reference", "compare", "Report",
           "fuzz", "FuzzSummary", "Unsupported", "CaseTimeout", "NUMPY_DTYPES", "OUTPUT_NAMES"]

# ropekv dtype name -> numpy dtype (bf16 and fp8 as ml_dtypes types).
NUMPY_DTYPES = {
    "f32": _np.dtype(_np.float32), "f16": _np.dtype(_np.float16),
    "bf16": _np.dtype(_mld.bfloat16),
    "fp8_e4m3fn": _np.dtype(_mld.float8_e4m3fn), "fp8_e4m3fnuz": _np.dtype(_mld.float8_e4m3fnuz),
    "fp8_e5m2": _np.dtype(_mld.float8_e5m2), "fp8_e5m2fnuz": _np.dtype(_mld.float8_e5m2fnuz),
    "i32": _np.dtype(_np.int32), "i64": _np.dtype(_np.int64), "u8": _np.dtype(_np.uint8),
}
# Tensors a kernel may write (q_pe / k_pe only with inplace_q / inplace_k, the decode outputs only
# when the problem passes them): a case's own list is output_names(problem).
OUTPUT_NAMES = ("q_out", "cache", "ckv_cache", "kpe_cache", "q_pe", "k_pe", "decode_q_pe_out", "k_pe_out",
                "q_nope_zeros_out")


class Unsupported(Exception):
    """Raise from your kernel (before writing anything) for a problem it does not cover: the
    fuzzer counts the case SKIPPED with your reason instead of ERRORED."""


# ----------------------------------------------------------------------------------- problems
_INT_KEYS = {"tq", "ts", "tk", "h", "kh", "dn", "dr", "p", "bs", "nb", "inplace_q", "inplace_k", "zero_copy",
             "row_pad", "entry_pad", "block_pad", "table_pad", "pad_slots", "seed", "dec"}
_FLOAT_KEYS = {"k_scale", "q_scale", "amp"}
_ALIASES = {"heads": "h", "kv_heads": "kh", "block_size": "bs", "num_blocks": "nb", "table_rows": "p",
            "in_dtype": "in", "cache_dtype": "cache", "q_out_dtype": "qo"}


def _pins_text(pin: Union[None, str, Mapping[str, Any]]) -> str:
    if pin is None:
        return ""
    if isinstance(pin, str):
        return pin
    return " ".join(f"{k}={_value_text(v)}" for k, v in pin.items())


def _value_text(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


class Problem:
    """One case of the op (a repro string, oneDNN benchdnn style): str(p) is the canonical
    repro and parses back to the same problem. Keys are attributes: p.tq, p.h (alias p.heads),
    p.layout, p.cache, p.k_scale, ... (docs/golden-format.md lists them)."""

    __slots__ = ("_repro", "_fields")

    def __init__(self, repro: Union[str, "Problem"] = ""):
        self._repro = _c.parse_problem(str(repro))
        fields = {}
        for token in self._repro.split():
            key, _, value = token.partition("=")
            fields[key] = (int(value) if key in _INT_KEYS else
                           float(value) if key in _FLOAT_KEYS else value)
        self._fields = fields

    def __getattr__(self, name: str) -> Any:
        fields = object.__getattribute__(self, "_fields")
        key = _ALIASES.get(name, name)
        if key in fields:
            return fields[key]
        raise AttributeError(f"Problem has no key '{name}' (keys: {', '.join(fields)})")

    def fields(self) -> Dict[str, Any]:
        """Every key with its value, in the canonical order."""
        return dict(self._fields)

    def replace(self, **keys: Any) -> "Problem":
        """This problem with some keys changed (sizes derived from them kept consistent). Keys
        by repro name or attribute alias (`heads=`, `in_dtype=` for the keyword `in`, ...)."""
        keys = {_ALIASES.get(k, k): v for k, v in keys.items()}
        try:
            return Problem(_c.pin_problem(self._repro, _pins_text(keys)))
        except ValueError as e:
            raise ValueError(str(e).replace("--pin:", "replace():", 1)) from None

    def __str__(self) -> str:
        return self._repro

    def __repr__(self) -> str:
        return f"ropekv.Problem({self._repro!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Problem) and other._repro == self._repro

    def __hash__(self) -> int:
        return hash(self._repro)


def random_problem(seed: int = 1, index: int = 0, profile: str = "any", max_tokens: int = 256,
                   pin: Union[None, str, Mapping[str, Any]] = None) -> Problem:
    """Case `index` of the fuzz campaign `seed`: what `ropekv fuzz --seed S --profile P --pin ...`
    draws as case `index`. `pin` ({"dn": 512, "cache": "fp8_e4m3fn"} or "dn=512 cache=...") keys
    stay fixed, the rest is random. ValueError when the pins suit no problem of this draw."""
    return Problem(_c.random_problem(seed, index, profile, max_tokens, _pins_text(pin)))


# -------------------------------------------------------------------------------------- cases
def _views(regions, specs) -> Dict[str, _np.ndarray]:
    """numpy views (ml_dtypes for bf16/fp8) into the memory regions, with the case's strides."""
    out = {}
    for name, dtype_name, shape, strides, region, offset in specs:
        dt = NUMPY_DTYPES[dtype_name]
        buf = regions[region]
        out[name] = _np.ndarray(tuple(shape), dtype=dt, buffer=buf, offset=offset,
                                strides=tuple(s * dt.itemsize for s in strides))
    return out


def _torch_dtype(name: str):
    import torch
    table = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
             "fp8_e4m3fn": torch.float8_e4m3fn, "fp8_e4m3fnuz": torch.float8_e4m3fnuz,
             "fp8_e5m2": torch.float8_e5m2, "fp8_e5m2fnuz": torch.float8_e5m2fnuz,
             "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8}
    return table[name]


def _torch_regions(regions, device):
    import torch
    return [torch.from_numpy(r).to(device, copy=True) for r in regions]


def _torch_views(dev_regions, specs):
    import torch
    out = {}
    for name, dtype_name, shape, strides, region, offset in specs:
        dt = _torch_dtype(dtype_name)
        size = torch.empty((), dtype=dt).element_size()
        base = dev_regions[region]
        usable = base[: base.numel() - base.numel() % size].view(dt)
        out[name] = torch.as_strided(usable, tuple(shape), tuple(strides), offset // size)
    return out


class Case:
    """One case in memory (make_case): inputs from the problem's seed, outputs and caches
    poisoned (never zeros), guard bytes around every buffer. `tensors` holds numpy views by
    their golden-file names, with the strides and padding the problem asks for."""

    def __init__(self, data, initial=None):
        self._data = data
        # the state before any call when it is not make_case's (a golden file written from your
        # own inputs); None: make_case of the problem rebuilds it
        self._initial = initial
        self.problem = Problem(data.repro)
        self._regions = data.regions()
        self.tensors: Dict[str, _np.ndarray] = _views(self._regions, data.tensor_specs())

    def clone(self) -> "Case":
        return Case(self._data.clone(), self._initial)

    def to_torch(self, device: Any = "cpu") -> Dict[str, Any]:
        """The tensors as torch tensors on `device`: same shapes, strides and sharing (kv_c and
        k_pe of a fused kv buffer stay views of one allocation), new memory."""
        return _torch_views(_torch_regions(self._regions, device), self._data.tensor_specs())

    def guard_report(self) -> str:
        """'' when every guard byte is intact."""
        return self._data.guard_report()


def make_case(problem: Union[str, Problem]) -> Case:
    """Builds the case of a problem (a Problem or a repro string)."""
    return Case(_c.make_case(str(Problem(problem))))


def _outputs_of(case: Case) -> Dict[str, _np.ndarray]:
    """The tensors a kernel writes for the case's problem (core: golden_output_specs)."""
    return {n: case.tensors[n] for n in _c.output_names(str(case.problem))}


def _pristine(case: Case) -> Case:
    """The case before any call, whatever a kernel has written into case.tensors since: as
    make_case built it (deterministic from the problem), or, for a golden file's case, as the
    file holds it (its inputs may be yours, not make_case's)."""
    if case._initial is not None:
        return Case(case._initial.clone(), case._initial)
    return Case(_c.make_case(str(case.problem)))


def reference(case: Case, backend: str = "ref") -> Dict[str, _np.ndarray]:
    """The outputs the reference writes for this case's problem, from its initial state (what
    make_case built: a kernel may already have written into case.tensors). numpy copies; `case`
    is not changed. backend="sim" runs the GPU kernel's source on the CPU instead."""
    run = _pristine(case)
    _c.run_backend(backend, run._data)
    return {k: v.copy() for k, v in _outputs_of(run).items()}


def run(case: Case, backend: str = "ref") -> str:
    """Runs a compiled-in backend (ref, sim, hip) on the case in place, with the GIL released;
    returns the kernel variant it ran ("reference" for ref)."""
    return _c.run_backend(backend, case._data)


# ---------------------------------------------------------------------------------- compare
def _to_numpy_bits(name: str, value: Any, want: _np.ndarray) -> _np.ndarray:
    """`value` (numpy or torch, any device) as a numpy array with want's dtype; ValueError
    naming the tensor when its shape or dtype differ."""
    if type(value).__module__.startswith("torch"):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        dtype_text = str(t.dtype).replace("torch.", "")
        shape = tuple(t.shape)
        nbytes = t.element_size()
        if nbytes != want.dtype.itemsize or _torch_name(t.dtype) != _dtype_name(want.dtype):
            raise ValueError(f"{name}: expected dtype {_dtype_name(want.dtype)}, got torch.{dtype_text}")
        ints = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}[nbytes]
        import torch
        arr = t.contiguous().view(getattr(torch, ints)).numpy().view(want.dtype)
    else:
        arr = _np.asarray(value)
        if arr.dtype != want.dtype:
            raise ValueError(f"{name}: expected dtype {_dtype_name(want.dtype)}, got {arr.dtype}")
        shape = arr.shape
    if tuple(shape) != want.shape:
        raise ValueError(f"{name}: expected shape {list(want.shape)}, got {list(shape)}")
    return arr


def _dtype_name(dt: _np.dtype) -> str:
    for k, v in NUMPY_DTYPES.items():
        if v == dt:
            return k
    return str(dt)


def _torch_name(dt) -> str:
    for k in NUMPY_DTYPES:
        if _torch_dtype(k) == dt:
            return k
    return str(dt)


class Report:
    """The comparison of one case, region by region (the CLI's report). `passed`, `outcome`
    (PASSED, FAILED, ERRORED, SKIPPED, MISTRUSTED), `regions` (dicts as in the CLI's JSON
    report: name, rule, compared, mismatches, max_ulp, numerics, first_mismatches), `numerics`
    ({rope region: {"exactly": [models matched bit for bit], "within": [models whose bound
    holds]}}), str(report): the text with the replay line."""

    def __init__(self, d: Dict[str, Any], replay: str):
        self.outcome: str = d["outcome"]
        self.passed: bool = self.outcome == "PASSED"
        self.repro: str = d["repro"]
        self.message: str = d["message"]
        self.regions = d["regions"]
        self.numerics = {r["name"]: {"exactly": [m["model"] for m in r["numerics"] if m["bit_exact"]],
                                     "within": [m["model"] for m in r["numerics"] if m["within_bound"]]}
                         for r in self.regions if r["numerics"]}
        self.replay = replay
        self._text = d["text"]

    def __str__(self) -> str:
        return f"{self._text}\n  replay: {self.replay}"

    def __repr__(self) -> str:
        return f"<ropekv.Report {self.outcome} {self.repro}>"

    def assert_ok(self) -> None:
        """AssertionError carrying the report unless the case passed."""
        if not self.passed:
            raise AssertionError(str(self))


def compare(case: Case, outputs: Mapping[str, Any], max_ulp: int = 1, strict: bool = False,
            bitwise: bool = False, numerics: str = "fp32") -> Report:
    """Compares your outputs for `case` with the reference: nope parts and untouched bytes bit
    for bit, rope parts by the ULP rule of core/SPEC.md. `outputs`: q_out and the cache(s) (and
    q_pe / k_pe when in place) by name, numpy or torch on any device, with the case's shapes
    and dtypes; the case's own input views among them are ignored, so compare(case,
    case.tensors) works after a kernel ran in place. The reference runs from the case's initial state (make_case of its
    problem), and bytes of an output outside the op's footprint must still hold that state's
    poison. Nothing of `case` is changed. `numerics` (fp32, operand-products, operand-dtype):
    the rope arithmetic your kernel claims, whose bound judges rope elements (core/SPEC.md);
    report.numerics says, per rope region, which models your values match bit for bit."""
    initial = _pristine(case)
    expected_names = _outputs_of(initial)
    # compare(case, case.tensors): the case's own input views come along and are ignored; any
    # other non-output is an error (q_pe is an output only with inplace_q)
    own_inputs = {n for n, v in outputs.items()
                  if n not in expected_names and v is case.tensors.get(n)}
    unknown = sorted(set(outputs) - set(expected_names) - own_inputs)
    if unknown:
        raise ValueError(f"outputs: expected names among {sorted(expected_names)}, got {unknown}")
    missing = sorted(set(expected_names) - set(outputs))
    if missing:
        raise ValueError(f"outputs: expected every output of the case {sorted(expected_names)}, "
                         f"got no {missing}")
    got = initial.clone()
    for name in expected_names:
        want = got.tensors[name]
        want[...] = _to_numpy_bits(name, outputs[name], want)
    d = _c.compare_with_reference(initial._data, got._data, max_ulp, strict, bitwise, numerics)
    return Report(d, f"ropekv.make_case({str(case.problem)!r})")


# -------------------------------------------------------------------------------------- fuzz
class FuzzSummary:
    """What `fuzz` found: counts, the non-passed cases (dicts of the JSON report: outcome, repro,
    replay, shrunk_repro, shrunk_replay, message, regions) and the whole report."""

    def __init__(self, report: Dict[str, Any], exit_code: int, error: str = ""):
        self.report = report
        self.exit_code = exit_code
        counts = report.get("counts", {})
        self.passed_cases = counts.get("passed", 0)
        self.failed = counts.get("failed", 0)
        self.errored = counts.get("errored", 0)
        self.skipped = counts.get("skipped", 0)
        self.mistrusted = counts.get("mistrusted", 0)
        self.cases = report.get("cases", [])
        self.error = error
        self.passed = exit_code == 0 and self.failed == 0 and self.errored == 0

    def __str__(self) -> str:
        lines = []
        for c in self.cases:
            if c["outcome"] == "SKIPPED":
                continue
            lines.append(f"{c['outcome']} {c['repro']}: {c['message']}")
            lines.append(f"  replay: {c['replay']}")
            if c.get("shrunk_replay"):
                lines.append(f"  shrunk: {c['shrunk_replay']}")
        lines.append(f"{self.passed_cases} passed, {self.failed + self.errored} failed"
                     + (f", {self.skipped} skipped" if self.skipped else ""))
        if self.error:
            lines.append(self.error)
        return "\n".join(lines)

    def assert_ok(self) -> None:
        if not self.passed:
            raise AssertionError(str(self))


def _kernel_name(kernel: Callable) -> str:
    """MODULE:NAME when the kernel can be imported back by that name (what --kernel takes), else
    a description in angle brackets (a lambda, a local function, a functools.partial)."""
    module = getattr(kernel, "__module__", None)
    qual = getattr(kernel, "__qualname__", None)
    if module and qual and "<" not in qual:
        obj = _sys.modules.get(module)
        for part in qual.split("."):
            obj = getattr(obj, part, None)
        if obj is kernel and module != "__main__":
            return f"{module}:{qual}"
    text = repr(kernel).replace("'", "")
    return f"'<{text[:120]}>'"


class CaseTimeout(Exception):
    """A kernel ran past fuzz's case_timeout (the case is ERRORED with this message)."""


def _call_with_timeout(fn: Callable, timeout_s: Optional[float]) -> None:
    """fn() under a SIGALRM timer (main thread only): a kernel stuck in Python code is
    interrupted with CaseTimeout. A kernel blocked inside native code (a hung GPU kernel) is
    interrupted only once it returns to Python."""
    import signal
    import threading
    if not timeout_s or threading.current_thread() is not threading.main_thread():
        fn()
        return

    def on_alarm(signum, frame):
        raise CaseTimeout(f"the kernel ran past case_timeout={timeout_s} s")
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _kernel_runner(kernel: Callable, framework: str, device: Any, case_timeout: Optional[float] = None):
    """The function the C++ backend calls per run: rebuilds the tensors over the run's memory,
    hands them to the kernel in its framework and device, copies every byte back (guards too:
    a write outside the outputs is caught), returns '' or the kernel's Unsupported reason."""
    if framework not in ("numpy", "torch"):
        raise ValueError(f"framework: expected numpy or torch, got {framework!r}")

    def run(regions, specs, repro):
        problem = Problem(repro)
        try:
            if framework == "numpy":
                _call_with_timeout(lambda: kernel(_views(regions, specs), problem), case_timeout)
                return ""
            import torch
            dev = _torch_regions(regions, device)

            def call():
                kernel(_torch_views(dev, specs), problem)
                if dev and dev[0].device.type == "cuda":
                    torch.cuda.synchronize(dev[0].device)
            _call_with_timeout(call, case_timeout)
            for host, d in zip(regions, dev):
                host[...] = d.cpu().numpy()
            return ""
        except Unsupported as e:
            return str(e) or "unsupported"
    return run


def _fuzz_args(cases, seed, profile, pin, json_path, max_tokens, time, max_ulp, strict, bitwise,
               repro, shrink, shrink_time, max_failures, dump, shard, numerics):
    args = ["--seed", str(seed), "--profile", profile, "--max-tokens", str(max_tokens),
            "--max-ulp", str(max_ulp), "--shrink-time", str(shrink_time), "--json", json_path,
            "--max-failures", str(max_failures)]
    if numerics != "fp32":
        args += ["--numerics", str(numerics)]
    if cases is not None:
        args += ["--cases", str(cases)]
    if time is not None:
        args += ["--time", str(time)]
    pins = _pins_text(pin)
    if pins:
        args += ["--pin", pins]
    if strict:
        args.append("--strict")
    if bitwise:
        args.append("--bitwise")
    if repro is not None:
        args += ["--repro", str(Problem(repro))]
    if not shrink:
        args.append("--no-shrink")
    if dump:
        args += ["--dump", str(dump)]
    if shard is not None:
        args += ["--shard", str(shard)]
    return args


def fuzz(kernel: Callable, cases: Optional[int] = None, seed: int = 1, profile: str = "any",
         pin: Union[None, str, Mapping[str, Any]] = None, framework: str = "numpy",
         device: Any = "cpu", json: Optional[str] = None, max_tokens: int = 256,
         time: Optional[str] = None, max_ulp: int = 1, strict: bool = False,
         bitwise: bool = False, repro: Union[None, str, Problem] = None, shrink: bool = True,
         shrink_time: str = "30s", max_failures: int = 0, dump: Optional[str] = None,
         shard: Optional[str] = None, case_timeout: Optional[float] = None,
         numerics: str = "fp32") -> FuzzSummary:
    """Differential fuzzing of your kernel against the reference: the `ropekv fuzz` campaign with
    `kernel(tensors, problem)` as the tested backend. `tensors` are numpy arrays
    (framework="numpy") or torch tensors on `device` (framework="torch"), by their golden names;
    the kernel writes its outputs in place. Failures print a report and a shrunk replay line;
    `json` writes the report (the schema of `ropekv fuzz --json`, so `ropekv report merge` takes
    shards of either; `shard="K/N"` runs case i only when i % N == K). Default 1000 cases unless
    `time` ("60s", "10m") is given. `case_timeout` (seconds): a kernel call running longer is
    interrupted and the case ERRORED with its repro (a kernel stuck in native code is
    interrupted once it returns to Python). `numerics`: the rope arithmetic your kernel claims
    (fp32, operand-products, operand-dtype; core/SPEC.md), whose bound judges rope elements; a
    failing rope region says which models its values match bit for bit."""
    # the backend's name in reports: comma-free (the CLI's --backends A,B syntax)
    name = "python:" + "".join(ch if ch.isalnum() or ch in "._:-" else "_"
                               for ch in _kernel_name(kernel).strip("'<>"))[:80]
    prefix = f"python -m ropekv fuzz --kernel {_kernel_name(kernel)}"
    if framework != "numpy":
        prefix += f" --framework {framework}"
    if str(device) != "cpu":
        prefix += f" --device {device}"
    if case_timeout is not None and not case_timeout > 0:
        raise ValueError(f"case_timeout: expected seconds > 0, got {case_timeout!r}")
    runner = _kernel_runner(kernel, framework, device, case_timeout)
    tmp = None
    if json is None:
        fd, tmp = _tempfile.mkstemp(prefix="ropekv-fuzz-", suffix=".json")
        _os.close(fd)
        _os.unlink(tmp)
    path = json if json is not None else tmp
    args = ["fuzz", "--backends", f"ref,{name}"] + _fuzz_args(
        cases, seed, profile, pin, path, max_tokens, time, max_ulp, strict, bitwise, repro,
        shrink, shrink_time, max_failures, dump, shard, numerics)
    _c.register_python_backend(name, runner, prefix)
    try:
        _sys.stdout.flush()
        _sys.stderr.flush()
        code = _c.cli_main(args)
    finally:
        _c.unregister_backend(name)
    try:
        with open(path) as f:
            report = _json.load(f)
    except FileNotFoundError:
        if code == 2:
            raise ValueError("ropekv.fuzz: the campaign did not start (see the error above)") from None
        raise
    finally:
        if tmp is not None and _os.path.exists(tmp):
            _os.unlink(tmp)
    return FuzzSummary(report, code)
