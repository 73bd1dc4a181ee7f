"""``mldebug trace show --pid/--job``: ask one live job's ranks on this host for their rings.

A rank with ``mldebug.trace.enable()`` and a dump handler (``mldebug.install_dump_handler()``
or ``mldebug.watchdog()``) writes its ring beside its stack dump when the handler's signal
comes (docs/capture.md). Here: find each selected rank's registry entry
(``mldebug.dumpreg``), signal only the ranks whose handler catches that signal (an uncaught
SIGUSR1 would end the rank), wait a bounded time for the dump the signal produces, and read
the ring that dump names. A rank that wrote no ring gets its reason: no handler, ring not
enabled, GIL held, no answer in time, exited. The job is never stopped or killed.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mldebug.dumpreg import catches, fh_size, fresh_dump, inside, registry_entries
from mldebug.nodekit import short_hostname
from mldebug.privdir import check_dir
from mldebug.trace.collect import MAX_FILE, read_ring
from mldebug.trace.model import RankTrace

NO_HANDLER = ("no dump handler, so nothing can ask it for its ring without stopping it: add "
              "mldebug.install_dump_handler() (or mldebug.watchdog()) beside "
              "mldebug.trace.enable()")
NO_RING = ("answered the signal (its stacks are in {dumps}) but has no ring: "
           "mldebug.trace.enable() was not called in it")
RING_FAILED = "answered the signal but could not write its ring (see the rank's stderr)"
GIL_HELD = ("holds the GIL: only faulthandler's C-level stack came, no Python ran to write "
            "the ring ('mldebug hang --signal --pid {pid}' shows that stack)")
USER_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)  # what a dump handler listens to
REGISTRY_WAIT = 6.0  # a handler's longest poll (5 s) and a margin
FH_GRACE = 3.0  # after faulthandler's text, how long the handler's thread may still take


@dataclass
class Asked:
    """One selected rank and what came of asking it."""

    pid: int
    rank: int | None
    uid: int
    entry: dict[str, Any] | None
    trace: RankTrace | None = None
    reason: str | None = None  # why no ring, when none
    kind: str | None = None  # that reason's kind: no-handler, no-ring, ring-failed, refused,
    #                          gil-held, no-answer, exited, unreadable
    since: float = 0.0
    fh_offset: int = -1
    fh_seen: float | None = None


def _why(a: Asked, kind: str, reason: str) -> None:
    a.kind, a.reason = kind, reason


def _fresh_dump(a: Asked) -> dict[str, Any] | None:
    """The ``capture`` block of the stack dump the rank's handler wrote after our signal."""
    doc = fresh_dump(a.entry or {}, a.uid, a.since, MAX_FILE)
    return doc["capture"] if doc is not None else None


def _ring_of(a: Asked, meta: dict[str, Any]) -> None:
    """Read the ring the dump's ``capture`` block names (only inside the rank's own
    directory's trace/ folder), or record why there is none."""
    entry = a.entry or {}
    d = str(entry.get("dir", ""))
    if "trace" not in meta:
        _why(a, "no-ring", NO_RING.format(dumps=str(Path(d) / "dumps")))
        return
    path = meta.get("trace")
    if not isinstance(path, str) or not path:
        _why(a, "ring-failed", RING_FAILED)
        return
    if not inside(path, str(Path(d) / "trace")):
        _why(a, "refused", f"its dump names a ring outside its directory ({path}); not read")
        return
    try:
        check_dir(Path(path).parent, a.uid)
    except Exception as e:  # noqa: BLE001
        _why(a, "refused", f"its ring's directory is not private ({e}); not read")
        return
    got = read_ring(Path(path), owner=a.uid)
    if isinstance(got, str):
        _why(a, "unreadable", got)
    else:
        a.trace = got


def ask(targets: list[dict[str, Any]], timeout: float) -> list[Asked]:
    """Signal each selected rank process (``mldebug.ranks.find_ranks``' dicts) that has a
    dump handler, and gather the rings; never signals a process that does not catch it."""
    host = short_hostname()
    uids = {int(t.get("uid", os.geteuid())) for t in targets}
    entries = registry_entries(uids, host)
    # a handler re-registers at its next poll when its entry was removed (a prune racing
    # with it): a rank that catches a user signal but has no entry yet gets that long
    waiting = [int(t["pid"]) for t in targets if int(t["pid"]) not in entries
               and any(catches(int(t["pid"]), s) for s in USER_SIGNALS)]
    until = time.monotonic() + REGISTRY_WAIT
    while waiting and time.monotonic() < until:
        time.sleep(0.25)
        entries = registry_entries(uids, host)
        waiting = [p for p in waiting if p not in entries]
    asked: list[Asked] = []
    for t in targets:
        pid = int(t["pid"])
        ident = t.get("identity") or {}
        rank = ident.get("rank") if isinstance(ident.get("rank"), int) else None
        a = Asked(pid, rank, int(t.get("uid", os.geteuid())), entries.get(pid))
        asked.append(a)
        sig = (a.entry or {}).get("signal")
        if a.entry is None or not isinstance(sig, int) or not catches(pid, sig):
            _why(a, "no-handler", NO_HANDLER)
            continue
        a.fh_offset = fh_size(a.entry, a.uid)
        a.since = time.time() - 0.05
        try:
            os.kill(pid, sig)
        except OSError as e:
            _why(a, "refused", f"could not signal pid {pid}: {e.strerror}")
    pending = [a for a in asked if a.reason is None]
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        time.sleep(0.1)
        for a in list(pending):
            meta = _fresh_dump(a)
            if meta is not None:
                _ring_of(a, meta)
                pending.remove(a)
                continue
            if a.entry is not None and fh_size(a.entry, a.uid) > a.fh_offset:
                first = a.fh_seen = a.fh_seen or time.monotonic()
                poll = a.entry.get("poll")
                grace = FH_GRACE + (float(poll) if isinstance(poll, (int, float)) else 5.0)
                if time.monotonic() - first > grace:
                    _why(a, "gil-held", GIL_HELD.format(pid=a.pid))
                    pending.remove(a)
    for a in pending:
        if not os.path.exists(f"/proc/{a.pid}"):
            _why(a, "exited", "exited before it answered")
        elif a.entry is not None and fh_size(a.entry, a.uid) > a.fh_offset:
            _why(a, "gil-held", GIL_HELD.format(pid=a.pid))
        else:
            _why(a, "no-answer", f"did not answer the signal within {timeout:g}s (raise --timeout)")
    return asked


def results(asked: list[Asked]) -> tuple[list[RankTrace], list[tuple[int | None, int, str]]]:
    """The rings read, sorted by rank, and (rank, pid, why) for each rank without one: the
    notes ``mldebug.trace.analyze.analyze`` turns into its missing ranks."""
    traces = sorted((a.trace for a in asked if a.trace is not None),
                    key=lambda t: (t.rank is None, t.rank or 0, t.host, t.pid))
    notes = [(a.rank, a.pid, a.reason or "no ring") for a in asked if a.trace is None]
    return traces, notes
