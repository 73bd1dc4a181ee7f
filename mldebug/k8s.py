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
