"""A stall watchdog inside each rank: no ``beat()`` for ``timeout`` seconds -> every thread's
stack (and the flight recorder, and the trace ring) lands in a private directory, in the
format ``mldebug hang analyze DIR`` reads.

``beat()`` only increments an int; the watchdog thread wakes every ``poll`` seconds and
compares. When the main thread holds the GIL inside a C call the watchdog thread cannot run,
so each wake-up also re-arms a C-level ``faulthandler.dump_traceback_later`` timer: if the
thread misses its next wake-up by ``timeout`` seconds, faulthandler writes the stacks without
the GIL, and the dump says its route was "faulthandler". With ``dump+abort`` a kernel timer
takes that timer's place (``mldebug.capture.abort``), so that both routes exit with
``STALL_EXIT_CODE``.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from mldebug.capture import handler as _handler
from mldebug.capture.abort import ABORT_SIGNAL, AbortTimer, AbortUnavailable
from mldebug.capture.handler import DumpHandler, _log
from mldebug.errors import UsageError
from mldebug.privdir import open_private

# dump+abort: the job fails in minutes, with a code that says why. It is the abort timer's
# signal number, because with the GIL held the kernel calls _exit(signo) (abort.py).
STALL_EXIT_CODE = ABORT_SIGNAL
ON_STALL = ("dump", "dump+abort", "dump+continue")
# seconds the GIL guard waits longer while this thread writes a stall dump itself
DUMP_GRACE = 30.0
_F = TypeVar("_F", bound=Callable[..., Any])


class Watchdog(DumpHandler):
    """See the module docstring; make one with ``mldebug.watchdog(...)``."""

    def __init__(self, timeout: float = 300.0, dir: str | Path | None = None,
                 on_stall: str = "dump", signum: int | str = signal.SIGUSR1,
                 locals: bool = False, poll: float | None = None, gil_guard: bool = True) -> None:
        if on_stall not in ON_STALL:
            raise UsageError(f"on_stall={on_stall!r} is not one of {', '.join(ON_STALL)}.",
                             'e.g. mldebug.watchdog(timeout=300, on_stall="dump+abort")')
        if timeout <= 0:
            raise UsageError("the watchdog timeout must be a positive number of seconds.",
                             "e.g. mldebug.watchdog(timeout=300)")
        self.timeout = float(timeout)
        self.on_stall = on_stall
        self.max_dumps = 3 if on_stall == "dump+continue" else 1
        self.gil_guard = gil_guard
        self.beats = 0
        self._seen_beats = 0
        self._last_change = time.monotonic()
        self._stalls = 0
        self._gil_fd: int | None = None
        self._gil_seen = 0
        self._abort: AbortTimer | None = None
        self._barrier: Any = None
        super().__init__(dir, signum, locals,
                         poll if poll is not None else min(5.0, max(0.05, timeout / 4)))
        if on_stall == "dump+abort":
            from mldebug.capture.evidence import Barrier

            try:
                self._barrier = Barrier(self.dir, self.stem, self.identity, self.pid,
                                        self.fh_dir, self.dumps_dir)
            except OSError as e:
                _log(f"on_stall=dump+abort: no evidence barrier ({e}); this rank will not "
                     "wait for the others' dumps before it exits")
        if gil_guard:
            self._gil_fd = open_private(self.fh_dir / f"{self.stem}.gil.txt",
                                        os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            self._gil_seen = os.fstat(self._gil_fd).st_size
            if on_stall == "dump+abort":
                try:
                    self._abort = AbortTimer(self._gil_fd)
                except AbortUnavailable as e:
                    _log(f"on_stall=dump+abort: a rank that holds the GIL will exit with code 1 "
                         f"(faulthandler), not {STALL_EXIT_CODE}: {e}")
            self._arm()

    def beat(self) -> None:
        """One step done: no syscall, no allocation beyond an int."""
        self.beats += 1

    # -- the thread ------------------------------------------------------------------------
    def _arm(self, extra: float = 0.0) -> None:
        if self._gil_fd is not None and not self._stop.is_set():
            # if this thread cannot run again within timeout + poll, someone holds the GIL
            if self._abort is not None:
                self._abort.arm(self.timeout + self.poll + extra)
                return
            faulthandler.dump_traceback_later(self.timeout + self.poll + extra, repeat=False,
                                              file=self._gil_fd,
                                              exit=self.on_stall == "dump+abort")

    def _tick(self) -> None:
        super()._tick()
        now = time.monotonic()
        if self.beats != self._seen_beats:
            self._seen_beats = self.beats
            if self._stalls:
                _log(f"beats resumed after {now - self._last_change:.0f}s without one")
            self._last_change, self._stalls = now, 0
        stalled = now - self._last_change
        if self._gil_fd is not None and os.fstat(self._gil_fd).st_size > self._gil_seen:
            self._gil_from_faulthandler(stalled)
        elif self._stalls < self.max_dumps and stalled >= self.timeout * (2 ** self._stalls):
            # this thread is busy while it dumps (the flight recorder, the ring: seconds on a
            # loaded node), not kept from running: the guard waits DUMP_GRACE longer, and what
            # it wrote meanwhile is no "GIL held" stall (this thread ran Python throughout)
            self._arm(DUMP_GRACE)
            self._stall(stalled, "python")
            if self._gil_fd is not None:
                self._gil_seen = os.fstat(self._gil_fd).st_size
        self._arm()

    def _gil_from_faulthandler(self, stalled: float) -> None:
        """faulthandler fired while this thread could not run: the GIL was held."""
        from mldebug.privdir import read_bounded

        raw = read_bounded(self.fh_dir / f"{self.stem}.gil.txt")[self._gil_seen:]
        assert self._gil_fd is not None
        self._gil_seen = os.fstat(self._gil_fd).st_size
        path = self.dump_faulthandler_text(
            raw.decode(errors="replace"), "stall", later=self._stalls > 0,
            timeout=self.timeout, stalled_for=round(max(stalled, self.timeout), 1),
            note="the GIL was held (a C call); stacks from the C-level faulthandler")
        self._stalls += 1
        _log(f"no beat for {self.timeout:g}s while the GIL was held: stacks in {path}")
        self._after_stall()

    def _stall(self, stalled: float, route: str) -> None:
        path = self.dump(reason="stall", route=route, later=self._stalls > 0,
                         timeout=self.timeout, stalled_for=round(stalled, 1),
                         beats=self.beats)
        self._stalls += 1
        from mldebug.capture.handler import debug_server_port

        port = debug_server_port()
        _log(f"no beat for {stalled:.0f}s (timeout {self.timeout:g}s): stacks in {path}"
             + (f"; next dump at {self.timeout * 2 ** self._stalls:g}s"
                if self._stalls < self.max_dumps else "")
             + (f"; torch's debug server is up here (worker port {port}): a live "
                "'mldebug hang' asks it where py-spy cannot attach" if port else ""))
        self._after_stall()

    def _after_stall(self) -> None:
        if self.on_stall == "dump+abort":
            if self._barrier is not None:
                from mldebug.capture.evidence import wait_s

                bound = wait_s()
                # this thread waits now instead of waking every poll: push the GIL guard's
                # abort past the wait, so it does not fire meanwhile (it still bounds us)
                if self._abort is not None:
                    self._abort.arm(bound + self.timeout + self.poll)
                elif self._gil_fd is not None:
                    faulthandler.dump_traceback_later(bound + self.timeout + self.poll,
                                                      repeat=False, file=self._gil_fd, exit=True)
                try:
                    note = self._barrier.wait(bound)
                    missing = ", ".join(f"rank {m['rank']} ({m['why']})" if m["rank"] is not None
                                        else f"pid {m['pid']} ({m['why']})"
                                        for m in note["missing"])
                    _log(f"on_stall=dump+abort: dumps written by {', '.join(note['dumped'])}"
                         + (f"; no dump from {missing}" if missing else "")
                         + f" (waited {note['waited_s']:g}s of {note['bound_s']:g})")
                except Exception as e:  # noqa: BLE001 - the abort must happen regardless
                    _log(f"on_stall=dump+abort: the evidence barrier failed ({e})")
            _log(f"on_stall=dump+abort: exiting with code {STALL_EXIT_CODE}")
            os._exit(STALL_EXIT_CODE)

    def close(self) -> None:
        super().close()  # the thread first: it re-arms the timers
        if self._barrier is not None:
            self._barrier.leave()
            self._barrier = None
        if self._abort is not None:
            self._abort.close()
            self._abort = None
        elif self._gil_fd is not None:
            faulthandler.cancel_dump_traceback_later()
        if self._gil_fd is not None:
            os.close(self._gil_fd)
            self._gil_fd = None
        if _handler._HANDLER is self:
            _handler._HANDLER = None

    # -- context manager and decorator ------------------------------------------------------
    def __enter__(self) -> Watchdog:
        self._last_change = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)
        return wrapper  # type: ignore[return-value]


def watchdog(timeout: float = 300.0, dir: str | Path | None = None, on_stall: str = "dump",
             signum: int | str = signal.SIGUSR1, locals: bool = False,
             poll: float | None = None, gil_guard: bool = True) -> Watchdog:
    """Start this rank's stall watchdog (it also answers ``mldebug hang --signal``).

    Call ``mldebug.beat()`` once per step. ``on_stall``: "dump" (once), "dump+continue"
    (again at 2x and 4x ``timeout``: stuck or slow?) or "dump+abort" (exit with code
    ``STALL_EXIT_CODE`` = 54 after the dump, even when the GIL is held). Usable as ``with``
    block and as decorator.
    """
    if _handler._HANDLER is not None:
        _handler._HANDLER.close()
        _handler._HANDLER = None
    wd = Watchdog(timeout, dir, on_stall, signum, locals, poll, gil_guard)
    _handler._HANDLER = wd
    return wd


def beat() -> None:
    """Tell this rank's watchdog a step finished (a no-op without one)."""
    wd = _handler._HANDLER
    if wd is not None and isinstance(wd, Watchdog):
        wd.beats += 1


__all__ = ["STALL_EXIT_CODE", "Watchdog", "beat", "watchdog"]
