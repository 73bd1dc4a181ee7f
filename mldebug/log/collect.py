"""Read the inputs of ``mldebug log``: files, directories of per-rank logs, standard input.

Streams line by line (memory does not grow with the file), caps each line's length, skips
symlinks and special files inside directories, and takes a rank from a per-rank file's path
(``rank3.log``, torchrun ``--log-dir``'s ``attempt_0/3/stderr.log``).
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from mldebug.errors import UsageError
from mldebug.log.model import ParsedLogs
from mldebug.log.parse import MAX_LINE, LogParser
from mldebug.names import trailing_number

MAX_FILES = 100_000
MAX_DEPTH = 6


def rank_from_path(path: Path) -> int | None:
    """The rank a per-rank log belongs to, when its path says so; else None (the lines'
    prefixes decide)."""
    number = trailing_number(path.stem)  # the rule hang and fr use for file names
    if number is not None and re.search(r"rank[_-]?\d+$", path.stem, re.IGNORECASE):
        return number
    if path.parent.name.isdigit() and path.name in ("stdout.log", "stderr.log", "error.json"):
        return int(path.parent.name)
    return None


def _lines(stream: object) -> Iterator[str]:
    """Decoded lines from a binary stream, each at most MAX_LINE bytes (the rest skipped)."""
    readline = stream.readline  # type: ignore[attr-defined]
    while True:
        chunk = readline(MAX_LINE)
        if not chunk:
            return
        if not chunk.endswith(b"\n"):  # an over-long line: skip to its end
            while True:
                more = readline(MAX_LINE)
                if not more or more.endswith(b"\n"):
                    break
        yield chunk.decode("utf-8", "replace")


def _walk(root: Path, depth: int = 0) -> Iterator[Path]:
    if depth > MAX_DEPTH:
        return
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        if e.is_symlink():
            continue
        if e.is_dir(follow_symlinks=False):
            yield from _walk(Path(e.path), depth + 1)
        elif e.is_file(follow_symlinks=False):
            yield Path(e.path)


def inputs(paths: Sequence[str]) -> list[Path | None]:
    """Expand directories; ``None`` stands for standard input. Raises UsageError for a path
    that does not exist or is neither a file nor a directory."""
    out: list[Path | None] = []
    for p in paths:
        if p == "-":
            out.append(None)
            continue
        path = Path(p)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise UsageError(f"{p}: no such file or directory.",
                             "Pass the launcher's log, per-rank log files or a directory of them.") from None
        except OSError as e:
            raise UsageError(f"{p}: cannot read ({e.strerror}).", "Check the path and permissions.") from None
        if stat.S_ISDIR(st.st_mode):
            found = list(_walk(path))
            if not found:
                raise UsageError(f"{p}: the directory holds no files.", "Pass the log files themselves.")
            out.extend(found[:MAX_FILES])
        elif stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode) or p.startswith("/dev/std") \
                or p.startswith("/dev/fd/") or p.startswith("/proc/self/fd/"):
            out.append(path)  # regular files, FIFOs, /dev/stdin: read as streams
        else:  # /dev/zero, /dev/urandom, a disk: endless or not a log
            raise UsageError(f"{p} is a device or socket, not a log file.",
                             "Pass a log file, a FIFO, or '-' to read standard input.")
    return out


def load(paths: Sequence[str], world_size: int | None = None) -> ParsedLogs:
    parser = LogParser()
    for path in inputs(paths):
        if path is None:
            parser.feed_source(_lines(sys.stdin.buffer), "<stdin>")
            continue
        try:
            with open(path, "rb") as f:
                parser.feed_source(_lines(f), str(path), rank_from_path(path))
        except OSError as e:
            raise UsageError(f"{path}: cannot read ({e.strerror}).", "Check the path and permissions.") from None
    parser.parsed.world_size = world_size
    return parser.parsed
