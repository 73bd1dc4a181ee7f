"""Per-node results are handed over as each node answers, not when the whole fan-out ends.

Unit tests feed ``PdshStream`` pdsh-shaped lines; the cluster test runs real pdsh to two sshd
nodes where node2's Python starts only after a sleep: node1's result must reach ``on_result``
while node2 is still asleep, and the fan-out must keep no document it handed over.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from jobs import slow_python

from mldebug.fanout import MARKER, FanoutOptions, NodeJob, NodeResult, PdshStream, run


def _stream(hosts: list[str], settle: float = 1.0) -> tuple[PdshStream, list[NodeResult]]:
    got: list[NodeResult] = []
    return PdshStream(hosts, got.append, schema={"processes": list}, settle=settle), got


def test_a_node_is_delivered_when_its_answer_line_arrives():
    stream, got = _stream(["node1", "node2"])
    stream.out("node1: starting")
    assert got == []
    stream.out(f'node1: {MARKER}{{"processes": [1]}}')
    assert [(r.host, r.data) for r in got] == [("node1", {"processes": [1]})]
    assert list(stream.pending) == ["node2"]  # what was handed over is not kept
    stream.out(f'node1: {MARKER}{{"processes": [2]}}')  # a second answer: ignored
    stream.finish()
    assert [(r.host, r.error) for r in got][1:] == [
        ("node2", "no answer (the node ran and printed nothing)")]


def test_a_failed_node_waits_for_the_lines_still_on_their_way():
    """pdsh reports a failure on stderr; ssh's reason, or even the node's answer on stdout,
    can come a moment later on the other pipe: a failure is final only after ``settle``."""
    stream, got = _stream(["node1", "node2", "node3"], settle=1.0)
    stream.err("pdsh@head: node1: ssh exited with exit code 255", now=10.0)
    stream.err("pdsh@head: node2: ssh exited with exit code 1", now=10.0)
    stream.err("node1: ssh: connect to host 10.0.0.1 port 22: Connection refused", now=10.2)
    stream.out(f'node2: {MARKER}{{"processes": []}}')  # the stdout reader was behind
    stream.tick(10.5)
    assert [r.host for r in got] == ["node2"] and got[0].data == {"processes": []}
    stream.tick(11.0)
    assert [r.host for r in got] == ["node2", "node1"]
    assert "connection refused" in (got[1].error or "")
    stream.err("pdsh@head: node3: command timeout", now=12.0)
    stream.finish()
    assert "command timeout" in (got[2].error or "")


def test_a_nodes_chatter_is_bounded():
    stream, got = _stream(["node1"])
    for i in range(10_000):
        stream.out(f"node1: line {i}")
    assert len(stream.pending["node1"].stderr) <= 2 * PdshStream._KEEP
    stream.finish()
    assert got[0].error == "no result; the node said: line 9999"


@dataclass
class _Args:
    bad_host: str = ""


@pytest.mark.cluster
def test_the_fast_node_is_handed_over_while_the_slow_one_sleeps(cluster, tmp_path, monkeypatch):
    for key, value in cluster.env().items():
        monkeypatch.setenv(key, value)
    woke = tmp_path / "node2-woke"
    python = slow_python(tmp_path, "node2", 4, then=f"touch {woke}")
    seen: list[tuple[str, float, bool, bool]] = []

    def on_result(r: NodeResult) -> None:  # when it came, was node2 awake yet, any document
        seen.append((r.host, time.monotonic(), woke.exists(), r.data is not None))

    start = time.monotonic()
    results = run(NodeJob(("contract_node",), _Args(), {"host": str, "processes": list}),
                  FanoutOptions(hosts=["node1", "node2"], timeout=30, remote_python=python),
                  on_result, progress=False)
    end = time.monotonic()
    assert [(h, awake, has_doc) for h, _, awake, has_doc in seen] == [
        ("node1", False, True), ("node2", True, True)]
    t1, t2 = seen[0][1], seen[1][1]
    assert t1 - start < t2 - start - 2 and end - t2 < 2, (t1 - start, t2 - start, end - start)
    # handed over, then dropped: the fan-out returns host and error only
    assert [(r.host, r.data, r.error) for r in results] == [("node1", None, None),
                                                            ("node2", None, None)]
