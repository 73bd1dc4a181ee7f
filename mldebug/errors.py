"""Every failure mldebug reports maps to an error with an actionable fix.

Messages name the thing, say what is wrong, and say what to do. Tests pin them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class MldebugError(Exception):
    """An error with a one-line message and a fix the user can act on."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message} {self.fix}".strip()


class UsageError(MldebugError):
    """Bad command-line input; the CLI exits with code 2."""


NO_PTRACE_ROUTE = ("Without ptrace: mldebug hang --signal, with mldebug.watchdog() or "
                   "mldebug.install_dump_handler() in the ranks.")
PTRACE_FIX = (
    "Run as root, or allow ptrace: sudo sysctl -w kernel.yama.ptrace_scope=0 "
    "(containers: --cap-add=SYS_PTRACE). " + NO_PTRACE_ROUTE
)


def torch_missing(feature: str) -> str:
    return (
        f"{feature} needs PyTorch, which is not installed in this Python. "
        "Install it: pip install 'mldebug[torch]' (or the torch build your cluster uses)."
    )


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a directory only this user can use: created 0700, refused when another user
    owns it or others can write it (a planted directory), or when it is a symlink."""
    d = Path(path)
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(d)
    except OSError as e:
        raise MldebugError(f"cannot create the private directory {d}: {e.strerror}.",
                           "Check the path and its permissions.") from None
    if not stat.S_ISDIR(st.st_mode):
        raise MldebugError(f"{d} is not a directory (a symlink or a file).",
                           "Remove it or choose another path.")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise MldebugError(
            f"{d} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}; only a "
            "directory of this user that nobody else can write is used.",
            f"Remove it, or fix it: chown {os.geteuid()} {d}; chmod 700 {d}.")
    return d


def save_traceback(text: str) -> Path | None:
    """Write an unexpected error's traceback to a new 0600 file in a private directory
    (``$XDG_STATE_HOME/mldebug/bugs``, else ``~/.local/state/mldebug/bugs``); None if impossible."""
    import time

    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                             "state")
    try:
        d = private_dir(os.path.join(base, "mldebug", "bugs"))
        path = d / f"traceback-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except (MldebugError, OSError):
        return None
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path
