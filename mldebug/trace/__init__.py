"""A flight recorder of Python execution per rank, and full traces on demand.

``mldebug.trace.enable(events="calls", ring=4096)`` keeps the last N call (or line) events of
the user's code per thread in memory; they are written, one file per rank, at a watchdog
stall, on the dump signal, on an unhandled exception, or with ``mldebug.trace.dump()``.
``mldebug trace show DIR`` puts the ranks side by side and names where one rank's path left
the others'; ``mldebug trace show --pid PID`` / ``--job KEY`` asks a live job's ranks on this
host for their rings first (``mldebug.trace.live``). ``python -m mldebug.trace run train.py`` writes a full per-rank trace.
"""

from __future__ import annotations

from mldebug.trace.ring import Ring, active, disable, dump, enable

__all__ = ["Ring", "active", "disable", "dump", "enable"]
