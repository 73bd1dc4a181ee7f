"""``mldebug trace show --k8s/--k8s-job`` (#45): each pod's ranks write their execution rings
on their dump handler's signal, asked over ``kubectl exec`` of the kubectl stand-in
(tests/k8s_standin.py: pods are real PID/mount/UTS namespaces), and the rings of every pod
are compared as one job's."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from jobs import free_port
from k8s_standin import PodProcess, install, write_state

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = str(Path(sys.executable).parent)

RANK = '''\
"""One rank per pod, no torch: rank 1 leaves the loop for load_batch and stays there."""
import os, time
import mldebug
import mldebug.trace

mldebug.trace.enable(events="calls")
mldebug.install_dump_handler(poll=0.2)
RANK = int(os.environ["RANK"])


def step(i):
    time.sleep(0.05)
    return i


def load_batch():
    while True:
        time.sleep(0.1)  # stuck: the others step on


def loop():
    for i in range(10**9):
        if i == 5:
            os.write(1, f"rank {RANK} pid {os.getpid()} ready\\n".encode())
        if RANK == 1 and i == 20:
            load_batch()
        step(i)


loop()
'''


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Pods tr-0 and tr-1 (label app=tr, job 'tr'), one traced rank each, of one job
    (MASTER_ADDR/PORT alike), and tr-2 whose exec is forbidden."""
    d = tmp_path_factory.mktemp("k8s-trace")
    script = d / "rank.py"
    script.write_text(RANK)
    port = str(free_port())
    pods: list[PodProcess] = []
    try:
        for i in range(2):
            env = dict(os.environ, PATH=f"{VENV_BIN}:/usr/bin:/bin", HOME="/root",
                       RANK=str(i), LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="tr-0",
                       MASTER_PORT=port, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
            pods.append(PodProcess(f"tr-{i}", [sys.executable, str(script)], env,
                                   d / f"tr-{i}.log"))
        deadline = time.monotonic() + 60
        while not all(" ready" in (d / f"tr-{i}.log").read_text() for i in range(2)):
            assert time.monotonic() < deadline, "pods did not start"
            assert all(p.proc.poll() is None for p in pods), "a pod ended"
            time.sleep(0.3)
        time.sleep(1.5)  # rank 1 is in load_batch
        state = d / "state.json"
        labels = {"app": "tr", "training.kubeflow.org/job-name": "tr"}
        write_state(state, [{"name": f"tr-{i}", "labels": labels, "pid": p.pid,
                             "containers": ["pytorch"]} for i, p in enumerate(pods)]
                    + [{"name": "tr-2", "labels": labels, "pid": pods[0].pid,
                        "forbid_exec": True}])
        install(d / "bin")
        env = dict(os.environ, PATH=f"{d / 'bin'}:{VENV_BIN}:{os.environ.get('PATH', '')}",
                   K8S_STANDIN_STATE=str(state))
        yield {"env": env, "pods": pods, "state": state}
    finally:
        for p in pods:
            p.stop()


@pytest.mark.timeout(300)
def test_trace_show_k8s_job_compares_every_pods_rings(traced):
    r = run_cli("trace", "show", "--k8s-job", "tr", "--json", "--timeout", "15",
                env=traced["env"], timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert sorted((x["host"], x["rank"]) for x in doc["ranks"]) == [("tr-0", 0), ("tr-1", 1)]
    assert all(x["recorded"] > 0 for x in doc["ranks"])
    last = {x["rank"]: x["last"]["func"] for x in doc["ranks"]}
    assert last[1] == "load_batch" and last[0] in ("step", "loop"), last
    # the rank that left the others' path is named, at its branch
    assert any(1 in d["ranks"] and d["left_at"]["func"] in ("loop", "load_batch")
               for d in doc["divergences"]), doc["divergences"]
    # the pod whose exec was refused is named, the others' rings kept
    assert any(e.startswith("tr-2: kubectl exec forbidden") for e in doc["errors"]), doc
    assert all(p.proc.poll() is None for p in traced["pods"])  # signalled, never ended
    calls = [json.loads(line) for line in Path(str(traced["state"]) + ".calls").read_text()
             .splitlines()]
    assert sum(c[0] == "get" for c in calls) == 1


def test_trace_show_k8s_text_and_refusals(traced):
    r = run_cli("trace", "show", "--k8s", "app=tr", "--timeout", "15", env=traced["env"],
                timeout=120)
    assert r.returncode == 0, r.stderr
    assert "load_batch" in r.stdout and "rank 1" in r.stdout, r.stdout
    r = run_cli("trace", "show", "somedir", "--k8s", "app=tr", env=traced["env"])
    assert r.returncode == 2 and "not both" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("trace", "show", "--k8s", "app=none", env=traced["env"])
    assert r.returncode == 1 and "no pod matches the selector 'app=none'" in r.stderr


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_trace_show_nodes_asks_each_sshd_nodes_ranks(cluster, tmp_path):
    """The same node script over pdsh: two nodes of the local sshd cluster, one rank each."""
    import re

    tmp_path.chmod(0o755)
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    port = free_port()
    logs = [tmp_path / f"node{i + 1}.log" for i in range(2)]
    for i, log in enumerate(logs):
        cluster.spawn(f"node{i + 1}", (
            f"env RANK={i} LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.1.1 MASTER_PORT={port} "
            f"PYTHONPATH={REPO} PYTHONUNBUFFERED=1 {sys.executable} {script}"), str(log))
    try:
        deadline = time.monotonic() + 60
        while not all(log.exists() and " ready" in log.read_text() for log in logs):
            assert time.monotonic() < deadline, "".join(
                log.read_text() for log in logs if log.exists())
            time.sleep(0.3)
        time.sleep(1.5)
        r = run_cli("trace", "show", "--nodes", "node[1-2]", "--json", "--timeout", "15",
                    env=cluster.env(), timeout=120)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert sorted((x["host"], x["rank"]) for x in doc["ranks"]) == [("node1", 0),
                                                                        ("node2", 1)]
        assert {x["rank"]: x["last"]["func"] for x in doc["ranks"]}[1] == "load_batch"
    finally:
        for i, log in enumerate(logs):  # each rank by the pid it printed, on its own node
            m = re.search(r"pid (\d+) ready", log.read_text() if log.exists() else "")
            if m:
                cluster.ssh(f"node{i + 1}", f"kill -9 {m[1]}", check=False)
