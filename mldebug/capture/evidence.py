"""``dump+abort`` keeps every rank's evidence: a short file barrier before the exit.

Without it the ranks whose watchdog fires first exit, the launcher (torchrun) sees a failed
worker and kills the rest - sometimes the culprit, before it wrote its dump. So each rank
under ``dump+abort`` registers as a member of the capture directory (``DIR/abort/<stem>.member``,
with its rank, pid and run id); after its own dump it marks itself dumped and waits, at most
``wait`` seconds, until every member of its job has dumped (a JSON dump, or the C-level
faulthandler text of a rank that held the GIL) or is gone. Then it writes what it saw
(``DIR/abort/<stem>.exit``: who dumped, who is missing and why) and exits with
``STALL_EXIT_CODE``. ``mldebug hang analyze DIR`` and ``mldebug trace show DIR`` read those
notes (``mldebug.abortnotes.missing_notes``) and say which ranks have no dump and why.

Only ranks that share the directory (one node, or a shared file system) see each other. The
kernel route (the GIL held: ``mldebug.capture.abort``) runs no Python and cannot wait; its
faulthandler text counts as its dump for the others.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from mldebug.abortnotes import NOTE_FORMAT
from mldebug.privdir import private_dir, read_bounded, write_atomic
from mldebug.ranks import alive

DEFAULT_WAIT_S = 30.0
MAX_MEMBERS = 4096


def wait_s() -> float:
    """The barrier's deadline: MLDEBUG_ABORT_WAIT seconds, default 30."""
    try:
        return max(0.0, min(600.0, float(os.environ.get("MLDEBUG_ABORT_WAIT", DEFAULT_WAIT_S))))
    except ValueError:
        return DEFAULT_WAIT_S


class Barrier:
    """One rank's membership and its wait (see the module docstring)."""

    def __init__(self, root: Path, stem: str, identity: dict[str, Any], pid: int,
                 fh_dir: Path, dumps_dir: Path) -> None:
        self.dir = private_dir(root / "abort")
        self.stem, self.pid = stem, pid
        self.rank = identity.get("rank")
        self.run_id = identity.get("run_id") or ""
        self.fh_dir, self.dumps_dir = fh_dir, dumps_dir
        self.started = time.time()
        write_atomic(self.dir / f"{stem}.member", json.dumps({
            "format": NOTE_FORMAT, "stem": stem, "rank": self.rank, "pid": pid,
            "run_id": self.run_id, "started": self.started}).encode())

    def leave(self) -> None:
        """The watchdog closed normally: this rank is no longer a member."""
        try:
            os.unlink(self.dir / f"{self.stem}.member")
        except OSError:
            pass

    def members(self) -> list[dict[str, Any]]:
        """This job's members in the directory (the same run id; older runs left out)."""
        out = []
        for f in sorted(self.dir.glob("*.member"))[:MAX_MEMBERS]:
            try:
                doc = json.loads(read_bounded(f, 64 << 10))
            except (OSError, ValueError):
                continue
            if (isinstance(doc, dict) and doc.get("format") == NOTE_FORMAT
                    and doc.get("run_id", "") == self.run_id and isinstance(doc.get("pid"), int)
                    and isinstance(doc.get("stem"), str) and "/" not in doc["stem"]):
                out.append(doc)
        return out

    def has_dump(self, m: dict[str, Any]) -> bool:
        stem = m["stem"]
        if (self.dir / f"{stem}.dumped").exists():
            return True
        gil = self.fh_dir / f"{stem}.gil.txt"
        try:
            return gil.stat().st_size > 0 and gil.stat().st_mtime >= m.get("started", 0)
        except OSError:
            return False

    def wait(self, deadline_s: float | None = None) -> dict[str, Any]:
        """Mark this rank dumped, wait for the others (bounded), write and return the note."""
        write_atomic(self.dir / f"{self.stem}.dumped", b"1")
        bound = wait_s() if deadline_s is None else deadline_s
        end = time.monotonic() + bound
        pending: list[dict[str, Any]] = []
        while True:
            pending = [m for m in self.members() if not self.has_dump(m) and alive(m["pid"])]
            if not pending or time.monotonic() >= end:
                break
            time.sleep(0.1)
        members = self.members()
        dumped = [m for m in members if self.has_dump(m)]
        gone = [m for m in members if not self.has_dump(m) and not alive(m["pid"])]
        note = {
            "format": NOTE_FORMAT, "stem": self.stem, "rank": self.rank, "pid": self.pid,
            "waited_s": round(bound - max(0.0, end - time.monotonic()), 2), "bound_s": bound,
            "dumped": sorted(_label(m) for m in dumped),
            "missing": [{"rank": m.get("rank"), "pid": m["pid"],
                         "why": "still running without a dump when the wait ended"}
                        for m in pending]
                       + [{"rank": m.get("rank"), "pid": m["pid"],
                           "why": "exited (or was killed) before writing a dump"} for m in gone],
        }
        write_atomic(self.dir / f"{self.stem}.exit", json.dumps(note).encode())
        return note


def _label(m: dict[str, Any]) -> str:
    return f"rank {m['rank']}" if m.get("rank") is not None else f"pid {m['pid']}"
