"""`mldebug hang --signal --nodes`: a 2-node x 2-rank torchrun job on the local sshd cluster,
ranks non-dumpable, asked for their stacks by signal over pdsh."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from jobs import RECIPES, free_port

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

RECIPE = "capture_rank_branch.py"


def test_signal_over_nodes_names_the_culprit_and_its_host(cluster, tmp_path):
    tmp_path.chmod(0o755)
    logs = [tmp_path / f"node{i}.log" for i in (1, 2)]
    port = free_port()
    for i, log in enumerate(logs):
        cap = tmp_path / f"cap{i + 1}"
        cluster.spawn(f"node{i + 1}", (
            f"env GLOO_SOCKET_IFNAME=lo PYTHONPATH={REPO} MLDEBUG_DIR={cap} STALL_TIMEOUT=600 "
            f"NO_PTRACE=1 {sys.executable} -m torch.distributed.run --nnodes 2 "
            f"--nproc_per_node 2 --node_rank {i} --master_addr 127.0.1.1 --master_port {port} "
            f"{RECIPES / RECIPE}"), str(log))
    try:
        deadline = time.monotonic() + 120
        while sum(log.read_text().count(" ready") for log in logs if log.exists()) < 4:
            assert time.monotonic() < deadline, "".join(
                log.read_text() for log in logs if log.exists())
            time.sleep(0.5)
        time.sleep(2)
        r = run_cli("hang", "--signal", "--nodes", "node[1-2]", "--pattern", RECIPE,
                    "--timeout", "10", "--json", env=cluster.env())
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        assert sorted((p["host"], p["rank"]) for p in rep["processes"]) == [
            ("node1", 0), ("node1", 1), ("node2", 2), ("node2", 3)], rep["errors"]
        assert [(s["rank"], s["host"]) for s in rep["suspects"]] == [(2, "node2")]
        assert [f["code"] for f in rep["capture"]["findings"]] == ["capture-route-python"]
        assert Path(tmp_path / "cap2" / "dumps").is_dir()
    finally:
        for node in ("node1", "node2"):
            cluster.ssh(node, f"pkill -9 -f {RECIPE} || true", check=False)
