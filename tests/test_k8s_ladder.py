"""The route ladder per pod (#45): py-spy in the container -> the ranks' torch debug server ->
``kubectl debug`` with an ephemeral container from --debug-image -> the signal route -> "cannot
read: here is what would".

Pure parts on fixtures (the kubectl debug argv as kubectl documents it, its failures in
kubectl's real words, the per-pod decision and merge), then one ``mldebug hang --k8s`` over
pods of the stand-in (tests/k8s_standin.py) where each rung has a pod whose rungs above it are
refused: the pods run without SYS_PTRACE (a seccomp filter fails ptrace and
process_vm_readv in every exec, so py-spy in the container is refused with its own
message), and the pods of the lower rungs refuse kubectl debug with kubectl's Forbidden."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from jobs import free_port
from k8s_standin import PodProcess, install, write_state

from mldebug import k8s
from mldebug.errors import UsageError
from mldebug.k8s import K8sTarget, Pod

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = str(Path(sys.executable).parent)

# --- pure: argv, failures, the decision per pod ---------------------------------------------


def test_debug_argv_is_kubectls_documented_ephemeral_container_shape():
    # kubectl debug --help: "kubectl debug (POD | TYPE[[.VERSION].GROUP]/NAME) [ -- COMMAND
    # [args...] ]"; "--target='': When using an ephemeral container, target processes in this
    # container name."; "--profile='legacy': Options are "legacy", "general", "baseline",
    # "netadmin", "restricted" or "sysadmin"."; "-c, --container='': Container name to use
    # for debug container."; "-q, --quiet=false: If true, suppress informational messages."
    pod = Pod("llama-worker-0", "training", "Running", containers=["pytorch", "sidecar"])
    assert k8s.debug_argv(K8sTarget(job="llama"), pod, "ghcr.io/me/pyspy:1",
                          name="mldebug-abc123") == [
        "debug", "llama-worker-0", "--stdin", "--quiet", "--image=ghcr.io/me/pyspy:1",
        "--profile=sysadmin", "--target=pytorch", "--container=mldebug-abc123",
        "--namespace=training", "--", "python3", "-", "<mldebug-node>"]
    t = K8sTarget(job="llama", container="sidecar", context="prod")
    argv = k8s.debug_argv(t, pod, "img@sha256:" + "a" * 64, python="/opt/py/bin/python3")
    assert "--target=sidecar" in argv and "--context=prod" in argv
    assert argv[-3:] == ["/opt/py/bin/python3", "-", "<mldebug-node>"]
    pod.default_container = "sidecar"  # kubectl.kubernetes.io/default-container
    assert "--target=sidecar" in k8s.debug_argv(K8sTarget(job="llama"), pod, "img")
    assert k8s.debug_container_name("A1_b2") == "mldebug-a1b2"


@pytest.mark.parametrize("image", ["", "-it", "a b", "img\nx", "x" * 600, "$(id)"])
def test_a_bad_debug_image_is_a_usage_error(image):
    with pytest.raises(UsageError, match="not an image reference"):
        k8s.check_image(image)


@pytest.mark.parametrize(("said", "expect"), [
    # github.com/ministryofjustice/cloud-platform/issues/7960: the user lacks the RBAC verb
    (['Error from server (Forbidden): pods "web-7d9f" is forbidden: User "dev@example.com" '
      'cannot patch resource "pods/ephemeralcontainers" in API group "" in the namespace '
      '"apps"'], "RBAC 'patch' on pods/ephemeralcontainers"),
    # github.com/kubernetes/kubernetes/issues/117130: a namespace under a Pod Security level
    (["Defaulting debug container name to debugger-wjzcc.",
      'Error from server (Forbidden): pods "testclient-848997fb8-dlcsn" is forbidden: violates '
      'PodSecurity "restricted:v1.24": allowPrivilegeEscalation != false (container '
      '"debugger-wjzcc" must set securityContext.allowPrivilegeEscalation=false)'],
     "Pod Security admission refuses the privileged debug container"),
    (['error: the ephemeral container mldebug-1 could not start: exec: "python3": executable '
      'file not found in $PATH'], "no python3 in the --debug-image"),
    (['Error from server (NotFound): pods "p" not found'], "the pod is gone"),
    ([], "gave no answer"),
])
def test_kubectl_debug_failures_are_one_actionable_line(said, expect):
    assert expect in k8s.explain_debug_failure(said, "p")


def _doc(*procs: dict[str, Any]) -> dict[str, Any]:
    return {"host": "p-0", "processes": list(procs), "errors": []}


DENIED = ("py-spy could not attach to pid 7 although running as root (ptrace denied: "
          "Error: Failed to suspend process). Containers: --cap-add=SYS_PTRACE")
SHORT = "ptrace denied: the container has no SYS_PTRACE (py-spy: Error: Failed to suspend process)"
NO_STORE = "Debug-server route: no TCPStore at 127.0.0.1:29500 (connection refused)"


def test_first_rung_says_which_answered_and_why_the_one_above_did_not():
    read = {"pid": 7, "dump": [{"thread_id": 1}], "route": "py-spy"}
    lad = k8s.first_rung("p-0", _doc(read), None)
    assert (lad.answered, lad.refused, k8s.climbing(lad)) == ("py-spy", {}, False)
    assert lad.line() == "pod p-0: py-spy answered"
    served = {"pid": 7, "dump": [{}], "route": "debug-server", "pyspy_error": DENIED}
    lad = k8s.first_rung("p-0", _doc(served), None)
    assert lad.answered == "debug-server" and lad.refused["py-spy"] == SHORT
    assert f"(refused above it: py-spy: {SHORT})" in lad.line()
    unread = {"pid": 7, "dump": None, "error": f"{DENIED}. {NO_STORE}"}
    lad = k8s.first_rung("p-0", _doc(unread, read), None)
    assert lad.answered is None and k8s.climbing(lad) and (lad.ranks, lad.unread) == (2, 1)
    assert lad.refused == {"py-spy": SHORT, "debug-server": NO_STORE[len("Debug-server route: "):]}
    # the node's own debug-server error when the rank's does not say
    doc = _doc({"pid": 7, "dump": None, "error": DENIED})
    doc["errors"] = [{"pid": None, "error": "debug-server route: the job's TCPStore at "
                                            "127.0.0.1:1 refused the connection"}]
    assert k8s.first_rung("p-0", doc, None).refused["debug-server"] == (
        "the job's TCPStore at 127.0.0.1:1 refused the connection")
    lad = k8s.first_rung("p-0", None, "kubectl exec forbidden: your user needs RBAC ...")
    assert k8s.climbing(lad) and lad.refused["py-spy"].startswith("kubectl exec forbidden")
    no_spy = _doc({"pid": 7, "dump": None, "error": None})
    no_spy["py_spy"] = None  # the node found no py-spy beside the image's Python or on PATH
    assert k8s.first_rung("p-0", no_spy, None).refused["py-spy"].startswith(
        "no py-spy in the container image")
    none = k8s.first_rung("p-0", _doc(), None)
    assert not k8s.climbing(none) and "no rank process seen" in none.line()


def test_py_spys_refusal_is_one_line_of_its_own_words():
    from mldebug.hang.node import explain_pyspy_error

    # what py-spy 0.4 printed here for `py-spy dump --pid P` under the stand-in's no-ptrace
    # seccomp filter (ptrace and process_vm_readv fail with EPERM)
    said = ("Error: Failed to get stack traces\n\nCaused by:\n    0: Failed to suspend process\n"
            "    1: EPERM: Operation not permitted\n    2: EPERM: Operation not permitted\n\n"
            "Stack backtrace:\n   0: <E as anyhow::context::ext::StdError>::ext_context\n"
            "   1: py_spy::python_spy::PythonSpy::get_stack_traces\n")
    msg = explain_pyspy_error(os.getpid(), said, 1, {"State": "S", "TracerPid": "0"}, euid=0)
    assert "\n" not in msg and "backtrace" not in msg and "Caused by" not in msg
    assert ("(ptrace denied: Error: Failed to get stack traces / 0: Failed to suspend process / "
            "1: EPERM: Operation not permitted)") in msg
    assert k8s.short_pyspy_why(msg) == (
        "ptrace denied: the container has no SYS_PTRACE (py-spy: Error: Failed to get stack "
        "traces / 0: Failed to suspend process / 1: EPERM: Operation not permitted)")


def test_a_lower_rung_replaces_only_the_ranks_it_read_and_the_last_line_names_every_fix():
    base = _doc({"pid": 7, "dump": None, "error": DENIED},
                {"pid": 8, "dump": None, "error": DENIED})
    lad = k8s.first_rung("p-0", base, None)
    later = _doc({"pid": 7, "dump": [{"x": 1}], "route": "py-spy"},
                 {"pid": 8, "dump": None, "error": "no"}, {"pid": 9, "dump": [{}]})
    read = k8s.merge_rung(base, later, "kubectl-debug", "kubectl debug")
    assert read == 1 and base["processes"][0]["route_detail"] == "kubectl debug"
    assert base["processes"][1]["dump"] is None and len(base["processes"]) == 2  # 9: not ours
    k8s.rung_result(lad, "kubectl-debug", read, None)
    assert lad.answered is None and lad.unread == 1
    k8s.rung_result(lad, "signal", 0, "no handler installed")
    line = lad.line()
    assert line.startswith("pod p-0: cannot read 1 of 2 rank(s): py-spy: ")
    for need in ("SYS_PTRACE", "shareProcessNamespace", "start_debug_server()",
                 "pods/ephemeralcontainers", "--debug-image", "mldebug.install_dump_handler()"):
        assert need in line, need


# --- the stand-in: one pod per rung -------------------------------------------------------

PLAIN_RANK = '''\
import os, sys, time
if os.environ.get("WITH_HANDLER") == "1":
    import mldebug
    mldebug.install_dump_handler(poll=0.2)
os.write(1, f"rank pid {os.getpid()} ready\\n".encode())


def load_batch():
    while True:
        time.sleep(1)  # stuck outside any collective


load_batch()
'''

IMAGE = "ghcr.io/example/pyspy-debug:1"


def _pod_env(port: int, **extra: str) -> dict[str, str]:
    return dict(os.environ, PATH=f"{VENV_BIN}:/usr/bin:/bin", HOME="/root", RANK="0",
                LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME="lo", **extra)


@pytest.fixture(scope="module")
def ladder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Four pods without SYS_PTRACE, one rank each, label app=ladder:

    - lad-ds-0: the rank runs torch's debug server (recipes/hang_debug_server.py) -> rung 2;
    - lad-dbg-0: a plain rank -> rung 3, kubectl debug with the image's py-spy;
    - lad-sig-0: kubectl debug forbidden (RBAC), the rank has mldebug's dump handler -> rung 4;
    - lad-none-0: kubectl debug forbidden, no handler -> no rung: what would is named;
    - lad-noexec-0: kubectl exec forbidden (RBAC pods/exec) -> kubectl debug reads it whole.

    One ``mldebug hang --k8s app=ladder --debug-image IMAGE --json`` over them."""
    if platform.machine() != "x86_64":
        pytest.skip("the stand-in's no-ptrace seccomp filter is written for x86_64")
    d = tmp_path_factory.mktemp("k8s-ladder")
    script = d / "rank.py"
    script.write_text(PLAIN_RANK)
    image = d / "image-bin"  # the debug image: python3 and py-spy
    image.mkdir()
    (image / "python3").symlink_to(sys.executable)
    (image / "py-spy").symlink_to(Path(VENV_BIN) / "py-spy")
    specs = {
        "lad-ds-0": ([sys.executable, str(REPO / "recipes" / "hang_debug_server.py")],
                     {"HANG_RANK": "0", "DEBUG_PORT": str(free_port())}, {}),
        "lad-dbg-0": ([sys.executable, str(script)], {}, {}),
        "lad-sig-0": ([sys.executable, str(script)], {"WITH_HANDLER": "1"},
                      {"forbid_debug": True}),
        "lad-none-0": ([sys.executable, str(script)], {}, {"forbid_debug": True}),
        "lad-noexec-0": ([sys.executable, str(script)], {}, {"forbid_exec": True}),
    }
    pods: dict[str, PodProcess] = {}
    try:
        for name, (argv, extra, _) in specs.items():
            pods[name] = PodProcess(name, argv, _pod_env(free_port(), **extra),
                                    d / f"{name}.log")
        deadline = time.monotonic() + 120
        while not all(" ready" in (d / f"{n}.log").read_text() for n in pods):
            assert time.monotonic() < deadline, "pods did not start: " + "".join(
                (d / f"{n}.log").read_text() for n in pods)
            assert all(p.proc.poll() is None for p in pods.values()), "a pod ended: " + "".join(
                (d / f"{n}.log").read_text() for n in pods)
            time.sleep(0.5)
        time.sleep(1.5)  # lad-ds-0's rank is inside wait_for_data
        state = d / "state.json"
        write_state(state, [{"name": n, "labels": {"app": "ladder"}, "pid": p.pid,
                             "containers": ["pytorch"], "no_ptrace": True, **specs[n][2]}
                            for n, p in pods.items()], images={IMAGE: str(image)})
        install(d / "bin")
        env = dict(os.environ, PATH=f"{d / 'bin'}:{VENV_BIN}:{os.environ.get('PATH', '')}",
                   K8S_STANDIN_STATE=str(state))
        r = run_cli("hang", "--k8s", "app=ladder", "--debug-image", IMAGE, "--json",
                    "--timeout", "10", env=env, timeout=240)
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        calls = [json.loads(line) for line in Path(str(state) + ".calls").read_text()
                 .splitlines()]
        yield {"report": report, "routes": {x["pod"]: x for x in report["k8s_routes"]},
               "calls": calls, "state": json.loads(state.read_text()), "pods": pods,
               "env": env}
    finally:
        for p in pods.values():
            p.stop()


