"""Kubernetes targets (#45, stage 1): --k8s SELECTOR / --k8s-job NAME over kubectl exec.

Pure parts on fixtures (the PodList parsing, kubectl's argument lists, the job labels of the
three operators, the failures explained), then the fan-out route against a kubectl stand-in
(tests/k8s_standin.py) whose pods are real PID/mount/UTS namespaces, and one end-to-end
`mldebug hang --k8s` on a 2-pod gloo job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from jobs import free_port
from k8s_standin import PodProcess, install, write_state

from mldebug import k8s
from mldebug.errors import MldebugError, UsageError
from mldebug.fanout import FanoutOptions, NodeJob, run
from mldebug.k8s import K8sTarget, Pod

VENV_BIN = str(Path(sys.executable).parent)


def _item(name: str, labels: dict[str, str], phase: str = "Running",
          containers: tuple[str, ...] = ("pytorch",), ns: str = "training",
          **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels, **meta},
            "spec": {"containers": [{"name": c, "image": "img"} for c in containers]},
            "status": {"phase": phase}}


PODLIST = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": [
    _item("llama-master-0", {"training.kubeflow.org/job-name": "llama",
                             "training.kubeflow.org/replica-type": "master"}),
    _item("llama-worker-0", {"training.kubeflow.org/job-name": "llama"}, phase="Pending"),
    _item("mix-trainer-0-0-x7k2p", {"jobset.sigs.k8s.io/jobset-name": "mix"},
          containers=("trainer", "sidecar")),
    _item("batch-abc12", {"batch.kubernetes.io/job-name": "batch", "job-name": "batch"}),
    _item("old-9zz", {"job-name": "old"}),
    _item("gone-0", {"job-name": "old"}, deletionTimestamp="2026-01-01T00:00:00Z"),
    _item("Bad_Name", {"job-name": "old"}),  # not a pod name: skipped
    "not an object",
]}


# --- pure: parsing, argv, labels, explanations ------------------------------------------


def test_parse_pods_reads_names_namespaces_labels_phases_containers():
    pods = k8s.parse_pods(json.dumps(PODLIST))
    assert [p.name for p in pods] == ["llama-master-0", "llama-worker-0",
                                      "mix-trainer-0-0-x7k2p", "batch-abc12", "old-9zz", "gone-0"]
    first = pods[0]
    assert (first.namespace, first.phase, first.containers, first.runnable) == (
        "training", "Running", ["pytorch"], True)
    assert first.labels["training.kubeflow.org/replica-type"] == "master"
    assert not pods[1].runnable and pods[2].containers == ["trainer", "sidecar"]
    assert pods[5].terminating and not pods[5].runnable
    one = k8s.parse_pods(json.dumps(_item("solo", {})))  # `kubectl get pod NAME -o json`
    assert [p.name for p in one] == ["solo"]


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", '{"items": 3}', "null", "[" * 100000])
def test_parse_pods_refuses_what_is_not_a_podlist_with_one_line(text):
    with pytest.raises(MldebugError, match="kubectl get pods answered"):
        k8s.parse_pods(text)


def test_get_pods_argv_passes_selector_namespace_context_kubeconfig_as_kubectl_takes_them():
    t = K8sTarget(selector="training.kubeflow.org/job-name=llama", namespace="training",
                  context="prod", kubeconfig="/etc/kube/cfg")
    assert k8s.get_pods_argv(t, timeout=30) == [
        "get", "pods", "-o", "json", "--selector=training.kubeflow.org/job-name=llama",
        "--namespace=training", "--context=prod", "--kubeconfig=/etc/kube/cfg",
        "--request-timeout=30s"]
    # --k8s-job: the namespace's pods, the labels matched here (a selector cannot OR keys)
    assert k8s.get_pods_argv(K8sTarget(job="llama")) == [
        "get", "pods", "-o", "json", f"--request-timeout={int(k8s.GET_TIMEOUT)}s"]


def test_exec_argv_runs_python_on_stdin_in_the_pods_namespace_and_container():
    pod = Pod("llama-master-0", "training", "Running", containers=["pytorch"])
    assert k8s.exec_argv(K8sTarget(selector="a=b"), pod) == [
        "exec", "-i", "llama-master-0", "--namespace=training", "--", "python3", "-",
        "<mldebug-node>"]
    t = K8sTarget(selector="a=b", namespace="other", context="prod", kubeconfig="k.cfg",
                  container="pytorch")
    assert k8s.exec_argv(t, Pod("p-0", None, "Running"), python="/opt/py/bin/python") == [
        "exec", "-i", "p-0", "--namespace=other", "--container=pytorch", "--context=prod",
        "--kubeconfig=k.cfg", "--", "/opt/py/bin/python", "-", "<mldebug-node>"]


def test_node_program_carries_script_and_arguments_on_stdin():
    src = "import sys, json\nprint('MLDEBUG-JSON ' + json.dumps(sys.argv))\n"
    program = k8s.node_program(src, ["a b", "$(touch /tmp/pwned)", "'q'"])
    r = subprocess.run([sys.executable, "-", "<mldebug-node>"], input=program,
                       capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == 'MLDEBUG-JSON ["-", "a b", "$(touch /tmp/pwned)", "\'q\'"]'


@pytest.mark.parametrize(("job", "pods"), [
    ("llama", ["llama-master-0", "llama-worker-0"]),  # Kubeflow PyTorchJob
    ("mix", ["mix-trainer-0-0-x7k2p"]),                # JobSet
    ("batch", ["batch-abc12"]),                        # batch/v1 Job (both labels)
    ("old", ["old-9zz", "gone-0"]),                    # a Job with the legacy label only
])
def test_k8s_job_matches_the_job_labels_of_the_three_operators(job, pods):
    chosen = k8s.select(K8sTarget(job=job), k8s.parse_pods(json.dumps(PODLIST)))
    assert [p.name for p in chosen] == pods


def test_no_matching_pod_names_selector_namespace_and_how_to_list():
    with pytest.raises(MldebugError) as e:
        k8s.select(K8sTarget(selector="app=nope", namespace="training"), [])
    assert e.value.message == "no pod matches the selector 'app=nope' in namespace training."
    assert "kubectl get pods --show-labels --namespace=training" in e.value.fix
    with pytest.raises(MldebugError) as e:
        k8s.select(K8sTarget(job="ghost", context="prod"), k8s.parse_pods(json.dumps(PODLIST)))
    assert "job 'ghost' in namespace (the context default)" in e.value.message
    assert "--context=prod" in e.value.fix and "jobset.sigs.k8s.io/jobset-name" in e.value.fix


def test_non_running_pods_and_missing_containers_are_named_with_why():
    pods = {p.name: p for p in k8s.parse_pods(json.dumps(PODLIST))}
    assert k8s.not_running_error(pods["llama-worker-0"]).startswith(
        "pod is Pending, not Running: not asked")
    assert "terminating" in k8s.not_running_error(pods["gone-0"])
    t = K8sTarget(selector="a", container="pytorch")
    assert k8s.container_error(t, pods["llama-master-0"]) is None
    assert k8s.container_error(t, pods["mix-trainer-0-0-x7k2p"]) == (
        "container 'pytorch' not found in pod mix-trainer-0-0-x7k2p (its containers: trainer, "
        "sidecar); pass --container with one of them")


@pytest.mark.parametrize(("said", "expect"), [
    (['Error from server (Forbidden): pods "p" is forbidden: User "u" cannot create resource '
      '"pods/exec" in API group "" in the namespace "t"'], "RBAC 'create' on pods/exec"),
    (['error: unable to upgrade connection: container not found ("x")'], "pass --container"),
    (['OCI runtime exec failed: exec failed: unable to start container process: exec: '
      '"python3": executable file not found in $PATH: unknown',
      "command terminated with exit code 126"], "no python3 in the container image"),
    (['Error from server (NotFound): pods "p" not found'], "the pod is gone"),
    (["error: unable to upgrade connection: error dialing backend: dial tcp: i/o timeout"],
     "could not reach the pod's kubelet"),
    (["Traceback (most recent call last):", "ValueError: x",
      "command terminated with exit code 1"], "kubectl exec said: ValueError: x"),
    ([], "printed nothing"),
])
def test_exec_failures_are_one_actionable_line(said, expect):
    assert expect in k8s.explain_exec_failure(said, "p")


@pytest.mark.parametrize("target", [
    K8sTarget(), K8sTarget(selector="a=b", job="j"), K8sTarget(selector=""),
    K8sTarget(selector="--all"), K8sTarget(selector="a=b\nc"), K8sTarget(job="Bad_Job"),
    K8sTarget(job="j", namespace="-n"), K8sTarget(job="j", container="A B"),
    K8sTarget(job="j", context=""), K8sTarget(job="j", kubeconfig="a\x00b"),
])
def test_bad_target_values_are_usage_errors(target):
    with pytest.raises(UsageError):
        k8s.check_target(target)


# --- the CLI: options, errors -------------------------------------------------------------


def test_k8s_options_are_exclusive_with_host_lists_and_need_k8s():
    r = run_cli("hang", "--nodes", "node1", "--k8s", "app=demo")
    assert r.returncode == 2 and "not allowed with argument" in r.stderr
    r = run_cli("env", "--namespace", "training")
    assert r.returncode == 2 and "--namespace is for Kubernetes pods" in r.stderr
    assert "Traceback" not in r.stderr
    for cmd in (["hang"], ["env"], ["fr", "trigger"]):
        out = run_cli(*cmd, "--help").stdout
        assert "--k8s SELECTOR" in out and "--k8s-job NAME" in out, cmd


def test_kubectl_missing_is_one_line_with_the_fix(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))  # no kubectl there
    r = run_cli("env", "--k8s", "app=demo", env=env)
    assert r.returncode == 1, r.stderr
    assert "kubectl is not on PATH; --k8s and --k8s-job need it." in r.stderr
    assert "Install kubectl" in r.stderr and "Traceback" not in r.stderr


# --- the stand-in: pods that are real namespaces ------------------------------------------


@dataclass
class Cluster:
    state: Path
    bin: Path
    pods: list[PodProcess]

    def env(self) -> dict[str, str]:
        return dict(os.environ, PATH=f"{self.bin}:{VENV_BIN}:{os.environ.get('PATH', '')}",
                    K8S_STANDIN_STATE=str(self.state))

    def calls(self) -> list[list[str]]:
        path = Path(str(self.state) + ".calls")
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() \
            else []


def _pod_env(extra: dict[str, str]) -> dict[str, str]:
    return dict(os.environ, PATH=f"{VENV_BIN}:/usr/bin:/bin", HOME="/root", **extra)


@pytest.fixture(scope="module")
def sleepers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three pods running `sleep`: web-0 and web-1 (Running), web-2 Pending (no process),
    web-3 whose exec is forbidden; in namespace 'default'."""
    d = tmp_path_factory.mktemp("k8s-sleepers")
    pods = []
    try:
        for i in range(2):
            pods.append(PodProcess(f"web-{i}", ["sleep", "600"],
                                   _pod_env({"RANK": str(i)}), d / f"web-{i}.log"))
        state = d / "state.json"
        labels = {"app": "web", "training.kubeflow.org/job-name": "web"}
        write_state(state, [
            {"name": "web-0", "labels": labels, "pid": pods[0].pid, "containers": ["pytorch"]},
            {"name": "web-1", "labels": labels, "pid": pods[1].pid,
             "containers": ["pytorch", "sidecar"]},
            {"name": "web-2", "labels": labels, "phase": "Pending"},
            {"name": "web-3", "labels": labels, "pid": pods[0].pid, "forbid_exec": True},
        ], contexts=["kind-test"])
        yield Cluster(state, d / "bin", pods)
    finally:
        for p in pods:
            p.stop()


