"""Paths given on the command line, and the directories mldebug writes (``--out DIR``).

One rule for every command that writes:

- **Resolved once** (``resolve``): the part of the path that exists is resolved with
  ``os.path.realpath``; ``..`` in the part that does not exist is refused, because the kernel
  and ``pathlib`` disagree about it (``data/missing/..`` is ``data`` to one, an error to the
  other) and that gap once made ``--force`` delete ``data/``.
- **Checked before any work** (``check_out``): a symlink, a file, a directory of another
  user, ``/``, ``$HOME``, the current directory or an ancestor of an input is refused; a
  non-empty directory needs ``--force`` and must hold mldebug's marker.
- **Built aside, swapped in at the end** (``staged``): the result is written into a fresh
  private directory beside ``out`` (created and opened by fd, 0700), which replaces ``out``
  only when the block succeeds - with SIGINT and SIGTERM held off for the two renames, so an
  interrupted run leaves the finished output or nothing. A replaced directory is renamed
  aside and deleted through the parent's fd, only when it still holds the marker.
- **Claimed, so two writers never mix** (``staged``): the staging directory has one name per
  output (``.NAME.tmp-writing``), made with ``mkdir`` (atomic) and held with ``flock`` on a
  file inside for the writer's life: a second run to the same ``out`` is refused at once and
  writes nowhere; one left by a killed run (lock free) is removed and taken over. Without
  ``replace`` (``mldebug hang --out`` without ``--force``) an ``out`` another run filled since
  the check is refused too, never replaced.
- **Files created, never reused** (``write_new``, ``Staged.write``): ``O_CREAT|O_EXCL|
  O_NOFOLLOW``, 0600 unless asked otherwise, relative to a directory fd we created.

``mldebug.outdir`` re-exports the names that lived there.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import signal
import stat
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mldebug.errors import MldebugError, UsageError
from mldebug.lifetime import sigterm_unwinds
from mldebug.privdir import check_stat

MARKER = ".mldebug-output"
# `mldebug hang --out`'s marker and the report it writes beside the dumps (mldebug.hang.collect)
HANG_MARKER = ".mldebug-hang"
HANG_REPORTS = ("report.json", "report.txt")
# each --out marker and the files written beside it *about* the evidence (not evidence)
OUT_REPORTS = {MARKER: (), HANG_MARKER: HANG_REPORTS}
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def resolve(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """``path`` made absolute: its existing prefix resolved (``realpath``), the rest kept as
    given; ``..`` in the rest is refused (one line), since nothing there can be resolved."""
    p = Path(os.path.expanduser(os.fspath(path)))
    if not p.is_absolute():
        p = Path.cwd() / p
    parts = p.parts
    i = len(parts)
    while i > 1 and not os.path.lexists(os.path.join(*parts[:i])):
        i -= 1
    rest = [x for x in parts[i:] if x not in ("", ".")]
    if ".." in rest:
        missing = os.path.join(*parts[:i + 1])
        raise UsageError(f"{what} {path}: '..' follows {missing}, which does not exist, so the "
                         "path cannot be resolved safely.",
                         f"Spell the directory without '..' (e.g. {os.path.normpath(path)}), "
                         "after checking it is the one you mean.")
    return Path(os.path.realpath(os.path.join(*parts[:i])), *rest)


def _is_ancestor_or_same(a: Path, b: Path) -> bool:
    return a == b or a in b.parents


def _real(p: Path) -> Path:
    return Path(os.path.realpath(p.expanduser()))


def protected_reason(out: Path, inputs: Iterable[Path] = ()) -> str | None:
    """Why ``out`` must never be replaced, or None. Pure apart from resolving paths."""
    target = resolve(out)
    if target == Path("/"):
        return "it is the root directory"
    home = os.environ.get("HOME")
    if home and _is_ancestor_or_same(target, _real(Path(home))):
        return ("it is your home directory ($HOME)" if target == _real(Path(home))
                else "it contains your home directory ($HOME)")
    cwd = _real(Path.cwd())
    if _is_ancestor_or_same(target, cwd):
        return ("it is the current directory" if target == cwd
                else "it contains the current directory")
    for src in inputs:
        s = _real(src)
        if target == s:
            return f"it is the input {src}"
        if target in s.parents:
            return f"it contains the input {src}"
    return None


def check_out(out: Path, *, force: bool, inputs: Iterable[Path] = (), marker: str = MARKER,
              what: str = "--out", command: str = "mldebug") -> Path:
    """Validate ``--out`` before any work: a UsageError that says what to do, else ``out``
    resolved (``resolve``). A missing or empty directory of ours is fine; a non-empty one
    needs ``force`` and must hold ``marker``."""
    raw = Path(os.path.expanduser(os.fspath(out)))
    if raw.is_symlink():
        raise UsageError(f"{what} {out} is a symbolic link; mldebug does not write through links.",
                         "Pass the real directory path, or a new one.")
    target = resolve(raw, what)
    if target.exists() and not target.is_dir():
        raise UsageError(f"{what} {out} is a file, not a directory.",
                         "Pass a directory path (a new one is created).")
    reason = protected_reason(target, inputs)
    if reason:
        raise UsageError(f"{what} {out} cannot be written: {reason}, which mldebug never "
                         "replaces.", "Pass a new directory, e.g. --out ./mldebug-out.")
    if not target.exists():
        return target
    st = os.lstat(target)
    if st.st_uid != os.geteuid():
        from mldebug.privdir import owner_name

        raise UsageError(f"{what} {out} belongs to {owner_name(st.st_uid)}, not to you: another "
                         "user could swap what is inside while mldebug writes.",
                         "Pass a new directory (mldebug creates it), or one you own.")
    if not any(target.iterdir()):
        return target
    if not force:
        raise UsageError(f"{out} already exists and is not empty.",
                         f"Pass --force to replace it (only a directory {command} wrote), "
                         "or another --out.")
    if not _has_marker(target, marker):
        raise UsageError(
            f"--force refused: {out} was not written by {command} (no {marker} inside), so it "
            "is not replaced.", f"Pass another --out, or remove it yourself (rm -r {out}).")
    return target


def _has_marker(d: Path | int, marker: str, name: str | None = None) -> bool:
    """Whether the directory (a path, or ``name`` inside the directory fd ``d``) holds the
    regular file ``marker`` - checked by fd, no link followed."""
    try:
        fd = (os.open(d, _DIR | os.O_NOFOLLOW) if not isinstance(d, int)
              else os.open(name or ".", _DIR | os.O_NOFOLLOW, dir_fd=d))
    except OSError:
        return False
    try:
        st = os.stat(marker, dir_fd=fd, follow_symlinks=False)
        return stat.S_ISREG(st.st_mode)
    except OSError:
        return False
    finally:
        os.close(fd)


def own_outputs(d: Path) -> set[str]:
    """The names in directory ``d`` that an mldebug ``--out`` wrote about its evidence: the
    marker, when it is a regular file (by fd, no link followed) that says mldebug wrote it
    (``staged``'s text), and the reports written beside it (``OUT_REPORTS``)."""
    try:
        fd = os.open(d, _DIR | os.O_NOFOLLOW)
    except OSError:
        return set()
    own: set[str] = set()
    try:
        for marker, reports in OUT_REPORTS.items():
            try:
                st = os.stat(marker, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
                    continue
                m = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                            dir_fd=fd)
                try:
                    head = os.read(m, 256)
                finally:
                    os.close(m)
            except OSError:
                continue
            if head.startswith((b"written by mldebug", b'{"written_by": "mldebug"')):
                own.update((marker, *reports))
    finally:
        os.close(fd)
    return own


def _fs_error(out: Path, e: OSError) -> MldebugError:
    what = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
            errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
            errno.EPERM: "permission denied"}.get(e.errno or 0, e.strerror or str(e))
    return MldebugError(f"cannot write {out}: {what} ({e.filename or out}).",
                        "Nothing was written there; pass an --out on a writable file system "
                        "with free space.")


