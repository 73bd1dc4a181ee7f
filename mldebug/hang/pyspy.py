"""Parse py-spy dumps: ``py-spy dump --json`` output and the plain-text output users paste.

Pure functions: text or decoded JSON in, model objects out.
"""

from __future__ import annotations

import math
import re
from typing import Any

from mldebug.hang.model import Process, StackFrame, Thread

# Frames and stacks repeat across ranks: each distinct one is built once and shared (a
# 16,384-rank set holds a few dozen distinct stacks). Bounded: past the cap, no sharing.
_FRAMES: dict[tuple[Any, ...], StackFrame] = {}
_STACKS: dict[tuple[int, ...], list[StackFrame]] = {}
_CAP = 1 << 18
_INT_BOUND = 1 << 63


def json_int(v: Any, field: str, bad: list[str] | None = None, default: int | None = 0) -> int | None:
    """An integer field of a dump. json.loads reads 1e400 as inf and takes NaN/Infinity: a
    non-finite, boolean or absurd (2**63 or more) number is damage of this one field, read as
    ``default`` and named in ``bad`` (``bad`` None: ValueError, the file is malformed).
    Anything else is ``int(v)`` as before (a string or list there still raises)."""
    if v is None:
        return default
    n: int | None = None
    if not isinstance(v, bool) and not (isinstance(v, float) and not math.isfinite(v)):
        n = int(v)
        if not -_INT_BOUND < n < _INT_BOUND:
            n = None
    if n is None:
        if bad is None:
            raise ValueError(f"'{field}' is {str(v)[:24]} (1e400, NaN or Infinity in the file?),"
                             " not a finite integer: skipped")
        if len(bad) < 8:
            bad.append(f"{field} {str(v)[:24]}")
        return default
    return n


def frame_from_json(f: dict[str, Any]) -> StackFrame:
    """One py-spy JSON frame; frames without locals are shared (see _FRAMES). A damaged line
    number (inf, NaN) raises ValueError: read as 0 it would split the rank from its peers."""
    line = json_int(f.get("line") or 0, "line") or 0
    if not f.get("locals"):
        key = (f.get("name"), f.get("filename"), line, f.get("short_filename"),
               f.get("module"))
        hit = _FRAMES.get(key)
        if hit is None:
            hit = _build_frame(f, line)
            if len(_FRAMES) < _CAP:
                _FRAMES[key] = hit
        return hit
    return _build_frame(f, line)


def _build_frame(f: dict[str, Any], line: int) -> StackFrame:
    filename = str(f.get("filename") or "")
    module = f.get("module")
    native = bool(module) or (line == 0 and not filename.endswith(".py"))
    local_items: list[tuple[str, str]] = []
    for loc in f.get("locals") or ():
        if isinstance(loc, dict) and "name" in loc:
            local_items.append((str(loc["name"]), str(loc.get("repr", ""))))
    return StackFrame(
        name=str(f.get("name") or "?"),
        filename=filename,
        line=line,
        short=str(f.get("short_filename") or ""),
        native=native,
        locals=tuple(local_items),
    )


def threads_from_json(data: list[dict[str, Any]], bad: list[str] | None = None) -> list[Thread]:
    """py-spy ``dump --json``: a list of thread objects, frames innermost first. A damaged
    thread id (inf, NaN, 1e400, a boolean) is read as 0 (os_thread_id: None) and named in
    ``bad``; a damaged frame line raises ValueError (the file is skipped)."""
    threads = []
    ids = bad if bad is not None else []
    for t in data:
        threads.append(Thread(
            name=str(t.get("thread_name") or ""),
            thread_id=json_int(t.get("thread_id") or 0, "thread_id", ids) or 0,
            os_thread_id=json_int(t.get("os_thread_id"), "os_thread_id", ids, None),
            active=t.get("active"),
            owns_gil=t.get("owns_gil"),
            frames=_shared_stack([frame_from_json(f) for f in t.get("frames") or ()]),
        ))
    return threads


def _shared_stack(frames: list[StackFrame]) -> list[StackFrame]:
    """The one list object for this sequence of shared frames (identity is equality for
    frames from _FRAMES, which the cache keeps alive); read-only by convention."""
    key = tuple(map(id, frames))
    hit = _STACKS.get(key)
    if hit is None:
        hit = frames
        if len(_STACKS) < _CAP:
            _STACKS[key] = frames
    return hit


