"""mldebug mem top: analysis on node documents, a real leaking torchrun job, the local cluster."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli
from jobs import RECIPES, free_port, torchrun

from mldebug.fanout import NodeResult
from mldebug.memory.node import parse_compute_apps
from mldebug.memory.top import analyze_top

MiB = 1024**2
GiB = 1024**3


def proc(pid, rank, rss0, rss1, gpu0=None, gpu1=None, job="j1", seconds=5.0):
    ident = {"rank": rank, "local_rank": rank % 8, "run_id": job, "launcher": "torchrun"}
    g0 = {"GPU-a": gpu0} if gpu0 is not None else {}
    g1 = {"GPU-a": gpu1} if gpu1 is not None else {}
    steps = 6
    samples = [[seconds * k / (steps - 1), rss0 + (rss1 - rss0) * k // (steps - 1), rss0 // 2,
                g1 if k == steps - 1 else g0] for k in range(steps)]
    return {"pid": pid, "cmdline": ["python", "train.py"], "identity": ident, "samples": samples}


def node(host, procs):
    return NodeResult(host, data={"host": host, "processes": procs, "errors": [],
                                  "gpu_source": "nvidia-smi"})


def test_leaking_and_imbalanced_ranks_are_named_at_scale():
    results = []
    for h in range(1000):  # 1,000 nodes x 8 ranks
        procs = []
        for lr in range(8):
            rank = h * 8 + lr
            rss1 = 2 * GiB + (100 * MiB if rank == 4242 else 0)
            gpu = 60 * GiB if rank == 17 else 20 * GiB
            procs.append(proc(10_000 + lr, rank, 2 * GiB, rss1, gpu, gpu))
        results.append(node(f"node{h + 1}", procs))
    results.append(NodeResult("node1001", error="unreachable: ssh connection timed out"))
    rep = analyze_top(results, watch=5.0)
    by_code = {f.code: f for f in rep.findings}
    assert by_code["mem-rss-leak"].title.startswith("rank 4242 of job j1")
    assert by_code["mem-rss-leak"].hosts == ("node531",)
    assert by_code["mem-gpu-imbalance"].title.startswith("rank 17 of job j1")
    assert by_code["mem-node-unanswered"].hosts == ("node1001",)
    assert "mem-gpu-leak" not in by_code and "mem-rss-imbalance" not in by_code
    assert len(rep.jobs) == 1 and rep.jobs[0].ranks == 8000


def test_every_rank_leaking_is_one_finding_and_no_watch_no_leak():
    results = [node("n1", [proc(p, p, GiB, GiB + 200 * MiB) for p in range(4)])]
    leaks = [f for f in analyze_top(results, watch=5.0).findings if f.code == "mem-rss-leak"]
    assert len(leaks) == 1 and leaks[0].title.startswith("every rank of job j1")
    assert not [f for f in analyze_top(results, watch=0).findings if f.code.endswith("leak")]


def test_two_jobs_are_judged_apart():
    results = [node("n1", [proc(1, 0, GiB, GiB, job="a"), proc(2, 1, GiB, GiB, job="a"),
                           proc(3, 0, 9 * GiB, 9 * GiB, job="b"), proc(4, 1, 9 * GiB, 9 * GiB,
                                                                      job="b")])]
    rep = analyze_top(results, watch=0)
    assert sorted(j.job for j in rep.jobs) == ["a", "b"]
    assert not [f for f in rep.findings if "imbalance" in f.code]


def test_parse_nvidia_smi_compute_apps():
    text = ("12345, 40200, GPU-3f2a\n12345, 1024, GPU-77aa\n23456, [N/A], MIG-1234\n"
            "garbage line\n")
    assert parse_compute_apps(text) == {12345: {"GPU-3f2a": 40200 * MiB, "GPU-77aa": 1024 * MiB}}


@pytest.mark.slow
def test_four_rank_job_one_rank_leaking_20mb_per_s(tmp_path):
    job = torchrun("memory_leak.py", 4, tmp_path / "job.log", "--job", "--leak-rank", "2",
                   "--rate", "20", "--seconds", "120")
    try:
        pids = job.wait_ready(settle=1)
        r = run_cli("mem", "top", "--watch", "5", "--pid", str(job.pid), "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert sorted(p["rank"] for p in doc["processes"]) == [0, 1, 2, 3]
        leaks = [f for f in doc["findings"] if f["code"] == "mem-rss-leak"]
        assert len(leaks) == 1 and leaks[0]["title"].startswith("rank 2 of job")
        rates = {p["rank"]: p["rss_rate"] for p in doc["processes"]}
        assert 10 * MiB < rates[2] < 30 * MiB and max(rates[0], rates[1], rates[3]) < MiB
        assert f"pid {pids[2]}" in leaks[0]["detail"]
        r = run_cli("mem", "top", "--pid", str(job.pid))  # human output, no watch
        assert r.returncode == 0 and "4 rank processes" in r.stdout
    finally:
        job.stop()


@pytest.mark.cluster
@pytest.mark.slow
def test_cluster_two_nodes_names_the_leaking_rank_and_host(cluster):
    port = free_port()
    logs = ("/tmp/mldebug-test-mem-node1.log", "/tmp/mldebug-test-mem-node2.log")
    try:
        for i, (name, log) in enumerate(zip(("node1", "node2"), logs, strict=True)):
            Path(log).unlink(missing_ok=True)
            cluster.spawn(name, (
                f"env GLOO_SOCKET_IFNAME=lo {sys.executable} -m torch.distributed.run "
                f"--nnodes 2 --nproc_per_node 1 --node_rank {i} --master_addr 127.0.1.1 "
                f"--master_port {port} {RECIPES / 'memory_leak.py'} --job --leak-rank 1 "
                "--rate 10 --seconds 120"), log)
        deadline = time.monotonic() + 120
        while sum(Path(x).read_text().count(" ready") for x in logs if Path(x).exists()) < 2:
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.5)
        r = run_cli("mem", "top", "--nodes", "node[1-2]", "--watch", "4", "--json",
                    "--pattern", "memory_leak.py", env=cluster.env())
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert sorted((p["host"], p["rank"]) for p in doc["processes"]) == [
            ("node1", 0), ("node2", 1)]
        leaks = [f for f in doc["findings"] if f["code"] == "mem-rss-leak"]
        assert len(leaks) == 1 and leaks[0]["title"].startswith("rank 1 of job")
        assert leaks[0]["hosts"] == ["node2"]
    finally:
        for name in ("node1", "node2"):
            cluster.ssh(name, "pkill -9 -f memory_leak.py || true", check=False)
