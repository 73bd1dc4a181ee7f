"""mldebug hang across nodes: a 2-node x 2-rank torchrun job on the local sshd cluster."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli
from jobs import RECIPES, free_port, slow_python

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

LOGS = ("/tmp/mldebug-test-mn-node1.log", "/tmp/mldebug-test-mn-node2.log")


@pytest.fixture(scope="module")
def two_node_job(cluster):
    port = free_port()
    for i, (node, log) in enumerate(zip(("node1", "node2"), LOGS, strict=True)):
        Path(log).unlink(missing_ok=True)
        cluster.spawn(node, (
            f"env GLOO_SOCKET_IFNAME=lo {sys.executable} -m torch.distributed.run --nnodes 2 "
            f"--nproc_per_node 2 --node_rank {i} --master_addr 127.0.1.1 --master_port {port} "
            f"{RECIPES / 'collective_mismatch.py'} --timeout 600"), log)
    deadline = time.monotonic() + 120
    while sum(Path(log).read_text().count(" ready") for log in LOGS if Path(log).exists()) < 4:
        assert time.monotonic() < deadline, "the 2-node job did not start: " + "".join(
            Path(log).read_text() for log in LOGS if Path(log).exists())
        time.sleep(0.5)
    time.sleep(2)
    yield cluster
    for node in ("node1", "node2"):
        cluster.ssh(node, "pkill -9 -f collective_mismatch.py || true", check=False)


def test_names_the_culprit_rank_and_host_from_outside_both_nodes(two_node_job):
    r = run_cli("hang", "--nodes", "node[1-2]", "--json", env=two_node_job.env())
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert sorted((p["host"], p["rank"]) for p in report["processes"]) == [
        ("node1", 0), ("node1", 1), ("node2", 2), ("node2", 3)]
    assert [(s["rank"], s["host"]) for s in report["suspects"]] == [(0, "node1")]
    assert report["suspects"][0]["call_site"].startswith("collective_mismatch.py:")
    assert report["errors"] == []


def test_out_writes_each_nodes_dumps_as_it_answers(two_node_job, tmp_path):
    """node2's Python starts 5 s late and first lists the dumps written so far: node1's ranks
    are on disk by then (written as node1 answered, not when every node had), and the report
    is whole. Until the run ends they are in the private directory beside --out
    (``.out.tmp-*``, mldebug.paths.staged), which replaces --out at the end: an interrupted
    run leaves no half-written --out (tests/test_safety_table.py, signals rows)."""
    out, seen = tmp_path / "out", tmp_path / "seen-by-node2"
    python = slow_python(tmp_path, "node2", 5, then=f"ls {tmp_path}/.out.tmp-*/dumps > {seen}")
    r = run_cli("hang", "--nodes", "node[1-2]", "--out", str(out), "--remote-python", python,
                "--json", env=two_node_job.env())
    assert r.returncode == 0, r.stderr
    early = sorted(n.split("-")[1] for n in seen.read_text().split())
    assert early == ["rank0", "rank1"], seen.read_text()
    saved = sorted(f.name.split("-")[1] for f in (out / "dumps").iterdir())
    assert saved == ["rank0", "rank1", "rank2", "rank3"]
    report = json.loads(r.stdout)
    assert sorted(p["rank"] for p in report["processes"]) == [0, 1, 2, 3]
    assert json.loads((out / "report.json").read_text())["suspects"] == report["suspects"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")] == []


def test_a_stopped_node_does_not_block_the_report(two_node_job):
    two_node_job.freeze_node("node3")
    try:
        t = time.monotonic()
        r = run_cli("hang", "--nodes", "node[1-3]", "--json", "--timeout", "5",
                    "--connect-timeout", "3", env=two_node_job.env())
        elapsed = time.monotonic() - t
    finally:
        two_node_job.thaw_node("node3")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert [s["rank"] for s in report["suspects"]] == [0]
    assert [e["host"] for e in report["errors"]] == ["node3"]
    assert "timed out" in report["errors"][0]["error"]
    assert elapsed < 5 + 3 + 10, elapsed  # timeout + connect timeout + a few seconds


def test_broken_nodes_are_explained(two_node_job, tmp_path):
    garbage = tmp_path / "fake-python"
    garbage.write_text("#!/bin/sh\necho 'MLDEBUG-JSON {not json'\n")
    garbage.chmod(0o755)
    r = run_cli("hang", "--nodes", "node1", "--remote-python", str(garbage), "--json",
                env=two_node_job.env())
    report = json.loads(r.stdout)
    assert r.returncode == 1
    assert report["errors"][0]["host"] == "node1"
    assert "unreadable JSON" in report["errors"][0]["error"]

    r = run_cli("hang", "--nodes", "node2", "--py-spy", "/nope/py-spy", "--json",
                env=two_node_job.env())
    report = json.loads(r.stdout)
    assert any(e["host"] == "node2" and "py-spy was not found on node2" in e["error"]
               for e in report["errors"])

    # no such interpreter on the node: the collector falls back to the node's python3, which
    # finds the ranks but no py-spy beside it or on the ssh session's PATH
    r = run_cli("hang", "--nodes", "node1", "--remote-python", "/nonexistent/python", "--json",
                env=two_node_job.env())
    report = json.loads(r.stdout)
    assert r.returncode == 1
    assert "py-spy was not found on node1" in report["errors"][0]["error"]

    r = run_cli("hang", "--nodes", "node1,nosuchhost", "--json", env=two_node_job.env())
    report = json.loads(r.stdout)
    assert r.returncode == 0
    assert [e["host"] for e in report["errors"]] == ["nosuchhost"]
    assert "does not resolve" in report["errors"][0]["error"]


def test_hostfile_formats(two_node_job, tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("# deepspeed style\nnode1 slots=2\nnode2:2\n")
    r = run_cli("hang", "--hostfile", str(hf), "--json", env=two_node_job.env())
    assert r.returncode == 0, r.stderr
    assert sorted({p["host"] for p in json.loads(r.stdout)["processes"]}) == ["node1", "node2"]
