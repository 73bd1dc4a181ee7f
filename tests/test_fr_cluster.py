"""`mldebug fr trigger --nodes`: a real two-node gloo job on the local pdsh/sshd cluster.

node1 runs ranks 0-1 and node2 ranks 2-3 of one job (static rendezvous on loopback); rank 3
skips a collective. The trigger fans the stdlib node script out over pdsh; each node dumps
only its own ranks (the dump directory is shared, as on NFS) and the dumps come back named by
host and rank. node3 runs nothing and says so.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from jobs import slow_python

pytest.importorskip("torch")
pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_trigger_over_nodes_gathers_every_rank_and_names_the_culprit(cluster, tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    port = _free_port()
    pidfiles = {}
    for node_rank, node in enumerate(["node1", "node2"]):
        log = tmp_path / f"{node}.log"
        pidfiles[node] = tmp_path / f"{node}.pid"
        cmd = (f"env MLDEBUG_FR=1 MLDEBUG_FR_DIR={d} PYTHONPATH={REPO} OMP_NUM_THREADS=1 "
               f"sh -c 'echo $$ > {pidfiles[node]}; exec {sys.executable} -m "
               f"torch.distributed.run --nnodes 2 --node_rank {node_rank} --nproc_per_node 2 "
               f"--master_addr 127.0.0.1 --master_port {port} "
               f"{REPO}/recipes/fr_skipped_collective.py --timeout 60'")
        cluster.spawn(node, cmd, str(log))
    try:
        deadline = time.monotonic() + 90
        while sum((tmp_path / f"{n}.log").read_text(errors="replace").count(" ready")
                  for n in ("node1", "node2") if (tmp_path / f"{n}.log").exists()) < 4:
            assert time.monotonic() < deadline, (tmp_path / "node1.log").read_text()[-2000:]
            time.sleep(0.5)
        time.sleep(1.5)
        out = tmp_path / "out"
        r = run_cli("fr", "trigger", "--nodes", "node[1-3]", "--dir", str(d), "--out", str(out),
                    "--timeout", "30", "--analyze", "--json", env=cluster.env(), timeout=120)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        by_host = {n["host"]: n for n in doc["nodes"]}
        assert sorted(Path(f).name for f in by_host["node1"]["files"]) == ["fr-node1-rank0",
                                                                          "fr-node1-rank1"]
        assert sorted(Path(f).name for f in by_host["node2"]["files"]) == ["fr-node2-rank2",
                                                                          "fr-node2-rank3"]
        assert by_host["node3"]["files"] == []
        assert any("no rank on node3" in n for n in by_host["node3"]["notes"])
        m = doc["analysis"]["mismatches"][0]
        assert (m["kind"], m["seq"], m["culprit_ranks"]) == ("missing", 2, [3])
        hosts = {json.loads(p.read_text())["host"] for p in d.glob(".mldebug-fr-*.json")}
        assert hosts == {"node1", "node2"}
        # --list over the nodes (#39: the job folders, here the one chosen directory): each
        # node names its own live ranks and the dumps there, and triggers nothing
        before = sorted(p.name for p in (d / "triggered").iterdir())
        r = run_cli("fr", "trigger", "--list", "--nodes", "node[1-3]", "--dir", str(d),
                    "--json", env=cluster.env(), timeout=120)
        assert r.returncode == 0, r.stderr
        listed = {n["host"]: n["homes"] for n in json.loads(r.stdout)["nodes"]}
        assert [h["ranks"] for h in listed["node1"]] == [[0, 1]], listed
        assert [h["ranks"] for h in listed["node2"]] == [[2, 3]], listed
        # node3 sees the shared directory's dumps but has no live rank of its own there
        assert [(h["pids"], h["dumps"] > 0) for h in listed["node3"]] == [([], True)]
        assert listed["node1"][0]["dir"] == str(d)
        assert sorted(p.name for p in (d / "triggered").iterdir()) == before
        # node2's Python starts 5 s late and first lists the output being built beside --out
        # (renamed into place at the end): node1's files are there
        out2, seen = tmp_path / "streamed", tmp_path / "seen-by-node2"
        python = slow_python(tmp_path, "node2", 5, then=f"ls {tmp_path}/.streamed.tmp-* > {seen}")
        r = run_cli("fr", "trigger", "--nodes", "node[1-2]", "--dir", str(d), "--out",
                    str(out2), "--timeout", "30", "--remote-python", python, "--json",
                    env=cluster.env(), timeout=120)
        assert r.returncode == 0, r.stderr
        assert sorted(seen.read_text().split()) == ["fr-node1-rank0", "fr-node1-rank1"]
        assert sorted(f.name for f in out2.iterdir()) == [
            "fr-node1-rank0", "fr-node1-rank1", "fr-node2-rank2", "fr-node2-rank3"]
        # a per-node cap smaller than one dump: every rank named with the reason, no file
        size = max(Path(f).stat().st_size for f in by_host["node1"]["files"])
        r = run_cli("fr", "trigger", "--nodes", "node[1-2]", "--dir", str(d), "--out",
                    str(tmp_path / "capped"), "--timeout", "30", "--max-mb",
                    str(size / 2 / (1 << 20)), "--json", env=cluster.env(), timeout=120)
        capped = json.loads(r.stdout)
        assert r.returncode == 1 and capped["files"] == [] and capped["out_dir"] is None
        errors = [e for n in capped["nodes"] for e in n["errors"]]
        assert len(errors) == 4 and all("per-node cap" in e for e in errors), errors
    finally:
        for node, pidfile in pidfiles.items():
            if pidfile.exists():
                cluster.ssh(node, f"kill {int(pidfile.read_text())}", check=False)
