"""``mldebug log --k8s SELECTOR | --k8s-job NAME`` (#45): the pods' own logs as inputs.

The pods come from the same ONE ``kubectl get pods -o json`` as the fan-out route
(``mldebug.fanout.k8s_pods``). Each pod's current container is read with ``kubectl logs``
and, when its status shows a restart, the previous container too (``--previous``: the run that
crashed): ``fanout`` reads at a time, each one at most ``limit_bytes`` (kubectl
``--limit-bytes``; this side stops reading at twice that) and ``timeout`` seconds. A read goes
to a private temporary file; the files are parsed one at a time, in pod order, as the inputs
``POD`` and ``POD (previous)``, so memory holds one chunk whatever the logs, and at most
``fanout`` files wait on disk.

A pod's unprefixed lines are its rank's (``mldebug.k8s.pod_rank``: the spec's RANK /
PET_NODE_RANK, or the Kubeflow replica index) unless the log carries launcher rank prefixes;
the ranks a pod's lines name get the pod as their host.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from mldebug import k8s
from mldebug.errors import UsageError
from mldebug.k8s import K8sTarget, Pod
from mldebug.log.collect import feed_file
from mldebug.log.parse import LogParser

MAX_STDERR = 64 << 10
# a launcher's rank prefix at the start of a line (after kubectl's --timestamps): the log
# names its ranks itself, the pod's rank is then not put on its lines
_RANK_PREFIX = re.compile(rb"(?:^|\n)(?:\d{4}-\d\d-\d\dT[\d:.]{8,20}(?:Z|[+-]\d\d:\d\d) )?"
                          rb"(?:\[(?:rank|default)\d{1,7}\]:|\[\d{1,7},\d{1,7}\]<std)")
SNIFF_PREFIX = 1 << 20


@dataclass(frozen=True)
class PodLogOptions:
    target: K8sTarget
    previous: bool = True  # also the previous container of a pod that restarted
    limit_bytes: int = k8s.LOG_LIMIT_BYTES
    tail: int | None = None
    timeout: float = k8s.LOG_TIMEOUT
    fanout: int = 32


@dataclass
class _Read:
    pod: Pod
    previous: bool
    path: Path
    error: str | None = None
    size: int = 0
    said: str = ""


def read_pods(opts: PodLogOptions, parser: LogParser) -> None:
    """Every matched pod's logs into ``parser`` (notes for the pods not read)."""
    from mldebug.fanout import FanoutOptions, k8s_pods

    t = k8s.check_target(opts.target)
    pods = k8s_pods(FanoutOptions(k8s=t))  # one kubectl get; kubectl missing / no pod: one line
    exe = _kubectl()
    notes = parser.parsed.notes
    reads: list[tuple[Pod, bool]] = []
    for pod in pods:
        why = k8s.container_error(t, pod)
        if why is not None:
            notes.append(f"pod {pod.name}: logs not read: {why}")
            continue
        container = k8s.logs_container(t, pod)
        status = pod.statuses.get(container or "")
        if opts.previous and status is not None and status.restarted:
            reads.append((pod, True))
            notes.append(f"pod {pod.name}: container {container} restarted {status.restarts} "
                         f"time{'s' * (status.restarts != 1)}"
                         + (f" (last run: {status.last_exit})" if status.last_exit else "")
                         + "; its previous run's log is read as "
                         f"'{pod.name} (previous)'")
        reads.append((pod, False))
    if not reads:
        return
    with tempfile.TemporaryDirectory(prefix="mldebug-pod-logs-") as tmp:
        _run(exe, opts, t, pods, reads, Path(tmp), parser)


def _kubectl() -> str:
    import shutil

    exe = shutil.which("kubectl")
    if exe is None:
        raise k8s.kubectl_missing()
    return exe


