"""Each node script's real output against the document its caller parses, and the fan-out
contract over real pdsh: more hosts than --fanout, a slow node, a wrongly typed answer."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
from envfacts import BASE
from jobs import slow_python

from mldebug.env import collect as env_collect
from mldebug.env.facts import NodeFacts
from mldebug.fanout import FanoutOptions, NodeJob, check_document, run
from mldebug.fr import collect as fr_collect
from mldebug.hang import collect as hang_collect


def test_hang_node_answer_is_what_collection_reads(tmp_path):
    marker = "mldebug-contract-rank"
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    proc = subprocess.Popen([sys.executable, "-c", f"import time  # {marker}\ntime.sleep(60)"],
                            env=env)
    try:
        opts = hang_collect.CollectOptions(pattern=marker, timeout=20)
        (res,) = run(NodeJob(hang_collect.NODE_MODULES, opts, hang_collect.NODE_SCHEMA),
                     FanoutOptions(timeout=30))
        assert res.error is None, res.error
        coll = hang_collect.collection_from_results([res])
        assert not coll.errors, coll.errors
        (p,) = coll.processes
        assert p.pid == proc.pid and p.rank == 0 and p.threads
    finally:
        proc.kill()
        proc.wait()


def test_fr_node_answer_is_what_the_trigger_saves(tmp_path):
    args = fr_collect.NodeArgs(timeout=2, dir=str(tmp_path / "nobody-registered"))
    (res,) = run(NodeJob(fr_collect.NODE_MODULES, args, fr_collect.NODE_SCHEMA),
                 FanoutOptions(timeout=30))
    assert res.error is None and res.data is not None
    outcome = fr_collect.save_node_doc(res.host, res.data, tmp_path)
    assert outcome.files == [] and "no rank called" in outcome.notes[0]


def _shape_errors(fixture: object, real: object, path: str, loose: set[str]) -> list[str]:
    if fixture is None or real is None:
        return []
    if isinstance(fixture, bool) or isinstance(real, bool):
        return [] if type(fixture) is type(real) else [f"{path}: {type(real).__name__}"]
    if isinstance(fixture, (int, float)) and isinstance(real, (int, float)):
        return []
    if type(fixture) is not type(real):
        return [f"{path}: fixture {type(fixture).__name__}, node {type(real).__name__}"]
    errors = []
    if isinstance(fixture, dict) and isinstance(real, dict):
        for key, value in fixture.items():
            if key not in real:
                if path not in loose:
                    errors.append(f"{path}.{key}: missing from the node's answer")
                continue
            errors += _shape_errors(value, real[key], f"{path}.{key}", loose)
    return errors


def test_env_node_answer_matches_the_rule_tests_fixture():
    """tests/envfacts.BASE is what the env rule tests feed the analysis: every key it has
    must be in the real node answer with the same type, so the two cannot drift apart."""
    args = env_collect.NodeArgs(torch_timeout=10)
    (res,) = run(NodeJob(env_collect.NODE_MODULES, args, env_collect.NODE_SCHEMA),
                 FanoutOptions(timeout=30))
    assert res.error is None and res.data is not None
    real = res.data
    # hardware- and install-dependent sections: their keys vary with GPUs and torch builds
    assert _shape_errors(BASE, real, "doc", {"doc.gpus", "doc.torch"}) == []
    assert set(real) - set(BASE) <= {"errors", "collect_s"}, set(real) - set(BASE)
    assert NodeFacts.from_dict(real).host == real["host"]


# -- real pdsh to the local cluster ------------------------------------------------------

@dataclass
class _BadHost:
    bad_host: str


@pytest.mark.cluster
def test_more_hosts_than_fanout_with_slow_nodes_and_a_bad_answer(cluster, tmp_path, monkeypatch):
    for key, value in cluster.env().items():
        monkeypatch.setenv(key, value)
    seen: dict[str, str | None] = {}
    job = NodeJob(("contract_node",), _BadHost("node3"), {"host": str, "processes": list})
    opts = FanoutOptions(hosts=["node1", "node2", "node3"], fanout=1, timeout=8,
                         connect_timeout=2,
                         remote_python=slow_python(tmp_path, "node1|node2", 60))
    results = {r.host: r for r in run(job, opts, lambda r: seen.__setitem__(r.host, r.error))}
    # One host at a time: node1 and node2 each use their whole command timeout, so node3
    # starts after ~16 s - past a single connect + timeout + slack deadline (15 s) that
    # ignores pdsh's waves. It is reached, and its wrongly typed answer is its error alone.
    for slow in ("node1", "node2"):
        assert "command timeout" in (results[slow].error or ""), results[slow]
    assert results["node3"].data is None
    assert "'processes' is str, expected list" in (results["node3"].error or "")
    # on_result heard every node once, with the same error the returned list keeps
    assert seen == {h: r.error for h, r in results.items()}


@pytest.mark.cluster
def test_excluded_hosts_are_not_contacted(cluster, monkeypatch):
    for key, value in cluster.env().items():
        monkeypatch.setenv(key, value)
    job = NodeJob(("contract_node",), _BadHost(""), {"host": str, "processes": list})
    results = run(job, FanoutOptions(hosts=["node1", "node2", "node3"], exclude=["node2"],
                                     timeout=20))
    assert [r.host for r in results] == ["node1", "node3"]
    assert all(r.data is not None for r in results)


def test_a_node_document_that_is_not_an_object_is_refused():
    assert check_document("x", {}) == "answered a str, not a JSON object"
