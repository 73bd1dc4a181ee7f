"""mldebug mem peak (whole process tree) and mem probe (safe allocation ceiling), for real."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from mldebug.memory import cgroup

MiB = 1024**2
TREE = str(Path(__file__).parent / "fixtures" / "memory" / "tree.py")


def _cgroup_ok() -> bool:
    try:
        g = cgroup.create("test")
    except cgroup.CgroupUnavailable:
        return False
    g.remove()
    return True


needs_cgroup = pytest.mark.skipif(not _cgroup_ok(), reason="no writable memory cgroup (root)")


def peak_json(*args: str) -> tuple[dict, subprocess.CompletedProcess[str]]:
    r = run_cli("mem", "peak", "--json", *args)
    out = r.stdout[r.stdout.index("{"):]
    return json.loads(out), r


@needs_cgroup
def test_grandchild_400mb_within_10_percent_cgroup():
    doc, r = peak_json("--", sys.executable, TREE, "3", "400", "1")
    assert r.returncode == 0, r.stderr
    assert doc["method"].startswith("cgroup")
    assert 400 * MiB <= doc["peak"] <= 440 * MiB
    assert doc["oom_kills"] == 0


@needs_cgroup
def test_four_workers_time_under_reports_tree_does_not():
    doc, r = peak_json("--", sys.executable, TREE, "3", "400", "4")
    assert r.returncode == 0, r.stderr
    assert 400 * MiB <= doc["peak"] <= 480 * MiB
    assert doc["largest_process"] < 150 * MiB
    assert "mem-tree-vs-process" in {f["code"] for f in doc["findings"]}
    if shutil.which("time") or os.path.exists("/usr/bin/time"):
        t = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, TREE, "3", "400", "4"],
                           capture_output=True, text=True, timeout=120)
        kb = int(t.stderr.strip().splitlines()[-1])
        assert kb * 1024 < 0.5 * doc["peak"]  # /usr/bin/time sees one worker, not the tree


def test_sampling_method_and_exit_code_passthrough():
    doc, r = peak_json("--method", "sampling", "--interval", "0.02", "--",
                       sys.executable, TREE, "3", "200", "1")
    assert doc["method"] == "sampling" and "misses spikes" in doc["method_note"]
    assert 180 * MiB <= doc["peak"] <= 260 * MiB
    r = run_cli("mem", "peak", "--", "sh", "-c", "exit 7")
    assert r.returncode == 7 and "exit code 7" in r.stderr
    r = run_cli("mem", "peak", "--", "sh", "-c", "kill -9 $$")
    assert r.returncode == 137 and "SIGKILL" in r.stderr
    r = run_cli("mem", "peak")
    assert r.returncode == 2 and "no command to run" in r.stderr


@needs_cgroup
def test_oom_kill_in_the_tree_is_reported(tmp_path):
    parent = cgroup.create("test-oom")
    try:
        parent.set_limit(300 * MiB)
        code = ("import sys,subprocess; sys.exit(subprocess.call(sys.argv[1:]))")
        cmd = [sys.executable, "-m", "mldebug", "mem", "peak", "--json", "--",
               sys.executable, "-c", code, sys.executable, TREE, "1", "600", "1"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO,
                           env=dict(os.environ, PYTHONPATH=str(REPO)),
                           preexec_fn=lambda: parent.add(os.getpid()))
        doc = json.loads(r.stdout[r.stdout.index("{"):])
        assert doc["oom_kills"] >= 1, doc
        assert "mem-oom-killed" in {f["code"] for f in doc["findings"]}
    finally:
        parent.remove()


@needs_cgroup
def test_probe_in_a_512mib_cgroup_names_the_limit():
    parent = cgroup.create("test-probe")
    try:
        parent.set_limit(512 * MiB)
        r = subprocess.run([sys.executable, "-m", "mldebug", "mem", "probe", "--json"],
                           capture_output=True, text=True, timeout=300, cwd=REPO,
                           env=dict(os.environ, PYTHONPATH=str(REPO)),
                           preexec_fn=lambda: parent.add(os.getpid()))
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["cgroup_limit"] == 512 * MiB and doc["max_from"] == "the cgroup limit"
        assert doc["stopped_by"] == "cgroup-limit"
        assert 400 * MiB <= doc["allocated"] <= 512 * MiB
        assert doc["findings"][0]["code"] == "mem-probe-cgroup-limit"
        assert str(parent.path) in doc["findings"][0]["title"]
    finally:
        parent.remove()


def test_probe_stops_at_max():
    r = run_cli("mem", "probe", "--max", "96MiB", "--step", "32MiB", "--json")
    doc = json.loads(r.stdout)
    assert (doc["allocated"], doc["stopped_by"], doc["max_from"]) == (96 * MiB, "max", "--max")
    r = run_cli("mem", "probe", "--step", "lots")
    assert r.returncode == 2 and "cannot read the size" in r.stderr


def test_probe_default_max_is_a_tenth_of_memavailable_or_4gib():
    """#39: the default once took all available memory of a shared node."""
    from mldebug.memory.probe import GiB, default_max, mem_available

    meminfo = "MemTotal:       263767000 kB\nMemFree:  1000 kB\nMemAvailable:   20971520 kB\n"
    assert mem_available(meminfo) == 20 * GiB
    assert mem_available("MemTotal: 1 kB\n") is None
    assert default_max(20 * GiB) == (2 * GiB, "10% of available memory")
    assert default_max(200 * GiB) == (4 * GiB, "the 4 GiB default cap")
    assert default_max(200 * GiB, 512 * MiB) == (512 * MiB, "the cgroup limit")
    assert default_max(20 * GiB, 8 * GiB) == (2 * GiB, "10% of available memory")
    assert default_max(mem_available(meminfo) or 0) == (2 * GiB, "10% of available memory")


def test_probe_cuda_without_a_gpu_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        r = run_cli("mem", "probe", "--device", "cuda", "--step", "1GiB", "--max", "4GiB",
                    "--json")
        doc = json.loads(r.stdout)
        assert (doc["allocated"], doc["stopped_by"]) == (4 * 1024 * MiB, "max")
        return
    r = run_cli("mem", "probe", "--device", "cuda", timeout=300)
    assert r.returncode == 1 and "needs torch with a CUDA device" in r.stderr
