"""The one rule for "a private directory owned by us", and files used inside it.

mldebug keeps dumps, registrations, sessions and saved tracebacks in directories that often
sit on shared ground (/tmp, a job's working directory on a shared file system). Another user
can plant a directory, a symlink or a file there before we arrive. So a directory is used only
when it is a real directory (not a symlink), owned by the expected user, and writable by
nobody else (mode & 0o022 == 0); directories we create are 0700. The check is made on an open
file descriptor (``open_dir``), and files inside are opened relative to it without following
links (``open_in``), so nothing can be swapped between the check and the use.

Stdlib only (Python 3.7+): node scripts bundle it (``mldebug.fanout``), with ``mldebug.errors``
and ``mldebug.nodekit``.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Union

from mldebug.errors import MldebugError
from mldebug.nodekit import read_fd

PathLike = Union[str, "os.PathLike[str]"]
OTHERS_WRITE = 0o022  # group or others may write: anyone could plant a file
ME = -1  # owner=ME: the effective uid of this process
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeDir(MldebugError):
    """A directory (or a file in one) that is not private; the message says why and the fix
    what to do."""


def owner_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def check_stat(st: os.stat_result, path: PathLike, owner: int | None = ME,
               what: str = "directory") -> None:
    """Raise UnsafeDir unless ``st`` is a real directory owned by ``owner`` (ME: us; None: any
    owner, as when root reads a user's dump directory) that nobody else can write."""
    fix = (f"Remove {path} if it is not yours, or choose another {what}; mldebug creates its "
           "own with mode 0700.")
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDir(f"{path} is a symlink (owner {owner_name(st.st_uid)}); a {what} is "
                        "never followed through a link.", fix)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDir(f"{path} is not a directory.", fix)
    mode = stat.S_IMODE(st.st_mode)
    want = os.geteuid() if owner == ME else owner
    if want is not None and st.st_uid != want:
        raise UnsafeDir(f"{path} belongs to {owner_name(st.st_uid)}, not to "
                        f"{owner_name(want)} (mode {mode:04o}): another user created it.", fix)
    if mode & OTHERS_WRITE:
        raise UnsafeDir(f"{path} (owner {owner_name(st.st_uid)}, mode {mode:04o}) can be "
                        "written by other users.", f"{fix} Or: chmod go-w {path}")


def check_dir(path: PathLike, owner: int | None = ME, what: str = "directory"
              ) -> os.stat_result:
    """lstat ``path`` and apply the rule (``check_stat``); FileNotFoundError when missing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UnsafeDir(f"cannot inspect {path}: {e.strerror}.",
                        "Check the path and its permissions.") from None
    check_stat(st, path, owner, what)
    return st


def open_dir(path: PathLike, owner: int | None = ME, what: str = "directory") -> int:
    """An fd of the directory ``path``, checked by the rule on the fd itself (no window between
    the check and the use); UnsafeDir or FileNotFoundError."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        raise
    except OSError:
        check_dir(path, owner, what)  # names the reason (a symlink, a file)
        raise UnsafeDir(f"cannot open {path}.", "Check the path and its permissions.") from None
    try:
        check_stat(os.fstat(fd), path, owner, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _mkdirs(path: Path) -> None:
    """Create ``path`` and missing parents with mode 0700 (existing parents left alone)."""
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass


def private_dir(path: PathLike, *, fallback: bool = False, what: str = "directory") -> Path:
    """``path`` as a directory only this user can use: created 0700 (and missing parents), or
    an existing one that passes the rule. Otherwise UnsafeDir - or, with ``fallback`` (code
    running inside a training job, which must not die for a debugging aid), a fresh private
    directory from ``tempfile.mkdtemp`` beside it (``NAME-XXXXXXXX``) whose path is returned, with one line on stderr saying
    which directory was refused and which one is used instead."""
    p = Path(path)
    try:
        try:
            _mkdirs(p)
        except OSError as e:
            raise UnsafeDir(f"cannot create the {what} {p}: {e.strerror}.",
                            "Check the path and its permissions, or choose another.") from None
        os.close(open_dir(p, ME, what))
        return p
    except UnsafeDir as e:
        if not fallback:
            raise
        try:  # beside the refused one (``<name>-XXXXXXXX``: found where it would be looked for)
            new = Path(tempfile.mkdtemp(prefix=p.name + "-", dir=p.parent))
        except OSError:
            new = Path(tempfile.mkdtemp(prefix=f"mldebug-{os.geteuid()}-"))
        sys.stderr.write(f"mldebug: {e.message} Using {new} instead.\n")
        return new


def subdir_at(dir_fd: int, name: str, owner: int | None = ME,
              what: str = "directory") -> int:
    """An fd of the directory ``name`` inside the directory ``dir_fd``, created 0700 when
    missing, never through a symlink, checked by the rule on the fd itself: what a writer that
    pinned its directory once (``open_dir``) uses below it, so a path swapped later never
    redirects it."""
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"{name!r} is not a plain name inside the directory")
    try:
        os.mkdir(name, 0o700, dir_fd=dir_fd)
    except FileExistsError:
        pass
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        raise UnsafeDir(f"the {what} {name} is not a plain directory ({e.strerror}).",
                        "Remove what is there, or choose another directory.") from None
    try:
        check_stat(os.fstat(fd), name, owner, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_atomic_at(dir_fd: int, name: str, data: bytes) -> None:
    """``write_atomic`` inside the directory ``dir_fd``: a random O_EXCL/O_NOFOLLOW 0600
    temporary renamed over ``name`` (a symlink there is replaced, never written through)."""
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"{name!r} is not a plain name inside the directory")
    tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.close(fd)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def open_in(dir_fd: int, name: str, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """Open ``name`` (a plain name, no slash) inside the directory ``dir_fd`` without following
    a symlink; files we create are 0600."""
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"{name!r} is not a plain name inside the directory")
    return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)


