"""Processes mldebug starts die with it: launchers get their own process group, killed on
exit, error and signal (``owned_group``), and die with mldebug even when it is SIGKILLed
(``die_with_parent``, Linux ``PR_SET_PDEATHSIG``); the ranks they launch do the same with
their launcher.

Stdlib only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux); if the
    parent is already gone, exit now. False where it cannot be asked (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the parent died before the request: too late for the kernel
        os._exit(128 + int(sig))
    return True


LAUNCHED_BY = "MLDEBUG_LAUNCHED_BY"  # "<pid>:<start time>" of the mldebug that launched us


def launcher_tag() -> str:
    """This process as ``LAUNCHED_BY`` names it, for the environment of what it launches."""
    from mldebug.ranks import start_time

    return f"{os.getpid()}:{start_time(os.getpid()) or 0}"


def exit_with_launcher(tag: str | None = None, every: float = 1.0) -> bool:
    """Exit (status 137) within ``every`` seconds of the mldebug process ``tag`` names
    (``LAUNCHED_BY`` from the environment by default) ending, by any means: a daemon thread
    that looks at its pid and start time. PR_SET_PDEATHSIG alone misses it when the signal
    is asked after the parent already died (the rank was still starting), when a credential
    change on the way cleared it (``unshare --user`` clears it for what it execs), or when
    the rank's parent is not the launcher mldebug started. False when there is nothing to
    watch (no tag)."""
    import threading
    import time

    from mldebug.ranks import start_time

    tag = os.environ.get(LAUNCHED_BY) if tag is None else tag
    pid_s, _, start_s = (tag or "").partition(":")
    if not pid_s.isdecimal() or not start_s.isdecimal() or not 0 < int(pid_s) < 1 << 31:
        return False
    pid, started = int(pid_s), int(start_s)

    def gone() -> bool:
        now = start_time(pid)
        return now is None or (started != 0 and now != started)

    def watch() -> None:
        while not gone():
            time.sleep(every)
        os._exit(137)

    if gone():
        os._exit(137)
    threading.Thread(target=watch, name="mldebug-launcher-watch", daemon=True).start()
    return True


def _preexec() -> None:  # in the child, between fork and exec
    die_with_parent()


def popen_owned(cmd: list[str], **kwargs: object) -> subprocess.Popen[str]:
    """``subprocess.Popen`` of a launcher in a new process group (its own session), which dies
    with this process (SIGKILLed when mldebug exits by any means)."""
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=_preexec,  # noqa: PLW1509
                            **kwargs)  # type: ignore[call-overload,no-any-return]


def kill_group(proc: subprocess.Popen[str], grace: float = 5.0) -> None:
    """Stop the process group of ``proc`` (a ``popen_owned`` launcher): SIGTERM (torchrun
    passes it to its ranks), SIGKILL after ``grace`` seconds; reaps ``proc``. Ranks that
    torchrun put in sessions of their own die with it (``die_with_parent`` in the rank)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """SIGTERM raises SystemExit (status 143) instead of killing the process outright, so
    ``finally`` blocks run (temporary directories removed, launched groups killed). Main
    thread only (Python's rule); elsewhere a no-op."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