def _rank_of(report: dict[str, Any], pod: str) -> dict[str, Any]:
    [p] = [p for p in report["processes"] if p["host"] == pod]
    return p


@pytest.mark.timeout(300)
def test_debug_server_answers_where_py_spy_in_the_container_is_refused(ladder):
    lad = ladder["routes"]["lad-ds-0"]
    assert lad["answered"] == "debug-server", lad
    assert [x["rung"] for x in lad["refused"]] == ["py-spy"]
    assert "ptrace denied" in lad["refused"][0]["why"], lad  # py-spy's own EPERM, explained
    p = _rank_of(ladder["report"], "lad-ds-0")
    assert p["route"] == "debug-server"


@pytest.mark.timeout(300)
def test_kubectl_debug_answers_where_py_spy_and_the_debug_server_are_refused(ladder):
    lad = ladder["routes"]["lad-dbg-0"]
    assert lad["answered"] == "kubectl-debug", lad
    assert [x["rung"] for x in lad["refused"]] == ["py-spy", "debug-server"]
    assert "ptrace denied" in lad["refused"][0]["why"]
    p = _rank_of(ladder["report"], "lad-dbg-0")
    assert p["route"] == "py-spy", p
    assert "load_batch" in json.dumps(ladder["report"]["stacks"])
    [call] = [c for c in ladder["calls"] if c[:2] == ["debug", "lad-dbg-0"]]
    assert call[2:7] == ["--stdin", "--quiet", f"--image={IMAGE}", "--profile=sysadmin",
                         "--target=pytorch"]
    [eph] = [pod["ephemeral"] for pod in ladder["state"]["pods"] if pod["name"] == "lad-dbg-0"]
    assert eph[0]["name"].startswith("mldebug-") and eph[0]["profile"] == "sysadmin"


