"""The job captures itself: a stall watchdog and dumps on a signal, without ptrace.

In the training script::

    import mldebug
    wd = mldebug.watchdog(timeout=300)     # dumps every thread's stack when no beat for 300 s
    for step in ...:
        ...
        mldebug.beat()

The dumps are written in the format of ``mldebug hang --out DIR``, so ``mldebug hang analyze
DIR`` gives the verdict a live ``mldebug hang`` would. ``mldebug hang --signal`` asks every
rank with a handler for a dump (SIGUSR1) instead of attaching py-spy. Stdlib only; importing
this package never imports torch.
"""

from __future__ import annotations

from mldebug.capture.handler import DumpHandler, install_dump_handler
from mldebug.capture.stall import STALL_EXIT_CODE, Watchdog, beat, watchdog

__all__ = ["STALL_EXIT_CODE", "DumpHandler", "Watchdog", "beat", "install_dump_handler",
           "watchdog"]
