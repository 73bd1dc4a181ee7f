"""`mldebug hang` through torch's debug server across nodes: a 2-node x 2-rank gloo torchrun
job on the local sshd cluster whose ranks start torch.distributed.debug's worker servers, with
ptrace forbidden on both sides (the ranks make themselves non-dumpable, NO_PTRACE=1, and the
node script runs under ``capsh --drop=cap_sys_ptrace`` through a ``--remote-python`` wrapper;
the ranks have no py-spy on their PATH, so their ``dump_traceback`` handler answers).

The nodes share one network namespace (only UTS + PID are their own), so every node can reach
every rank's worker server on 127.0.0.1 and read every registration in the store: each node
must use only the registrations whose host is itself (the ranks register ``gethostname()``,
their node's name)."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time

import pytest
from conftest import REPO, cluster_unavailable, run_cli
from jobs import RECIPES, free_port

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

RECIPE = "hang_debug_server.py"
NODES = ("node1", "node2")
LAYOUT = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}


@pytest.fixture(scope="module")
def dbg_job(cluster, tmp_path_factory):
    pytest.importorskip("torch.distributed.debug")
    if shutil.which("capsh") is None:  # part of the cluster here: MLDEBUG_REQUIRE_CLUSTER fails
        cluster_unavailable("capsh (to drop CAP_SYS_PTRACE on the nodes) is missing")
    work = tmp_path_factory.mktemp("dbgsrv-cluster")
    logs = {node: work / f"{node}.log" for node in NODES}
    port, debug_port = free_port(), free_port()
    for i, node in enumerate(NODES):
        # PATH without the venv: no py-spy in the ranks, so pyspy_dump fails and
        # dump_traceback answers (no pid in its text: the rank's environment tells it)
        cluster.spawn(node, (
            f"env PATH=/usr/bin:/bin PYTHONPATH={REPO} GLOO_SOCKET_IFNAME=lo NO_PTRACE=1 "
            f"DEBUG_PORT={debug_port} {sys.executable} -m torch.distributed.run --nnodes 2 "
            f"--nproc_per_node 2 --node_rank {i} --master_addr 127.0.1.1 --master_port {port} "
            f"{RECIPES / RECIPE}"), str(logs[node]))

    def pids() -> dict[int, tuple[str, int]]:
        out = {}
        for node, log in logs.items():
            text = log.read_text(errors="replace") if log.exists() else ""
            out.update({int(r): (node, int(p))
                        for r, p in re.findall(r"rank (\d+) pid (\d+) ready", text)})
        return out

    try:
        deadline = time.monotonic() + 120
        while len(pids()) < 4:
            assert time.monotonic() < deadline, "the 2-node job did not start: " + "".join(
                log.read_text(errors="replace") for log in logs.values() if log.exists())
            time.sleep(0.5)
        time.sleep(2)  # every rank reaches its blocking call
        # no ptrace for mldebug's node script either: py-spy (beside this interpreter) is
        # denied
        python = work / "noptrace-python"
        python.write_text("#!/bin/sh\nexec capsh --drop=cap_sys_ptrace -- -c "
                          f"'exec {sys.executable} \"$@\"' python \"$@\"\n")
        python.chmod(0o755)
        yield cluster, pids(), str(python), port
    finally:
        for node in NODES:
            cluster.ssh(node, f"pkill -9 -f {RECIPE} || true", check=False)


def hang(cluster, python: str, *args: str) -> dict:
    r = run_cli("hang", "--nodes", "node[1-2]", "--remote-python", python, "--json", *args,
                env=cluster.env())
    assert r.stdout, r.stderr
    return json.loads(r.stdout)


def test_each_node_answers_for_its_own_ranks_through_the_debug_server(dbg_job):
    cluster, pids, python, _ = dbg_job
    assert {r: node for r, (node, _) in pids.items()} == LAYOUT
    t = time.monotonic()
    rep = hang(cluster, python)
    elapsed = time.monotonic() - t
    assert rep["errors"] == [], rep["errors"]
    procs = rep["processes"]
    # every rank once, filed under the node that owns it, with its own pid there
    assert sorted((p["host"], p["rank"], p["pid"]) for p in procs) == sorted(
        (node, r, pid) for r, (node, pid) in pids.items())
    assert {p["route"] for p in procs} == {"debug-server"}, procs
    assert {p["route_detail"] for p in procs} == {"dump_traceback"}
    assert [(s["rank"], s["host"]) for s in rep["suspects"]] == [(2, "node2")], rep["verdict"]
    assert "not in any collective" in rep["suspects"][0]["reason"]
    route = [f for f in rep["findings"] if f["code"] == "route-debug-server"]
    assert [f["hosts"] for f in route] == [["node[1-2]"]], route
    assert elapsed < 30, elapsed
    # --watch asks each node's servers a second time: every rank twice, every group stuck
    watch = hang(cluster, python, "--watch", "1")
    assert sorted((p["host"], p["rank"]) for p in watch["processes"]
                  if "threads_later" in p) == sorted((n, r) for r, n in LAYOUT.items())
    assert {g["state"] for g in watch["groups"]} == {"stuck"}, watch["groups"]
    # --signal asks each node's servers before it would signal anything
    sig = hang(cluster, python, "--signal", "--timeout", "10")
    assert sorted((p["host"], p["rank"], p["route"]) for p in sig["processes"]) == sorted(
        (n, r, "debug-server") for r, n in LAYOUT.items()), sig["processes"]
    assert [(s["rank"], s["host"]) for s in sig["suspects"]] == [(2, "node2")], sig["verdict"]


def test_a_node_whose_server_does_not_answer_is_one_line(dbg_job):
    """Rank 1's process is stopped (SIGSTOP): its worker server accepts and never answers.
    node1 says so in one line for rank 1; rank 0 on node1 and node2's ranks are reported."""
    cluster, pids, python, _ = dbg_job
    node, pid = pids[1]
    cluster.ssh(node, f"kill -STOP {pid}")
    try:
        rep = hang(cluster, python, "--timeout", "5")
    finally:
        cluster.ssh(node, f"kill -CONT {pid}")
    assert sorted((p["host"], p["rank"]) for p in rep["processes"]
                  if p.get("route") == "debug-server") == [
        ("node1", 0), ("node2", 2), ("node2", 3)], rep["processes"]
    errs = rep["errors"]
    assert len(errs) == 1, errs
    assert errs[0]["host"] == "node1" and "rank 1" in errs[0]["error"], errs
    assert "did not answer" in errs[0]["error"], errs
    assert [(s["rank"], s["host"]) for s in rep["suspects"]][:1] == [(2, "node2")], \
        rep["verdict"]


