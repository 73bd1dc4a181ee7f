"""``mldebug.memory.record``: the PyTorch allocator recorder around a few steps, one file per
rank.

A context manager and a decorator around ``torch.cuda.memory._record_memory_history`` and
``_dump_snapshot``. The file name always carries the host and the rank (ranks writing one
shared file race and produce a plausible-looking mess), it is written to a temporary name
and renamed, the size is printed, and without CUDA it raises instead of writing an empty file.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from mldebug.dist import identity
from mldebug.errors import MldebugError

F = TypeVar("F", bound=Callable[..., Any])


def rank_path(template: str, host: str, rank: int | None, pid: int) -> Path:
    """The per-rank file name: {host}, {rank}, {pid} filled; a rank added if the template has
    none, so no two ranks can share a name."""
    who = str(rank) if rank is not None else f"pid{pid}"
    path = template.format(host=host, rank=who, pid=pid)
    if "{rank}" not in template and "{pid}" not in template:
        p = Path(path)
        path = str(p.with_name(f"{p.stem}-{host}-{who}{p.suffix}"))
    return Path(path)


class record:  # noqa: N801 - used like a function: with record(...): / @record(...)
    """Record allocator history; dump after ``steps`` calls of ``step()`` or on exit."""

    def __init__(self, path: str = "mem-{host}-{rank}.pickle", max_entries: int = 100_000,
                 steps: int | None = None) -> None:
        self.template = path
        self.max_entries = max_entries
        self.steps = steps
        self.count = 0
        self.path: Path | None = None
        self.active = False
        self.written: Path | None = None

    def __enter__(self) -> record:
        try:
            import torch
        except ImportError:
            from mldebug.errors import torch_missing

            raise MldebugError(torch_missing("mldebug.memory.record"), "") from None
        if not torch.cuda.is_available():
            raise MldebugError(
                "mldebug.memory.record: CUDA is not available, and the PyTorch memory recorder "
                "only records CUDA allocations; no snapshot would be written.",
                "Run on a GPU; on CPU use mldebug.see_memory_usage(...) (process RSS) or "
                "'mldebug mem peak -- CMD'.")
        ident = identity()
        self.path = rank_path(self.template, ident.host, ident.rank, os.getpid())
        torch.cuda.memory._record_memory_history(max_entries=self.max_entries)
        self.active = True
        return self

    def step(self) -> None:
        """Count one training step; after ``steps`` of them dump and stop recording."""
        self.count += 1
        if self.active and self.steps is not None and self.count >= self.steps:
            self.dump()

    def dump(self) -> Path:
        import torch

        assert self.path is not None
        import tempfile

        # written inside a fresh 0700 directory of ours (an unpredictable name: nobody can
        # plant a link where torch writes), then renamed over the final name
        private = tempfile.mkdtemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            tmp = os.path.join(private, "snapshot.pickle")
            torch.cuda.memory._dump_snapshot(tmp)
            os.replace(tmp, self.path)
        finally:
            for leftover in os.listdir(private):
                os.unlink(os.path.join(private, leftover))
            os.rmdir(private)
        torch.cuda.memory._record_memory_history(enabled=None)
        self.active = False
        self.written = self.path
        from mldebug.memory.units import fmt_bytes
        from mldebug.printing import rank_print

        rank_print(f"mldebug.memory.record: wrote {self.path} "
                   f"({fmt_bytes(self.path.stat().st_size)}); read it with: mldebug mem report "
                   f"{self.path}")
        return self.path

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.active:
            self.dump()

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with record(self.template, self.max_entries, self.steps):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
