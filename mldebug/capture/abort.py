"""``on_stall="dump+abort"`` while a thread holds the GIL: dump, then exit with
``STALL_EXIT_CODE``, with no Python code running and nothing compiled at run time.

No Python thread can run while the GIL is held, and faulthandler's own timer ends with
``_exit(1)``. So the kernel does it: a POSIX per-process timer (``timer_create``,
``SIGEV_SIGNAL``) sends the real-time signal ``ABORT_SIGNAL`` when the watchdog thread misses
its wake-ups. That signal's handler is faulthandler's C handler (``faulthandler.register(...,
chain=True)``): it writes every thread's stack, puts back the handler it found - libc's
async-signal-safe ``_exit``, installed below through ctypes - and raises the signal again, so
``_exit(ABORT_SIGNAL)`` runs: the dump is always complete before the exit, and the exit code
is the signal number. The Python route exits with the same number (``STALL_EXIT_CODE``).

Safety: the signal is taken only when nobody handles or ignores it (C level, from
``/proc/self/status``, and Python level); ``close()`` deletes the timer and gives the signal
back to ``SIG_DFL`` (unless the program has set its own Python handler since: then it is
left alone). POSIX timers are not inherited by ``fork()`` children (which forget the timer's
id) and are deleted by ``execve()``. Where any of this is unavailable (no ctypes, no ``timer_create``, not Linux, the
signal taken), ``AbortTimer`` raises ``AbortUnavailable`` and the watchdog falls back to
faulthandler's ``exit=True`` (exit code 1).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import weakref
from typing import Any

from mldebug.nodekit import signal_in_mask

ABORT_SIGNAL = 54  # SIGRTMIN+20 on glibc (SIGRTMIN is 34 there; the kernel's is 32)
CLOCK_MONOTONIC = 1
SIGEV_SIGNAL = 0


_LIVE: weakref.WeakSet[AbortTimer] = weakref.WeakSet()


def _forget_in_child() -> None:
    """A fork() child has none of its parent's timers: never delete an id it does not own."""
    for t in list(_LIVE):
        t._timer = None


os.register_at_fork(after_in_child=_forget_in_child)


class AbortUnavailable(Exception):
    """The kernel route cannot be set up here; the message says why."""


def signal_free(signum: int, status: str | None = None) -> str | None:
    """Why ``signum`` cannot be taken (someone catches or ignores it), or None when free.
    ``status``: the text of /proc/self/status (read here when None)."""
    py = signal.getsignal(signum)
    if py not in (signal.SIG_DFL, None):
        return f"signal {signum} has a Python handler ({py!r})"
    if status is None:
        try:
            with open("/proc/self/status") as f:
                status = f.read(1 << 16)
        except OSError as e:
            return f"/proc/self/status unreadable ({e.strerror})"
    for key, what in (("SigCgt", "caught"), ("SigIgn", "ignored")):
        try:
            if signal_in_mask(status, key, signum):
                return f"signal {signum} is already {what}"
        except ValueError:
            return f"/proc/self/status has an unreadable {key} line"
    return None


class AbortTimer:
    """The kernel's abort for one watchdog: ``arm(seconds)`` at each wake-up, ``close()``."""

    def __init__(self, fd: int, signum: int = ABORT_SIGNAL) -> None:
        if not sys.platform.startswith("linux"):
            raise AbortUnavailable(f"POSIX timers through ctypes are set up on Linux only, "
                                   f"not {sys.platform}")
        lo, hi = getattr(signal, "SIGRTMIN", 0), getattr(signal, "SIGRTMAX", 0)
        if not lo <= signum <= hi:
            raise AbortUnavailable(f"signal {signum} is not a real-time signal here "
                                   f"(SIGRTMIN {lo}, SIGRTMAX {hi})")
        why = signal_free(signum)
        if why:
            raise AbortUnavailable(why)
        try:
            import ctypes
            import ctypes.util
        except ImportError as e:
            raise AbortUnavailable(f"no ctypes ({e})") from None
        self._ct = ctypes
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            funcs = [getattr(libc, n, None) for n in ("timer_create", "timer_settime",
                                                       "timer_delete")]
            if None in funcs:  # glibc < 2.34 keeps the timers in librt
                rt_name = ctypes.util.find_library("rt")
                if rt_name is None:
                    raise AbortUnavailable("timer_create not found (no librt)")
                rt = ctypes.CDLL(rt_name, use_errno=True)
                funcs = [getattr(rt, n, None) for n in ("timer_create", "timer_settime",
                                                         "timer_delete")]
                if None in funcs:
                    raise AbortUnavailable("timer_create not found in libc or librt")
            self._create, self._settime, self._delete = (f for f in funcs if f is not None)
            self._signal = libc.signal
            self._signal.restype = ctypes.c_void_p
            self._signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
            exit_addr = ctypes.cast(libc._exit, ctypes.c_void_p).value
        except (OSError, AttributeError) as e:
            raise AbortUnavailable(f"libc not usable through ctypes ({e})") from None

        class Sigevent(ctypes.Structure):  # Linux: value, signo, notify, then padding
            _fields_ = [("sigev_value", ctypes.c_void_p), ("sigev_signo", ctypes.c_int),
                        ("sigev_notify", ctypes.c_int), ("_pad", ctypes.c_int * 16)]

        class Timespec(ctypes.Structure):
            _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

        class Itimerspec(ctypes.Structure):
            _fields_ = [("it_interval", Timespec), ("it_value", Timespec)]

        self._Timespec, self._Itimerspec = Timespec, Itimerspec
        self.signum = signum
        self._lock = threading.Lock()
        self._timer: Any = None
        # the order matters: _exit first, so that faulthandler records it as the handler to
        # chain to; the timer last, so that it never fires before both are in place
        if self._signal(signum, exit_addr) == ctypes.c_void_p(-1).value:  # SIG_ERR
            raise AbortUnavailable(f"signal({signum}, _exit) failed")
        try:
            faulthandler.register(signum, file=fd, all_threads=True, chain=True)
            timer = ctypes.c_void_p()
            ev = Sigevent(None, signum, SIGEV_SIGNAL)
            if self._create(CLOCK_MONOTONIC, ctypes.byref(ev), ctypes.byref(timer)) != 0:
                raise AbortUnavailable(f"timer_create failed (errno {ctypes.get_errno()})")
            self._timer = timer
        except BaseException:
            self._release()
            raise
        _LIVE.add(self)

    def arm(self, seconds: float) -> None:
        """Send the signal in ``seconds`` unless armed again before (one shot)."""
        whole = int(seconds)
        spec = self._Itimerspec(self._Timespec(0, 0),
                                self._Timespec(whole, int((seconds - whole) * 1e9)))
        with self._lock:
            if self._timer is not None:
                self._settime(self._timer, 0, self._ct.byref(spec), None)

    def close(self) -> None:
        """Delete the timer and give the signal back (SIG_DFL): nothing of ours is left."""
        with self._lock:
            self._release()

    def _release(self) -> None:
        if self._timer is not None:
            self._delete(self._timer)
            self._timer = None
        if callable(signal.getsignal(self.signum)):
            return  # the program took the signal over since (signal.signal): it is theirs now
        try:
            faulthandler.unregister(self.signum)
        except (RuntimeError, ValueError):
            pass
        self._signal(self.signum, 0)  # SIG_DFL
