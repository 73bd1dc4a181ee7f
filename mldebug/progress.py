"""Progress of a fan-out on stderr: nodes answered / total and failures so far.

Shown only when stderr is a terminal, so pipes, logs and ``--json`` consumers never see it.
``mldebug.fanout.run`` opens one for every collection over several nodes.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any


class FanoutProgress:
    """Counts node answers (called as each node's result is complete) and shows them on a
    rich bar: nodes answered / total, and how many failed so far."""

    def __init__(self, total: int, bar: Any = None, task: Any = None) -> None:
        self.total = total
        self.answered = 0
        self.failed = 0
        self._bar = bar
        self._task = task
        self._lock = threading.Lock()

    def __call__(self, host: str, ok: bool) -> None:
        with self._lock:
            self.answered += 1
            self.failed += 0 if ok else 1
            if self._bar is not None:
                self._bar.update(self._task, completed=self.answered,
                                 description=self.description())

    def description(self) -> str:
        return "nodes answered" + (f" ({self.failed} failed)" if self.failed else "")


@contextmanager
def fanout_progress(total: int, file: IO[str] | None = None, *,
                    shown: bool = True) -> Iterator[FanoutProgress]:
    """A ``FanoutProgress`` for ``total`` nodes; drawn on ``file`` (stderr) only on a terminal
    and when ``shown`` (``--json`` callers pass False)."""
    out = file if file is not None else sys.stderr
    if not shown or not (hasattr(out, "isatty") and out.isatty()):
        yield FanoutProgress(total)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mldebug.render import console

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console(out), transient=True)
    with bar:
        task = bar.add_task("nodes answered", total=total)
        yield FanoutProgress(total, bar, task)