@pytest.mark.timeout(300)
def test_signal_answers_where_kubectl_debug_is_forbidden(ladder):
    lad = ladder["routes"]["lad-sig-0"]
    assert lad["answered"] == "signal", lad
    refused = {x["rung"]: x["why"] for x in lad["refused"]}
    assert list(refused) == ["py-spy", "debug-server", "kubectl-debug"]
    assert "RBAC 'patch' on pods/ephemeralcontainers" in refused["kubectl-debug"]
    p = _rank_of(ladder["report"], "lad-sig-0")
    assert p["route"] in ("python", "faulthandler")


@pytest.mark.timeout(300)
def test_no_rung_names_the_permission_or_hook_that_would(ladder):
    lad = ladder["routes"]["lad-none-0"]
    assert lad["answered"] is None and lad["unread"] == 1
    refused = {x["rung"]: x["why"] for x in lad["refused"]}
    assert list(refused) == ["py-spy", "debug-server", "kubectl-debug", "signal"]
    assert "no handler installed" in refused["signal"]
    for need in ("SYS_PTRACE", "shareProcessNamespace", "start_debug_server()",
                 "pods/ephemeralcontainers", "mldebug.install_dump_handler()"):
        assert need in lad["line"], need
    assert not [p for p in ladder["report"]["processes"] if p["host"] == "lad-none-0"]
    assert all(p.proc.poll() is None for p in ladder["pods"].values())  # only read, never ended
    # one get for the whole run; kubectl debug only where exec's rungs left ranks unread
    calls = ladder["calls"]
    assert sum(c[0] == "get" for c in calls) == 1
    assert sorted(c[1] for c in calls if c[0] == "debug") == [
        "lad-dbg-0", "lad-noexec-0", "lad-none-0", "lad-sig-0"]