# Numbers are bounded: a pasted 5,000-digit "pid" is no header (and no ValueError).
_PROCESS = re.compile(r"^Process (?P<pid>\d{1,10}): (?P<cmd>.*)$")
_THREAD = re.compile(
    r"^Thread (?:(?P<tid>0x[0-9A-Fa-f]{1,16}|\d{1,10}) )?\((?P<state>[^)]*)\)(?:: \"(?P<name>.*)\")?\s*$"
)
_PY_FRAME = re.compile(r"^\s+(?P<name>.+?) \((?P<file>[^()]+):(?P<line>\d{1,9})\)\s*$")
_NATIVE_FRAME = re.compile(r"^\s+(?P<name>.+?) \((?P<file>[^():]+)\)\s*$")
_LOCAL = re.compile(r"^\s{8,}(?P<name>[A-Za-z_][A-Za-z0-9_]*): (?P<repr>.*)$")
_PDSH_PREFIX = re.compile(r"^(?P<host>[A-Za-z0-9_.\-]+): (?P<rest>.*)$")


def parse_text_dump(text: str, default_host: str = "?") -> list[Process]:
    """Parse one or more ``py-spy dump`` text outputs (also with pdsh ``host:`` prefixes).

    ``pgrep ... | xargs py-spy dump``, pdsh and srun produce exactly this. Ranks are unknown
    in plain text, so processes are labelled host:pid. Pastes often lose the ``Process N:``
    lines: then each ``MainThread`` header (or the first thread of a host) starts a new
    process, numbered by the pid in the header when it is decimal (py-spy prints the OS
    thread id, which is the pid for the main thread), else by order.
    """
    procs: list[Process] = []
    current: Process | None = None
    thread: Thread | None = None
    in_locals = False
    headed = False  # the current process came with a "Process N:" line
    for raw in text.splitlines():
        host = default_host
        line = raw.rstrip()
        m = _PDSH_PREFIX.match(line)
        if m and (m["rest"].startswith(("Process ", "Thread ", "Python v", " "))
                  or m["rest"] == ""):
            host, line = m["host"], m["rest"]
        if not line.strip():
            continue
        if pm := _PROCESS.match(line):
            current = Process(host=host, pid=int(pm["pid"]), cmdline=pm["cmd"].split())
            procs.append(current)
            headed = True
            thread = None
            continue
        if line.startswith("Python v"):
            continue
        if tm := _THREAD.match(line):
            is_main = tm["name"] == "MainThread"
            if current is None or (not headed and (current.host != host or (
                    is_main and any(t.name == "MainThread" for t in current.threads)))):
                tid = tm["tid"] or ""  # a dump without its "Process" header
                current = Process(host=host, pid=int(tid) if tid.isdecimal() and is_main
                                  else len(procs) + 1)
                procs.append(current)
                headed = False
            tid_s = tm["tid"] or "0"
            tid = int(tid_s, 16) if tid_s.startswith("0x") else int(tid_s)
            thread = Thread(
                name=tm["name"] or "", thread_id=tid,
                os_thread_id=tid if not tid_s.startswith("0x") else None,
                active="active" in tm["state"],
                owns_gil="gil" in tm["state"],
            )
            current.threads.append(thread)
            in_locals = False
            continue
        if thread is None:
            continue
        stripped = line.strip()
        if stripped in ("Arguments:", "Locals:"):
            in_locals = True
            continue
        if in_locals and (lm := _LOCAL.match(line)) and thread.frames:
            last = thread.frames[-1]
            thread.frames[-1] = StackFrame(last.name, last.filename, last.line, last.short,
                                      last.native, (*last.locals, (lm["name"], lm["repr"])))
            continue
        if fm := _PY_FRAME.match(line):
            in_locals = False
            thread.frames.append(StackFrame(fm["name"], fm["file"], int(fm["line"]), fm["file"]))
        elif nm := _NATIVE_FRAME.match(line):
            in_locals = False
            thread.frames.append(StackFrame(nm["name"], nm["file"], 0, nm["file"], native=True))
    return procs