def write_error(out: Path, e: BaseException) -> MldebugError | None:
    """A one-line error when ``e`` (or what caused it) is a file-system write failure."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS,
                                                        errno.EACCES, errno.EPERM, errno.EIO):
            return _fs_error(out, seen)
        seen = seen.__cause__ or seen.__context__
    text = str(e)  # writers in Rust/C (safetensors, arrow) wrap the errno in their own text
    for code, words in ((errno.ENOSPC, ("No space left", "StorageFull")),
                        (errno.EROFS, ("Read-only file system", "ReadOnlyFilesystem"))):
        if any(w in text for w in words):
            return _fs_error(out, OSError(code, os.strerror(code), str(out)))
    return None


def _parts(rel: str) -> list[str]:
    parts = [x for x in rel.split("/") if x not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"{rel!r} is not a relative name inside the directory")
    return parts


def _open_subdir(dir_fd: int, names: list[str]) -> int:
    """An fd of ``names`` below ``dir_fd`` (created 0700 where missing), no link followed."""
    fd = os.dup(dir_fd)
    for name in names:
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
        except FileExistsError:
            pass
        try:
            new = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        fd = new
    return fd


def write_at(dir_fd: int, rel: str, data: bytes, mode: int = 0o600) -> None:
    """Create ``rel`` (``a/b/file``) below the directory fd ``dir_fd`` and write ``data``:
    O_EXCL (never an existing file), O_NOFOLLOW (never through a link), ``mode``."""
    parts = _parts(rel)
    sub = _open_subdir(dir_fd, parts[:-1])
    try:
        fd = os.open(parts[-1], _NEW, mode, dir_fd=sub)
    finally:
        os.close(sub)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def write_new(path: Path, data: bytes | str, mode: int = 0o600) -> Path:
    """Create the file ``path`` (never over an existing file, never through a link) with
    ``mode``; the directory above it must exist."""
    raw = data.encode() if isinstance(data, str) else data
    parent = os.open(path.parent, _DIR)
    try:
        write_at(parent, path.name, raw, mode)
    finally:
        os.close(parent)
    return path


class Staged:
    """The private directory a staged output is built in: ``path`` for code that writes by
    path (inside a 0700 directory only we can change), ``write`` to create a file by fd."""

    def __init__(self, path: Path, fd: int, final: Path) -> None:
        self.path = path
        self.fd = fd
        self.final = final

    def write(self, rel: str, data: bytes | str, mode: int = 0o600) -> Path:
        write_at(self.fd, rel, data.encode() if isinstance(data, str) else data, mode)
        return self.path / rel


_HELD = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM delivered only after the block (the swap cannot be cut in half)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _tmp_name(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(4)}"


CLAIM_LOCK = ".mldebug-writing"  # inside the staging directory: flock held by its writer


def _claim_state(parent: int, name: str) -> str:
    """What holds the staging name: "stale" (ours - this user's private directory, by fd -
    with a lock file nobody holds: a killed run's), "busy" (a writer at work) or "foreign"
    (not a private directory of this user: planted)."""
    import fcntl

    try:
        fd = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=parent)
    except OSError:
        return "foreign"  # a file, a link
    try:
        try:
            check_stat(os.fstat(fd), Path(name), what="staging directory")
        except MldebugError:
            return "foreign"
        try:
            lock = os.open(CLAIM_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            return "busy"  # its writer is creating it now
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return "stale"
        except OSError:
            return "busy"
        finally:
            os.close(lock)
    finally:
        os.close(fd)


def _claim(parent: int, out: Path) -> str:
    """Make this run's staging directory for ``out`` (``mkdir``: one run wins); the name."""
    name = f".{out.name}.tmp-writing"
    for attempt in range(2):
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
            return name
        except FileExistsError:
            state = _claim_state(parent, name)
            if state == "stale" and attempt == 0:
                remove_at(parent, name)  # a killed run's: ours, its lock free
                continue
            if state == "foreign":
                raise UsageError(f"{out.parent / name} exists and is not a private directory "
                                 "of yours (planted?); nothing was written.",
                                 "Pass an --out in a directory only you can write.") from None
            raise UsageError(f"another mldebug run is writing {out} now ({out.parent / name} "
                             "is its work in progress); this run wrote nothing.",
                             "Wait for it to finish, or pass another --out.") from None
    raise AssertionError("unreachable")


@contextmanager
def staged(out: Path, *, command: str = "", marker: str = MARKER,
           marker_text: str | None = None, private: bool = False,
           replace: bool = True) -> Iterator[Staged]:
    """Build ``out`` in a fresh directory beside it; it replaces ``out`` only when the block
    finishes without an exception (and SIGTERM unwinds like one), so a failed or interrupted
    run leaves ``out`` as it was. Call ``check_out`` first (it resolves ``out``).

    ``private``: the directory stays 0700 (reports with command lines, stacks); otherwise it
    becomes 0755 like any directory a user makes (a tiny model to share). ``replace``: an
    ``out`` that holds files when the run starts or ends may be replaced (when mldebug wrote
    it); without, it is refused (``--out`` without ``--force``: another run filled it)."""
    import fcntl

    out = resolve(out)
    name = out.name
    try:
        os.makedirs(out.parent, exist_ok=True)
        parent = os.open(out.parent, _DIR)
    except OSError as e:
        err = write_error(out, e)
        raise (err or UsageError(f"cannot create {out.parent}: {e.strerror}.",
                                 "Pass an --out you can write.")) from None
    tmp = ""
    tmp_fd = lock = -1
    try:
        with sigterm_unwinds():
            try:
                tmp = _claim(parent, out)
                tmp_fd = os.open(tmp, _DIR | os.O_NOFOLLOW, dir_fd=parent)
                # ours, by fd: the one private-directory rule (a planted one is refused)
                check_stat(os.fstat(tmp_fd), out.parent / tmp, what="staging directory")
                lock = os.open(CLAIM_LOCK, _NEW, 0o600, dir_fd=tmp_fd)
                fcntl.flock(lock, fcntl.LOCK_EX)  # held until the swap or this process ends
                if not replace:
                    _refuse_filled(parent, out)
                if not private:
                    os.fchmod(tmp_fd, 0o755)
                text = marker_text if marker_text is not None else json.dumps(
                    {"written_by": "mldebug", "command": command}) + "\n"
                write_at(tmp_fd, marker, text.encode(), 0o600 if private else 0o644)
                yield Staged(out.parent / tmp, tmp_fd, out)
                with _signals_held():
                    if not replace:
                        _refuse_filled(parent, out)
                    os.unlink(CLAIM_LOCK, dir_fd=tmp_fd)  # still held: the fd stays open
                    _swap_in(parent, tmp, name, marker)
                    tmp = ""
            except MldebugError:
                raise
            except Exception as e:
                err = write_error(out, e)
                if err is None:
                    raise
                raise err from e
    finally:
        if tmp_fd >= 0:
            os.close(tmp_fd)
        if tmp:
            with _signals_held():
                remove_at(parent, tmp)
        if lock >= 0:
            os.close(lock)  # after the removal: nobody takes a half-removed claim over
        os.close(parent)


def _refuse_filled(parent: int, out: Path) -> None:
    """An ``out`` that holds files now (another run's, since the check) is not replaced."""
    try:
        fd = os.open(out.name, _DIR | os.O_NOFOLLOW, dir_fd=parent)
    except FileNotFoundError:
        return
    except OSError:
        raise UsageError(f"{out} changed while mldebug worked (now not a directory); nothing "
                         "was written.", "Pass a new --out.") from None
    try:
        with os.scandir(fd) as it:
            full = any(True for _ in it)
    finally:
        os.close(fd)
    if full:
        raise UsageError(f"{out} was filled by another run while this one worked (two runs "
                         "with the same --out?); this run wrote nothing there.",
                         "Pass a new --out, or --force to replace what is there.")


def remove_at(parent: int, name: str) -> None:
    """Delete the directory ``name`` inside the directory fd ``parent`` and all it holds, by fd
    (``openat``/``unlinkat``): a link inside is removed, never followed. Errors are ignored
    (what cannot be removed stays)."""
    try:
        fd = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=parent)
    except OSError:
        return
    try:
        with os.scandir(fd) as it:
            entries = list(it)
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    remove_at(fd, e.name)
                else:
                    os.unlink(e.name, dir_fd=fd)
            except OSError:
                pass
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=parent)
    except OSError:
        pass


