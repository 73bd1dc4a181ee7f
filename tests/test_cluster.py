"""The local cluster itself: distinct hosts over real pdsh, isolated process tables."""

from __future__ import annotations

import subprocess
import time

import pytest

pytestmark = pytest.mark.cluster


def test_pdsh_reaches_two_distinct_hosts(cluster):
    r = subprocess.run(["pdsh", "-R", "ssh", "-w", "node[1-2]", "hostname"],
                       capture_output=True, text=True, env=cluster.env(), timeout=60)
    assert r.returncode == 0, r.stderr
    lines = sorted(r.stdout.split("\n"))
    pairs = [line.split(": ", 1) for line in lines if line]
    assert pairs == [["node1", "node1"], ["node2", "node2"]]


def test_processes_are_visible_only_on_their_node(cluster):
    marker = "sleep 3171"
    cluster.spawn("node1", marker, "/tmp/mldebug-test-sleep.log")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        on1 = cluster.ssh("node1", f"pgrep -fx '{marker}' || true").stdout.split()
        if on1:
            break
        time.sleep(0.2)
    assert on1, "the process did not start on node1"
    on2 = cluster.ssh("node2", f"pgrep -fx '{marker}' || true").stdout.split()
    assert on2 == []
    # PID namespaces: node1's sshd tree starts at pid 1 of its own namespace
    assert cluster.ssh("node1", "cat /proc/1/comm").stdout.strip() == "bash"
    cluster.ssh("node1", f"pkill -fx '{marker}' || true")