@pytest.mark.timeout(300)
def test_kubectl_debug_reads_a_pod_whose_exec_is_forbidden(ladder):
    lad = ladder["routes"]["lad-noexec-0"]
    assert lad["answered"] == "kubectl-debug" and (lad["ranks"], lad["unread"]) == (1, 0), lad
    refused = {x["rung"]: x["why"] for x in lad["refused"]}
    assert list(refused) == ["py-spy", "debug-server"]
    assert "RBAC 'create' on pods/exec" in refused["py-spy"]
    assert _rank_of(ladder["report"], "lad-noexec-0")["route"] == "py-spy"
    assert not [e for e in ladder["report"]["errors"] if e.get("host") == "lad-noexec-0"]


@pytest.mark.timeout(300)
def test_the_text_report_has_one_line_per_pod_with_its_rung(ladder):
    r = run_cli("hang", "--k8s", "app=ladder", "--timeout", "10", env=ladder["env"],
                timeout=240)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "routes per pod" in out
    for line in ("pod lad-ds-0: debug-server answered (refused above it: py-spy: ",
                 "pod lad-dbg-0: cannot read 1 of 1 rank(s): py-spy: ",
                 "kubectl-debug: not tried: pass --debug-image IMAGE",
                 "pod lad-sig-0: signal answered (refused above it: py-spy: "):
        assert line in out, out[-3000:]


def test_debug_image_needs_k8s_and_an_image_reference(tmp_path):
    r = run_cli("hang", "--debug-image", "img:1")
    assert r.returncode == 2 and "--debug-image is for Kubernetes pods" in r.stderr
    env = dict(os.environ, PATH=str(tmp_path))  # never reaches kubectl
    r = run_cli("hang", "--k8s", "app=x", "--debug-image=-it", env=env)
    assert r.returncode == 2 and "not an image reference" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
