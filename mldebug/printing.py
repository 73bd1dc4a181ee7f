"""Rank-aware printing: whole lines from many processes, never interleaved.

``printflock`` serialises output across processes with ``fcntl.flock`` on a shared lock
file, so a line (or a multi-line block) from one rank is never split by another rank's
output. ``rank_print`` adds a ``[host:rank]`` prefix to every line, and
``install_excepthook`` makes an uncaught traceback print whole, prefixed, under the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import re
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import IO, Any

from mldebug.dist import Identity, identity

DEFAULT_FORMAT = "[{host}:{rank}]"

_lock_fd: int | None = None
_lock_path: str | None = None
_lock_pid = -1
_thread_lock = threading.Lock()
_warned: set[str] = set()


def lock_path() -> str:
    """The lock file every process on this host shares (override: MLDEBUG_PRINT_LOCK)."""
    return os.environ.get("MLDEBUG_PRINT_LOCK") or default_lock_path()


def default_lock_path() -> str:
    return os.path.join(tempfile.gettempdir(), f"mldebug-print-{os.geteuid()}.lock")


def fallback_lock_path() -> str:
    """Where every process of this user on this host locks when the default lock file in the
    shared /tmp is refused (another user squatted its name, #39): ``$XDG_RUNTIME_DIR`` when it
    is a 0700 directory of ours, else ``~/.cache/mldebug/print-HOST.lock`` (created 0700; the
    home is $HOME only when it is ours - under sudo it may be the caller's - else the
    account's). OSError or UnsafeDir when there is none."""
    import pwd
    import socket

    from mldebug.privdir import UnsafeDir, check_dir, private_dir

    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(xdg):
        try:
            check_dir(xdg, what="XDG_RUNTIME_DIR")  # ours, no link, nobody else can write it
            return os.path.join(xdg, "mldebug-print.lock")
        except (OSError, UnsafeDir):
            pass
    home = os.environ.get("HOME", "")
    try:
        ours = os.path.isabs(home) and os.stat(home).st_uid == os.geteuid()
    except OSError:
        ours = False
    if not ours:
        home = pwd.getpwuid(os.geteuid()).pw_dir
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())
    d = private_dir(os.path.join(home, ".cache", "mldebug"), what="print lock directory")
    return str(d / f"print-{host or 'host'}.lock")


def open_lock_file(path: str) -> int:
    """Open (or create, 0600) the lock file without following a symlink; it must be ours.

    /tmp is shared: another user could plant a link or a file of theirs under our name.
    Raises OSError (ELOOP for a link) or PermissionError naming the owner.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(f"{path} is owned by uid {st.st_uid} (not a regular file of "
                              f"uid {os.geteuid()})")
    return fd


def _fd() -> int | None:
    # One descriptor per process: flock locks belong to the open file description, so a
    # descriptor inherited over fork would be shared, and would not exclude the parent.
    path = lock_path()
    if _lock_fd is None or _lock_path != path or _lock_pid != os.getpid():
        _reset(path)
    return _lock_fd


def _reset(path: str) -> None:
    global _lock_fd, _lock_path, _lock_pid
    _lock_path, _lock_pid = path, os.getpid()
    try:
        _lock_fd = open_lock_file(path)
    except OSError as e:
        _lock_fd = None
        if not os.environ.get("MLDEBUG_PRINT_LOCK"):  # the default, squatted: ours elsewhere
            from mldebug.errors import MldebugError

            try:
                fallback = fallback_lock_path()
                _lock_fd = open_lock_file(fallback)
            except (OSError, MldebugError):
                pass
            else:
                if path not in _warned:
                    _warned.add(path)
                    why = str(e) if str(e).startswith(path) else f"{path}: {e}"
                    sys.stderr.write(f"mldebug.printflock: {why}; using {fallback} instead.\n")
                return
        if path not in _warned:  # a print must never fail a rank: warn once, print unlocked
            _warned.add(path)
            sys.stderr.write(f"mldebug.printflock: not using the lock file {path} ({e}); "
                             "lines may interleave. Remove it or set MLDEBUG_PRINT_LOCK to a "
                             "path of yours.\n")


def _after_fork_in_child() -> None:
    """A child forked while another thread printed inherits a held lock: start afresh."""
    global _thread_lock, _lock_fd, _lock_pid
    _thread_lock = threading.Lock()
    if _lock_fd is not None:
        try:
            os.close(_lock_fd)
        except OSError:
            pass
    _lock_fd, _lock_pid = None, -1


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def output_lock() -> Iterator[None]:
    """Hold the cross-process print lock (and a thread lock) for the duration."""
    with _thread_lock:
        fd = _fd()
        if fd is None:
            yield
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _write_locked(text: str, file: IO[str] | None) -> None:
    out = file if file is not None else sys.stdout
    with output_lock():
        out.write(text)
        out.flush()


def printflock(*args: Any, sep: str = " ", end: str = "\n", file: IO[str] | None = None,
               flush: bool = True) -> None:
    """A drop-in ``print`` whose output is written whole while holding a cross-process lock."""
    buf = io.StringIO()
    print(*args, sep=sep, end=end, file=buf)
    _write_locked(buf.getvalue(), file)


def _numeric(host: str) -> str:
    digits = re.sub(r"[^0-9]", "", host)
    return digits or host


def make_prefix(fmt: str = DEFAULT_FORMAT, *, numeric_host: bool = False,
                ident: Identity | None = None) -> str:
    """Render a prefix such as ``[node3:17]``.

    ``fmt`` may use {host}, {rank}, {local_rank}, {world_size}, {pid}. Unknown values print
    as '-'. ``numeric_host`` keeps only the digits of the host name (``hostname -s | tr -dc 0-9``).
    """
    ident = ident or identity()
    host = _numeric(ident.host) if numeric_host else ident.host

    def show(v: int | None) -> str:
        return "-" if v is None else str(v)

    return fmt.format(
        host=host,
        rank=show(ident.rank),
        local_rank=show(ident.local_rank),
        world_size=show(ident.world_size),
        pid=os.getpid(),
    )


def prefix_lines(text: str, prefix: str) -> str:
    """Put ``prefix`` and a space in front of every line of ``text`` (keeps a final newline)."""
    if not text:
        return text
    lines = text.split("\n")
    trailing = lines[-1] == ""
    if trailing:
        lines = lines[:-1]
    out = "\n".join(f"{prefix} {line}" for line in lines)
    return out + ("\n" if trailing else "")


def rank_print(*args: Any, sep: str = " ", end: str = "\n", file: IO[str] | None = None,
               fmt: str = DEFAULT_FORMAT, numeric_host: bool = False) -> None:
    """``printflock`` with a ``[host:rank]`` prefix on every line."""
    buf = io.StringIO()
    print(*args, sep=sep, end=end, file=buf)
    _write_locked(prefix_lines(buf.getvalue(), make_prefix(fmt, numeric_host=numeric_host)), file)