def _run(exe: str, opts: PodLogOptions, t: K8sTarget, pods: list[Pod],
         reads: list[tuple[Pod, bool]], tmp: Path, parser: LogParser) -> None:
    slots = threading.Semaphore(max(1, opts.fanout))  # reads running or waiting to be parsed
    lock = threading.Lock()
    ready = threading.Condition(lock)
    results: dict[int, _Read] = {}
    nxt = [0]
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            slots.acquire()
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(reads) or stop.is_set():
                slots.release()
                return
            pod, previous = reads[i]
            try:
                res = _read_one(exe, opts, t, pod, previous, tmp / f"{i}.log")
            except Exception as e:  # one pod's failure is that pod's note, never the run's
                res = _Read(pod, previous, tmp / f"{i}.log",
                            error=f"pod {pod.name}: logs not read: {str(e)[:300]}")
            with ready:
                results[i] = res
                ready.notify_all()

    threads = [threading.Thread(target=worker, daemon=True)
               for _ in range(min(max(1, opts.fanout), len(reads)))]
    for th in threads:
        th.start()
    try:
        for i in range(len(reads)):
            with ready:
                ready.wait_for(lambda i=i: i in results, timeout=opts.timeout + 30)  # type: ignore[misc]
                res = results.pop(i, None)
            if res is None:
                pod, previous = reads[i]
                parser.parsed.notes.append(f"pod {pod.name}: logs not read: no answer within "
                                           f"{opts.timeout + 30:.0f}s")
                continue
            try:
                _parse(res, opts, pods, t, parser)
            finally:
                res.path.unlink(missing_ok=True)
                slots.release()
    finally:
        stop.set()
        for _ in threads:
            slots.release()  # a worker waiting for a slot wakes and ends


def _read_one(exe: str, opts: PodLogOptions, t: K8sTarget, pod: Pod, previous: bool,
              path: Path) -> _Read:
    """One ``kubectl logs`` into ``path`` (mode 0600): at most twice ``limit_bytes`` read
    (kubectl's --timestamps may count on top), killed after ``timeout``."""
    argv = [exe, *k8s.logs_argv(t, pod, previous=previous, limit_bytes=opts.limit_bytes,
                                tail=opts.tail, timeout=opts.timeout)]
    res = _Read(pod, previous, path)
    from mldebug.fanout import run_bounded

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        run = run_bounded(argv, timeout=opts.timeout, limit=2 * opts.limit_bytes, sink=out,
                          stderr_limit=MAX_STDERR)
    res.size, rc, cut = run.size, run.rc, run.cut
    lines = [ln for ln in run.err.splitlines() if ln.strip()]
    what = f"pod {pod.name}" + (" (previous container)" if previous else "")
    if run.timed_out:
        res.error = (f"{what}: logs read for {opts.timeout:.0f}s and not finished; "
                     + ("the part read is used" if res.size else "nothing read") + "; raise --timeout")
        if not res.size:
            return res
    elif rc != 0 and not cut and not res.size:
        res.error = k8s.explain_logs_failure(lines, pod.name, previous)
        return res
    if cut or res.size >= opts.limit_bytes:
        res.said = (f"{what}: only the first {opts.limit_bytes >> 20 or opts.limit_bytes} "
                    f"{'MiB' if opts.limit_bytes >> 20 else 'bytes'} of its log read "
                    "(--limit-bytes); a lower --tail LINES reads the end within it")
    return res


def _parse(res: _Read, opts: PodLogOptions, pods: list[Pod], t: K8sTarget,
           parser: LogParser) -> None:
    notes = parser.parsed.notes
    if res.error is not None:
        notes.append(res.error[:400])
        if not res.size:
            return
    if res.said:
        notes.append(res.said)
    pod = res.pod
    source = pod.name + (" (previous)" if res.previous else "")
    with open(res.path, "rb") as f:
        head = f.read(SNIFF_PREFIX)
    rank = None if _RANK_PREFIX.search(head) else k8s.pod_rank(pod, pods,
                                                               k8s.logs_container(t, pod))
    ranks = parser.parsed.ranks
    before = {r: st.lines for r, st in ranks.items()}
    try:
        feed_file(parser, res.path, source, rank)
    except UsageError as e:  # binary or not text: that pod's note
        notes.append(f"pod {pod.name}: logs skipped: {e.message}"[:300])
        return
    for r, st in ranks.items():
        if st.host is None and (st.lines > before.get(r, 0) or r == rank):
            st.host = pod.name
