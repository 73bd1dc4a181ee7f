"""Stacks in py-spy's ``dump --json`` shape, from inside the process (``sys._current_frames``)
or from the text the C-level ``faulthandler`` writes; both feed ``mldebug.hang`` unchanged.

The Python route sees thread names and locals; the faulthandler route works while a thread
holds the GIL in a C call (it runs in a signal handler or a C thread, without the GIL).
"""

from __future__ import annotations

import os
import re
import sys
import threading
from types import FrameType
from typing import Any

MAX_FRAMES = 256
MAX_REPR = 200
MAX_LOCALS = 64


def short_filename(path: str, prefixes: list[str] | None = None) -> str:
    """The path relative to the longest ``sys.path`` entry holding it (py-spy's short name)."""
    best = ""
    for p in prefixes if prefixes is not None else sys.path:
        if p and path.startswith(p.rstrip("/") + "/") and len(p) > len(best):
            best = p.rstrip("/")
    return path[len(best) + 1:] if best else path


def _safe_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as e:  # noqa: BLE001 - a user's __repr__ may raise anything
        text = f"<repr failed: {type(e).__name__}>"
    return text if len(text) <= MAX_REPR else text[:MAX_REPR - 3] + "..."


def frames_of(frame: FrameType | None, with_locals: bool = False) -> list[dict[str, Any]]:
    """One thread's frames, innermost first, as py-spy JSON frame objects."""
    out: list[dict[str, Any]] = []
    while frame is not None and len(out) < MAX_FRAMES:
        code = frame.f_code
        f: dict[str, Any] = {"name": getattr(code, "co_qualname", code.co_name), "filename": code.co_filename, "module": None,
                             "short_filename": short_filename(code.co_filename),
                             "line": frame.f_lineno or 0, "locals": None}
        if with_locals:
            nargs = code.co_argcount + code.co_kwonlyargcount
            args = set(code.co_varnames[:nargs])
            f["locals"] = [{"name": k, "addr": id(v), "arg": k in args, "repr": _safe_repr(v)}
                           for k, v in list(frame.f_locals.items())[:MAX_LOCALS]]
        out.append(f)
        frame = frame.f_back
    return out


def python_threads(with_locals: bool = False, skip: set[int] | None = None) -> list[dict[str, Any]]:
    """Every thread's stack from ``sys._current_frames()`` (needs the GIL: it is ours here)."""
    pid = os.getpid()
    by_ident = {t.ident: t for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    threads = []
    for ident, frame in sys._current_frames().items():
        if skip and ident in skip:
            continue
        t = by_ident.get(ident)
        native = getattr(t, "native_id", None)
        threads.append({
            "pid": pid, "thread_id": ident,
            "thread_name": t.name if t is not None else None,
            "os_thread_id": pid if ident == main_ident else native,
            "active": None, "owns_gil": None,
            "frames": frames_of(frame, with_locals),
        })
    threads.sort(key=lambda t: t["thread_id"] != main_ident)
    return threads


# Python/traceback.c: write_thread_id (3.14 adds " [name]"), dump_frame (strings are ASCII
# with backslash escapes, cut at 500 characters + "..."; "???" for an unknown line), and the
# markers "  <no Python frame>", "  <tstate is freed>", "  Garbage-collecting", "  ..." (over
# 100 frames) and "..." (over 100 threads). A dump may be preceded by faulthandler's header
# ("Timeout (0:00:05)!", "Fatal Python error: ...").
_FH_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<id>0x[0-9a-fA-F]+|\d+)"
                        r"(?: \[(?P<name>[^\]]*)\])? \(most recent call first\):$")
_FH_FRAME = re.compile(r'^  File (?:"(?P<file>.*)"|\?\?\?), line (?P<line>\d+|\?\?\?) '
                       r'in (?P<name>.*)$')
_FH_HEADER = re.compile(r"^(Timeout \(\d+:\d\d:\d\d(\.\d+)?\)!|Fatal Python error: .*"
                        r"|Stack \(most recent call first\):)$")
MAX_FH_LINE = 4096  # a frame line is at most ~1,030 characters; longer ones are not ours
MAX_FH_THREADS = 1024


def looks_like_faulthandler(text: str) -> bool:
    """Whether ``text`` holds a faulthandler thread header (what the C-level dumps start with)."""
    return any(_FH_THREAD.match(line) for line in text.splitlines()
               if len(line) <= MAX_FH_LINE)


def faulthandler_dumps(text: str, pid: int, main_ident: int | None = None,
                       names: dict[int, str] | None = None,
                       prefixes: list[str] | None = None,
                       guess_main: bool = False) -> list[list[dict[str, Any]]]:
    """Every dump in a faulthandler text (a file the handler appends to holds several), each
    as py-spy JSON threads, oldest first. A dump ends where a thread id repeats or a header
    line starts the next one. With ``guess_main`` and no ``main_ident``, the main thread is
    the last one of each dump: CPython links each new thread state at the head of the list
    it walks, so the first thread created comes last."""
    dumps: list[list[dict[str, Any]]] = []
    threads: list[dict[str, Any]] = []
    seen: set[int] = set()
    cur: dict[str, Any] | None = None

    def close() -> None:
        nonlocal threads, seen, cur
        if threads:
            if guess_main and main_ident is None and not any(
                    t["thread_name"] == "MainThread" for t in threads):
                threads[-1]["thread_name"] = threads[-1]["thread_name"] or "MainThread"
                threads[-1]["os_thread_id"] = pid
            dumps.append(threads)
        threads, seen, cur = [], set(), None

    for line in text.splitlines():
        if len(line) > MAX_FH_LINE:
            continue
        if m := _FH_THREAD.match(line):
            ident = int(m["id"], 16) if m["id"].startswith("0x") else int(m["id"])
            if ident in seen:  # the next dump starts
                close()
            if len(threads) >= MAX_FH_THREADS:
                cur = None
                continue
            seen.add(ident)
            name = (names or {}).get(ident) or m["name"]
            is_main = main_ident is not None and ident == main_ident
            cur = {"pid": pid, "thread_id": ident,
                   "thread_name": "MainThread" if is_main else name,
                   "os_thread_id": pid if is_main else None,
                   "active": None, "owns_gil": None, "frames": []}
            threads.append(cur)
        elif _FH_HEADER.match(line):
            close()
        elif cur is not None and (fm := _FH_FRAME.match(line)):
            if len(cur["frames"]) < MAX_FRAMES:
                ln, file = fm["line"], fm["file"] if fm["file"] is not None else "???"
                cur["frames"].append({
                    "name": fm["name"], "filename": file, "module": None,
                    "short_filename": short_filename(file, prefixes),
                    "line": int(ln) if ln.isdecimal() else 0, "locals": None})
    close()
    return dumps


def parse_faulthandler(text: str, pid: int, main_ident: int | None = None,
                       names: dict[int, str] | None = None,
                       prefixes: list[str] | None = None) -> list[dict[str, Any]]:
    """The threads of the first ``faulthandler`` dump in ``text`` as py-spy JSON (callers keep
    the file offset from before they asked for it, so the first is theirs).

    faulthandler prints thread idents without names; ``main_ident`` (recorded when the
    handler was installed) marks the main thread, ``names`` names others where known.
    """
    dumps = faulthandler_dumps(text, pid, main_ident, names, prefixes)
    return dumps[0] if dumps else []
