"""Kubernetes targets (#45, stage 1): pods found with one ``kubectl get pods -o json``, each
reached with ``kubectl exec -i POD -- python3 -`` (the node script on stdin).

Pure parts only, tested on fixtures (tests/test_k8s.py): the kubectl argument lists, the
PodList parsing, the ``--k8s-job`` label matching, the stdin program a pod runs and the
sentence that explains a failed exec. Running kubectl is ``mldebug.fanout``'s (``_run_k8s``).

kubectl's argument shapes used here (``kubectl get --help``, ``kubectl exec --help``):

    kubectl get pods [-l key=value] [-n NAMESPACE] -o json
    kubectl exec (POD | TYPE/NAME) [-c CONTAINER] [flags] -- COMMAND [args...]
    kubectl logs [-f] [-p] (POD | TYPE/NAME) [-c CONTAINER]      (mldebug log --k8s, #45)

with the global flags ``--context``, ``--kubeconfig`` and ``--request-timeout``. Every value
is passed as ``--flag=value``, so no value (a selector, a namespace) can be read as a flag.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mldebug.errors import MldebugError, UsageError

# The labels operators put on the pods of one job, for --k8s-job NAME: Kubeflow's training
# operator (PyTorchJob), JobSet, and batch/v1 Job (the new and the legacy label).
JOB_LABELS = (
    "training.kubeflow.org/job-name",
    "jobset.sigs.k8s.io/jobset-name",
    "batch.kubernetes.io/job-name",
    "job-name",
)
MAX_PODS_JSON = 64 << 20  # bytes of `kubectl get pods -o json` read; a larger answer is refused
GET_TIMEOUT = 60.0  # seconds the one `kubectl get pods` may take (also its --request-timeout)
NODE_ARGV0 = "<mldebug-node>"  # the pod's `python3 - <mldebug-node>`: mldebug, never a rank
LOG_LIMIT_BYTES = 32 << 20  # default bytes of one container's log read (kubectl --limit-bytes)
LOG_TIMEOUT = 60.0  # default seconds one `kubectl logs` may take
# the container variables that say a pod's rank (Kubeflow's training operator sets them in the
# pod spec: RANK and WORLD_SIZE with a Master replica, PET_* with an elastic policy/torchrun)
RANK_ENV = ("RANK", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "WORLD_SIZE")
DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"  # the annotation kubectl reads

# a DNS-1123 subdomain (pod and namespace names; a namespace is a label, a subset of it)
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_CONTAINER = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class K8sTarget:
    """Which pods: a label ``selector`` or the pods of job ``job`` (by ``JOB_LABELS``); where
    kubectl looks (``namespace``, ``context``, ``kubeconfig``: kubectl's defaults when None);
    ``container`` to exec into (None: the pod's default container)."""

    selector: str | None = None
    job: str | None = None
    namespace: str | None = None
    context: str | None = None
    kubeconfig: str | None = None
    container: str | None = None

    def describe(self) -> str:
        what = f"selector {self.selector!r}" if self.selector else f"job {self.job!r}"
        return f"{what} in namespace {self.namespace or '(the context default)'}"


@dataclass(frozen=True)
class ContainerStatus:
    """What ``status.containerStatuses[]`` says of one container: how often it restarted and
    how its previous run ended (``lastState.terminated``: "Error, exit code 1")."""

    restarts: int = 0
    last_exit: str | None = None

    @property
    def restarted(self) -> bool:
        return self.restarts > 0 or self.last_exit is not None


@dataclass
class Pod:
    name: str
    namespace: str | None
    phase: str
    labels: dict[str, str] = field(default_factory=dict)
    containers: list[str] = field(default_factory=list)
    terminating: bool = False
    statuses: dict[str, ContainerStatus] = field(default_factory=dict)
    env: dict[str, dict[str, str]] = field(default_factory=dict)  # container -> RANK_ENV values
    default_container: str | None = None  # the kubectl.kubernetes.io/default-container annotation

    @property
    def runnable(self) -> bool:
        return self.phase == "Running" and not self.terminating


def check_target(t: K8sTarget) -> K8sTarget:
    """``t`` with its values checked: one line for a bad one, never a traceback later."""
    if (t.selector is None) == (t.job is None):
        raise UsageError("pass one of --k8s SELECTOR or --k8s-job NAME.",
                         "E.g. --k8s app=demo or --k8s-job llama.")
    if t.selector is not None and (not t.selector.strip() or t.selector.startswith("-")
                                   or any(c in t.selector for c in "\n\r\x00")):
        raise UsageError(f"--k8s {t.selector!r} is not a label selector.",
                         "Pass key=value[,key2=value2], e.g. "
                         "--k8s training.kubeflow.org/job-name=llama.")
    if t.job is not None and not _NAME.fullmatch(t.job):
        raise UsageError(f"--k8s-job {t.job!r} is not a job name.",
                         "Pass the PyTorchJob/JobSet/Job name as kubectl get shows it, "
                         "e.g. --k8s-job llama.")
    if t.namespace is not None and not _NAME.fullmatch(t.namespace):
        raise UsageError(f"--namespace {t.namespace!r} is not a namespace name.",
                         "Pass e.g. -n training (kubectl get namespaces lists them).")
    if t.container is not None and not _CONTAINER.fullmatch(t.container):
        raise UsageError(f"--container {t.container!r} is not a container name.",
                         "Pass e.g. -c pytorch (kubectl get pod POD -o "
                         "jsonpath='{.spec.containers[*].name}' lists them).")
    for opt, v in (("--context", t.context), ("--kubeconfig", t.kubeconfig)):
        if v is not None and (not v.strip() or any(c in v for c in "\n\r\x00")):
            raise UsageError(f"{opt} {v!r} is empty or has a control character.",
                             f"Pass the value kubectl takes, e.g. {opt} "
                             + ("my-cluster." if opt == "--context" else "~/.kube/config."))
    return t


def _global_flags(t: K8sTarget) -> list[str]:
    return ([f"--context={t.context}"] if t.context else []) + \
           ([f"--kubeconfig={t.kubeconfig}"] if t.kubeconfig else [])


def get_pods_argv(t: K8sTarget, timeout: float = GET_TIMEOUT) -> list[str]:
    """``kubectl get pods -o json`` for ``t`` (without the program name): one call for every
    pod; ``--k8s-job`` reads the namespace's pods and matches the job labels itself (a label
    selector cannot OR over label keys)."""
    argv = ["get", "pods", "-o", "json"]
    if t.selector:
        argv.append(f"--selector={t.selector}")
    if t.namespace:
        argv.append(f"--namespace={t.namespace}")
    return [*argv, *_global_flags(t), f"--request-timeout={max(1, int(timeout))}s"]


def exec_argv(t: K8sTarget, pod: Pod, python: str | None = None) -> list[str]:
    """``kubectl exec -i POD`` running the node script from stdin (``node_program``):
    ``python3 - <mldebug-node>``; the argv[1] marks the process as mldebug's (its container
    environment carries RANK, as the ranks' does) and the script's own arguments travel on
    stdin with it, so nothing sent grows the command line."""
    argv = ["exec", "-i", pod.name]
    ns = pod.namespace or t.namespace
    if ns:
        argv.append(f"--namespace={ns}")
    if t.container:
        argv.append(f"--container={t.container}")
    return [*argv, *_global_flags(t), "--", python or "python3", "-", NODE_ARGV0]


def node_program(script_source: str, args: Sequence[str]) -> str:
    """What a pod's ``python3 -`` reads on stdin: the arguments, then the bundled script run as
    ``__main__`` (as the pdsh route's bootstrap runs it from its argv)."""
    return (f"import sys\nsys.argv = [sys.argv[0]] + {list(args)!r}\n"
            f"exec(compile({script_source!r}, {NODE_ARGV0!r}, 'exec'), {{'__name__': '__main__'}})\n")


def parse_pods(text: str) -> list[Pod]:
    """The pods of a ``kubectl get pods -o json`` answer (a PodList; a single Pod also), in
    its order. Items that are not pods, or whose name is not a pod name, are skipped."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, ValueError, RecursionError) as e:
        raise MldebugError(f"kubectl get pods answered something that is not JSON ({str(e)[:120]}).",
                           "Check 'kubectl get pods -o json' works with the same options.") from None
    if isinstance(doc, dict) and doc.get("kind") == "Pod":
        doc = {"items": [doc]}
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise MldebugError("kubectl get pods answered JSON without an items list.",
                           "Check 'kubectl get pods -o json' works with the same options.")
    pods = []
    for item in items:
        if not isinstance(item, dict):
            continue
        meta, spec, status = (_obj(item, k) for k in ("metadata", "spec", "status"))
        name, ns = meta.get("name"), meta.get("namespace")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            continue
        labels = {str(k): str(v) for k, v in _obj(meta, "labels").items()
                  if isinstance(v, (str, int, float))}
        containers = [c["name"] for c in spec.get("containers") or []
                      if isinstance(c, dict) and isinstance(c.get("name"), str)] \
            if isinstance(spec.get("containers"), list) else []
        phase = status.get("phase")
        default = _obj(meta, "annotations").get(DEFAULT_CONTAINER)
        pods.append(Pod(name, ns if isinstance(ns, str) and _NAME.fullmatch(ns) else None,
                        phase if isinstance(phase, str) else "Unknown", labels, containers,
                        terminating=meta.get("deletionTimestamp") is not None,
                        statuses=_statuses(status), env=_rank_env(spec),
                        default_container=default if isinstance(default, str) else None))
    return pods


def _statuses(status: Mapping[str, Any]) -> dict[str, ContainerStatus]:
    out = {}
    for cs in status.get("containerStatuses") or []:
        if not isinstance(cs, dict) or not isinstance(cs.get("name"), str):
            continue
        n = cs.get("restartCount")
        term = _obj(_obj(cs, "lastState"), "terminated")
        last = None
        if term:
            reason, code = term.get("reason"), term.get("exitCode")
            last = ", ".join(x for x in (str(reason)[:60] if isinstance(reason, str) else "",
                                         f"exit code {code}" if isinstance(code, int) else "")
                             if x) or "terminated"
        out[cs["name"]] = ContainerStatus(n if isinstance(n, int) and n >= 0 else 0, last)
    return out


def _rank_env(spec: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The literal ``RANK_ENV`` values of each container (``valueFrom`` ones are unknown here)."""
    out: dict[str, dict[str, str]] = {}
    containers = spec.get("containers")
    for c in containers if isinstance(containers, list) else []:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            continue
        env = c.get("env")
        found = {e["name"]: e["value"][:20] for e in (env if isinstance(env, list) else [])
                 if isinstance(e, dict) and e.get("name") in RANK_ENV
                 and isinstance(e.get("value"), str)}
        if found:
            out[c["name"]] = found
    return out


def _obj(d: Mapping[str, Any], key: str) -> dict[str, Any]:
    v = d.get(key)
    return v if isinstance(v, dict) else {}


def job_pods(pods: Sequence[Pod], job: str) -> list[Pod]:
    """The pods of job ``job``: any of ``JOB_LABELS`` equal to it."""
    return [p for p in pods if any(p.labels.get(k) == job for k in JOB_LABELS)]


def select(t: K8sTarget, pods: Sequence[Pod]) -> list[Pod]:
    """The pods ``t`` names (kubectl applied ``--k8s``'s selector already); none is an error
    with the way to list them."""
    chosen = job_pods(pods, t.job) if t.job else list(pods)
    if not chosen:
        ns = f" --namespace={t.namespace}" if t.namespace else ""
        flags = " ".join(_global_flags(t))
        flags = f" {flags}" if flags else ""
        if t.job:
            how = (f"List the pods and their labels: kubectl get pods --show-labels{ns}{flags} "
                   f"(--k8s-job matches the labels {', '.join(JOB_LABELS)}; --k8s SELECTOR "
                   "takes any other).")
        else:
            how = f"List the pods and their labels: kubectl get pods --show-labels{ns}{flags}."
        raise MldebugError(f"no pod matches the {t.describe()}.", how)
    return chosen


def not_running_error(pod: Pod) -> str:
    if pod.terminating:
        return f"pod is terminating (phase {pod.phase}): not asked"
    return f"pod is {pod.phase}, not Running: not asked (kubectl describe pod {pod.name})"


def container_error(t: K8sTarget, pod: Pod) -> str | None:
    """Why ``pod`` has no container ``t.container`` (None when it has, or none was asked)."""
    if t.container is None or not pod.containers or t.container in pod.containers:
        return None
    return (f"container {t.container!r} not found in pod {pod.name} (its containers: "
            f"{', '.join(pod.containers)}); pass --container with one of them")


def logs_container(t: K8sTarget, pod: Pod) -> str | None:
    """The container ``kubectl logs`` reads: ``--container``, else the pod's
    ``kubectl.kubernetes.io/default-container``, else its first (kubectl's own choice)."""
    if t.container:
        return t.container
    if pod.default_container in pod.containers:
        return pod.default_container
    return pod.containers[0] if pod.containers else None


def logs_argv(t: K8sTarget, pod: Pod, *, previous: bool = False,
              limit_bytes: int = LOG_LIMIT_BYTES, tail: int | None = None,
              timeout: float = LOG_TIMEOUT) -> list[str]:
    """``kubectl logs POD`` (without the program name): the current container, or with
    ``previous`` the one before its last restart (``--previous``); at most ``limit_bytes``
    (``--limit-bytes``), the last ``tail`` lines when given (``--tail``), each line with the
    kubelet's time (``--timestamps``: the pods' lines are ordered by one clock)."""
    argv = ["logs", pod.name]
    ns = pod.namespace or t.namespace
    if ns:
        argv.append(f"--namespace={ns}")
    if t.container:
        argv.append(f"--container={t.container}")
    if previous:
        argv.append("--previous")
    argv += [f"--limit-bytes={limit_bytes}", "--timestamps"]
    if tail is not None:
        argv.append(f"--tail={tail}")
    return [*argv, *_global_flags(t), f"--request-timeout={max(1, int(timeout))}s"]


_KUBEFLOW_NAME = re.compile(r"-(?P<type>master|worker)-(?P<index>\d{1,7})$")
REPLICA_TYPE = "training.kubeflow.org/replica-type"
REPLICA_INDEX = "training.kubeflow.org/replica-index"


def _int(v: str | None) -> int | None:
    return int(v) if v is not None and v.isdecimal() and len(v) <= 7 else None


def pod_rank(pod: Pod, pods: Sequence[Pod], container: str | None = None) -> int | None:
    """The rank of a pod that runs ONE rank, for its log lines without a ``[rankN]:`` prefix;
    None when not known.

    1. the container's env in the pod spec: ``RANK``, else ``PET_NODE_RANK`` - when
       ``PET_NPROC_PER_NODE`` is absent or 1 (with more processes per pod these are the node
       rank, and an unprefixed line could be any of its ranks);
    2. a Kubeflow PyTorchJob pod (``REPLICA_TYPE``/``REPLICA_INDEX`` labels, else the name's
       ``-master-N``/``-worker-N``): the training operator numbers the master first - master-0
       is rank 0 and worker-K rank K+1 when the job has a master replica; without one,
       worker-K is K.
    """
    env = pod.env.get(container or "") or (next(iter(pod.env.values())) if len(pod.env) == 1
                                          else {})
    nproc = env.get("PET_NPROC_PER_NODE")
    if nproc not in (None, "1"):
        return None
    for name in ("RANK", "PET_NODE_RANK"):
        r = _int(env.get(name))
        if r is not None:
            return r
    kind, index = _replica(pod)
    if kind is None or index is None:
        return None
    if kind == "master":
        return index
    has_master = any(_replica(p)[0] == "master" for p in pods)
    return index + 1 if has_master else index


def _replica(pod: Pod) -> tuple[str | None, int | None]:
    kind = pod.labels.get(REPLICA_TYPE, "").lower() or None
    index = _int(pod.labels.get(REPLICA_INDEX))
    m = _KUBEFLOW_NAME.search(pod.name)
    if m is not None:
        kind = kind or m["type"]
        index = index if index is not None else int(m["index"])
    return (kind, index) if kind in ("master", "worker") else (None, None)


def explain_logs_failure(lines: Sequence[str], pod: str, previous: bool = False) -> str:
    """What ``kubectl logs`` said when it read nothing, as one sentence naming the pod."""
    text = "\n".join(lines)
    low = text.lower()
    what = f"pod {pod}" + (" (previous container)" if previous else "")
    if "forbidden" in low:
        return (f"{what}: logs not read: kubectl logs forbidden; your user needs RBAC 'get' on "
                "pods/log in this namespace (docs/k8s.md, RBAC)")
    if "is not valid for pod" in low or "container not found" in low:
        return (f"{what}: logs not read: no such container; pass --container NAME (kubectl get "
                f"pod {pod} -o jsonpath='{{.spec.containers[*].name}}')")
    if "previous terminated container" in low and "not found" in low:
        return f"{what}: no previous container's logs (the kubelet kept none)"
    if "waiting to start" in low or "containercreating" in low or "podinitializing" in low:
        return f"{what}: logs not read: the container has not started ({_last(lines)})"
    if "notfound" in low.replace(" ", "") and "pods" in low:
        return f"{what}: logs not read: the pod is gone (deleted since kubectl get pods listed it)"
    if text.strip():
        return f"{what}: logs not read: kubectl logs said: {_last(lines)}"
    return f"{what}: logs not read: kubectl logs failed and said nothing"


def explain_exec_failure(lines: Sequence[str], pod: str, python: str = "python3") -> str:
    """What kubectl exec (or the container) said, as one actionable sentence."""
    text = "\n".join(lines)
    low = text.lower()
    if "forbidden" in low or "cannot create resource" in low:
        return ("kubectl exec forbidden: your user needs RBAC 'create' on pods/exec in this "
                "namespace (docs/k8s.md, RBAC)")
    if "container not found" in low or ("container" in low and "not found" in low
                                        and "executable" not in low):
        return ("container not found in the pod; pass --container NAME (kubectl get pod "
                f"{pod} -o jsonpath='{{.spec.containers[*].name}}')")
    if (f'"{python}": executable file not found' in low or "executable file not found" in low
            or f"{python}: not found" in low or "no such file or directory" in low
            and python in low):
        return (f"no {python} in the container image: pass --remote-python PATH (a Python "
                "3 in the image) or --container for a container that has one")
    if "notfound" in low.replace(" ", "") and "pods" in low:
        return "the pod is gone (deleted since kubectl get pods listed it)"
    if "unable to upgrade connection" in low or "error dialing backend" in low:
        return "kubectl exec could not reach the pod's kubelet: " + _last(lines)
    if text.strip():
        return "no result; kubectl exec said: " + _last(lines)
    return "no answer (the pod ran the script and printed nothing)"


def _last(lines: Sequence[str]) -> str:
    for line in reversed(lines):
        if line.strip() and not line.startswith("command terminated with exit code"):
            return line.strip()[:300]
    return lines[-1].strip()[:300] if lines else ""


def get_failure(stderr: str, t: K8sTarget) -> MldebugError:
    """The error for a failed ``kubectl get pods``."""
    last = _last(stderr.splitlines()) or "no output"
    low = stderr.lower()
    if "forbidden" in low:
        return MldebugError(f"kubectl get pods was refused: {last}",
                            "Your user needs RBAC 'get' and 'list' on pods in the namespace "
                            "(docs/k8s.md, RBAC).")
    return MldebugError(f"kubectl get pods failed for the {t.describe()}: {last}",
                        "Check 'kubectl get pods' works with the same --context, --kubeconfig "
                        "and --namespace.")


def kubectl_missing() -> MldebugError:
    return MldebugError("kubectl is not on PATH; --k8s and --k8s-job need it.",
                        "Install kubectl (https://kubernetes.io/docs/tasks/tools/) or put it "
                        "on PATH.")


# --- the route ladder per pod (#45): which way of reading the ranks answered ---------------
#
#   1. py-spy in the container (``kubectl exec``; needs SYS_PTRACE)
#   2. the ranks' torch debug server (same exec; torch.distributed.debug.start_debug_server())
#   3. ``kubectl debug POD --profile=sysadmin --target=CONTAINER --image=IMAGE``: an ephemeral
#      container from ``--debug-image`` that has python3 and py-spy, in the pod's process
#      namespace (RBAC 'patch' on pods/ephemeralcontainers)
#   4. the signal route: the ranks' own dump handler (mldebug.watchdog() /
#      mldebug.install_dump_handler()), asked over ``kubectl exec``
#   5. none: the line names what would let each rung read the ranks.
#
# kubectl's shape (``kubectl debug --help``): ``kubectl debug (POD | TYPE[[.VERSION].GROUP]/NAME)
# [ -- COMMAND [args...] ]`` with ``-i/--stdin``, ``-q/--quiet``, ``--image``, ``--target``
# ("When using an ephemeral container, target processes in this container name"),
# ``--profile`` ("Options are "legacy", "general", "baseline", "netadmin", "restricted" or
# "sysadmin"") and ``-c/--container`` ("Container name to use for debug container").

RUNG_PYSPY = "py-spy"
RUNG_DEBUG_SERVER = "debug-server"
RUNG_KUBECTL_DEBUG = "kubectl-debug"
RUNG_SIGNAL = "signal"
RUNGS = (RUNG_PYSPY, RUNG_DEBUG_SERVER, RUNG_KUBECTL_DEBUG, RUNG_SIGNAL)
DEBUG_PROFILE = "sysadmin"  # kubectl's profile that sets privileged: true (ptrace allowed)
DEBUG_CONTAINER_PREFIX = "mldebug-"
# what lets each rung read a pod's ranks (the last line of a pod no rung could read)
RUNG_NEEDS = {
    RUNG_PYSPY: "SYS_PTRACE for the container (securityContext: {capabilities: {add: "
                "[SYS_PTRACE]}}; a py-spy sidecar passed with -c also needs "
                "shareProcessNamespace: true)",
    RUNG_DEBUG_SERVER: "torch.distributed.debug.start_debug_server() in the ranks",
    RUNG_KUBECTL_DEBUG: "--debug-image IMAGE (python3 and py-spy in it) with RBAC 'patch' on "
                        "pods/ephemeralcontainers and 'create' on pods/attach",
    RUNG_SIGNAL: "the mldebug.capture handler in the ranks (mldebug.watchdog() or "
                 "mldebug.install_dump_handler())",
}
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}")


def check_image(image: str) -> str:
    """``--debug-image``'s value: an image reference (``registry/name:tag`` or ``@sha256:``)."""
    if not _IMAGE.fullmatch(image):
        raise UsageError(f"--debug-image {image!r} is not an image reference.",
                         "Pass an image that has python3 and py-spy, e.g. --debug-image "
                         "ghcr.io/you/pyspy-debug:1.")
    return image


def debug_container_name(token: str) -> str:
    """The ephemeral container's name: ``mldebug-TOKEN`` (a DNS label; kubectl's own default
    is ``debugger-xxxxx``), so ``kubectl get pod -o yaml`` tells whose it is."""
    return (DEBUG_CONTAINER_PREFIX + re.sub(r"[^a-z0-9-]", "", token.lower()))[:63].rstrip("-")


def debug_argv(t: K8sTarget, pod: Pod, image: str, python: str | None = None,
               name: str | None = None) -> list[str]:
    """``kubectl debug POD -i -q --image=IMAGE --profile=sysadmin --target=CONTAINER
    [--container=NAME] -- python3 - <mldebug-node>`` (without the program name): an ephemeral
    container in the target container's process namespace, the node script on its stdin as
    with ``exec_argv``. The target: ``--container``, else the pod's default container, else
    its first."""
    argv = ["debug", pod.name, "--stdin", "--quiet", f"--image={image}",
            f"--profile={DEBUG_PROFILE}"]
    target = logs_container(t, pod)
    if target:
        argv.append(f"--target={target}")
    if name:
        argv.append(f"--container={name}")
    ns = pod.namespace or t.namespace
    if ns:
        argv.append(f"--namespace={ns}")
    return [*argv, *_global_flags(t), "--", python or "python3", "-", NODE_ARGV0]


def explain_debug_failure(lines: Sequence[str], pod: str, python: str = "python3") -> str:
    """What ``kubectl debug`` (or the ephemeral container) said, as one actionable sentence."""
    text = "\n".join(lines)
    low = text.lower()
    if "pods/ephemeralcontainers" in low and ("forbidden" in low or "cannot patch" in low):
        return ("kubectl debug forbidden: your user needs RBAC 'patch' on "
                "pods/ephemeralcontainers in this namespace (docs/k8s.md, RBAC)")
    if "pods/attach" in low and "forbidden" in low:
        return ("kubectl debug forbidden: your user needs RBAC 'create' on pods/attach to "
                "reach the debug container (docs/k8s.md, RBAC)")
    if "violates podsecurity" in low:
        return ("the namespace's Pod Security admission refuses the privileged debug container "
                f"(--profile={DEBUG_PROFILE}): " + _last(lines)[:200])
    if "ephemeral containers are disabled" in low or "could not find the requested resource" \
            in low:
        return "the cluster has no ephemeral containers (Kubernetes 1.23+ has them)"
    if "executable file not found" in low or f"{python}: not found" in low:
        return (f"no {python} in the --debug-image: use an image with python3 and py-spy "
                "(or pass --remote-python PATH)")
    if "errimagepull" in low or "imagepullbackoff" in low or "pull" in low and "image" in low:
        return "the --debug-image could not be pulled: " + _last(lines)
    if "notfound" in low.replace(" ", "") and "pods" in low:
        return "the pod is gone (deleted since kubectl get pods listed it)"
    if text.strip():
        return "kubectl debug said: " + _last(lines)
    return "kubectl debug gave no answer (the debug container printed nothing)"


@dataclass
class PodLadder:
    """One pod's climb: the rung that read its ranks (None: none could), and why each rung
    above it did not (``refused``: rung -> why)."""

    pod: str
    answered: str | None = None
    refused: dict[str, str] = field(default_factory=dict)
    ranks: int = 0  # rank processes seen in the pod
    unread: int = 0  # of them, still without stacks

    def line(self) -> str:
        above = "; ".join(f"{r}: {why}" for r, why in self.refused.items())
        if self.answered is not None:
            head = f"pod {self.pod}: {self.answered} answered"
            return f"{head} (refused above it: {above})" if above else head
        if self.ranks == 0 and not self.refused:
            return (f"pod {self.pod}: no rank process seen in the container (the ranks in "
                    "another container: pass -c, with shareProcessNamespace: true for a "
                    "sidecar)")
        needs = "; or ".join(RUNG_NEEDS[r] for r in RUNGS)
        what = f"{self.unread} of {self.ranks} rank(s)" if self.ranks else "the ranks"
        return (f"pod {self.pod}: cannot read {what}: {above}. What would: {needs}")

    def to_dict(self) -> dict[str, Any]:
        return {"pod": self.pod, "answered": self.answered,
                "refused": [{"rung": r, "why": w} for r, w in self.refused.items()],
                "ranks": self.ranks, "unread": self.unread, "line": self.line()}


def doc_processes(doc: Any) -> list[dict[str, Any]]:
    procs = doc.get("processes") if isinstance(doc, dict) else None
    return [p for p in procs if isinstance(p, dict)] if isinstance(procs, list) else []


def unread_pids(doc: Any) -> list[int]:
    """The rank processes of a hang node document that have no stacks."""
    return [p["pid"] for p in doc_processes(doc)
            if p.get("dump") is None and isinstance(p.get("pid"), int)]


_DS_SPLIT = "Debug-server route: "


def short_pyspy_why(err: str) -> str:
    """py-spy's failure in a pod's ladder line: ptrace denied is said with its cause (the
    container's missing SYS_PTRACE) and py-spy's own words, the rest as its first sentence."""
    one = " ".join(err.split())
    if "ptrace denied" in one:
        said = one.partition("(ptrace denied")[2].partition(")")[0].lstrip(": ").strip()
        return ("ptrace denied: the container has no SYS_PTRACE" +
                (f" (py-spy: {said[:120]})" if said else ""))
    return one.split(". ")[0][:300]


def _why_pyspy(doc: Any) -> tuple[str, str]:
    """(why py-spy, why the debug server) did not read the first unread rank of ``doc``; the
    debug server's reason from the rank's error, else from the node's debug-server error."""
    for p in doc_processes(doc):
        if p.get("dump") is not None:
            continue
        err = str(p.get("pyspy_error") or p.get("error") or "no stacks")
        pyspy, _, ds = err.partition(_DS_SPLIT)
        if not ds.strip():
            errs = doc.get("errors") if isinstance(doc, dict) else None
            ds = next((str(e["error"]).partition("debug-server route: ")[2]
                       for e in (errs if isinstance(errs, list) else [])
                       if isinstance(e, dict) and "debug-server route: " in str(e.get("error"))),
                      "")
        return (short_pyspy_why(pyspy) or "no stacks",
                " ".join(ds.split())[:300] or "no rank registered a torch debug server "
                                              "(start_debug_server())")
    return "no stacks", "not asked"


def first_rung(pod: str, doc: Any, error: str | None) -> PodLadder:
    """Rungs 1-2 from the ``kubectl exec`` answer: py-spy, else the debug server in the same
    run. A pod whose ranks were all read is done; the others climb on."""
    lad = PodLadder(pod)
    if doc is None:
        why = error or "no answer"
        lad.refused[RUNG_PYSPY] = why
        lad.refused[RUNG_DEBUG_SERVER] = "needs kubectl exec (as py-spy)"
        return lad
    procs = doc_processes(doc)
    lad.ranks, lad.unread = len(procs), len(unread_pids(doc))
    routes = {str(p.get("route")) for p in procs if p.get("dump") is not None}
    if procs and lad.unread == 0:
        if RUNG_PYSPY in routes or not routes - {RUNG_DEBUG_SERVER}:
            lad.answered = RUNG_PYSPY if RUNG_PYSPY in routes else RUNG_DEBUG_SERVER
        if lad.answered == RUNG_DEBUG_SERVER:
            why = next((str(p.get("pyspy_error")) for p in procs if p.get("pyspy_error")),
                       "could not read the ranks")
            lad.refused[RUNG_PYSPY] = short_pyspy_why(why)
        return lad
    if not procs:
        return lad
    lad.refused[RUNG_PYSPY], lad.refused[RUNG_DEBUG_SERVER] = _why_pyspy(doc)
    if isinstance(doc, dict) and "py_spy" in doc and doc["py_spy"] is None:
        lad.refused[RUNG_PYSPY] = ("no py-spy in the container image (pip install py-spy in "
                                   "the image, or --py-spy PATH)")
    return lad


def climbing(lad: PodLadder) -> bool:
    """Whether the pod needs a rung below the ones tried: ranks left unread, or an exec that
    failed (kubectl debug may still reach it)."""
    return lad.answered is None and (lad.unread > 0 or RUNG_PYSPY in lad.refused)


def merge_rung(base: Any, later: Any, rung: str, detail: str | None = None) -> int:
    """Fold a lower rung's answer into the pod's document: each rank ``base`` has without
    stacks that ``later`` read is replaced by ``later``'s entry (same PID namespace, same
    pids). ``base`` None: ``later``'s processes are taken whole. Returns the ranks read."""
    got = {p["pid"]: p for p in doc_processes(later)
           if p.get("dump") is not None and isinstance(p.get("pid"), int)}
    if not isinstance(base, dict):
        return len(got)
    read = 0
    procs = base.get("processes")
    if not isinstance(procs, list):
        return 0
    for i, p in enumerate(procs):
        if isinstance(p, dict) and p.get("dump") is None and p.get("pid") in got:
            q = dict(got[p["pid"]])
            if detail:
                q["route_detail"] = detail
            procs[i] = q
            read += 1
    return read


def rung_result(lad: PodLadder, rung: str, read: int, why: str | None) -> None:
    """Record rung ``rung``'s outcome: ``read`` ranks it read (the pod answered when none is
    left), else ``why`` it could not."""
    lad.unread = max(0, lad.unread - read)
    if read and lad.unread == 0:
        lad.answered = rung
    elif why is not None or not read:
        lad.refused[rung] = " ".join((why or "read none of the ranks").split())[:300]
