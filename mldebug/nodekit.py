"""What every node script shares: the answer marker, the host name, py-spy lookup, argparse.

Stdlib only and Python 3.7+: ``mldebug.fanout`` bundles this module with every node script
(``NodeJob``), so a node without mldebug runs it on whatever ``python3`` it has. A node
script answers with one line, ``MLDEBUG-JSON {...}`` (``emit``); anything else it prints is
kept only to explain a failure.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

if TYPE_CHECKING:
    import argparse

_T = TypeVar("_T")

MARKER = "MLDEBUG-JSON "


def emit(doc: dict[str, Any]) -> None:
    """Print the node's answer: one marked line of compact JSON, flushed at once."""
    sys.stdout.write(MARKER + json.dumps(doc, separators=(",", ":"), default=str) + "\n")
    sys.stdout.flush()


def short_hostname(name: str | None = None) -> str:
    """The host name up to the first dot (``hostname -s``), as pdsh and SLURM name nodes."""
    # uname's node name is what gethostname() returns, without importing socket (~10 ms)
    return (name or os.uname().nodename).split(".")[0]


def find_py_spy(explicit: str | None = None) -> str | None:
    """py-spy to use here: ``explicit`` if it exists, else the one beside this Python, else PATH."""
    if explicit:
        return explicit if os.path.exists(explicit) or _which(explicit) else None
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return _which("py-spy")


def _which(name: str) -> str | None:
    import shutil  # not at the top: it loads zlib, bz2 and lzma, a fifth of a node's imports

    return shutil.which(name)


_PARSER_CLASS: Any = None


def ArgumentParser(**kwargs: Any) -> argparse.ArgumentParser:  # noqa: N802 (was a class)
    """argparse for node scripts: a bad argument becomes this node's error document.

    The caller then reports ``node3: bad node arguments: ...`` for that node instead of a
    usage text lost in pdsh's output; the exit code stays argparse's 2. argparse is loaded on
    the first call: a local ``mldebug hang`` starts its dumps from options built without it
    (``mldebug.hang.node.fast_opts``).
    """
    global _PARSER_CLASS
    if _PARSER_CLASS is None:
        import argparse

        class NodeArgumentParser(argparse.ArgumentParser):
            def error(self, message: str) -> NoReturn:
                emit({"host": short_hostname(), "error": "bad node arguments: " + message})
                sys.stderr.write(self.format_usage())
                sys.exit(2)

        _PARSER_CLASS = NodeArgumentParser
    return _PARSER_CLASS(**kwargs)  # type: ignore[no-any-return]


def signal_in_mask(status: str, key: str, signum: int) -> bool:
    """Whether the ``key`` mask line (``SigCgt``: caught, ``SigIgn``: ignored) of a
    /proc/PID/status text has ``signum``; False without that line, ValueError when the line
    is not a hex mask."""
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name == key:
            return bool(int(value.strip(), 16) >> (signum - 1) & 1)
    return False


def read_fd(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes from an open file descriptor (a bounded read of outside data:
    a file that grows, or a device like /dev/zero, never costs more than ``limit``)."""
    chunks = []
    left = limit
    while left > 0:
        b = os.read(fd, min(left, 1 << 20))
        if not b:
            break
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` through a random, exclusively created 0600 file in ``path``'s directory,
    renamed over ``path``: readers never see half a file, and a symlink planted at ``path`` is
    replaced, never written through."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=".mldebug-", suffix=".tmp", dir=os.path.dirname(path) or ".")
    try:
        with open(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def for_each(items: Sequence[_T], fn: Callable[[_T], None], width: int) -> None:
    """``fn(item)`` for every item, in order, on at most ``width`` daemon threads (plain threads:
    concurrent.futures costs more to import than a node's whole answer); returns when all ran.
    ``fn`` bounds its own time and keeps its own errors."""
    import threading

    queue = list(reversed(items))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                item = queue.pop()
            fn(item)

    threads = [threading.Thread(target=worker, daemon=True)
               for _ in range(max(1, min(len(items), width)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
