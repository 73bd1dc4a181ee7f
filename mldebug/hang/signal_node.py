"""``mldebug hang --signal``: ask the ranks for their stacks with a signal instead of ptrace.

Per node (stdlib only, sent over the fan-out like ``mldebug.hang.node``): find the rank
processes as ``hang`` does, plus those that announced a dump handler in their user's registry
(``~/.cache/mldebug/capture``; found even when their environment cannot be read), check that
each one really catches the signal (``SigCgt`` in /proc/PID/status: an uncaught SIGUSR1 would
kill it), send it, and collect the dump the rank writes - the Python route's file, or the
C-level faulthandler text when the rank holds the GIL. The answer is the same per-node
document ``mldebug.hang.node.collect`` returns, so the hang analysis runs unchanged.
"""

from __future__ import annotations

import argparse
import os
import re
import signal as _signal
import sys
import time
from pathlib import Path
from typing import Any

from mldebug.dumpreg import catches, fh_size, fresh_dump, registry_entries
from mldebug.hang.node import NODE_VERSION, select_targets
from mldebug.nodekit import emit, short_hostname
from mldebug.privdir import read_bounded
from mldebug.ranks import proc_status
from mldebug.stacks import parse_faulthandler

NO_HANDLER = "no handler installed: add mldebug.watchdog() or use ptrace mode"
MODULES = ("mldebug.nodekit", "mldebug.dist", "mldebug.errors", "mldebug.ranks",
           "mldebug.stacks", "mldebug.hang.debugserver", "mldebug.hang.node", "mldebug.privdir",
           "mldebug.dumpreg", "mldebug.hang.signal_node")
FALLBACK_WAIT = 3.0  # after the C-level text arrived and the handler's thread should have
                    # woken (its poll), how long the Python route may still take


def signal_number(name: str) -> int:
    """SIGUSR1, USR1 or 10 as a signal number."""
    if name.isdecimal():
        return int(name)
    up = name.upper()
    num = getattr(_signal, up if up.startswith("SIG") else "SIG" + up, None)
    if not isinstance(num, int):
        raise ValueError(f"unknown signal {name!r}")
    return int(num)


def _fh_threads(entry: dict[str, Any], offset: int) -> list[dict[str, Any]]:
    try:
        raw = read_bounded(Path(entry["faulthandler"]), offset + (16 << 20))[offset:]
    except OSError:
        return []
    ident = entry.get("main_ident")
    threads = parse_faulthandler(raw.decode(errors="replace"), int(entry["pid"]),
                                 ident if isinstance(ident, int) else None,
                                 prefixes=[p for p in entry.get("python_path") or ()
                                           if isinstance(p, str)])
    return [t for t in threads if t.get("thread_name") != "mldebug-capture"]


def ask(targets: list[dict[str, Any]], signum: int, timeout: float, key: str) -> None:
    """Signal every target that has a handler, then wait for their dumps (``key`` is "dump"
    or "dump_later"); targets gain ``key``, ``route`` and, on failure, ``error``."""
    pending: dict[int, dict[str, Any]] = {}
    for t in targets:
        entry = t.get("entry")
        if entry is None or not catches(t["pid"], signum):
            t.setdefault("error", NO_HANDLER)
            continue
        if int(entry.get("signal") or 0) != signum:
            t.setdefault("error", f"its handler listens to signal {entry.get('signal')}, not "
                                  f"{signum}: pass --signal {entry.get('signal')}")
            continue
        t["_offset"], t["_since"] = fh_size(entry, entry["uid"]), time.time() - 0.05
        try:
            os.kill(t["pid"], signum)
        except OSError as e:
            t.setdefault("error", f"could not signal pid {t['pid']}: {e.strerror}")
            continue
        pending[t["pid"]] = t
    deadline = time.monotonic() + timeout
    fh_seen: dict[int, float] = {}
    while pending and time.monotonic() < deadline:
        time.sleep(0.1)
        for pid, t in list(pending.items()):
            doc = fresh_dump(t["entry"], t["entry"]["uid"], t["_since"])
            if doc is not None:
                t[key], t["route"] = doc.get("dump"), (doc.get("capture") or {}).get("route")
                t["identity"] = doc.get("identity") or t["identity"]
                del pending[pid]
            elif fh_size(t["entry"], t["entry"]["uid"]) > t["_offset"]:
                first = fh_seen.setdefault(pid, time.monotonic())
                poll = t["entry"].get("poll")
                grace = FALLBACK_WAIT + (float(poll) if isinstance(poll, (int, float)) else 5.0)
                if time.monotonic() - first > grace:
                    t[key], t["route"] = _fh_threads(t["entry"], t["_offset"]), "faulthandler"
                    del pending[pid]
    for pid, t in pending.items():
        if fh_size(t["entry"], t["entry"]["uid"]) > t["_offset"]:
            t[key], t["route"] = _fh_threads(t["entry"], t["_offset"]), "faulthandler"
        elif not os.path.exists(f"/proc/{pid}"):
            t.setdefault("error", f"process {pid} exited before it answered")
        elif proc_status(pid).get("State", "").startswith(("T", "t")):
            t.setdefault("error", (
                f"pid {pid} is alive but stopped (State {proc_status(pid).get('State')}): the "
                f"signal waits until it runs again; resume it with kill -CONT {pid} (or detach "
                "the debugger) and run again"))
        else:
            t.setdefault("error", f"pid {pid} did not answer the signal within {timeout:g}s")


