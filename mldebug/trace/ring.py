"""The execution ring: the last N call or line events of the user's code, per thread.

Python 3.12+ uses ``sys.monitoring``: code the filter excludes (the standard library, site
packages such as torch, mldebug itself) gets ``DISABLE`` on its first event and costs nothing
after. Below 3.12, ``sys.settrace``: excluded code returns no local tracer, so only its call
event is seen, and that costs one set lookup of the code's file name (a string whose hash
Python caches; hashing the code object itself costs 0.25-0.5 us on 3.11, more than the rest
of the trace function). An event is a (code object, line) pair appended to a bounded deque;
turning it into file names and source text waits until the ring is written.
"""

from __future__ import annotations

import json
import linecache
import os
import sys
import sysconfig
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

FORMAT = "mldebug.trace/1"
EVENTS = ("calls", "lines")
_MLDEBUG_DIR = str(Path(__file__).resolve().parent.parent)


def _library_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    out = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    out.add(_MLDEBUG_DIR)
    return tuple(sorted(p.rstrip("/") + "/" for p in out))


def user_file_filter(include: str | Iterable[str] | Callable[[str], bool] | None = None
                     ) -> Callable[[str], bool]:
    """Which code to record, by its file name: by default everything outside the standard
    library, the site packages (torch, ...) and mldebug; ``include`` narrows it to file names
    that contain one of the given strings, or to those a callable accepts. A verdict depends
    on the file name only, so tracers cache it per file name."""
    libs = _library_prefixes()
    if callable(include):
        return lambda name: bool(include(name))
    wanted = (include,) if isinstance(include, str) else tuple(include or ())

    def keep(name: str) -> bool:
        if name.startswith(("<frozen", "<string>")) or name.startswith(libs):
            return False
        return not wanted or any(w in name for w in wanted)
    return keep


class FileVerdicts:
    """The filter's verdict per file name, as two sets a tracer tests with ``in`` (a file
    name's hash is cached by Python, a code object's is recomputed on every lookup)."""

    def __init__(self, keep: Callable[[str], bool]) -> None:
        self.keep = keep
        self.kept: set[str] = set()
        self.skipped: set[str] = set()

    def __call__(self, name: str) -> bool:
        """The verdict for a file name not in either set yet (the tracer's slow path)."""
        if self.keep(name):
            self.kept.add(name)
            return True
        self.skipped.add(name)
        return False


