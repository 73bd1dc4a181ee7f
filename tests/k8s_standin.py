"""A ``kubectl`` stand-in for tests/test_k8s.py: the subset of kubectl that mldebug uses (#45),
over "pods" that are real isolated process trees on this host.

A pod is ``unshare --pid --fork --mount-proc --uts``: its own PID namespace (its first process
is PID 1, /proc shows the pod's processes only), mount namespace (its own /proc and
/etc/hosts) and host name (the pod's name, as Kubernetes sets it); the network namespace is
the host's, so ranks in two pods meet over 127.0.0.1. ``start_pod`` starts one; the pods are
listed in a JSON state file named by ``$K8S_STANDIN_STATE`` (``write_state``), and every call
is appended, as its argv, to ``$K8S_STANDIN_STATE.calls``; ``get_delay`` in the state makes
``get`` slow.

The documented shapes implemented (``kubectl get --help``, ``kubectl exec --help``):

    kubectl get pods -l key=value -o json            (-l/--selector, -n/--namespace,
                                                      --context, --kubeconfig,
                                                      --request-timeout)
    kubectl exec (POD | TYPE/NAME) [-c CONTAINER] [flags] -- COMMAND [args...]
                                                     (-i/--stdin, -n, -c/--container,
                                                      --context, --kubeconfig)
    kubectl logs [-f] [-p] (POD | TYPE/NAME) [-c CONTAINER]
                                                     (-p/--previous, -c/--container, -n,
                                                      --limit-bytes, --tail, --timestamps,
                                                      --context, --kubeconfig,
                                                      --request-timeout; not -f)

``get`` answers a PodList (items[].metadata.name/namespace/labels, spec.containers[].name,
status.phase) for the equality-based selectors (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``,
comma-separated). ``exec`` enters the pod with ``nsenter --target <pod PID 1> --pid --mount
--uts -- COMMAND`` in the pod's own environment (as the container runtime gives an exec the
container's env), stdin passed through with -i; the failures kubectl reports are reproduced
with kubectl's words: an unknown pod or context, a container not in the pod, a pod not
Running, exec forbidden (a pod marked ``forbid_exec``), a command not in the image's PATH.

``logs`` serves the files the test wrote beside the state file: ``logs/POD.log`` (the current
container) and ``logs/POD.previous.log`` (``--previous``), whose lines may start with the
kubelet's RFC 3339 time (kept with ``--timestamps``, removed without; a line without one gets
the file's mtime); ``--tail`` then ``--limit-bytes`` cut it as the kubelet does. It fails
with the API server's words for an unknown pod, a container not in the pod, a pod marked
``forbid_logs`` or ``waiting`` (e.g. "ContainerCreating"), and ``--previous`` without a
previous log. ``get`` adds each pod's ``restarts``/``last_exit`` as
status.containerStatuses[] and its ``env`` as spec.containers[].env.

A pod marked ``no_ptrace`` is a container without ``CAP_SYS_PTRACE``: every ``exec`` into it
runs under a seccomp filter that fails ``ptrace``, ``process_vm_readv`` and
``process_vm_writev`` with EPERM. That is what such a container meets (moby's default
seccomp profile allows process_vm_readv/writev only with CAP_SYS_PTRACE, and attaching to a
process that is not one's child needs it under Yama's ptrace_scope 1, the common default):
py-spy in the container is refused with its own message ("Failed to suspend process ...
EPERM: Operation not permitted") while signals, sockets and /proc reads still work. (py-spy
--nonblocking reads /proc/PID/mem instead, which this host - root, no Yama - still allows; in
a real pod Yama refuses that too. mldebug hang dumps blocking by default.)

``debug`` is kubectl's documented ``kubectl debug (POD | TYPE[[.VERSION].GROUP]/NAME)
[ -- COMMAND [args...] ]`` for an ephemeral container (``-i/--stdin``, ``-q/--quiet``,
``--image``, ``--target``, ``--profile``, ``-c/--container``, ``-n``, ``--context``,
``--kubeconfig``): the image is a directory named in the state's ``images`` (its programs
first on PATH, the image's own environment, not the target's), the container a process
entering the pod's PID, mount and UTS namespaces with nsenter; ``--profile=sysadmin``
(privileged) or ``general`` (adds SYS_PTRACE) runs it without the ptrace filter, any other
profile under it when the pod is ``no_ptrace``. Each ephemeral container is recorded in the
state as the API server keeps it in ``spec.ephemeralContainers`` (never removed). Refusals
in kubectl's words: a pod marked ``forbid_debug`` (RBAC: "cannot patch resource
\"pods/ephemeralcontainers\"") or ``psa`` (Pod Security admission refuses a privileged
container).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STATE_ENV = "K8S_STANDIN_STATE"


def _fail(msg: str, code: int = 1) -> int:
    sys.stderr.write(msg + "\n")
    return code


def _parse(argv: list[str], with_value: set[str], bare: set[str]) -> tuple[dict[str, str],
                                                                            list[str], list[str]]:
    """kubectl's flag forms: ``--flag=v``, ``--flag v``, ``-f v``, ``-fv``; ``--`` ends them.
    Returns the flags (long names), the positional words, and the words after ``--``."""
    alias = {"-l": "--selector", "-n": "--namespace", "-o": "--output", "-c": "--container",
             "-i": "--stdin", "-p": "--previous", "-q": "--quiet", "-t": "--tty"}
    flags: dict[str, str] = {}
    words: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return flags, words, argv[i + 1:]
        if a.startswith("-") and len(a) > 1:
            name, eq, val = a.partition("=")
            if not name.startswith("--") and len(name) > 2:  # -lapp=demo, -ojson
                name, val, eq = name[:2], a[2:], "="
            name = alias.get(name, name)
            if name in bare:
                flags[name] = "true"
            elif name in with_value:
                if not eq:
                    i += 1
                    if i >= len(argv):
                        raise SystemExit(_fail(f"error: flag needs an argument: {a}"))
                    val = argv[i]
                flags[name] = val
            else:
                raise SystemExit(_fail(f"error: unknown flag: {name}\nSee 'kubectl --help' "
                                       "for usage."))
        else:
            words.append(a)
        i += 1
    return flags, words, []


_GLOBAL = {"--namespace", "--context", "--kubeconfig", "--request-timeout"}


def _state() -> dict[str, Any]:
    path = os.environ.get(STATE_ENV)
    if not path:
        raise SystemExit(_fail("error: the stand-in has no cluster: $K8S_STANDIN_STATE is unset "
                               "(The connection to the server localhost:8080 was refused)"))
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


def _check_config(flags: dict[str, str], state: dict[str, Any]) -> None:
    ctx = flags.get("--context")
    if ctx is not None and ctx not in state.get("contexts", []):
        raise SystemExit(_fail(f'error: context "{ctx}" does not exist'))
    cfg = flags.get("--kubeconfig")
    if cfg is not None and not Path(cfg).is_file():
        raise SystemExit(_fail(f"error: stat {cfg}: no such file or directory"))


def _matches(labels: dict[str, str], selector: str) -> bool:
    for req in filter(None, (r.strip() for r in selector.split(","))):
        if "!=" in req:
            k, v = req.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in req:
            k, v = req.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif req.startswith("!"):
            if req[1:] in labels:
                return False
        elif req not in labels:
            return False
    return True


def get(argv: list[str]) -> int:
    flags, words, _ = _parse(argv, {"--selector", "--output", *_GLOBAL}, set())
    if words[:1] != ["pods"] or len(words) > 1:
        return _fail(f"error: the stand-in answers 'get pods' only, not {words}")
    if flags.get("--output") != "json":
        return _fail("error: the stand-in answers -o json only")
    state = _state()
    _check_config(flags, state)
    time.sleep(float(state.get("get_delay", 0)))  # a slow API server
    ns = flags.get("--namespace", "default")
    items = []
    for p in state["pods"]:
        if p.get("namespace", "default") != ns or not _matches(p.get("labels", {}),
                                                                flags.get("--selector", "")):
            continue
        items.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": p["name"], "namespace": ns, "labels": p.get("labels", {}),
                         "uid": f"uid-{p['name']}"},
            "spec": {"containers": [
                {"name": c, "image": "pytorch/pytorch",
                 **({"env": [{"name": k, "value": v} for k, v in p["env"].items()]}
                    if p.get("env") else {})}
                for c in p.get("containers", ["main"])]},
            "status": {"phase": p.get("phase", "Running"), "podIP": "127.0.0.1",
                       "containerStatuses": [_container_status(p, c)
                                             for c in p.get("containers", ["main"])]},
        })
    json.dump({"apiVersion": "v1", "kind": "List", "items": items,
               "metadata": {"resourceVersion": ""}}, sys.stdout, indent=4)
    sys.stdout.write("\n")
    return 0


def _container_status(p: dict[str, Any], name: str) -> dict[str, Any]:
    st: dict[str, Any] = {"name": name, "ready": p.get("phase", "Running") == "Running",
                          "restartCount": int(p.get("restarts", 0)), "image": "pytorch/pytorch"}
    if p.get("last_exit"):  # e.g. {"exitCode": 1, "reason": "Error"}
        st["lastState"] = {"terminated": {**p["last_exit"], "containerID": "containerd://x"}}
    if p.get("waiting"):
        st["state"] = {"waiting": {"reason": p["waiting"]}}
    return st


def _pod(flags: dict, words: list[str], state: dict) -> tuple[str, str, dict | None]:
    """(namespace, pod name, the pod) of a POD | pod/NAME argument; the pod None: not found."""
    ns = flags.get("--namespace", "default")
    name = words[0].removeprefix("pod/").removeprefix("pods/")
    return ns, name, next((p for p in state["pods"] if p["name"] == name
                           and p.get("namespace", "default") == ns), None)


def logs(argv: list[str]) -> int:
    flags, words, _ = _parse(argv, {"--container", "--limit-bytes", "--tail", *_GLOBAL},
                             {"--previous", "--timestamps"})
    if len(words) != 1:
        return _fail("error: expected 'logs [-f] [-p] (POD | TYPE/NAME) [-c CONTAINER]'.\n"
                     "See 'kubectl logs -h' for help and examples")
    state = _state()
    _check_config(flags, state)
    ns, name, pod = _pod(flags, words, state)
    if pod is None:
        return _fail(f'Error from server (NotFound): pods "{name}" not found')
    if pod.get("forbid_logs"):
        return _fail(f'Error from server (Forbidden): pods "{name}" is forbidden: User '
                     f'"tester" cannot get resource "pods/log" in API group "" in the '
                     f'namespace "{ns}"')
    containers = pod.get("containers", ["main"])
    container = flags.get("--container", containers[0])
    if container not in containers:
        return _fail(f"Error from server (BadRequest): container {container} is not valid for "
                     f"pod {name}")
    previous = "--previous" in flags
    if pod.get("waiting") and not previous:
        return _fail(f'Error from server (BadRequest): container "{container}" in pod "{name}" '
                     f'is waiting to start: {pod["waiting"]}')
    path = Path(os.environ[STATE_ENV]).parent / "logs" / \
        f"{name}{'.previous' if previous else ''}.log"
    if not path.is_file():
        if previous:
            return _fail(f'Error from server (BadRequest): previous terminated container '
                         f'"{container}" in pod "{name}" not found')
        return 0  # a container that printed nothing
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime(path.stat().st_mtime))
    out = []
    for line in path.read_bytes().splitlines(keepends=True):
        head, sep, rest = line.partition(b" ")
        has = bool(sep) and len(head) >= 20 and head[:4].isdigit() and head[10:11] == b"T" \
            and head.endswith(b"Z")
        if "--timestamps" in flags:
            out.append(line if has else stamp.encode() + b" " + line)
        else:
            out.append(rest if has else line)
    if "--tail" in flags and int(flags["--tail"]) >= 0:
        out = out[len(out) - min(len(out), int(flags["--tail"])):]
    data = b"".join(out)
    if "--limit-bytes" in flags:
        data = data[:int(flags["--limit-bytes"])]
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    return 0


def _pod_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


# seccomp, as <linux/seccomp.h>, <linux/filter.h> and <linux/audit.h> define it (x86_64)
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_AUDIT_ARCH_X86_64 = 0xC000003E
_RET_ALLOW, _RET_EPERM = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
_NO_PTRACE_CALLS = (101, 310, 311)  # ptrace, process_vm_readv, process_vm_writev (x86_64)


def refuse_ptrace() -> None:
    """Install a seccomp filter on this process (inherited by everything it execs) that fails
    ptrace and process_vm_readv/writev with EPERM: a container without CAP_SYS_PTRACE under
    the runtime's default seccomp profile."""
    import ctypes
    import platform

    if platform.machine() != "x86_64":
        raise SystemExit(_fail("error: the stand-in's no_ptrace pods need x86_64"))
    ld_abs, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
    n = len(_NO_PTRACE_CALLS)
    prog = [(ld_abs, 0, 0, 4),                                  # seccomp_data.arch
            (jeq, 0, n + 1, _AUDIT_ARCH_X86_64),                # another arch: allow
            (ld_abs, 0, 0, 0)]                                  # seccomp_data.nr
    for i, nr in enumerate(_NO_PTRACE_CALLS):
        prog.append((jeq, n - i, 0, nr))                        # -> EPERM
    prog += [(ret, 0, 0, _RET_ALLOW), (ret, 0, 0, _RET_EPERM)]

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(prog))(*[SockFilter(*f) for f in prog])
    fprog = SockFprog(len(prog), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise SystemExit(_fail(f"error: seccomp filter refused (errno {ctypes.get_errno()})"))


def _enter(pid: int, command: list[str], env: dict[str, str], stdin: bool,
           no_ptrace: bool) -> int:
    """Run ``command`` in pod ``pid``'s PID, mount and UTS namespaces (this process is
    replaced), under the ptrace filter when ``no_ptrace``."""
    nsenter = shutil.which("nsenter") or "/usr/bin/nsenter"
    if not stdin:
        fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(fd, 0)
    if no_ptrace:
        refuse_ptrace()
    os.execve(nsenter, [nsenter, f"--target={pid}", "--pid", "--mount", "--uts", "--",
                        *command], env)
    return 127  # not reached


def _record_ephemeral(name: str, ns: str, container: dict[str, Any]) -> None:
    """Add the ephemeral container to the pod in the state file: read, changed and replaced
    under a lock (kubectl debug runs for several pods at once; a reader never sees half a
    file)."""
    import fcntl

    path = Path(os.environ[STATE_ENV])
    with open(str(path) + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = json.loads(path.read_text())
        for p in state["pods"]:
            if p["name"] == name and p.get("namespace", "default") == ns:
                p.setdefault("ephemeral", []).append(container)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, path)


def debug(argv: list[str]) -> int:
    """``kubectl debug POD -i --image=IMAGE --target=CONTAINER [--profile=P] -- COMMAND``: an
    ephemeral container in the pod (see the module's docstring)."""
    flags, words, command = _parse(argv, {"--container", "--image", "--target", "--profile",
                                          *_GLOBAL}, {"--stdin", "--tty", "--quiet"})
    if len(words) != 1:
        return _fail("error: expected 'debug (POD | TYPE[[.VERSION].GROUP]/NAME) "
                     "[ -- COMMAND [args...] ]'.\nSee 'kubectl debug -h' for help and examples")
    if "--image" not in flags:
        return _fail("error: --image is required when not using --copy-to")
    profile = flags.get("--profile", "legacy")
    if profile not in ("legacy", "general", "baseline", "netadmin", "restricted", "sysadmin"):
        return _fail(f"error: unknown profile: {profile}")
    state = _state()
    _check_config(flags, state)
    ns, name, pod = _pod(flags, words, state)
    if pod is None:
        return _fail(f'Error from server (NotFound): pods "{name}" not found')
    debugger = flags.get("--container") or f"debugger-{os.urandom(3).hex()[:5]}"
    if "--quiet" not in flags and "--container" not in flags:
        sys.stderr.write(f"Defaulting debug container name to {debugger}.\n")
    if pod.get("forbid_debug"):  # the words of github.com/ministryofjustice/cloud-platform#7960
        return _fail(f'Error from server (Forbidden): pods "{name}" is forbidden: User '
                     f'"tester" cannot patch resource "pods/ephemeralcontainers" in API group "" '
                     f'in the namespace "{ns}"')
    if pod.get("psa") and profile in ("sysadmin", "general", "legacy"):
        # the words of github.com/kubernetes/kubernetes/issues/117130 (a baseline namespace)
        return _fail(f'Error from server (Forbidden): pods "{name}" is forbidden: violates '
                     f'PodSecurity "baseline:latest": privileged (container "{debugger}" must '
                     f'not set securityContext.privileged=true)')
    target = flags.get("--target")
    if target is not None and target not in pod.get("containers", ["main"]):
        return _fail(f'error: container "{target}" not found in pod "{name}"')
    image = (state.get("images") or {}).get(flags["--image"])
    if image is None:
        return _fail(f"error: the stand-in cannot pull image {flags['--image']!r} "
                     "(not in the state's images)")
    if pod.get("phase", "Running") != "Running" or not pod.get("pid"):
        return _fail(f"error: cannot debug a container in a pod whose phase is "
                     f"{pod.get('phase', 'Running')}")
    _record_ephemeral(name, ns, {"name": debugger, "image": flags["--image"],
                                 "targetContainerName": target, "profile": profile})
    if not command:
        return 0
    env = {"PATH": f"{image}:/usr/local/bin:/usr/bin:/bin", "HOME": "/root"}
    if shutil.which(command[0], path=env["PATH"]) is None:
        return _fail(f"error: the ephemeral container {debugger} could not start: exec: "
                     f"\"{command[0]}\": executable file not found in $PATH")
    privileged = profile in ("sysadmin", "general")
    return _enter(int(pod["pid"]), command, env, "--stdin" in flags,
                  bool(pod.get("no_ptrace")) and not privileged)


def exec_(argv: list[str]) -> int:
    flags, words, command = _parse(argv, {"--container", *_GLOBAL}, {"--stdin", "--tty"})
    if len(words) != 1 or not command:
        return _fail("error: expected 'exec (POD | TYPE/NAME) [-c CONTAINER] [flags] -- "
                     "COMMAND [args...]'.\nSee 'kubectl exec -h' for help and examples")
    state = _state()
    _check_config(flags, state)
    ns, name, pod = _pod(flags, words, state)
    if pod is None:
        return _fail(f'Error from server (NotFound): pods "{name}" not found')
    if pod.get("forbid_exec"):
        return _fail(f'Error from server (Forbidden): pods "{name}" is forbidden: User '
                     f'"tester" cannot create resource "pods/exec" in API group "" in the '
                     f'namespace "{ns}"')
    containers = pod.get("containers", ["main"])
    container = flags.get("--container", containers[0])
    if container not in containers:
        return _fail(f'error: unable to upgrade connection: container not found ("{container}")')
    phase = pod.get("phase", "Running")
    if phase != "Running" or not pod.get("pid"):
        return _fail(f"error: cannot exec into a container in a completed pod; current phase "
                     f"is {phase}")
    pid = int(pod["pid"])
    try:
        env = _pod_env(pid)
    except OSError:
        return _fail("error: unable to upgrade connection: container not running")
    if shutil.which(command[0], path=env.get("PATH", "/usr/bin:/bin")) is None:
        sys.stderr.write(f"OCI runtime exec failed: exec failed: unable to start container "
                         f"process: exec: \"{command[0]}\": executable file not found in $PATH: "
                         f"unknown\ncommand terminated with exit code 126\n")
        return 126
    return _enter(pid, command, env, "--stdin" in flags, bool(pod.get("no_ptrace")))


def main(argv: list[str]) -> int:
    path = os.environ.get(STATE_ENV)
    if path:
        with open(path + ".calls", "a") as f:
            f.write(json.dumps(argv) + "\n")
    if not argv:
        return _fail("kubectl controls the Kubernetes cluster manager.")
    if argv[0] == "get":
        return get(argv[1:])
    if argv[0] == "exec":
        return exec_(argv[1:])
    if argv[0] == "logs":
        return logs(argv[1:])
    if argv[0] == "debug":
        return debug(argv[1:])
    return _fail(f'error: unknown command "{argv[0]}" for "kubectl"')


# --- the tests' side: pods and the state file --------------------------------------------


def install(bin_dir: Path) -> Path:
    """``bin_dir/kubectl``: this stand-in, run by this Python."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "kubectl"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} \"$@\"\n")
    exe.chmod(0o755)
    return exe


def write_state(path: Path, pods: list[dict[str, Any]], contexts: list[str] | None = None,
                **extra: Any) -> None:
    """The cluster: ``pods`` (name, namespace, labels, phase, containers, pid: the pod's PID 1,
    forbid_exec, no_ptrace; for ``logs``: restarts, last_exit, env, forbid_logs, waiting; for
    ``debug``: forbid_debug, psa), the ``contexts`` that exist; ``get_delay``: seconds each
    get takes; ``images``: image name -> the directory of its programs (``debug --image``)."""
    path.write_text(json.dumps({"pods": pods, "contexts": contexts or [], **extra}))


class PodProcess:
    """One pod: ``unshare --pid --fork --mount-proc --uts --kill-child`` (its own process
    group), whose child - the pod's PID 1 - sets the host name to the pod's, binds ``hosts``
    over /etc/hosts in the pod's mount namespace when given, then execs ``argv``."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path,
                 hosts: Path | None = None) -> None:
        self.name = name
        script = ('hostname "$1" && { [ -z "$2" ] || mount --bind "$2" /etc/hosts; } && '
                  'shift 2 && exec "$@"')
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--mount-proc", "--uts", "--kill-child", "--",
                 "sh", "-c", script, "pod", name, str(hosts or ""), *argv],
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.pid = self._init_pid()

    def _init_pid(self) -> int:
        """The pod's PID 1 as this host sees it: the unshare process's one child."""
        deadline = time.monotonic() + 20
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        while time.monotonic() < deadline:
            try:
                kids = path.read_text().split()
            except OSError:
                kids = []
            if kids:
                return int(kids[0])
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pod {self.name} did not start (unshare exit {self.proc.poll()})")

    def stop(self) -> None:
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # unshare, the pod's PID 1 and its tree
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