def collect(opts: argparse.Namespace) -> dict[str, Any]:
    """Find the ranks here, signal them, and return hang's per-node document."""
    start = time.monotonic()
    host = short_hostname()
    doc: dict[str, Any] = {"host": host, "node_version": NODE_VERSION, "processes": [],
                           "errors": [], "python": sys.executable, "mode": "signal"}
    try:
        signum = signal_number(opts.signal)
    except ValueError as e:
        doc["errors"].append({"pid": None, "error": str(e)})
        return doc
    procs, targets, errors, uid = select_targets(opts, host)
    doc["errors"].extend(errors)
    if targets is None:
        return doc
    uids = {p["uid"] for p in procs.values()} if uid is None else {uid}
    entries = registry_entries(uids, host)
    by_pid = {t["pid"]: t for t in targets}
    for pid, entry in entries.items():
        if pid in by_pid:
            by_pid[pid]["entry"] = entry
            continue
        info = procs.get(pid)
        if info is None or pid == os.getpid():
            continue
        if opts.pid is not None and pid != opts.pid and opts.pid not in _ancestors(pid, procs):
            continue
        if opts.pattern and not re.search(opts.pattern, " ".join(info["cmdline"])):
            continue
        ident: dict[str, Any] = entry["identity"] if isinstance(entry.get("identity"), dict) else {}
        if opts.slurm_job and ident.get("run_id") != opts.slurm_job:
            continue
        # not found by its environment (unreadable without ptrace rights): the registry says
        by_pid[pid] = dict(info, identity=ident, entry=entry, ns_pid=entry.get("ns_pid"))
    targets = [by_pid[p] for p in sorted(by_pid)]
    # torch's debug server first: it answers without a signal (mldebug.hang.debugserver)
    from mldebug.hang import debugserver
    from mldebug.hang.node import debug_server_route

    targets += debug_server_route(targets, procs, opts, host, uid, doc["errors"])
    signalled = [t for t in targets if t.get("route") != debugserver.ROUTE]
    ask(signalled, signum, opts.timeout, "dump")
    for t in signalled:
        if t.get("dump") is None and t.get("route_error"):
            t["error"] = (f"{t['error']}. " if t.get("error") else "") + \
                f"Debug-server route: {t.pop('route_error')}"[:800]
    if opts.watch:
        time.sleep(opts.watch)
        ask([t for t in signalled if t.get("dump") is not None], signum, opts.timeout,
            "dump_later")
        debugserver.again(targets, opts, "dump_later")
    for t in targets:
        doc["processes"].append({
            "pid": t["pid"], "ppid": t["ppid"], "cmdline": t["cmdline"], "ns_pid": t.get("ns_pid"),
            "identity": t["identity"], "job": t.get("job"),  # the job key, as hang's node
            "dump": t.get("dump"), "dump_later": t.get("dump_later"),
            "error": t.get("error"), "route": t.get("route"),
            "route_detail": t.get("route_detail"),
        })
    doc["seconds"] = round(time.monotonic() - start, 3)
    return doc


def _ancestors(pid: int, procs: dict[int, dict[str, Any]]) -> set[int]:
    out: set[int] = set()
    while pid in procs and pid not in out:
        out.add(pid)
        pid = procs[pid]["ppid"]
    return out


def parser() -> argparse.ArgumentParser:
    from mldebug.hang.node import parser as hang_parser

    p = hang_parser()
    p.prog = "mldebug-signal-collect"
    p.add_argument("--signal", default="SIGUSR1", help="the signal the ranks' handler listens to")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    doc = collect(opts)
    emit(doc)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