class Ring:
    """Per-thread deques of (code, line) events, and the tracer that fills them."""

    def __init__(self, events: str = "calls", size: int = 4096,
                 filter: str | Iterable[str] | Callable[[str], bool] | None = None,
                 dir: str | Path | None = None) -> None:
        if events not in EVENTS:
            from mldebug.errors import UsageError

            raise UsageError(f"events={events!r} is not one of {', '.join(EVENTS)}.",
                             'e.g. mldebug.trace.enable(events="lines", ring=4096)')
        self.events = events
        self.size = size
        self.verdicts = FileVerdicts(user_file_filter(filter))
        self.dir = Path(dir) if dir is not None else None
        self.rings: dict[int, deque[tuple[CodeType, int]]] = {}
        self._lines_on: dict[int, CodeType] = {}  # 3.12+: id -> code with LINE events on
        self._tool: int | None = None
        self._prev_excepthook: Any = None

    # -- recording -----------------------------------------------------------------------
    def _ring(self) -> deque[tuple[CodeType, int]]:
        ident = threading.get_ident()
        r = self.rings.get(ident)
        if r is None:
            r = self.rings[ident] = deque(maxlen=self.size)
        return r

    def _wanted(self, code: CodeType) -> bool:
        name = code.co_filename
        v = self.verdicts
        return name in v.kept or (name not in v.skipped and v(name))

    def _settrace_tracer(self) -> Callable[[FrameType, str, Any], Any]:
        """This thread's global trace function (a closure over its own deque). It is called
        for every Python call, torch's included: the excluded case is one set lookup."""
        append = self._ring().append
        verdicts = self.verdicts
        skipped, kept = verdicts.skipped, verdicts.kept
        lines = self.events == "lines"

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "line":
                append((frame.f_code, frame.f_lineno))
            return local

        def global_(frame: FrameType, event: str, arg: Any) -> Any:
            if frame.f_code.co_filename in skipped:
                return None
            code = frame.f_code
            if code.co_filename not in kept and not verdicts(code.co_filename):
                return None
            append((code, frame.f_lineno))
            return local if lines else None
        global_.local = local  # type: ignore[attr-defined]
        return global_

    def _thread_bootstrap(self, frame: FrameType, event: str, arg: Any) -> Any:
        tracer = self._settrace_tracer()
        sys.settrace(tracer)
        return tracer(frame, event, arg)

    def start(self) -> Ring:
        if sys.version_info >= (3, 12):
            self._start_monitoring()
        else:
            threading.settrace(self._thread_bootstrap)
            tracer = self._settrace_tracer()
            sys.settrace(tracer)
            if self.events == "lines":  # frames already running: trace their lines too
                frame: FrameType | None = sys._getframe(1)
                while frame is not None:
                    if self._wanted(frame.f_code):
                        frame.f_trace = tracer.local  # type: ignore[attr-defined]
                    frame = frame.f_back
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        return self

    def _start_monitoring(self) -> None:
        """PY_START globally; LINE only on the code objects the filter keeps (set per code
        object on its first start), so the line callback has nothing to check."""
        mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        tool = next((t for t in (4, 3, 5, 2) if mon.get_tool(t) is None), None)
        if tool is None:
            raise RuntimeError("every sys.monitoring tool id is taken")
        mon.use_tool_id(tool, "mldebug.trace")
        self._tool = tool
        disable, line_ev = mon.DISABLE, mon.events.LINE
        set_local = mon.set_local_events
        lines = self.events == "lines"
        rings, size, lines_on = self.rings, self.size, self._lines_on
        verdicts = self.verdicts
        skipped, kept = verdicts.skipped, verdicts.kept
        tls = threading.local()

        def new_ring() -> deque[tuple[CodeType, int]]:
            r: deque[tuple[CodeType, int]] = deque(maxlen=size)
            tls.r = rings[threading.get_ident()] = r
            return r

        def on_start(code: CodeType, offset: int) -> Any:
            name = code.co_filename
            if name in skipped or (name not in kept and not verdicts(name)):
                return disable  # this code object's PY_START never reaches us again
            if lines and id(code) not in lines_on:
                lines_on[id(code)] = code  # kept alive here, so its id stays its own
                set_local(tool, code, line_ev)
            try:
                tls.r.append((code, code.co_firstlineno))
            except AttributeError:
                new_ring().append((code, code.co_firstlineno))
            return None

        def on_line(code: CodeType, line: int) -> Any:
            try:
                tls.r.append((code, line))
            except AttributeError:
                new_ring().append((code, line))

        mon.register_callback(tool, mon.events.PY_START, on_start)
        if lines:
            mon.register_callback(tool, line_ev, on_line)
            for frame in list(sys._current_frames().values()):  # already running
                f: FrameType | None = frame
                while f is not None:
                    if self._wanted(f.f_code) and id(f.f_code) not in lines_on:
                        lines_on[id(f.f_code)] = f.f_code
                        set_local(tool, f.f_code, line_ev)
                    f = f.f_back
        mon.set_events(tool, mon.events.PY_START)

    def stop(self) -> None:
        if self._tool is not None:
            mon = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
            mon.set_events(self._tool, 0)
            for code in list(self._lines_on.values()):
                mon.set_local_events(self._tool, code, 0)
            self._lines_on.clear()
            mon.register_callback(self._tool, mon.events.PY_START, None)
            mon.register_callback(self._tool, mon.events.LINE, None)
            mon.free_tool_id(self._tool)
            self._tool = None
        else:
            sys.settrace(None)
            threading.settrace(None)  # type: ignore[arg-type]
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook

    def _excepthook(self, tp: type[BaseException], value: BaseException, tb: Any) -> None:
        try:
            self.write(reason=f"unhandled {tp.__name__}")
        finally:
            (self._prev_excepthook or sys.__excepthook__)(tp, value, tb)

    # -- writing -------------------------------------------------------------------------
    def snapshot(self, reason: str = "requested") -> dict[str, Any]:
        """The rings as a JSON document: a table of locations and per-thread indexes."""
        from mldebug.dist import identity

        ident = identity()
        names = {t.ident: t.name for t in threading.enumerate()}
        locs: dict[tuple[str, int, str], int] = {}
        threads = []
        for tid, ring in list(self.rings.items()):
            events = []
            for code, line in list(ring):
                key = (code.co_filename, line, code.co_name)
                idx = locs.get(key)
                if idx is None:
                    idx = locs[key] = len(locs)
                events.append(idx)
            threads.append({"thread_id": tid, "name": names.get(tid, f"thread-{tid}"),
                            "events": events})
        threads.sort(key=lambda t: t["name"] != "MainThread")
        table = [[f, ln, fn, linecache.getline(f, ln).strip()[:160]] for (f, ln, fn) in locs]
        return {"format": FORMAT, "host": ident.host, "rank": ident.rank, "pid": os.getpid(),
                "world_size": ident.world_size, "events": self.events, "ring": self.size,
                "reason": reason, "time": time.time(), "locations": table, "threads": threads}

    def write(self, dir: str | Path | None = None, reason: str = "requested") -> Path | None:
        """Write this rank's file into ``dir`` (private); returns it, or None on failure."""
        from mldebug.privdir import default_dir, private_dir, write_atomic

        try:
            d = private_dir(dir if dir is not None else self.dir or default_dir() / "trace")
            doc = self.snapshot(reason)
            rank = doc["rank"]
            name = (f"{doc['host']}-rank{rank}-{doc['pid']}.json" if rank is not None
                    else f"{doc['host']}-{doc['pid']}.json")
            path = Path(d) / name
            write_atomic(path, json.dumps(doc).encode())
            return path
        except Exception as e:  # noqa: BLE001 - never hurt the job
            sys.stderr.write(f"mldebug.trace: could not write the ring ({e})\n")
            return None


_ACTIVE: Ring | None = None


def enable(events: str = "calls", ring: int = 4096,
           filter: str | Iterable[str] | Callable[[str], bool] | None = None,
           dir: str | Path | None = None) -> Ring:
    """Start recording the last ``ring`` events of the user's code in every thread started
    from now on (and this one). Returns the ring; a second call returns the same one."""
    global _ACTIVE
    if _ACTIVE is None:
        _ACTIVE = Ring(events, ring, filter, dir).start()
    return _ACTIVE


def active() -> Ring | None:
    return _ACTIVE


def disable() -> None:
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.stop()
        _ACTIVE = None


def dump(dir: str | Path | None = None, reason: str = "requested") -> Path | None:
    """Write the ring now (on demand)."""
    return _ACTIVE.write(dir, reason) if _ACTIVE is not None else None


def write(dir: str | Path, reason: str) -> Path | None:
    """Used by the watchdog and the dump handler at a stall or a signal."""
    return dump(dir, reason)
