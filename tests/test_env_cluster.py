"""mldebug env --nodes on a local sshd cluster whose nodes are given different environments."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from cluster import LocalCluster
from conftest import run_cli, start_cluster
from test_env_cli import clean_env

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def env_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """node1 and node2: same machine, different NCCL_SOCKET_IFNAME and NCCL_DEBUG (sshd SetEnv)."""
    c = start_cluster(tmp_path_factory.mktemp("envcluster"), ["node1", "node2"], node_env={
        "node1": {"NCCL_SOCKET_IFNAME": "eth", "NCCL_DEBUG": "WARN"},
        "node2": {"NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "WARN"},
    })
    yield c
    c.stop()


def pdsh_env(c: LocalCluster) -> dict[str, str]:
    """This shell's environment without NCCL/torch variables, plus how pdsh reaches the nodes."""
    return {**clean_env(), "PDSH_RCMD_TYPE": "ssh",
            "PDSH_SSH_ARGS_APPEND": c.env()["PDSH_SSH_ARGS_APPEND"]}


def test_env_across_nodes_reports_the_difference(env_cluster: LocalCluster) -> None:
    env = pdsh_env(env_cluster)
    r = run_cli("env", "--nodes", "node[1-2]", "--json", env=env, timeout=90)
    doc = json.loads(r.stdout)
    assert [n["host"] for n in doc["nodes"]] == ["node1", "node2"], r.stderr
    assert doc["unreachable"] == {}
    rows = {row["key"]: row for row in doc["differences"]}
    assert rows["NCCL_SOCKET_IFNAME"]["values"] == {"node1": "eth", "node2": "lo"}
    assert "NCCL_DEBUG" not in rows  # same on both nodes
    sockets = rows["nccl socket ifaces"]["values"]
    assert sockets["node2"] == "lo" and sockets["node1"] != "lo"
    codes = {f["code"]: f for f in doc["findings"]}
    # values with their folded host lists (majority first) instead of host=value pairs
    assert "NCCL_SOCKET_IFNAME: eth [node1]; lo [node2]" in codes["env-diff-variables"]["detail"]
    assert codes["nccl-socket-ifname-local-only"]["hosts"] == ["node2"]
    # the facts came from the nodes themselves (each has its own UTS namespace)
    assert [n["hostname"] for n in doc["nodes"]] == ["node1", "node2"]

    # human output: the table names both nodes and the differing variable
    r = run_cli("env", "--nodes", "node[1-2]", env={**env, "NO_COLOR": "1"}, timeout=90)
    assert "Differences across nodes" in r.stdout and "NCCL_SOCKET_IFNAME" in r.stdout
    assert r.returncode == 0, r.stdout


def test_env_names_a_node_that_does_not_answer(env_cluster: LocalCluster) -> None:
    env = pdsh_env(env_cluster)
    r = run_cli("env", "--nodes", "node1,nosuchnode", "--json", "--connect-timeout", "3",
                env=env, timeout=90)
    doc = json.loads(r.stdout)
    assert r.returncode == 1
    assert [n["host"] for n in doc["nodes"]] == ["node1"]
    assert "nosuchnode" in doc["unreachable"]
    assert any(f["code"] == "node-unreachable" and f["hosts"] == ["nosuchnode"]
               for f in doc["findings"])


@pytest.fixture(scope="module")
def cluster32(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """32 sshd nodes; node7 and node20-21 run with a different NCCL_SOCKET_IFNAME."""
    names = [f"node{i}" for i in range(1, 33)]
    odd = {"node7": {"NCCL_SOCKET_IFNAME": "lo"}, "node20": {"NCCL_SOCKET_IFNAME": "lo"},
           "node21": {"NCCL_SOCKET_IFNAME": "lo"}}
    c = start_cluster(tmp_path_factory.mktemp("env32"), names,
                      node_env={n: {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth",
                                    **odd.get(n, {})} for n in names})
    yield c
    c.stop()


def test_env_on_32_nodes_reads_on_one_screen(cluster32: LocalCluster) -> None:
    env = {**pdsh_env(cluster32), "NO_COLOR": "1", "COLUMNS": "120"}
    r = run_cli("env", "--nodes", "node[1-32],down[1-3]", "--connect-timeout", "3",
                "--torch-timeout", "20", env=env, timeout=240)
    out = r.stdout
    assert "mldebug env: 32 node(s), 3 unreachable" in out, r.stderr + out
    assert "no facts from 3 nodes  [down[1-3]]" in out  # grouped by reason, folded
    assert "NCCL_SOCKET_IFNAME" in out and "node[7,20-21]" in out
    assert "eth" in out and "node[1-6,8-19,22-32]" in out
    assert out.count("\n") < 60, out
    assert "node1, node2" not in out  # never a list of every host
