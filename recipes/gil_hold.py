"""Hold the GIL inside a C call for a while: what a C extension that never releases it does.

Used by capture_rank_branch.py (BLOCK=gil) and the capture tests; torch-free.
"""

from __future__ import annotations

import ctypes
import time


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def hold_gil(seconds: float) -> None:
    """A C call that keeps the GIL (ctypes.PyDLL does not release it) for ``seconds``: no
    Python thread of this process can run, only C-level faulthandler sees the stack. A timed
    lock on a mutex we already hold: unlike sleep(), signals do not cut it short."""
    libc = ctypes.PyDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed = PTHREAD_MUTEX_INITIALIZER
    libc.pthread_mutex_lock(mutex)
    until = _Timespec(int(time.time() + seconds), 0)
    libc.pthread_mutex_timedlock(mutex, ctypes.byref(until))
