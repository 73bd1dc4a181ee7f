"""``mldebug hang --k8s``: the route ladder per pod (#45; ``mldebug.k8s`` has the pure parts).

1. ``kubectl exec`` the hang node script: py-spy in the container, and where it cannot read
   a rank, the ranks' torch debug server (both in ``mldebug.hang.node.collect``);
2. for the pods with ranks still unread (or whose exec failed), with ``--debug-image``: the
   same script in an ephemeral container (``kubectl debug --profile=sysadmin --target=C``);
3. for those still unread, over ``kubectl exec``: the signal route (``mldebug.hang.signal_node``:
   only ranks whose mldebug.capture handler catches the signal are signalled);
4. what is left is said per pod with what would read it.

A pod's answer is handed on when its climb ends: at once for a pod py-spy (or the debug
server) read whole, after the lower rungs for the others, which are the only ones held.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mldebug import k8s
from mldebug.fanout import FanoutOptions, NodeJob, NodeResult, OnResult, k8s_pods, run
from mldebug.hang.collect import NODE_MODULES, NODE_SCHEMA, CollectOptions, node_docs


class K8sLadder:
    """``docs`` has ``mldebug.hang.collect.node_docs``'s signature; ``pods`` then holds each
    pod's ``PodLadder`` (which rung answered, why the ones above did not), in pod order."""

    def __init__(self, debug_image: str | None = None, signal: str = "SIGUSR1") -> None:
        self.debug_image = k8s.check_image(debug_image) if debug_image else None
        self.signal = signal
        self.pods: list[k8s.PodLadder] = []

    def docs(self, opts: CollectOptions, target: FanoutOptions, on_result: OnResult,
             progress: bool = True) -> list[NodeResult]:
        pods = target.k8s_listed if target.k8s_listed is not None else k8s_pods(target)
        order = {p.name: i for i, p in enumerate(pods)}
        target = dataclasses.replace(target, k8s_listed=pods)
        held: dict[str, tuple[NodeResult, k8s.PodLadder]] = {}
        done: dict[str, k8s.PodLadder] = {}

        def first(r: NodeResult) -> None:
            lad = k8s.first_rung(r.host, r.data, r.error)
            if k8s.climbing(lad) and (r.data is not None or "forbidden" in (r.error or "")
                                      or self.debug_image):
                held[r.host] = (r, lad)
                return
            done[r.host] = lad
            on_result(r)

        results = node_docs(opts, target, first, progress)
        try:
            self._kubectl_debug(opts, target, held)
            self._signal(opts, target, held)
        finally:
            for name, (r, lad) in held.items():
                done[name] = lad
                on_result(r)
        self.pods = sorted(done.values(), key=lambda lad: order.get(lad.pod, len(order)))
        return results

    def _sub(self, target: FanoutOptions, held: dict[str, Any], **kw: Any) -> FanoutOptions:
        assert target.k8s_listed is not None
        return dataclasses.replace(target, k8s_listed=[p for p in target.k8s_listed
                                                       if p.name in held], **kw)

    def _kubectl_debug(self, opts: CollectOptions, target: FanoutOptions,
                       held: dict[str, tuple[NodeResult, k8s.PodLadder]]) -> None:
        if not held:
            return
        if self.debug_image is None:
            for _, lad in held.values():
                lad.refused[k8s.RUNG_KUBECTL_DEBUG] = (
                    "not tried: pass --debug-image IMAGE (an image with python3 and py-spy)")
            return
        node_timeout = opts.timeout * (4 if opts.watch else 2) + opts.watch + 5

        def got(r: NodeResult) -> None:
            base, lad = held[r.host]
            if r.data is None:
                k8s.rung_result(lad, k8s.RUNG_KUBECTL_DEBUG, 0, r.error)
                return
            if base.data is None:  # the exec failed: the debug container's answer is the pod's
                held[r.host] = (NodeResult(r.host, data=r.data), lad)
                lad.ranks = len(k8s.doc_processes(r.data))
                lad.unread = lad.ranks
                read = lad.ranks - len(k8s.unread_pids(r.data))
                for p in k8s.doc_processes(r.data):
                    if p.get("dump") is not None:
                        p["route_detail"] = "kubectl debug"
            else:
                read = k8s.merge_rung(base.data, r.data, k8s.RUNG_KUBECTL_DEBUG, "kubectl debug")
            why = None if read else _why(r.data, "the debug container read none of the ranks")
            k8s.rung_result(lad, k8s.RUNG_KUBECTL_DEBUG, read, why)

        run(NodeJob(NODE_MODULES, opts, NODE_SCHEMA),
            self._sub(target, held, k8s_debug_image=self.debug_image, timeout=node_timeout),
            got, progress=False)

    def _signal(self, opts: CollectOptions, target: FanoutOptions,
                held: dict[str, tuple[NodeResult, k8s.PodLadder]]) -> None:
        left = {n: v for n, v in held.items() if v[1].answered is None}
        for _, (base, lad) in left.items():
            if base.data is None:
                lad.refused[k8s.RUNG_SIGNAL] = "needs kubectl exec: " + (base.error or "")[:200]
        asked = {n: v for n, v in left.items() if v[0].data is not None}
        if not asked:
            return
        from mldebug.hang.signal_collect import signal_docs

        def got(r: NodeResult) -> None:
            base, lad = asked[r.host]
            if r.data is None:
                k8s.rung_result(lad, k8s.RUNG_SIGNAL, 0, r.error)
                return
            read = k8s.merge_rung(base.data, r.data, k8s.RUNG_SIGNAL)
            k8s.rung_result(lad, k8s.RUNG_SIGNAL, read,
                            None if read else _why(r.data, "no rank answered the signal"))

        signal_docs(opts, self._sub(target, asked), got, progress=False, signal=self.signal)


def _why(doc: Any, default: str) -> str:
    for p in k8s.doc_processes(doc):
        if p.get("dump") is None and p.get("error"):
            return str(p["error"])[:300]
    errs = doc.get("errors") if isinstance(doc, dict) else None
    for e in errs if isinstance(errs, list) else []:
        if isinstance(e, dict) and e.get("error"):
            return str(e["error"])[:300]
    return default
