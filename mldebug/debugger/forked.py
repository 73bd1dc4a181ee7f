"""pdb on the terminal of a forked or launched process.

Child processes often have no usable stdin: multiprocessing replaces it with /dev/null.
``ForkedPdb`` talks to the controlling terminal (/dev/tty) when there is one, else to fd 0
when that is a terminal, so the debugger is interactive in any child that has a terminal at
all. A process with none (every batch job) gets a remote session instead: see
``mldebug.debugger.hooks.breakpoint``.
"""

from __future__ import annotations

import os
import pdb as _pdb
import sys
from collections.abc import Callable
from typing import IO, Any


def _open_terminal() -> tuple[IO[str], IO[str]] | None:
    """Open the controlling terminal, else fd 0/1 when stdin is a terminal; None without one.

    MLDEBUG_PDB=remote makes every process count as terminal-less (a session is served).
    """
    if os.environ.get("MLDEBUG_PDB") == "remote":
        return None
    try:
        tty_in = open("/dev/tty")  # noqa: SIM115 - closed in interaction()
        tty_out = open("/dev/tty", "w")  # noqa: SIM115
        return tty_in, tty_out
    except OSError:
        pass
    try:
        if os.isatty(0):
            return open("/dev/stdin"), sys.stdout  # noqa: SIM115
    except OSError:
        pass
    return None


def has_terminal() -> bool:
    """Whether a terminal pdb can talk to this process (else it needs a remote session)."""
    streams = _open_terminal()
    if streams is None:
        return False
    for f in streams:
        if f is not sys.stdout:
            f.close()
    return True


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
                f"mldebug.ForkedPdb: pid {os.getpid()} has no terminal to debug on; continuing "
                "(mldebug.breakpoint() serves a remote session instead: mldebug pdb connect).",
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