@pytest.fixture
def standin(sleepers: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    install(sleepers.bin)
    for k, v in sleepers.env().items():
        monkeypatch.setenv(k, v)
    Path(str(sleepers.state) + ".calls").unlink(missing_ok=True)
    return sleepers


@dataclass
class _Args:
    word: tuple[str, ...] = ("a b", "$(id)")
    sleep_on: str | None = None


NODE_JOB = NodeJob(("k8s_node",), _Args(), {"host": str, "processes": list})


def test_each_pod_answers_from_its_own_namespaces_and_the_others_say_why(standin):
    seen = []
    results = run(NODE_JOB, FanoutOptions(k8s=K8sTarget(selector="app=web"), fanout=2,
                                          timeout=20), seen.append, progress=False)
    assert [r.host for r in results] == ["web-0", "web-1", "web-2", "web-3"]
    docs = {r.host: r.data for r in seen if r.data is not None}
    errors = {r.host: r.error for r in results}
    assert sorted(docs) == ["web-0", "web-1"], errors
    for name, doc in docs.items():
        assert doc["host"] == name  # the pod's own host name (UTS namespace)
        assert doc["pids"][0] == 1 and len(doc["pids"]) <= 4, doc["pids"]  # its PID namespace
        assert doc["words"] == ["a b", "$(id)"] and doc["argv0"] == "-"
    assert docs["web-1"]["rank_env"] == "1"  # the container's environment, not the caller's
    assert errors["web-2"].startswith("pod is Pending, not Running: not asked")
    assert "RBAC 'create' on pods/exec" in errors["web-3"]
    calls = standin.calls()
    assert calls[0] == ["get", "pods", "-o", "json", "--selector=app=web",
                        f"--request-timeout={int(k8s.GET_TIMEOUT)}s"]
    assert sum(c[0] == "get" for c in calls) == 1  # one get for every pod
    assert sorted(c[2] for c in calls if c[0] == "exec") == ["web-0", "web-1", "web-3"]


def test_a_missing_container_or_python_fails_that_pod_only(standin):
    t = K8sTarget(job="web", container="sidecar", context="kind-test")
    results = {r.host: r for r in run(NODE_JOB, FanoutOptions(k8s=t, timeout=20),
                                      progress=False)}
    assert results["web-1"].data is not None and results["web-1"].data["host"] == "web-1"
    assert results["web-0"].error == ("container 'sidecar' not found in pod web-0 (its "
                                      "containers: pytorch); pass --container with one of them")
    results = {r.host: r for r in run(NODE_JOB, FanoutOptions(
        k8s=K8sTarget(selector="app=web"), remote_python="python9", timeout=20), progress=False)}
    assert "no python9 in the container image" in (results["web-0"].error or "")
    assert "no python9 in the container image" in (results["web-1"].error or "")


def _in_pod(pod: PodProcess) -> list[int]:
    """The host PIDs of the processes in ``pod``'s PID namespace."""
    ns = os.readlink(f"/proc/{pod.pid}/ns/pid")
    out = []
    for e in os.listdir("/proc"):
        try:
            if e.isdigit() and os.readlink(f"/proc/{e}/ns/pid") == ns:
                out.append(int(e))
        except OSError:
            pass
    return out


def test_a_slow_pod_times_out_alone_and_the_others_answer_first(standin):
    order: list[str] = []
    t0 = time.monotonic()
    job = NodeJob(("k8s_node",), _Args(sleep_on="web-0"), {"host": str, "processes": list})
    results = {r.host: r for r in run(job, FanoutOptions(
        k8s=K8sTarget(selector="app=web"), timeout=3, connect_timeout=1),
        lambda r: order.append(r.host), progress=False)}
    assert time.monotonic() - t0 < 20
    assert results["web-0"].error == ("did not finish within 4s (kubectl exec, the pod busy "
                                      "or hung); raise --timeout")
    assert results["web-1"].error is None
    assert order.index("web-1") < order.index("web-0")  # streamed as each pod finished
    deadline = time.monotonic() + 10  # the killed exec left nothing in the pod
    while len(_in_pod(standin.pods[0])) > 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(_in_pod(standin.pods[0])) == 1


def test_kubectl_get_is_bounded_in_size_and_time(standin, tmp_path, monkeypatch):
    from mldebug import fanout

    monkeypatch.setattr(k8s, "MAX_PODS_JSON", 1000)  # the stand-in's PodList is larger
    with pytest.raises(MldebugError, match="kubectl get pods answered over"):
        fanout.k8s_pods(FanoutOptions(k8s=K8sTarget(selector="app=web")))
    monkeypatch.undo()
    for k, v in standin.env().items():
        monkeypatch.setenv(k, v)
    slow = tmp_path / "slow.json"
    write_state(slow, json.loads(standin.state.read_text())["pods"], get_delay=60)
    monkeypatch.setenv("K8S_STANDIN_STATE", str(slow))
    monkeypatch.setattr(k8s, "GET_TIMEOUT", 1.0)
    t0 = time.monotonic()
    with pytest.raises(MldebugError, match="no answer within 6s"):
        fanout.k8s_pods(FanoutOptions(k8s=K8sTarget(selector="app=web")))
    assert time.monotonic() - t0 < 15


def test_no_matching_pod_through_the_cli_is_one_line(standin):
    r = run_cli("env", "--k8s", "app=nope", "-n", "default", env=standin.env())
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[0].startswith(
        "mldebug: error: no pod matches the selector 'app=nope' in namespace default.")
    assert "kubectl get pods --show-labels --namespace=default" in r.stderr
    assert "Traceback" not in r.stderr
    r = run_cli("env", "--k8s", "app=web", "--context", "nope", env=standin.env())
    assert r.returncode == 1 and 'context "nope" does not exist' in r.stderr
    assert "Traceback" not in r.stderr


# --- end to end: mldebug hang --k8s on a 2-pod gloo job -----------------------------------

RANK_SCRIPT = '''\
"""One rank per pod; rank 1 skips the all_reduce (a stuck data loader), rank 0 waits in it."""
import datetime
import os
import time

import torch
import torch.distributed as dist


def load_batch(rank):
    if rank == 1:
        time.sleep(3600)  # stuck outside any collective: rank 1 never joins the all_reduce
    return torch.ones(4)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=900))
    rank = dist.get_rank()
    os.write(1, f"rank {rank} pid {os.getpid()} ready\\n".encode())
    batch = load_batch(rank)
    dist.all_reduce(batch)


main()
'''


@pytest.fixture(scope="module")
def demo_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A PyTorchJob 'demo' as Kubeflow's training operator runs it: pods demo-master-0 and
    demo-worker-0, one rank each, with the operator's variables (MASTER_ADDR is the master
    pod's name, resolved by each pod's own /etc/hosts to 127.0.0.1: the pods share the host
    network), both ready; the ranks hang in the all_reduce rank 1 never joins."""
    d = tmp_path_factory.mktemp("k8s-demo")
    script = d / "train_rank.py"
    script.write_text(RANK_SCRIPT)
    hosts = d / "hosts"
    hosts.write_text("127.0.0.1 localhost demo-master-0 demo-worker-0\n")
    port = str(free_port())
    names = ["demo-master-0", "demo-worker-0"]
    pods: list[PodProcess] = []
    try:
        for i, name in enumerate(names):
            env = _pod_env({
                "MASTER_ADDR": "demo-master-0", "MASTER_PORT": port, "WORLD_SIZE": "2",
                "RANK": str(i), "PET_NNODES": "2", "PET_NODE_RANK": str(i),
                "PET_NPROC_PER_NODE": "1", "PET_MASTER_ADDR": "demo-master-0",
                "PET_MASTER_PORT": port, "GLOO_SOCKET_IFNAME": "lo",
                "PYTHONUNBUFFERED": "1"})
            pods.append(PodProcess(name, [sys.executable, str(script)], env,
                                   d / f"{name}.log", hosts))
        logs = [d / f"{n}.log" for n in names]
        deadline = time.monotonic() + 120
        while sum(log.read_text().count(" ready") for log in logs) < 2:
            assert time.monotonic() < deadline, "the 2-pod job did not start: " + "".join(
                log.read_text() for log in logs)
            assert all(p.proc.poll() is None for p in pods), "a pod ended: " + "".join(
                log.read_text() for log in logs)
            time.sleep(0.5)
        time.sleep(2)  # rank 0 is inside the all_reduce
        state = d / "state.json"
        write_state(state, [
            {"name": name, "labels": {"app": "demo", "training.kubeflow.org/job-name": "demo",
                                      "training.kubeflow.org/replica-type":
                                          "master" if i == 0 else "worker"},
             "pid": p.pid, "containers": ["pytorch"]}
            for i, (name, p) in enumerate(zip(names, pods, strict=True))])
        install(d / "bin")
        yield Cluster(state, d / "bin", pods)
    finally:
        for p in pods:
            p.stop()


@pytest.mark.timeout(300)
def test_hang_k8s_names_the_rank_that_skipped_the_all_reduce(demo_job):
    r = run_cli("hang", "--k8s", "app=demo", "--json", env=demo_job.env(), timeout=240)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert sorted((p["host"], p["rank"]) for p in report["processes"]) == [
        ("demo-master-0", 0), ("demo-worker-0", 1)], report["errors"]
    assert [(s["rank"], s["host"]) for s in report["suspects"]] == [(1, "demo-worker-0")]
    assert report["suspects"][0]["call_site"].startswith("train_rank.py:"), report["suspects"]
    assert report["errors"] == []
    # the route ladder's first rung read both pods: nothing above it to refuse
    assert [(x["pod"], x["answered"], x["refused"]) for x in report["k8s_routes"]] == [
        ("demo-master-0", "py-spy", []), ("demo-worker-0", "py-spy", [])]
    assert all(p.proc.poll() is None for p in demo_job.pods)  # the ranks are only read
    calls = demo_job.calls()
    assert sum(c[0] == "get" for c in calls) == 1
    assert sorted(c[2] for c in calls if c[0] == "exec") == ["demo-master-0", "demo-worker-0"]


def test_docs_k8s_page_is_registered():
    for name in ("k8s", "kubernetes"):
        r = run_cli("docs", name)
        assert r.returncode == 0 and "# Kubernetes: `--k8s` and `--k8s-job`" in r.stdout, name


def test_pdb_connect_into_a_pod_is_refused_with_the_way_in():
    r = run_cli("pdb", "connect", "web-0:5678", "--k8s", "app=web")
    assert r.returncode == 1, r.stderr
    assert "does not reach pod web-0 yet" in r.stderr and "kubectl exec -it web-0" in r.stderr
    assert "Traceback" not in r.stderr


# --- mldebug log --k8s / --k8s-job: the pods' logs over kubectl logs ----------------------

# a PyTorchJob 'demo' (Master + Worker replica, one rank per pod, `python train.py` as the
# operator runs it: no torchrun rank prefixes). demo-worker-0 (rank 1: the operator numbers
# the master first) crashed with a CUDA error and was restarted: its previous container's log
# holds the crash, its current one is the restarted run waiting for the master. demo-master-0
# (rank 0) timed out in the all_reduce the crashed rank never joined.
MASTER_LOG = """\
2026-03-02T10:14:58.201934512Z [W302 10:14:58.201000 1 torch/distributed/c10d/socket.cpp:752] [c10d] The client socket has failed to connect to [demo-master-0]:23456 (errno: 111 - Connection refused).
2026-03-02T10:15:02.410021873Z rank 0: step 0 loss 2.3061
2026-03-02T10:15:03.012387120Z rank 0: step 1 loss 2.2874
2026-03-02T10:45:03.519876204Z [E302 10:45:03.519000 33 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=4194304, NumelOut=4194304, Timeout(ms)=1800000) ran for 1800092 milliseconds before timing out.
2026-03-02T10:45:03.521004113Z [E302 10:45:03.521000 33 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2162] [PG ID 0 PG GUID 0(default_pg) Rank 0]  failure detected by watchdog at work sequence id: 12 PG status: last enqueued work: 12, last completed work: 11
2026-03-02T10:45:03.521190877Z [E302 10:45:03.521000 33 torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1706] [PG ID 0 PG GUID 0(default_pg) Rank 0] Timeout at NCCL work: 12, last enqueued NCCL work: 12, last completed NCCL work: 11.
"""
WORKER_PREVIOUS_LOG = """\
2026-03-02T10:15:02.409113620Z step 0 loss 2.3058
2026-03-02T10:15:03.011900441Z step 1 loss 2.2871
2026-03-02T10:15:03.250871003Z Traceback (most recent call last):
2026-03-02T10:15:03.250890112Z   File "/workspace/train.py", line 88, in <module>
2026-03-02T10:15:03.250893356Z     main()
2026-03-02T10:15:03.250895870Z   File "/workspace/train.py", line 79, in main
2026-03-02T10:15:03.250898250Z     loss = model(batch).float().mean()
2026-03-02T10:15:03.250900547Z            ^^^^^^^^^^^^
2026-03-02T10:15:03.250902877Z   File "/workspace/train.py", line 41, in forward
2026-03-02T10:15:03.250905165Z     h = self.gather(h, index)
2026-03-02T10:15:03.250907461Z         ^^^^^^^^^^^^^^^^^^^^^
2026-03-02T10:15:03.250909711Z RuntimeError: CUDA error: an illegal memory access was encountered
2026-03-02T10:15:03.250912006Z CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
2026-03-02T10:15:03.250914300Z For debugging consider passing CUDA_LAUNCH_BLOCKING=1.
2026-03-02T10:15:03.250916581Z Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""
WORKER_LOG = """\
2026-03-02T10:15:09.771203014Z [W302 10:15:09.771000 1 torch/distributed/c10d/socket.cpp:752] [c10d] The client socket has failed to connect to [demo-master-0]:23456 (errno: 111 - Connection refused).
"""