def open_private(path: PathLike, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """A file descriptor for ``path`` (in a private directory), never through a symlink, 0600."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def write_atomic(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary name, so readers never see half a file."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        os.write(fd, data)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, p)


def read_bounded(path: PathLike, limit: int = 64 << 20) -> bytes:
    """At most ``limit`` bytes of a regular file, never through a symlink, never a FIFO or a
    device (OSError says why)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, f"{path} is not a regular file")
        return read_fd(fd, limit)
    finally:
        os.close(fd)


def default_dir() -> Path:
    """Where a rank's hooks write (watchdog/dump-handler stacks, trace rings): $MLDEBUG_DIR,
    else ``$XDG_STATE_HOME/mldebug/capture/<job>`` (``~/.local/state/...``), one directory per
    job (mldebug.ranks.job_of's key: torchrun's run id, the Slurm job and step, ...; else
    ``pid-<pid>``). Never the job's working directory, which is often its source checkout."""
    env = os.environ.get("MLDEBUG_DIR")
    if env:
        return Path(env)
    import re
    import socket

    from mldebug.ranks import job_of

    key = job_of(dict(os.environ), socket.gethostname().split(".")[0], None)["key"]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", key)[:120] if key else f"pid-{os.getpid()}"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                             "state")
    return Path(base) / "mldebug" / "capture" / name


def registry_dir(home: PathLike | None = None) -> Path:
    """Where ranks with a dump handler announce themselves: ``~/.cache/mldebug/capture``,
    private to the user, so a collector finds them without reading their environment."""
    return Path(home if home is not None else Path.home()) / ".cache" / "mldebug" / "capture"


def own_registry_dir() -> Path:
    return private_dir(registry_dir())


def state_dir(*parts: str) -> Path:
    """A private directory under ``$XDG_STATE_HOME/mldebug`` (else ``~/.local/state/mldebug``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                             "state")
    return private_dir(os.path.join(base, "mldebug", *parts))


def save_traceback(text: str) -> Path | None:
    """Write an unexpected error's traceback to a new 0600 file in a private directory
    (``$XDG_STATE_HOME/mldebug/bugs``, else ``~/.local/state/mldebug/bugs``); None if impossible."""
    import time

    try:
        d = state_dir("bugs")
        path = d / f"traceback-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except (MldebugError, OSError):
        return None
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path