def _swap_in(parent: int, tmp: str, name: str, marker: str) -> None:
    """Rename ``tmp`` to ``name`` inside ``parent``: over an empty directory directly, over
    one mldebug wrote (``marker`` inside, checked now by fd) after renaming it aside."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        return
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise UsageError(f"{name} changed while mldebug worked (now not a directory of yours); "
                         "nothing was replaced.", "Pass a new --out.")
    try:
        os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)  # an empty directory
        return
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if not _has_marker(parent, marker, name):
        raise UsageError(f"{name} now holds files mldebug did not write (no {marker}); nothing "
                         "was replaced.", "Pass a new --out.")
    old = _tmp_name(f".{name}.old-")
    os.rename(name, old, src_dir_fd=parent, dst_dir_fd=parent)
    os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    remove_at(parent, old)


_NAME_OK = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-+")


def name_part(value: object, limit: int = 64) -> str:
    """Outside text (a host, a rank, a pid from a node's answer) as one plain file-name part:
    letters, digits and ``._-+`` kept, anything else (``/``, controls, spaces) as ``_``, no
    leading dot (``..`` cannot come out), at most ``limit`` characters."""
    s = "".join(c if c in _NAME_OK else "_" for c in str(value)[:limit])
    s = s.lstrip(".")
    return s or "_"
