"""pytest helpers: a fuzz campaign as test items, one per case, each failing with its report.

    import pytest, ropekv.testing as rt

    @pytest.mark.parametrize("problem", rt.problems(cases=200, seed=1, pin={"dn": 512}))
    def test_my_kernel(problem):
        rt.check(my_kernel, problem)           # AssertionError with the report and shrunk replay
"""
from typing import Any, Callable, List, Mapping, Optional, Union

from . import Problem, fuzz, random_problem


def problems(cases: int = 100, seed: int = 1, profile: str = "any", max_tokens: int = 64,
             pin: Union[None, str, Mapping[str, Any]] = None) -> List[Any]:
    """The campaign's problems as pytest params (id = case index); cases whose pins suit no
    problem of that draw are left out."""
    import pytest
    out = []
    for i in range(cases):
        try:
            p = random_problem(seed, i, profile, max_tokens, pin)
        except ValueError:
            continue
        out.append(pytest.param(p, id=f"case{i}"))
    return out


def check(kernel: Callable, problem: Union[str, Problem], framework: str = "numpy",
          device: Any = "cpu", max_ulp: int = 1, strict: bool = False, shrink_time: str = "10s",
          pin: Union[None, str, Mapping[str, Any]] = None, profile: str = "any") -> None:
    """Runs `kernel` on the problem's case through the fuzzer (poison, guards, comparison; a
    failure is shrunk inside `profile` and `pin`) and raises AssertionError with the report."""
    summary = fuzz(kernel, repro=problem, framework=framework, device=device, max_ulp=max_ulp,
                   strict=strict, shrink_time=shrink_time, pin=pin, profile=profile)
    if summary.skipped and not summary.failed and not summary.errored:
        import pytest
        pytest.skip("kernel: " + "; ".join(c["message"] for c in summary.cases))
    summary.assert_ok()