def test_a_lone_node_never_reports_the_other_nodes_ranks(dbg_job):
    """Asked alone, node2 asks only its own ranks' servers, though node1's are reachable from
    it on 127.0.0.1 (one network namespace). With --store it reads every rank's registration
    (a scan): node1's are dropped by host name, not asked, and no line is said about them;
    the store named another way than the ranks' MASTER_ADDR (127.0.0.1, not 127.0.1.1) is
    the same store: each rank is still asked once."""
    cluster, pids, python, port = dbg_job
    for extra in ((), ("--store", f"127.0.1.1:{port}"), ("--store", f"127.0.0.1:{port}")):
        r = run_cli("hang", "--nodes", "node2", "--remote-python", python, "--json", *extra,
                    env=cluster.env())
        rep = json.loads(r.stdout)
        assert sorted((p["host"], p["rank"], p["pid"]) for p in rep["processes"]) == [
            ("node2", 2, pids[2][1]), ("node2", 3, pids[3][1])], (extra, rep["processes"])
        assert {p["route"] for p in rep["processes"]} == {"debug-server"}, extra
        assert rep["errors"] == [], (extra, rep["errors"])
    # without the capsh wrapper the node script keeps CAP_SYS_PTRACE: py-spy reads the
    # (non-dumpable) ranks itself - the wrapper is what forbids ptrace in the tests above
    r = run_cli("hang", "--nodes", "node2", "--json", env=cluster.env())
    assert {p["route"] for p in json.loads(r.stdout)["processes"]} == {"py-spy"}, r.stdout


def test_a_rank_without_a_registration_is_one_line(dbg_job):
    """Rank 3 (node2) as if it never started its server: its registration is taken out of the
    store for the run (and put back). node2 says one line for rank 3 (py-spy denied, no
    server registered), rank 2 beside it and node1's ranks are reported, the culprit named."""
    import datetime

    import torch.distributed as dist

    cluster, pids, python, port = dbg_job
    store = dist.PrefixStore("debug_server", dist.TCPStore(
        "127.0.1.1", port, is_master=False, timeout=datetime.timedelta(seconds=10)))
    url = store.get("rank3")
    assert store.delete_key("rank3")
    try:
        rep = hang(cluster, python, "--timeout", "5")
    finally:
        store.set("rank3", url)
    assert sorted((p["host"], p["rank"]) for p in rep["processes"]
                  if p.get("route") == "debug-server") == [
        ("node1", 0), ("node1", 1), ("node2", 2)], rep["processes"]
    errs = rep["errors"]
    assert len(errs) == 1 and errs[0]["host"] == "node2", errs
    assert errs[0]["pid"] == pids[3][1] and "ptrace" in errs[0]["error"], errs
    assert [(s["rank"], s["host"]) for s in rep["suspects"]][:1] == [(2, "node2")], \
        rep["verdict"]