@pytest.fixture
def log_cluster(tmp_path: Path) -> Cluster:
    """The stand-in with the 'demo' job's pods and their logs (no processes: kubectl logs
    reads what the kubelet kept), plus web-0 whose logs are forbidden and web-1 still
    ContainerCreating, both of job 'web' in namespace 'training'."""
    state = tmp_path / "state.json"
    job = "training.kubeflow.org/job-name"
    write_state(state, [
        {"name": "demo-master-0", "namespace": "training", "containers": ["pytorch"],
         "labels": {job: "demo", "training.kubeflow.org/replica-type": "master"},
         "env": {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "demo-master-0"}},
        {"name": "demo-worker-0", "namespace": "training", "containers": ["pytorch"],
         "labels": {job: "demo", "training.kubeflow.org/replica-type": "worker"},
         "restarts": 1, "last_exit": {"exitCode": 1, "reason": "Error"}},
        {"name": "web-0", "namespace": "training", "labels": {job: "web"},
         "forbid_logs": True},
        {"name": "web-1", "namespace": "training", "labels": {job: "web"},
         "phase": "Pending", "waiting": "ContainerCreating"},
    ])
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "demo-master-0.log").write_text(MASTER_LOG)
    (logs / "demo-worker-0.previous.log").write_text(WORKER_PREVIOUS_LOG)
    (logs / "demo-worker-0.log").write_text(WORKER_LOG)
    (logs / "web-0.log").write_text(MASTER_LOG)
    install(tmp_path / "bin")
    return Cluster(state, tmp_path / "bin", [])


