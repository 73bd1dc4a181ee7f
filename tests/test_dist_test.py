"""mldebug dist-test on real gloo ranks: success, and a rank that skips the all_reduce."""

from __future__ import annotations

import re
import time

import pytest
from conftest import run_cli

pytestmark = pytest.mark.slow


def test_four_ranks_pass():
    r = run_cli("dist-test", "--nproc", "4", "--timeout", "60", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    oks = re.findall(r"^\[(\S+):(\d)\] OK \(global rank (\d)/4\)$", r.stdout, re.M)
    assert sorted(int(g[2]) for g in oks) == [0, 1, 2, 3]
    assert re.search(r"torch \S+, CUDA \S+, NCCL \S+, backend gloo, world size 4", r.stdout)
    assert "mldebug dist-test: all ranks OK" in r.stdout


def test_single_process_world():
    r = run_cli("dist-test", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK (global rank 0/1)" in r.stdout


def test_a_rank_skipping_all_reduce_is_a_timeout_naming_the_collective():
    t = time.monotonic()
    r = run_cli("dist-test", "--nproc", "3", "--timeout", "5", "--fault", "skip-allreduce:1",
                timeout=300)
    elapsed = time.monotonic() - t
    assert r.returncode == 1
    timeouts = re.findall(r"TIMEOUT \(global rank (\d)/3\): all_reduce did not complete within 5s",
                          r.stdout)
    assert sorted(timeouts) == ["0", "2"], r.stdout
    assert "mldebug dist-test: FAILED" in r.stdout
    assert elapsed < 60, elapsed  # the 5 s timeout plus start-up, not a hang


def test_bad_arguments():
    r = run_cli("dist-test", "--nproc", "0")
    assert r.returncode == 2 and "--nproc must be at least 1" in r.stderr
    r = run_cli("dist-test", "--timeout", "0")
    assert r.returncode == 2
