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
_calls = 0


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
        store.wait([f"{name}/done"], datetime.timedelta(seconds=timeout))
    except Exception:  # torch raises DistStoreError / RuntimeError on timeout
        sys.stderr.write(
            f"mldebug.breakpoint: rank {dist.get_rank()} waited {timeout:g}s for {waiting_for} "
            "and continues without it (raise breakpoint(timeout=...) or MLDEBUG_PDB_TIMEOUT)\n")
        return False
    return True
