"""A rank on a node of the local cluster (its own host name and PID namespace) stops at
mldebug.breakpoint(); pdb list finds it over pdsh and pdb connect reaches it through ssh."""

from __future__ import annotations

import json
import shlex
import socket
import sys
import time

import pytest
from conftest import REPO, run_cli
from test_debugger_remote import (
    STOP_LINE,
    TORCHRUN_JOB,
    after_times,
    drive_session,
    spawn_cli,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_rank_on_a_node_is_listed_and_debugged_through_ssh(cluster, tmp_path):
    script = tmp_path / "tr.py"
    script.write_text(TORCHRUN_JOB.replace("BP_RANK", "1"))
    sessions = tmp_path / "sessions"
    log = tmp_path / "job.log"
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    cluster.spawn("node1", " ".join(shlex.quote(a) for a in [
        "env", f"PYTHONPATH={REPO}", f"MLDEBUG_PDB_DIR={sessions}", "PYTHONUNBUFFERED=1",
        "GLOO_SOCKET_IFNAME=lo", sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
        "--nproc_per_node=2", "--node_rank=0", "--master_addr=127.0.0.1",
        f"--master_port={port}", str(script)]), str(log))
    m = wait_for(log, r"rank 1 on node1 \(pid (\d+)\) stopped at tr.py:(\d+), waiting for a "
                      r"debugger: mldebug pdb connect node1:(\d+)", None)
    assert int(m[2]) == STOP_LINE
    env = cluster.env()
    where = ["--nodes", "node1,node2", "--dir", str(sessions)]
    r = run_cli("pdb", "list", *where, "--json", env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["hosts"] == ["node1", "node2"] and doc["errors"] == []
    [s] = doc["sessions"]  # node2 shares /tmp here but reports only its own sessions
    assert (s["host"], s["rank"], s["pid"], s["line"], s["port"]) == (
        "node1", 1, int(m[1]), STOP_LINE, int(m[3]))
    time.sleep(1.0)
    assert after_times(log) == {}
    child = spawn_cli(["pdb", "connect", "1", *where], env, tmp_path)
    before_c = drive_session(child, 1, world=2)
    deadline = time.monotonic() + 120
    while len(after_times(log)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    times = after_times(log)
    assert sorted(times) == [0, 1], log.read_text()[-3000:]
    assert all(t > before_c for t in times.values())
    r = run_cli("pdb", "list", *where, env=env)
    assert r.returncode == 1 and "no debugger session is open" in r.stdout
