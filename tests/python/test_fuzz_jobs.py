"""Sharded campaigns end to end: N shard reports merged equal the unsharded run; `fuzz --jobs N`
equals its N shards merged by hand (and the unsharded run); a worker that dies fails the campaign;
SIGINT reaches every worker and the campaign does not pass.

Run: ROPEKV_BIN=build/ropekv python -m pytest -v tests/python/test_fuzz_jobs.py
"""
import json
import os
import signal
import subprocess
import time

import pytest

# ref vs sim with --bitwise: sim's rope arithmetic is not ref's bit for bit on every case, so the
# campaign has FAILED cases (listed, with replay lines) among passed ones; --no-shrink keeps the
# listed cases independent of timing
CAMPAIGN = ["fuzz", "--backends", "ref,sim", "--bitwise", "--cases", "24", "--max-tokens", "8", "--seed", "11",
            "--no-shrink"]


def run(ropekv_bin, *args, timeout=300):
    return subprocess.run([ropekv_bin, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def same_campaign(report):
    """What runs of one campaign must agree on: everything but timings and shard bookkeeping."""
    cases = [{k: c[k] for k in ("index", "outcome", "repro", "replay", "message", "variant", "regions")}
             for c in report["cases"]]
    return {"config": report["config"], "counts": report["counts"], "skip_reasons": report["skip_reasons"],
            "variants": report["variants"], "numerics": report["numerics"], "summary": report["summary"],
            "cases": cases}


def shards_without_time(report):
    return [{k: v for k, v in sh.items() if k != "elapsed_s"} for sh in report["shards"]]


def unsharded(ropekv_bin, tmp_path):
    path = tmp_path / "whole.json"
    r = run(ropekv_bin, *CAMPAIGN, "--json", path)
    assert r.returncode in (0, 1), r.stderr
    return r, json.loads(path.read_text())


def merged_by_hand(ropekv_bin, tmp_path, n):
    paths = []
    for k in range(n):
        path = tmp_path / f"shard-{k}-of-{n}.json"
        r = run(ropekv_bin, *CAMPAIGN, "--shard", f"{k}/{n}", "--json", path)
        assert r.returncode in (0, 1), r.stderr
        paths.append(path)
    out = tmp_path / f"merged-{n}.json"
    r = run(ropekv_bin, "report", "merge", *reversed(paths), "--json", out)  # in any order
    assert r.returncode in (0, 1), r.stderr
    return r, json.loads(out.read_text())


def test_four_shards_merged_equal_the_unsharded_run(ropekv_bin, tmp_path):
    whole_run, whole = unsharded(ropekv_bin, tmp_path)
    assert whole["counts"]["failed"] > 0 and whole["counts"]["passed"] > 0, whole["counts"]  # a campaign worth merging
    merge_run, merged = merged_by_hand(ropekv_bin, tmp_path, 4)
    assert same_campaign(merged) == same_campaign(whole)
    assert [sh["index"] for sh in merged["shards"]] == [0, 1, 2, 3]
    assert sum(sh["cases_run"] for sh in merged["shards"]) == whole["counts"]["total"] == 24
    assert merged["interrupted"] is False
    assert merge_run.returncode == whole_run.returncode == 1
    assert merge_run.stdout.splitlines()[-1] == whole_run.stdout.splitlines()[-1] == whole["summary"]


def test_jobs_equal_their_shards_merged_and_the_unsharded_run(ropekv_bin, tmp_path):
    whole_run, whole = unsharded(ropekv_bin, tmp_path)
    _, by_hand = merged_by_hand(ropekv_bin, tmp_path, 3)
    out = tmp_path / "jobs.json"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    jobs = subprocess.run([ropekv_bin, *CAMPAIGN, "--jobs", "3", "--json", str(out)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TMPDIR": str(tmp)})
    assert list(tmp.iterdir()) == [], "the workers' reports were left behind"
    assert jobs.returncode == whole_run.returncode == 1, jobs.stderr
    report = json.loads(out.read_text())
    assert same_campaign(report) == same_campaign(by_hand) == same_campaign(whole)
    assert shards_without_time(report) == shards_without_time(by_hand)
    assert report["interrupted"] is False
    lines = jobs.stdout.splitlines()
    assert lines[-1] == whole["summary"]
    # every worker's lines, prefixed; every failure printed with its replay line
    for k in range(3):
        assert any(line.startswith(f"[shard {k}/3] ") for line in lines), k
    for case in whole["cases"]:
        if case["outcome"] in ("FAILED", "ERRORED"):
            assert any(line.endswith("replay: " + case["replay"]) for line in lines), case["replay"]


def test_jobs_one_worker_equals_the_unsharded_run(ropekv_bin, tmp_path):
    _, whole = unsharded(ropekv_bin, tmp_path)
    out = tmp_path / "jobs1.json"
    r = run(ropekv_bin, *CAMPAIGN, "--jobs", 1, "--json", out)
    assert r.returncode == 1, r.stderr
    report = json.loads(out.read_text())
    assert same_campaign(report) == same_campaign(whole)
    assert shards_without_time(report) == shards_without_time(whole)


def children_of(pid):
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            kids.append(int(entry))
    return kids


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_long_campaign(ropekv_bin, tmp_path, jobs):
    out = tmp_path / "long.json"
    p = subprocess.Popen([ropekv_bin, "fuzz", "--backends", "ref,ref", "--time", "120s", "--max-tokens", "8",
                          "--jobs", str(jobs), "--json", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    workers = []
    while time.time() < deadline and len(workers) < jobs:
        time.sleep(0.1)
        workers = children_of(p.pid)
    assert len(workers) == jobs, f"workers did not start: {workers}"
    time.sleep(1.0)  # let them begin their campaigns
    return p, out, workers


def test_a_killed_worker_fails_the_campaign(ropekv_bin, tmp_path):
    p, out, workers = start_long_campaign(ropekv_bin, tmp_path, 2)
    # which worker is shard 1: its command line ends with its report shard-1.json
    shard1 = next(w for w in workers if open(f"/proc/{w}/cmdline").read().split("\0")[-2].endswith("shard-1.json"))
    os.kill(shard1, signal.SIGKILL)
    stdout, stderr = p.communicate(timeout=60)  # the other worker is stopped, not waited out
    assert p.returncode == 2, (p.returncode, stderr)
    last = stderr.splitlines()[-1]
    assert last.startswith("ropekv: error: --jobs: expected every worker to end with its report"), last
    assert "worker 1 (shard 1/2): killed by signal 9" in last, last
    assert not out.exists()
    assert not any(alive(w) for w in workers)


def test_sigint_reaches_every_worker_and_the_campaign_does_not_pass(ropekv_bin, tmp_path):
    p, out, workers = start_long_campaign(ropekv_bin, tmp_path, 2)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGINT, (p.returncode, stderr)
    assert not any(alive(w) for w in workers)
    if out.exists():  # every worker wrote its report: the merge says the campaign was interrupted
        assert json.loads(out.read_text())["interrupted"] is True
    else:
        assert "ropekv: error: --jobs" in stderr.splitlines()[-1], stderr
