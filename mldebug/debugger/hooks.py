"""``mldebug.breakpoint`` and ``mldebug.post_mortem``: pdb on any rank, with or without a terminal.

The chosen rank(s) stop in the caller's frame: in pdb on the terminal when the rank has one
(``ForkedPdb``), else in a session served on 127.0.0.1 that ``mldebug pdb connect`` reaches
from anywhere (``RemotePdb``), or in an IDE (``ide="debugpy"``). The other ranks wait at a
barrier with a timeout until the debugged ranks continue, so nobody hits the collective
timeout meanwhile. Nothing here ever ends a rank.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import Any

from mldebug.debugger import wait
from mldebug.debugger.forked import ForkedPdb, has_terminal
from mldebug.dist import identity
from mldebug.render import fold_ints

Ranks = int | str | Iterable[int] | None


def _dist() -> Any:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def _current_rank() -> int | None:
    dist = _dist()
    if dist is not None:
        return int(dist.get_rank())
    return identity().rank


def wanted_ranks(rank: Ranks) -> set[int] | None:
    """The ranks that stop: None means every process (``rank=None`` or ``"all"``)."""
    if rank is None or rank == "all":
        return None
    if isinstance(rank, bool) or isinstance(rank, str):
        raise ValueError(f"rank must be an int, a list of ints or 'all', not {rank!r}")
    if isinstance(rank, int):
        return {rank}
    return {int(r) for r in rank}


def breakpoint(rank: Ranks = 0, *, frame: FrameType | None = None, ide: str | bool | None = None,
               timeout: float | None = None, directory: str | None = None) -> None:
    """Break into pdb on ``rank`` (an int, a list of ints, ``"all"``; None is every process).

    With a terminal the debugger uses it; without one (batch jobs, stdin /dev/null) it serves
    a session on 127.0.0.1 and prints the ``mldebug pdb connect`` command; ``ide="debugpy"``
    waits for an IDE instead. Outside a distributed job the process always breaks. When
    torch.distributed is initialised the other ranks wait (up to ``timeout`` seconds,
    default MLDEBUG_PDB_TIMEOUT or an hour) until every debugged rank continues.
    """
    me = _current_rank()
    wanted = wanted_ranks(rank)
    caller = frame or sys._getframe(1)
    dist = _dist()
    release: Callable[[], None] | None = None
    if dist is not None:
        name, bound = wait.next_name(), wait.timeout_s(timeout)
        debugged = ("every rank" if wanted is None else
                    f"rank{'s' if len(wanted) > 1 else ''} {fold_ints(wanted)}")
        everyone, came, world = wait.handshake(dist, name, f"mldebug.breakpoint (for {debugged})")

        def release() -> None:
            wait.barrier(dist, name, bound, f"the debugger on {debugged}")

        if not everyone:
            # some ranks never called breakpoint() here (an `if rank == N:` around it): say
            # who, and nobody waits for the others (they would wait forever)
            missing = sorted(set(range(world)) - set(came)) if came else []
            absent = sorted((wanted or set()) - set(came)) if came else []
            sys.stderr.write(
                f"mldebug.breakpoint: rank {me}: only rank{'s' if len(came) != 1 else ''} "
                f"{fold_ints(came) or '?'} of {world} reached this breakpoint within "
                f"{wait.handshake_s():g}s (rank{'s' if len(missing) != 1 else ''} "
                f"{fold_ints(missing) or '?'} did not: call mldebug.breakpoint on every rank; "
                f"it stops only rank={rank!r}). "
                + (f"{'Ranks' if len(absent) > 1 else 'Rank'} {fold_ints(absent)} will not be "
                   "debugged here; " if absent else "")
                + ("this rank is debugged; nobody waits for it, so the others may reach their "
                   "collective timeout.\n" if wanted is None or me in wanted else
                   "this rank continues without waiting.\n"))
            sys.stderr.flush()
            release = None
            if wanted is not None and me not in wanted:
                return
        elif wanted is not None and me not in wanted:
            if me == min(set(range(int(dist.get_world_size()))) - wanted, default=None):
                sys.stderr.write(f"mldebug.breakpoint: the other ranks wait (up to {bound:g}s) "
                                 f"while {debugged} {'are' if len(wanted) > 1 else 'is'} "
                                 "debugged\n")
                sys.stderr.flush()
            release()
            return
    elif wanted is not None and me is not None and me not in wanted:
        return
    if ide:
        if ide not in (True, "debugpy"):
            raise ValueError(f"ide must be 'debugpy' (or True), not {ide!r}")
        from mldebug.debugger.ide import debugpy_session

        if debugpy_session(on_continue=release, directory=directory):
            return
    if has_terminal():
        debugger = ForkedPdb(on_continue=release)
        debugger.message(f"mldebug.breakpoint: rank {me} stopped; 'c' releases the other ranks.")
        debugger.set_trace(caller)
    else:
        from mldebug.debugger.remote import RemotePdb

        debugger = _remote(lambda: RemotePdb(directory=directory, on_continue=release))
        if debugger is None:
            if release is not None:
                release()
            return
        debugger.set_trace(caller)


def _remote(make: Callable[[], Any]) -> Any:
    """A remote debugger, or None (said on stderr) when its private directory is unsafe:
    a rank goes on without a debugger rather than fail."""
    from mldebug.debugger.registry import RegistryError

    try:
        return make()
    except (RegistryError, OSError) as e:
        sys.stderr.write(f"mldebug.breakpoint: cannot open a debugger session: {e}; "
                         "continuing without one.\n")
        sys.stderr.flush()
        return None


def post_mortem(tb: TracebackType | None = None, *, directory: str | None = None) -> None:
    """Debug the frame that raised: the current exception's, or ``tb``.

    On a terminal this is ``pdb.post_mortem``; without one a session is served as for
    ``breakpoint`` (kind "post-mortem"). Returns when you continue.
    """
    if tb is None:
        tb = sys.exc_info()[2] or getattr(sys, "last_traceback", None)
    if tb is None:
        raise ValueError("post_mortem() needs a traceback: call it in an except block or pass tb")
    if has_terminal():
        debugger = ForkedPdb()
        debugger.reset()
        debugger.interaction(None, tb)
    else:
        from mldebug.debugger.remote import RemotePdb

        debugger = _remote(lambda: RemotePdb(kind="post-mortem", directory=directory))
        if debugger is not None:
            debugger.reset()
            debugger.interaction(None, tb)
            debugger.finish(f"{debugger.label}: post-mortem session closed.")
