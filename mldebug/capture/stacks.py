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


_FH_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<id>0x[0-9a-fA-F]+|\d+)"
                        r"(?: \[(?P<name>[^\]]*)\])? \(most recent call first\):$")
_FH_FRAME = re.compile(r'^  File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<name>.*)$')


def parse_faulthandler(text: str, pid: int, main_ident: int | None = None,
                       names: dict[int, str] | None = None,
                       prefixes: list[str] | None = None) -> list[dict[str, Any]]:
    """The threads of one ``faulthandler`` dump as py-spy JSON (``text`` starts at the dump:
    callers keep the file offset from before they asked for it).

    faulthandler prints thread idents without names; ``main_ident`` (recorded when the
    handler was installed) marks the main thread, ``names`` names others where known.
    """
    threads: list[dict[str, Any]] = []
    seen: set[int] = set()
    cur: dict[str, Any] | None = None
    for line in text.splitlines():
        if m := _FH_THREAD.match(line):
            ident = int(m["id"], 16) if m["id"].startswith("0x") else int(m["id"])
            if ident in seen:  # a second dump follows: keep the first one
                break
            seen.add(ident)
            name = (names or {}).get(ident) or m["name"]
            is_main = main_ident is not None and ident == main_ident
            cur = {"pid": pid, "thread_id": ident,
                   "thread_name": "MainThread" if is_main else name,
                   "os_thread_id": pid if is_main else None,
                   "active": None, "owns_gil": None, "frames": []}
            threads.append(cur)
        elif cur is not None and (fm := _FH_FRAME.match(line)):
            if len(cur["frames"]) < MAX_FRAMES:
                ln = fm["line"]
                cur["frames"].append({
                    "name": fm["name"], "filename": fm["file"], "module": None,
                    "short_filename": short_filename(fm["file"], prefixes),
                    "line": int(ln) if ln.isdigit() else 0, "locals": None})
    return threads
