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


def test_json_carries_findings_with_code_and_fix():
    import json

    r = run_cli("dist-test", "--nproc", "3", "--timeout", "5", "--fault", "skip-allreduce:1",
                "--json", timeout=300)
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    (f,) = [f for f in doc["findings"] if f["code"] == "dist-test-timeout"]
    assert f["title"] == "all_reduce did not complete on ranks 0,2" and f["fix"]
    assert {x["rank"]: x["status"] for x in doc["ranks"]} == {0: "timeout", 2: "timeout"}
    # rank 1 (the one that skipped) was ended by torchrun when the others failed
    (m,) = [f for f in doc["findings"] if f["code"] == "dist-test-missing-ranks"]
    assert m["title"] == "rank 1 of 3 never reported" and m["fix"]


def test_nccl_without_cuda_is_one_fail_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = run_cli("dist-test", "--nproc", "2", "--backend", "nccl", timeout=120)
    assert r.returncode == 1
    assert r.stdout.count("FAIL") == 1 and "backend nccl needs CUDA" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr
    r = run_cli("dist-test", "--backend", "nccl", timeout=120)
    assert r.returncode == 1 and "FAIL (global rank 0/1): backend nccl needs CUDA" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


def test_the_local_launch_listens_on_loopback_only():
    import subprocess
    import sys

    import psutil
    from conftest import REPO

    env = dict(__import__("os").environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "mldebug", "dist-test", "--nproc", "2",
                             "--timeout", "60"], stdout=subprocess.PIPE, text=True, env=env,
                            cwd=REPO)
    listening: set[str] = set()
    try:
        while proc.poll() is None:
            try:
                tree = {proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))}
            except psutil.NoSuchProcess:
                break
            for c in psutil.net_connections("inet"):
                if c.status == psutil.CONN_LISTEN and c.pid in tree:
                    listening.add(c.laddr.ip)
            time.sleep(0.2)
        out = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0 and "all ranks OK" in out, out
    assert listening <= {"127.0.0.1", "::1"}, listening
