"""`python -m ropekv fuzz --kernel MODULE:FUNCTION [--framework torch] [--device cuda] [fuzz flags]`:
the `ropekv fuzz` CLI with your Python kernel as the tested backend (--case-timeout SECONDS:
a kernel call running longer is ERRORED). Every flag of `ropekv fuzz
--help` after these applies (--cases, --time, --seed, --profile, --pin, --repro, --json, ...).
Any other subcommand is the `ropekv` CLI itself (`python -m ropekv info`)."""
import argparse
import importlib
import sys

from . import _c, _kernel_runner


class UsageError(Exception):
    """Bad usage: exit 2, as the ropekv CLI does (1 means test failures)."""


def load_kernel(spec: str):
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--kernel: expected MODULE:FUNCTION, got '{spec}'")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(f"--kernel: cannot import '{module_name}': {e}")
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"--kernel: '{module_name}' has no '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"--kernel: '{spec}' is not callable")
    return obj


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "fuzz" or "--kernel" not in " ".join(argv):
        return _c.cli_main(argv)
    parser = argparse.ArgumentParser(prog="python -m ropekv fuzz", add_help=False)
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--framework", default="numpy", choices=["numpy", "torch"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--case-timeout", type=float, default=None)
    known, rest = parser.parse_known_args(argv[1:])
    if any(a == "--backends" or a.startswith("--backends=") for a in rest):
        print("ropekv: error: --backends: expected none with --kernel (the tested side is the kernel, "
              "the other the reference), got one", file=sys.stderr)
        return 2
    sys.path.insert(0, "")
    try:
        kernel = load_kernel(known.kernel)
    except UsageError as e:
        print(f"ropekv: error: {e}", file=sys.stderr)
        return 2
    name = "python:" + known.kernel
    prefix = f"python -m ropekv fuzz --kernel {known.kernel}"
    if known.framework != "numpy":
        prefix += f" --framework {known.framework}"
    if known.device != "cpu":
        prefix += f" --device {known.device}"
    _c.register_python_backend(name, _kernel_runner(kernel, known.framework, known.device, known.case_timeout), prefix)
    try:
        sys.stdout.flush()
        return _c.cli_main(["fuzz", "--backends", f"ref,{name}"] + rest)
    finally:
        _c.unregister_backend(name)


if __name__ == "__main__":
    sys.exit(main())
