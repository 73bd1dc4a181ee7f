"""A step clock: ``with mldebug.step():`` around each training step (#44).

    for batch in loader:          # waiting for data: between two steps
        with mldebug.step():      # compute and communication: inside
            train_step(batch)

Each rank keeps when it entered and left its latest ``RING`` steps (wall clock,
``time.time_ns``: the flight recorder's ``time_created_ns`` clock, so the two line up) and
writes them, at most every ``EVERY_S`` seconds and at exit, to ``.steps_rank<R>.json`` beside
its flight-recorder dumps (the directory of ``mldebug.fr.enable()``, else ``$MLDEBUG_FR_DIR``;
hidden, so the dump loader never takes it for a dump). ``mldebug fr analyze`` reads it for a
straggler's phase: the time between a step's exit and the next one's entry is the wait for
data; entry to the step's first collective is compute; the rest is communication (the
collectives and what follows them). No torch import; about 1 us per step.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RING = 4096  # steps kept per rank
EVERY_S = 2.0  # the file is rewritten at most this often (and at exit)
PREFIX = ".steps_rank"
MAX_BYTES = 1 << 20  # a step file larger than this is refused when read
VERSION = 1


class _Clock:
    """This process's step ring and where it is written."""

    def __init__(self) -> None:
        self.enter: deque[int] = deque(maxlen=RING)
        self.exit: deque[int] = deque(maxlen=RING)
        self.steps = 0
        self.inside = False
        self.last_write = 0
        self.dir: Path | None = None
        self.dir_fd: int | None = None
        self.resolved = False
        self.error = ""
        atexit.register(self.flush)

    def _where(self) -> None:
        """The recorder's directory (opened and checked once by it), else $MLDEBUG_FR_DIR."""
        self.resolved = True
        rec_mod = sys.modules.get("mldebug.fr.recorder")
        rec = getattr(rec_mod, "_RECORDER", None) if rec_mod is not None else None
        try:
            if rec is not None:
                self.dir, self.dir_fd = rec.dump_dir, rec.dir_fd()
            elif os.environ.get("MLDEBUG_FR_DIR"):
                from mldebug.privdir import open_dir, private_dir

                self.dir = private_dir(os.environ["MLDEBUG_FR_DIR"], what="step clock directory")
                self.dir_fd = open_dir(self.dir)
        except Exception as e:  # noqa: BLE001 - a step clock must never hurt the job
            self.error = f"{type(e).__name__}: {e}"
            self.dir = self.dir_fd = None

    def document(self) -> dict[str, Any]:
        import socket

        enter, exit_ = list(self.enter), list(self.exit)
        if self.inside:  # the step in progress has no exit yet
            enter.pop()
        n = min(len(enter), len(exit_))
        return {"version": VERSION, "rank": _rank(), "pid": os.getpid(),
                "host": socket.gethostname().split(".")[0], "clock": "time_ns",
                "steps": self.steps, "enter": enter[len(enter) - n:],
                "exit": exit_[len(exit_) - n:]}

    def flush(self) -> Path | None:
        """Write the ring now (also at exit); None when there is nowhere to write."""
        if not self.resolved:
            self._where()
        if self.dir_fd is None or self.dir is None or not self.steps:
            return None
        name = f"{PREFIX}{_rank()}.json"
        try:
            from mldebug.privdir import write_atomic_at

            write_atomic_at(self.dir_fd, name, json.dumps(self.document()).encode())
        except Exception as e:  # noqa: BLE001
            self.error = f"{type(e).__name__}: {e}"
            return None
        self.last_write = time.monotonic_ns()
        return self.dir / name


_CLOCK: _Clock | None = None


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def clock() -> _Clock:
    global _CLOCK
    if _CLOCK is None:
        _CLOCK = _Clock()
    return _CLOCK


@contextmanager
def step() -> Iterator[None]:
    """Time one training step on this rank (see the module's docstring)."""
    c = _CLOCK or clock()
    c.enter.append(time.time_ns())
    c.inside = True
    try:
        yield
    finally:
        c.exit.append(time.time_ns())
        c.inside = False
        c.steps += 1
        if time.monotonic_ns() - c.last_write > EVERY_S * 1e9:
            c.flush()


def flush() -> Path | None:
    """Write this rank's step file now (e.g. right after ``mldebug.fr.dump``)."""
    return clock().flush()


# --- reading (analysis side) ---------------------------------------------------------------

@dataclass
class Steps:
    """One rank's step clock: entry and exit times (ns, wall clock), oldest first."""

    rank: int
    enter: list[int]
    exit: list[int]


def parse(data: bytes, rank: int) -> Steps | None:
    """A step file's record, or None when it is not one (bounded: size, length, types)."""
    if len(data) > MAX_BYTES:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or doc.get("rank") != rank:
        return None
    enter, exit_ = doc.get("enter"), doc.get("exit")
    if not (isinstance(enter, list) and isinstance(exit_, list)) or len(enter) > RING \
            or len(exit_) != len(enter):
        return None
    if not all(type(v) is int and 0 < v < 1 << 63 for v in (*enter, *exit_)):
        return None
    if any(b < a for a, b in zip(enter, exit_, strict=True)):
        return None
    return Steps(rank, enter, exit_)


def read_beside(dump_file: str, rank: int) -> Steps | None:
    """The step file of ``rank`` next to its dump (or in the recorder's directory when the dump
    is a trigger's, ``<dir>/triggered/<token>/``); never through a link, at most MAX_BYTES."""
    from mldebug.privdir import read_bounded

    here = Path(dump_file).parent
    places = [here]
    if here.parent.name == "triggered":
        places.append(here.parent.parent)
    for d in places:
        try:
            data = read_bounded(d / f"{PREFIX}{rank}.json", MAX_BYTES + 1)
        except OSError:
            continue
        got = parse(data, rank)
        if got is not None:
            return got
    return None
