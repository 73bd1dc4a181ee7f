"""The other ranks wait while one is debugged: a barrier with its own timeout and a message.

It uses the job's rendezvous store (every backend has one) rather than a collective, so its
timeout is the debugger's, not the process group's, and a rank that gives up continues with
a message instead of failing. Without a store (an unusual process group) it falls back to
``dist.barrier()``.
"""

from __future__ import annotations

import datetime
import os
import sys
from typing import Any

DEFAULT_TIMEOUT_S = 3600.0
DEFAULT_HANDSHAKE_S = 30.0
MAX_LISTED = 1024  # ranks checked one by one when naming who arrived
_calls = 0


def handshake_s() -> float:
    """How long every rank waits for the others to reach the same breakpoint call before
    saying who did not (MLDEBUG_PDB_HANDSHAKE, default 30 s)."""
    try:
        return max(0.1, float(os.environ.get("MLDEBUG_PDB_HANDSHAKE", DEFAULT_HANDSHAKE_S)))
    except ValueError:
        return DEFAULT_HANDSHAKE_S


class _Named:
    """The main thread carries what it waits for as its name while it waits: py-spy reads
    it, and ``mldebug hang`` says "in mldebug: waiting for ..." instead of blaming our frames."""

    def __init__(self, what: str) -> None:
        import threading

        self.thread = threading.current_thread()
        self.old = self.thread.name
        self.what = what

    def __enter__(self) -> None:
        self.thread.name = f"mldebug: {self.what}"[:200]

    def __exit__(self, *exc: object) -> None:
        self.thread.name = self.old


def arrived(store: Any, name: str, world: int) -> list[int]:
    """The ranks that reached breakpoint call ``name`` (their key is in the store)."""
    out = []
    for r in range(min(world, MAX_LISTED)):
        try:
            if store.check([f"{name}/at/{r}"]):
                out.append(r)
        except Exception:
            break
    return out


def handshake(dist: Any, name: str, what: str) -> tuple[bool, list[int], int]:
    """Every rank that reaches breakpoint call ``name`` says so in the job's store and waits
    (MLDEBUG_PDB_HANDSHAKE seconds at most) for all the others. Returns (all arrived, the
    ranks that arrived, the world size). Without a store: (True, [], world)."""
    store = _store(dist)
    world = int(dist.get_world_size())
    if store is None:
        return True, [], world
    me = int(dist.get_rank())
    bound = handshake_s()
    with _Named(f"waiting up to {bound:g}s for every rank to reach {what}"):
        store.set(f"{name}/at/{me}", b"1")
        if int(store.add(f"{name}/hs", 1)) >= world:
            store.set(f"{name}/all", b"1")
        try:
            store.wait([f"{name}/all"], datetime.timedelta(seconds=bound))
        except Exception:  # DistStoreError / RuntimeError on timeout
            store.set(f"{name}/abandoned", b"1")  # a late rank must not wait for us
            return False, arrived(store, name, world), world
        try:
            if store.check([f"{name}/abandoned"]):
                return False, arrived(store, name, world), world
        except Exception:
            pass
    return True, list(range(world)), world


def timeout_s(value: float | None = None) -> float:
    """The wait bound: the argument, else MLDEBUG_PDB_TIMEOUT, else an hour."""
    if value is not None:
        return float(value)
    try:
        return float(os.environ.get("MLDEBUG_PDB_TIMEOUT", DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S


def next_name() -> str:
    """A name for this breakpoint call, equal on every rank that makes the same calls."""
    global _calls
    _calls += 1
    return f"mldebug/breakpoint/{_calls}"


def _store(dist: Any) -> Any:
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


def barrier(dist: Any, name: str, timeout: float, waiting_for: str) -> bool:
    """Every rank arrives at ``name``; True when all did, False after ``timeout`` seconds."""
    store = _store(dist)
    if store is None:
        dist.barrier()
        return True
    world = int(dist.get_world_size())
    if int(store.add(f"{name}/arrived", 1)) >= world:
        store.set(f"{name}/done", b"1")
    try:
        with _Named(f"waiting for {waiting_for}"):
            store.wait([f"{name}/done"], datetime.timedelta(seconds=timeout))
    except Exception:  # torch raises DistStoreError / RuntimeError on timeout
        sys.stderr.write(
            f"mldebug.breakpoint: rank {dist.get_rank()} waited {timeout:g}s for {waiting_for} "
            "and continues without it (raise breakpoint(timeout=...) or MLDEBUG_PDB_TIMEOUT)\n")
        return False
    return True