def test_pod_rank_from_the_spec_env_or_kubeflows_replica_numbering():
    def pod(name: str, env: dict[str, str] | None = None, **labels: str) -> Pod:
        return Pod(name, "training", "Running", dict(labels), ["pytorch"],
                   env={"pytorch": env} if env else {})

    job = [pod("j-master-0"), pod("j-worker-0"), pod("j-worker-1")]
    assert [k8s.pod_rank(p, job, "pytorch") for p in job] == [0, 1, 2]  # master first
    workers = [pod("w-worker-0"), pod("w-worker-1")]
    assert [k8s.pod_rank(p, workers) for p in workers] == [0, 1]  # no master replica
    labelled = pod("x-abc12", **{k8s.REPLICA_TYPE: "Worker", k8s.REPLICA_INDEX: "3"})
    assert k8s.pod_rank(labelled, [*job, labelled]) == 4
    assert k8s.pod_rank(pod("j-worker-1", {"RANK": "7"}), job, "pytorch") == 7  # env first
    assert k8s.pod_rank(pod("p", {"PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "1"}), []) == 2
    # 8 ranks per pod: RANK/PET_NODE_RANK is the node's rank, an unprefixed line any rank's
    assert k8s.pod_rank(pod("j-worker-1", {"PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "8"}),
                        job) is None
    assert k8s.pod_rank(pod("llama-abc12"), []) is None


def test_parse_pods_reads_restarts_last_exit_env_and_default_container():
    item = _item("p-worker-0", {}, containers=("sidecar", "pytorch"),
                 annotations={k8s.DEFAULT_CONTAINER: "pytorch"})
    item["spec"]["containers"][1]["env"] = [
        {"name": "RANK", "value": "1"}, {"name": "PATH", "value": "/bin"},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]
    item["status"]["containerStatuses"] = [
        {"name": "pytorch", "restartCount": 2,
         "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}},
        {"name": "sidecar", "restartCount": "x"}, "junk"]
    (p,) = k8s.parse_pods(json.dumps(item))
    assert p.env == {"pytorch": {"RANK": "1"}} and p.default_container == "pytorch"
    assert p.statuses["pytorch"] == k8s.ContainerStatus(2, "OOMKilled, exit code 137")
    assert p.statuses["sidecar"].restarted is False
    assert k8s.logs_container(K8sTarget(job="p"), p) == "pytorch"
    assert k8s.logs_argv(K8sTarget(job="p", container="pytorch", context="c"), p,
                         previous=True, limit_bytes=1000, tail=50, timeout=30) == [
        "logs", "p-worker-0", "--namespace=training", "--container=pytorch", "--previous",
        "--limit-bytes=1000", "--timestamps", "--tail=50", "--context=c",
        "--request-timeout=30s"]


def test_log_k8s_job_names_the_crashed_rank_from_the_previous_container(log_cluster):
    r = run_cli("log", "--k8s-job", "demo", "-n", "training", "--json", env=log_cluster.env())
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["sources"] == ["demo-master-0", "demo-worker-0 (previous)", "demo-worker-0"]
    verdict = report["verdict"]
    assert (verdict["culprits"], verdict["hosts"]) == ([1], ["demo-worker-0"]), verdict
    assert verdict["code"] == "log-first-failure-cuda-error"
    assert "CUDA error: an illegal memory access" in verdict["title"]
    assert "at demo-worker-0 (previous):12" in verdict["detail"]  # the crashed run's own line
    ranks = {r["rank"]: r["host"] for r in report["ranks"]}
    assert ranks == {0: "demo-master-0", 1: "demo-worker-0"}, report["ranks"]
    assert any("demo-worker-0: container pytorch restarted 1 time (last run: Error, exit code "
               "1)" in n for n in report["notes"]), report["notes"]
    calls = log_cluster.calls()
    assert sum(c[0] == "get" for c in calls) == 1
    logs = [c for c in calls if c[0] == "logs"]
    assert sorted((c[1], "--previous" in c) for c in logs) == [
        ("demo-master-0", False), ("demo-worker-0", False), ("demo-worker-0", True)]
    for c in logs:
        assert f"--limit-bytes={k8s.LOG_LIMIT_BYTES}" in c and "--namespace=training" in c
        assert "--timestamps" in c
        assert "--tail=200000" in c  # the end of a log by default: where a crash is
    r = run_cli("log", "--k8s-job", "demo", "-n", "training", "--json", "--tail", "0",
                env=log_cluster.env())  # --tail 0: no --tail (kubectl's 0 is no line at all)
    assert r.returncode == 0, r.stderr
    later = [c for c in log_cluster.calls()[len(calls):] if c[0] == "logs"]
    assert len(later) == 3 and not any(a.startswith("--tail") for c in later for a in c), later


def test_log_k8s_limit_bytes_and_no_previous_are_passed(log_cluster):
    r = run_cli("log", "--k8s-job", "demo", "-n", "training", "--json", "--limit-bytes",
                "300", "--no-previous", "--tail", "100", env=log_cluster.env())
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["sources"] == ["demo-master-0", "demo-worker-0"]
    assert any("pod demo-master-0: only the first 300 bytes of its log read (--limit-bytes)"
               in n for n in report["notes"]), report["notes"]
    logs = [c for c in log_cluster.calls() if c[0] == "logs"]
    assert len(logs) == 2 and all("--limit-bytes=300" in c and "--tail=100" in c
                                  and "--previous" not in c for c in logs)


def test_log_k8s_an_unreadable_pod_is_a_note_and_the_others_are_read(log_cluster):
    r = run_cli("log", "--k8s", "training.kubeflow.org/job-name", "-n", "training", "--json",
                env=log_cluster.env())
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert "web-0" not in report["sources"] and "demo-master-0" in report["sources"]
    notes = "\n".join(report["notes"])
    assert ("pod web-0: logs not read: kubectl logs forbidden; your user needs RBAC 'get' on "
            "pods/log") in notes
    assert "pod web-1: logs not read: the container has not started" in notes
    assert "ContainerCreating" in notes
    r = run_cli("log", "--k8s-job", "demo", "-n", "training", "-c", "nope",
                env=log_cluster.env())
    assert r.returncode == 0 and "container 'nope' not found in pod demo-master-0" in r.stdout


def test_log_k8s_errors_are_one_line(log_cluster, tmp_path):
    r = run_cli("log", "--k8s-job", "nope", "-n", "training", env=log_cluster.env())
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("mldebug: error: no pod matches the job 'nope' in namespace "
                               "training."), r.stderr
    r = run_cli("log", "--k8s-job", "demo", env=dict(os.environ, PATH=str(tmp_path)))
    assert r.returncode == 1 and "kubectl is not on PATH" in r.stderr
    for bad in (["--k8s-job", "demo", "--limit-bytes", "0"], ["--k8s-job", "Bad_Name"],
                ["-n", "training", "x.log"], [], ["--k8s", "a=b", "--timeout", "inf"]):
        r = run_cli("log", *bad, env=log_cluster.env())
        assert r.returncode == 2 and "Traceback" not in r.stderr, (bad, r.stderr)
        said = [ln for ln in r.stderr.splitlines() if "error:" in ln]  # (argparse's usage aside)
        assert len(said) == 1, (bad, r.stderr)
    assert "--k8s-job NAME" in run_cli("log", "--help").stdout


def test_standin_logs_fails_like_kubectl_for_an_unknown_pod(log_cluster):
    r = subprocess.run([str(log_cluster.bin / "kubectl"), "logs", "x", "-n", "training"],
                       capture_output=True, text=True, env=log_cluster.env())
    assert r.returncode == 1 and r.stderr == 'Error from server (NotFound): pods "x" not found\n'
    r = subprocess.run([str(log_cluster.bin / "kubectl"), "logs", "-p", "demo-master-0",
                        "-n", "training"], capture_output=True, text=True, env=log_cluster.env())
    assert r.returncode == 1 and "previous terminated container" in r.stderr


def test_env_k8s_covers_every_pod_answered_or_named(standin):
    r = run_cli("env", "--k8s", "app=web", "--json", env=standin.env(), timeout=120)
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert sorted(n["host"] for n in doc["nodes"]) == ["web-0", "web-1"]
    assert sorted(doc["unreachable"]) == ["web-2", "web-3"]
    assert "Pending" in doc["unreachable"]["web-2"]
    assert "pods/exec" in doc["unreachable"]["web-3"]
