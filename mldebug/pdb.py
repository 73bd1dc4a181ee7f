"""pdb that works in forked and torchrun-launched processes.

Child processes often have no usable stdin: multiprocessing replaces it with /dev/null, and
torchrun's workers run in their own session. ``ForkedPdb`` talks to the controlling terminal
(/dev/tty) when there is one, else to the inherited fd 0, so the debugger is interactive in
any rank. ``breakpoint(rank=0)`` stops only on the chosen rank(s); when torch.distributed is
initialised the other ranks wait at a barrier and all continue together.
"""

from __future__ import annotations

import os
import pdb as _pdb
import sys
from collections.abc import Callable, Iterable
from types import FrameType
from typing import IO, Any

from mldebug.dist import identity


def _open_terminal() -> tuple[IO[str], IO[str]] | None:
    """Open the controlling terminal, else fd 0/1 when they are terminals."""
    try:
        tty_in = open("/dev/tty")  # noqa: SIM115 - closed in interaction()
        tty_out = open("/dev/tty", "w")  # noqa: SIM115
        return tty_in, tty_out
    except OSError:
        pass
    try:
        return open("/dev/stdin"), sys.stdout  # noqa: SIM115
    except OSError:
        return None


class ForkedPdb(_pdb.Pdb):
    """A Pdb whose interaction uses the terminal even in forked/launched children.

    ``on_continue`` (optional) runs once when the user continues or quits; ``breakpoint``
    uses it to release the ranks waiting at the barrier.
    """

    def __init__(self, *args: Any, on_continue: Callable[[], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_continue = on_continue

    def _release(self) -> None:
        callback, self._on_continue = self._on_continue, None
        if callback is not None:
            callback()

    def set_continue(self) -> None:
        super().set_continue()
        self._release()

    def set_quit(self) -> None:
        super().set_quit()
        self._release()

    def interaction(self, *args: Any, **kwargs: Any) -> None:
        streams = _open_terminal()
        if streams is None:
            print(
                f"mldebug.ForkedPdb: pid {os.getpid()} has no terminal to debug on; continuing.",
                file=sys.stderr,
            )
            self.set_continue()
            return
        tin, tout = streams
        saved = (sys.stdin, self.stdin, self.stdout)
        try:
            sys.stdin = tin
            self.stdin, self.stdout = tin, tout
            super().interaction(*args, **kwargs)
        finally:
            sys.stdin, self.stdin, self.stdout = saved
            tin.close()
            if tout is not sys.stdout:
                tout.close()


def _current_rank() -> int | None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return identity().rank


def breakpoint(rank: int | Iterable[int] | None = 0, *, frame: FrameType | None = None) -> None:
    """Break into pdb on ``rank`` (an int, several ranks, or None for every process).

    Outside a distributed job (no rank known) the process always breaks. When
    torch.distributed is initialised, the other ranks wait at a barrier that the debugging
    rank joins when you type ``c``, so nobody times out in a collective meanwhile.
    """
    me = _current_rank()
    wanted: set[int] | None
    if rank is None:
        wanted = None
    elif isinstance(rank, int):
        wanted = {rank}
    else:
        wanted = set(rank)
    caller = frame or sys._getframe(1)
    dist = sys.modules.get("torch.distributed")
    barrier = None
    if dist is not None and dist.is_available() and dist.is_initialized():
        barrier = dist.barrier
    if me is None or wanted is None or me in wanted:
        # The debugger stops in the caller's frame; the barrier runs when the user continues.
        debugger = ForkedPdb(on_continue=barrier)
        debugger.message(f"mldebug.breakpoint: rank {me} stopped; 'c' releases the other ranks.")
        debugger.set_trace(caller)
    elif barrier is not None:
        barrier()
