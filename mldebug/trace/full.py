"""Full per-rank traces (the book's NicerTrace use case): every call or line of the user's
code, with a timestamp and a ``[host:rank]`` prefix, into one file per rank. For a program
that stops responding: the file's last lines say where each rank was. Buffered, and flushed
every half second by a thread, so a killed rank loses at most that much."""

from __future__ import annotations

import linecache
import os
import runpy
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import IO, Any

from mldebug.trace.ring import FileVerdicts, user_file_filter


class FullTrace:
    def __init__(self, out: str | Path, lines: bool = False) -> None:
        from mldebug.dist import identity
        from mldebug.privdir import open_private, private_dir

        ident = identity()
        d = private_dir(out)
        rank = ident.rank
        self.prefix = f"[{ident.host}:{rank if rank is not None else os.getpid()}]"
        name = f"{ident.host}-rank{rank}-{os.getpid()}.trace" if rank is not None else \
            f"{ident.host}-{os.getpid()}.trace"
        self.path = d / name
        self.file: IO[str] = os.fdopen(open_private(self.path), "w", buffering=1 << 16)
        self.lines = lines
        self.verdicts = FileVerdicts(user_file_filter())
        self.t0 = time.monotonic()
        self._stop = threading.Event()

    def _emit(self, frame: FrameType, what: str) -> None:
        code = frame.f_code
        line = frame.f_lineno
        text = linecache.getline(code.co_filename, line).strip()
        self.file.write(f"{self.prefix} {time.monotonic() - self.t0:12.6f} {what:4} "
                        f"{code.co_filename}:{line} {code.co_name}: {text}\n")

    def tracer(self, frame: FrameType, event: str, arg: Any) -> Any:
        name = frame.f_code.co_filename
        v = self.verdicts
        if name in v.skipped or (name not in v.kept and not v(name)):
            return None
        self._emit(frame, "call")
        return self.local if self.lines else None

    def local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self._emit(frame, "line")
        return self.local

    def _flusher(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.file.flush()
            except (OSError, ValueError):
                return

    def start(self) -> None:
        threading.Thread(target=self._flusher, name="mldebug-trace-flush", daemon=True).start()
        threading.settrace(self.tracer)
        sys.settrace(self.tracer)

    def stop(self) -> None:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]
        self._stop.set()
        try:
            self.file.close()
        except OSError:
            pass


def run_script(argv: list[str], out: str | Path, lines: bool) -> int:
    """Run ``argv[0]`` (a script) as ``__main__`` with a full trace; its exit code."""
    tracer = FullTrace(out, lines)
    sys.stderr.write(f"mldebug.trace: tracing into {tracer.path}\n")
    sys.argv = list(argv)
    script = Path(argv[0]).resolve()
    sys.path.insert(0, str(script.parent))
    tracer.start()
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        tracer.stop()
    return 0
