"""Fuzzing a plain PyTorch implementation with ropekv, as a user's own test would:

    pytest examples/pytorch_unfused

The implementation passes 2000 random cases against ropekv's exact reference; each planted bug
fails with a shrunk repro (the smallest problem that still fails) and its one-line replay."""
import functools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import mla_rope_cache  # noqa: E402

import ropekv  # noqa: E402

CASES = int(os.environ.get("ROPEKV_EXAMPLE_CASES", "2000"))


def test_fuzz_passes():
    summary = ropekv.fuzz(mla_rope_cache.mla_rope_cache_concat, cases=CASES, seed=1,
                          framework="torch", max_tokens=64)
    summary.assert_ok()
    assert summary.passed_cases + summary.skipped == CASES
    assert summary.passed_cases >= 0.99 * CASES


@pytest.mark.parametrize("bug", ["neox_partner", "slot_off_by_one", "no_q_scale"])
def test_planted_bug_fails_with_a_shrunk_repro(bug, capfd):
    kernel = functools.partial(mla_rope_cache.mla_rope_cache_concat, bug=bug)
    summary = ropekv.fuzz(kernel, cases=500, seed=1, framework="torch", max_tokens=64,
                          max_failures=1, shrink_time="20s")
    assert not summary.passed
    # a wrong value FAILS the comparison; an exception in the kernel (an index past the cache)
    # makes the case ERRORED: both are failures, both are shrunk
    failed = [c for c in summary.cases if c["outcome"] in ("FAILED", "ERRORED")]
    assert failed, str(summary)
    shrunk = failed[0]["shrunk_repro"]
    assert shrunk, "the failure was not shrunk"
    small, big = ropekv.Problem(shrunk), ropekv.Problem(failed[0]["repro"])
    assert small.tq * small.h <= big.tq * big.h and small.ts <= big.ts
    assert failed[0]["shrunk_replay"].startswith("python -m ropekv fuzz --kernel ")
    # the shrunk problem still fails when replayed, and is reported with that replay line
    replay = ropekv.fuzz(kernel, repro=shrunk, framework="torch", shrink=False)
    assert replay.failed + replay.errored == 1
    with pytest.raises(AssertionError, match="replay: python -m ropekv fuzz"):
        replay.assert_ok()
    print(f"{bug}: {failed[0]['outcome']}, shrunk to {shrunk}")
