"""The reference through Python costs what it costs through the CLI: `ropekv run` (one call,
host clock) and ropekv.run(case) on the same problem, alternating, N times each; medians.
    build/venv/bin/python bench/python_vs_cli.py [--preset deepseek-v3-tp8] [--tokens 4096] [--runs 7]
"""
import argparse
import json
import re
import statistics
import subprocess
import time

import ropekv

ap = argparse.ArgumentParser()
ap.add_argument("--ropekv", default="build/ropekv")
ap.add_argument("--preset", default="deepseek-v3-tp8")
ap.add_argument("--tokens", type=int, default=4096)
ap.add_argument("--runs", type=int, default=7)
ap.add_argument("--json")
a = ap.parse_args()

cli_ms, py_ms, repro = [], [], None
for _ in range(a.runs):
    out = subprocess.run([a.ropekv, "run", "--preset", a.preset, "--tokens", str(a.tokens)],
                         check=True, capture_output=True, text=True).stdout
    cli_ms.append(float(re.search(r"time: ([0-9.]+) ms", out).group(1)))
    repro = re.search(r"--repro '([^']+)'", out).group(1)
    case = ropekv.make_case(repro)
    t0 = time.perf_counter()
    ropekv.run(case)
    py_ms.append((time.perf_counter() - t0) * 1e3)
cli, py = statistics.median(cli_ms), statistics.median(py_ms)
result = {"preset": a.preset, "tokens": a.tokens, "runs": a.runs, "cli_ms": cli_ms, "python_ms": py_ms,
          "cli_median_ms": cli, "python_median_ms": py, "ratio": py / cli, "commit": ropekv._c.commit}
print(f"{a.preset} x {a.tokens}: CLI `ropekv run` median {cli:.2f} ms, Python ropekv.run median "
      f"{py:.2f} ms, ratio {py / cli:.3f} ({a.runs} runs each, alternating)")
if a.json:
    with open(a.json, "w") as f:
        json.dump(result, f, indent=2)
