"""Progress lines of the long commands: a line per interval on stderr (never on stdout, never in a
--json report), the interval made small here with ROPEKV_PROGRESS_INTERVAL (default 10 s):
bench (what it measures, k of n), fuzz (cases, and the shrinking of a failure), and the build
steps of scripts/lib.sh (the time so far and the last [k/n] line).

Run: ROPEKV_BIN=build/ropekv python -m pytest -v tests/python/test_progress.py
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(ropekv_bin, args, interval="0", timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "ROPEKV_PROGRESS_INTERVAL"}
    if interval is not None:
        env["ROPEKV_PROGRESS_INTERVAL"] = interval
    return subprocess.run([ropekv_bin, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def test_bench_says_what_it_measures_on_stderr(ropekv_bin, tmp_path):
    report = tmp_path / "bench.json"
    r = run(ropekv_bin, ["bench", "--backend", "ref", "--case", "deepseek-v3:1", "--cache", "bf16", "--copy-mb", "1",
                         "--budget", "0.01", "--json", report])
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert "bench: measuring 1 of 2: deepseek-v3:1 cache=bf16, mode copy, variant auto" in lines, r.stderr
    assert "bench: measuring 2 of 2: deepseek-v3:1 cache=bf16, mode zero_copy, variant auto" in lines, r.stderr
    assert any(line.startswith("bench: measuring the copy reference") for line in lines), r.stderr
    assert not [line for line in r.stdout.splitlines() if line.startswith("bench: ")], r.stdout
    assert "bench: measuring" not in report.read_text() and len(json.loads(report.read_text())["results"]) == 2


def test_bench_is_quiet_within_the_default_interval(ropekv_bin):
    r = run(ropekv_bin, ["bench", "--backend", "ref", "--case", "deepseek-v3:1", "--cache", "bf16", "--copy-mb", "1",
                         "--budget", "0.01"], interval=None)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


def test_shrinking_a_failure_prints_progress(ropekv_bin, tmp_path):
    # ref vs sim with --bitwise has FAILED cases in this stream (tests/python/test_fuzz_jobs.py)
    report = tmp_path / "r.json"
    r = run(ropekv_bin, ["fuzz", "--backends", "ref,sim", "--bitwise", "--cases", "24", "--max-tokens", "8", "--seed",
                         "11", "--max-failures", "1", "--shrink-time", "10s", "--json", report])
    assert r.returncode == 1, r.stdout + r.stderr
    shrinking = [line for line in r.stderr.splitlines() if line.startswith("shrinking case ")]
    assert shrinking, r.stderr
    assert "step 0, try 1, tokens " in shrinking[0] and "s of 10s" in shrinking[0], shrinking[0]
    assert "shrinking" not in r.stdout and "progress:" not in r.stdout
    assert "shrinking" not in report.read_text()


def test_fuzz_progress_goes_to_stderr(ropekv_bin):
    r = run(ropekv_bin, ["fuzz", "--backends", "ref,ref", "--cases", "3", "--max-tokens", "4"])
    assert r.returncode == 0, r.stderr
    assert [line.split(",")[0] for line in r.stderr.splitlines()] == ["progress: 1 cases", "progress: 2 cases",
                                                                       "progress: 3 cases"], r.stderr
    assert r.stdout.splitlines()[-1] == "3 passed, 0 failed"


@pytest.mark.parametrize("value", ["", "abc", "-1", "1e3", "inf", "nan", "0x10", "1.5s"])
def test_a_malformed_interval_is_an_error(ropekv_bin, tmp_path, value):
    for args in (["fuzz", "--backends", "ref,ref", "--cases", "1", "--json", tmp_path / "r.json"],
                 ["bench", "--backend", "ref", "--case", "deepseek-v3:1", "--copy-mb", "1", "--json", tmp_path / "b.json"]):
        r = run(ropekv_bin, args, interval=value)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stdout == ""
        assert r.stderr.splitlines() == [f"ropekv: error: ROPEKV_PROGRESS_INTERVAL: expected a number of seconds >= 0 "
                                         f"between progress lines (unset: 10), got '{value}'"]
    assert list(tmp_path.iterdir()) == []


def test_build_steps_print_progress(tmp_path):
    # scripts/lib.sh's run_with_progress, as setup.sh runs the build with it
    log = tmp_path / "build.log"
    script = (f"source {REPO / 'scripts' / 'lib.sh'}\n"
              f"run_with_progress 'setup: building' {log} "
              "bash -c 'echo \"[1/3] Building a\"; sleep 0.6; echo \"[2/3] Building b\"; sleep 0.6; exit 3'\n"
              "echo \"rc=$?\"\n")
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "ROPEKV_PROGRESS_INTERVAL": "0.2"})
    assert r.stdout == "rc=3\n", r.stdout + r.stderr  # the command's status; its output in the log
    lines = r.stderr.splitlines()
    assert len(lines) >= 3, r.stderr
    assert all(line.startswith("setup: building, ") for line in lines), r.stderr
    assert lines[0].endswith("s: [1/3] Building a") and lines[-1].endswith("s: [2/3] Building b"), r.stderr
    assert log.read_text() == "[1/3] Building a\n[2/3] Building b\n"
