"""Read the ring files ``mldebug.trace`` writes (one per rank), bounded and without following
links: they come from a job's directory, which other users may be able to write to."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from mldebug.abortnotes import missing_notes
from mldebug.errors import UsageError
from mldebug.trace.model import Loc, RankTrace
from mldebug.trace.ring import FORMAT

MAX_FILE = 64 << 20
MAX_WORLD = 1 << 17  # beyond any job: a larger recorded world size is ignored


def _files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            sub = p / "trace" if (p / "trace").is_dir() else p
            out.extend(sorted(f for f in sub.iterdir() if f.suffix == ".json" and f.is_file()
                              and not f.is_symlink()))
        elif p.is_file():
            out.append(p)
        else:
            raise UsageError(f"{p} does not exist.",
                             "Pass the dump directory (DIR or DIR/trace) or ring files.")
    return out


def rank_from_doc(doc: dict[str, Any], source: str) -> RankTrace:
    table = doc.get("locations") or []
    locs = [Loc(str(x[0]), int(x[1]), str(x[2]), str(x[3]) if len(x) > 3 else "")
            for x in table if isinstance(x, list) and len(x) >= 3]
    threads = [t for t in doc.get("threads") or () if isinstance(t, dict)]
    main = threads[0] if threads else {}
    events = [locs[i] for i in main.get("events") or () if isinstance(i, int) and 0 <= i < len(locs)]
    rank = doc.get("rank")
    ws = doc.get("world_size")
    return RankTrace(host=str(doc.get("host") or "?"), pid=int(doc.get("pid") or 0),
                     rank=int(rank) if isinstance(rank, int) else None,
                     kind=str(doc.get("events") or "?"), reason=str(doc.get("reason") or ""),
                     events=events, threads=len(threads), source=source,
                     world_size=ws if isinstance(ws, int) and 0 < ws <= MAX_WORLD else None)


def read_ring(f: Path, owner: int | None = None) -> RankTrace | str:
    """One ring file, read without following links and bounded (and, with ``owner``, only
    when that user owns it); the rank's trace, or why not as one line."""
    try:
        fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return f"{f.name}: not a regular file, skipped"
            if owner is not None and st.st_uid != owner:
                return f"{f.name}: owned by uid {st.st_uid}, not the rank's user {owner}; skipped"
            raw = os.read(fd, MAX_FILE + 1)
        finally:
            os.close(fd)
        if len(raw) > MAX_FILE:
            return f"{f.name}: larger than {MAX_FILE >> 20} MiB, skipped"
        doc = json.loads(raw)
    except (OSError, ValueError, RecursionError) as e:
        return f"{f.name}: unreadable ({e})"
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return f"{f.name}: not an mldebug.trace ring file"
    try:
        return rank_from_doc(doc, f.name)
    except (TypeError, ValueError) as e:
        return f"{f.name}: malformed ({e})"


def load(paths: list[str]) -> tuple[list[RankTrace], list[str]]:
    """The rank traces in the given files or directories, and one error per bad file."""
    traces: list[RankTrace] = []
    errors: list[str] = []
    files = _files(paths)
    if not files:
        raise UsageError(f"no trace files in {', '.join(paths)}.",
                         "Enable the ring in the job (mldebug.trace.enable()) and pass the "
                         "watchdog's directory, or DIR/trace.")
    for f in files:
        got = read_ring(f)
        if isinstance(got, str):
            errors.append(got)
        else:
            traces.append(got)
    traces.sort(key=lambda t: (t.rank is None, t.rank if t.rank is not None else 0, t.host, t.pid))
    return traces, errors


def _roots(paths: list[str]) -> list[Path]:
    """The capture directories above the given paths: DIR for DIR, DIR/trace or DIR/trace/F."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        d = p if p.is_dir() else p.parent
        if d.name == "trace" and not (d / "trace").is_dir():
            d = d.parent
        if d not in out:
            out.append(d)
    return out


def abort_notes(paths: list[str]) -> list[tuple[int | None, int, str]]:
    """dump+abort's notes (``DIR/abort/*.exit``) beside the rings: (rank, pid, why) of each
    rank they name as having no dump."""
    seen: set[tuple[int | None, int]] = set()
    out = []
    for root in _roots(paths):
        for rank, pid, why in missing_notes(root):
            if (rank, pid) not in seen:
                seen.add((rank, pid))
                out.append((rank, pid, why))
    return out
