"""mldebug hang over 48 sshd nodes, 8 at a time, some answering slowly: nobody is lost.

Each node (its own UTS + PID namespace) runs one rank of one 48-rank "job" (recipes/
hang_waits.py blocked on an Event, rank from the host name; no torch, so it starts in
milliseconds). The fan-out goes through a --remote-python wrapper that makes nodes 40-48
sleep before answering. Every node must answer and every rank must be in the report.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import REPO, run_cli, start_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

N = 48
NAMES = [f"n{i}" for i in range(1, N + 1)]
SLOW = "n4?"  # a shell pattern: n40-n48 answer 2 s late


@pytest.fixture(scope="module")
def big_cluster(tmp_path_factory):
    work = tmp_path_factory.mktemp("cluster48")
    c = start_cluster(work, NAMES)  # most of this test's time: 48 sshd answering, one by one
    try:
        env = c.env()
        # one rank per node; the rank is the host's number - 1, one job (one MASTER_ADDR:PORT)
        start = (f"cd /tmp; n=$(hostname | tr -dc 0-9); RANK=$((n-1)) LOCAL_RANK=0 "
                 f"WORLD_SIZE={N} LOCAL_WORLD_SIZE=1 MASTER_ADDR=10.77.0.1 MASTER_PORT=29400 "
                 f"PYTHONPATH={REPO} setsid nohup {sys.executable} "
                 f"{REPO / 'recipes' / 'hang_waits.py'} event >/tmp/mldebug-scale-$n.log 2>&1 "
                 "</dev/null &")
        subprocess.run(["pdsh", "-R", "ssh", "-f", "16", "-u", "60", "-w", ",".join(NAMES), start],
                       env=env, check=True, capture_output=True, timeout=120)
        wrapper = work / "slow-python"
        wrapper.write_text(f"#!/bin/sh\ncase $(hostname) in {SLOW}) sleep 2;; esac\n"
                           f"exec {sys.executable} \"$@\"\n")
        wrapper.chmod(0o755)
        deadline = time.monotonic() + 60
        while True:  # every rank started (its 'ready' line)
            r = subprocess.run(["pdsh", "-R", "ssh", "-f", "16", "-u", "20", "-w", "n1",
                                "cat /tmp/mldebug-scale-*.log"], env=env, capture_output=True,
                               text=True, timeout=120)  # /tmp is shared: one node sees all
            if r.stdout.count(" ready") >= N:
                break
            assert time.monotonic() < deadline, r.stdout[-2000:]
            time.sleep(1)
        c.wrapper = wrapper  # type: ignore[attr-defined]
        yield c
    finally:
        c.stop()  # SIGKILL ends every process in each node's namespace


def test_48_nodes_fanout_8_with_slow_nodes_every_rank_reported(big_cluster):
    t = time.monotonic()
    r = run_cli("hang", "--nodes", "n[1-48]", "--fanout", "8", "--timeout", "30",
                "--remote-python", str(big_cluster.wrapper), "--json",
                env=big_cluster.env(), timeout=300)
    elapsed = time.monotonic() - t
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["errors"] == [] and report["dead_hosts"] == [], report["errors"]
    assert sorted(p["rank"] for p in report["processes"]) == list(range(N))
    assert sorted({p["host"] for p in report["processes"]}) == sorted(NAMES)
    assert len(report["jobs"]) == 1 and report["jobs"][0]["key"] == "master:10.77.0.1:29400"
    assert report["jobs"][0]["verdict"]["code"] == "same-place"
    assert report["missing_ranks"] == []
    print(f"48 nodes, fanout 8: {elapsed:.1f}s", file=sys.stderr)
