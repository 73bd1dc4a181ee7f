"""torchelastic error files (``TORCHELASTIC_ERROR_FILE``): what ``@record`` writes for a rank
whose entry point raised, and torchrun keeps as ``<log-dir>/<run>/attempt_N/<local rank>/
error.json``. Pure but for the bounded reads; never raises on a file's content.

The shape (torch/distributed/elastic/multiprocessing/errors/error_handler.py, torch 2.13)::

    {"message": {"message": "RuntimeError: ...",
                 "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1796417651"},
                 "errorCode": 1}}                       # errorCode: torchrun's copy only

or, the "new message format" ``ProcessFailure`` also accepts, ``{"message": "...",
"timestamp": 1796417651}``.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MAX_BYTES = 1 << 20  # an error file is a message and one traceback: a few KiB
MAX_TEXT = 300  # characters of the exception line kept
PREFIX_HEAD = 1 << 16  # bytes of a sibling stderr.log read for its [rankN]: prefix

_START = re.compile(rb'^\s*\{\s*"message"\s*:')
_ATTEMPT = re.compile(r"attempt_(\d{1,6})")
_PREFIX = re.compile(rb"^\[rank(\d{1,7})\]:", re.MULTILINE)


def sniff(head: bytes) -> bool:
    """Whether a file's first bytes look like an elastic error file: a JSON object whose first
    key is ``message`` (json.dump keeps torch's order), or one holding ``py_callstack``."""
    return bool(_START.match(head)) or (b'"py_callstack"' in head and b'"message"' in head
                                        and head.lstrip()[:1] == b"{")


@dataclass
class ErrorFile:
    """What one error file says. ``rank``: the job's rank, or the local rank from the path when
    the global one is not known (``rank_from`` says which: "prefix", "local", "name", "")."""

    path: Path
    rank: int | None
    rank_from: str
    run: str  # the run directory of a --log-dir tree ("" outside one)
    attempt: int | None
    exception: str  # "RuntimeError: ..." (one line, capped)
    frame: str | None  # the innermost user frame: "train.py:12 in step"
    timestamp: int | None
    primary: bool  # the rank's own failure (not a reaction to a peer's: classify())
    kind: str  # mldebug.log.parse.classify's kind

    @property
    def who(self) -> str:
        if self.rank is None:
            return "an unknown rank"
        return f"rank {self.rank}" if self.rank_from != "local" else f"local rank {self.rank}"

    def short(self) -> str:
        """"rank 1 raised RuntimeError at train.py:12"; a peer's failure says so."""
        exc = self.exception.split(":", 1)[0] or "an error"
        at = f" at {self.frame.split(' in ', 1)[0]}" if self.frame else ""
        if self.primary:
            return f"{self.who} raised {exc}{at}"
        return f"{self.who} reported a peer's failure ({exc}{at})"


def where(path: Path) -> tuple[str, int | None, int | None]:
    """(run directory, attempt, local rank) of a file in a --log-dir tree; ("", None, None)
    outside one."""
    parent = path.parent
    att = _ATTEMPT.fullmatch(parent.parent.name)
    if parent.name.isdecimal() and att:
        return str(parent.parent.parent), int(att[1]), int(parent.name)
    for part in path.parents:
        m = _ATTEMPT.fullmatch(part.name)
        if m:
            return str(part.parent), int(m[1]), None
    return "", None, None


def _prefix_rank(d: Path) -> int | None:
    """The global rank a local rank's directory belongs to: the ``[rankN]:`` prefix torch's
    exception hook puts on its stderr.log lines (the log-dir itself keeps no mapping)."""
    for name in ("stderr.log", "stdout.log"):
        try:
            fd = os.open(d / name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device: never read
                continue
            head = os.read(fd, PREFIX_HEAD)
        except OSError:
            continue
        finally:
            os.close(fd)
        ranks = {int(m[1]) for m in _PREFIX.finditer(head)}
        if len(ranks) == 1:
            return ranks.pop()
    return None


# a traceback's frame line; which files are the user's code: mldebug.ours.user_file
_TB_FILE = re.compile(r'^\s+File "(?P<file>[^"]{1,1000})", line (?P<line>\d+), in (?P<func>\S+)')
_RANK_NAME = re.compile(r"rank[_-]?\d+$", re.IGNORECASE)


def _frame(callstack: str) -> str | None:
    """``file:line in func`` of the innermost frame of the user's code: torch, libraries and
    mldebug's own hooks (mldebug.ours) skipped."""
    from mldebug.ours import user_file

    found = None
    for line in callstack.splitlines()[-400:]:
        m = _TB_FILE.match(line)
        if m and user_file(m["file"]):
            found = f"{m['file'].rsplit('/', 1)[-1]}:{m['line']} in {m['func']}"
    return found


def _rank_from_name(path: Path) -> int | None:
    from mldebug.names import trailing_number

    return trailing_number(path.stem) if _RANK_NAME.search(path.stem) else None


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _int(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if 0 <= v < 1 << 40 else None
    if isinstance(v, str) and v.strip().isdecimal() and len(v.strip()) < 13:
        return int(v)
    return None


def parse(data: bytes, path: Path,
          classify: Callable[[str], tuple[str, bool]] | None = None) -> ErrorFile | str:
    """The error file's content, or why it cannot be read (one sentence, for a note).
    ``classify``: (kind, primary) of an exception line (the caller passes mldebug.log's);
    without it every error is the rank's own."""
    if len(data) > MAX_BYTES:
        return f"over the {MAX_BYTES >> 20} MiB an elastic error file may have; not read"
    try:
        doc = json.loads(data.decode("utf-8", "replace"))
    except RecursionError:
        return "nested too deeply to be an elastic error file; not read"
    except ValueError as e:
        return f"not valid JSON ({str(e)[:80]}); not read"
    if not isinstance(doc, dict) or "message" not in doc:
        return "JSON without an elastic error file's 'message'; not read"
    msg = doc["message"]
    stamp: object = None
    if isinstance(msg, dict):
        text = msg.get("message")
        extra = msg.get("extraInfo")
        extra = extra if isinstance(extra, dict) else {}
        stack = extra.get("py_callstack")
        stack = stack if isinstance(stack, str) else ""
        stamp = extra.get("timestamp")
        if not isinstance(text, str):
            text = _last_line(stack)
    elif isinstance(msg, str):
        text, stack, stamp = msg, msg if "Traceback" in msg else "", doc.get("timestamp")
    else:
        return "its 'message' is neither text nor an object; not read"
    exception = (_last_line(stack) if "\n" in text or not text.strip() else text.strip())
    exception = " ".join(exception.split())[:MAX_TEXT] or "<no message>"
    run, attempt, local = where(path)
    rank, rank_from = None, ""
    if local is not None:
        rank = _prefix_rank(path.parent)
        rank, rank_from = (rank, "prefix") if rank is not None else (local, "local")
    else:
        named = _rank_from_name(path)
        if named is not None:
            rank, rank_from = named, "name"
    kind, primary = classify(exception) if classify else ("exception", True)
    return ErrorFile(path, rank, rank_from, run, attempt, exception, _frame(stack[-(1 << 18):]),
                     _int(stamp), primary, kind)


def culprit(errors: list[ErrorFile]) -> ErrorFile:
    """The root cause among one attempt's error files: a rank's own failure before a reaction
    to a peer's, then the earliest (torchrun's rule), then the lowest rank."""
    return min(errors, key=lambda e: (not e.primary, e.timestamp if e.timestamp is not None
                                      else 1 << 41, e.rank if e.rank is not None else 1 << 30))
