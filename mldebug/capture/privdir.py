"""Private directories and files for dumps: 0700 dirs we own, files opened without following
symlinks. A dump directory may sit in a shared place (a job's cwd on a shared file system),
so nothing another user could plant there is ever followed or trusted."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from mldebug.errors import MldebugError
from mldebug.nodekit import read_fd


def check_private(path: Path, uid: int | None = None) -> None:
    """Refuse a directory that is a symlink, not owned by ``uid`` (default: us), or writable
    by group/others."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise MldebugError(f"{path} is not a plain directory (a symlink or a file).",
                           "Remove it or choose another directory (dir=... or $MLDEBUG_DIR).")
    if st.st_uid != (os.geteuid() if uid is None else uid):
        raise MldebugError(f"{path} belongs to uid {st.st_uid}, not to the expected user.",
                           "Choose a directory you own (dir=... or $MLDEBUG_DIR).")
    if st.st_mode & 0o022:
        raise MldebugError(f"{path} is writable by other users (mode {st.st_mode & 0o777:o}).",
                           f"chmod 700 {path}, or choose another directory.")


def private_dir(path: str | Path) -> Path:
    """Create ``path`` (and missing parents) 0700, or check an existing one is private."""
    p = Path(path)
    try:
        os.mkdir(p, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        p.parent.mkdir(parents=True, exist_ok=True)
        return private_dir(p)
    check_private(p)
    return p


def default_dir() -> Path:
    """$MLDEBUG_DIR, else ``mldebug-capture`` in the job's working directory."""
    env = os.environ.get("MLDEBUG_DIR")
    return Path(env) if env else Path.cwd() / "mldebug-capture"


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """A file descriptor for ``path`` in a private dir, never through a symlink."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary name, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = open_private(tmp)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_bounded(path: Path, limit: int = 64 << 20) -> bytes:
    """Read at most ``limit`` bytes of a file, never through a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return read_fd(fd, limit)
    finally:
        os.close(fd)


def registry_dir(home: str | Path | None = None) -> Path:
    """Where ranks with a dump handler announce themselves: ``~/.cache/mldebug/capture``,
    private to the user, so a collector finds them without reading their environment."""
    return Path(home if home is not None else Path.home()) / ".cache" / "mldebug" / "capture"


def own_registry_dir() -> Path:
    d = registry_dir()
    private_dir(d.parent)
    return private_dir(d)
