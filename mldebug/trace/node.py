"""``mldebug trace show --nodes/--slurm-job/--k8s``: ask the ranks on this node (or pod) for
their rings and answer with them (stdlib only: sent over the fan-out with the modules it
imports, ``NODE_MODULES``).

The same asking as a local ``trace show --pid/--job`` (``mldebug.trace.live.ask``: only ranks
whose dump handler catches the signal are signalled; the others are named with why). Output:
one line ``MLDEBUG-JSON {"host", "ranks": [{"pid", "rank", "job", "trace": {...} | null,
"reason", "kind"}], "errors": [...]}``; a ring is the rank's main-thread events as
``[file, line, func, text]`` rows.
"""

from __future__ import annotations

import os
from typing import Any

from mldebug.nodekit import ArgumentParser, emit, short_hostname
from mldebug.ranks import find_ranks, list_processes
from mldebug.trace.live import ask

NODE_MODULES = ("mldebug.nodekit", "mldebug.errors", "mldebug.dist", "mldebug.ranks",
                "mldebug.text", "mldebug.privdir", "mldebug.findings", "mldebug.abortnotes",
                "mldebug.trace.model", "mldebug.trace.ring", "mldebug.trace.collect",
                "mldebug.dumpreg", "mldebug.trace.live", "mldebug.trace.node")
NODE_SCHEMA = {"host": str, "ranks": list}
MAX_EVENTS = 100_000  # events of one rank's ring sent back (a ring keeps 4,096 by default)


def collect(pid: int | None, job: str | None, timeout: float) -> dict[str, Any]:
    host = short_hostname()
    uid = None if os.geteuid() == 0 else os.geteuid()
    targets, errors = find_ranks(list_processes(), pid=pid, uid=uid, host=host)
    if job is not None:
        targets = [t for t in targets if (t.get("job") or {}).get("key") == job]
    keys = {t["pid"]: (t.get("job") or {}).get("key") for t in targets}
    doc: dict[str, Any] = {"host": host, "ranks": [],
                           "errors": [str(e.get("error"))[:300] for e in errors[:20]]}
    for a in ask(targets, timeout) if targets else []:
        ring = None
        if a.trace is not None:
            t = a.trace
            ring = {"host": t.host, "pid": t.pid, "rank": t.rank, "kind": t.kind,
                    "reason": t.reason, "threads": t.threads, "source": t.source,
                    "world_size": t.world_size,
                    "events": [[e.file, e.line, e.func, e.text] for e in t.events[-MAX_EVENTS:]]}
        doc["ranks"].append({"pid": a.pid, "rank": a.rank, "job": keys.get(a.pid),
                             "trace": ring, "reason": a.reason, "kind": a.kind})
    return doc


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="mldebug-trace-node")
    p.add_argument("--pid", type=int, default=None)
    p.add_argument("--job", default=None)
    p.add_argument("--timeout", type=float, default=30.0)
    a = p.parse_args(argv)
    emit(collect(a.pid, a.job, a.timeout))
    return 0
