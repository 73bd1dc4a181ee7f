"""Output directories (``--out DIR``): checked before anything is written, replaced all or nothing.

Every command that writes a directory goes through here, so ``--force`` means the same thing
everywhere: it replaces only a directory mldebug itself wrote (it holds ``MARKER``), and never
the current directory, an ancestor of it or of an input, ``/`` or ``$HOME``. ``staged`` builds
the result in a hidden sibling and swaps it in only when the block succeeds; file-system errors
(read-only, full disk, no permission) become one-line errors naming the directory.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mldebug.errors import MldebugError, UsageError

MARKER = ".mldebug-output"


def _resolved(p: Path) -> Path:
    return Path(os.path.realpath(p.expanduser()))


def _is_ancestor_or_same(a: Path, b: Path) -> bool:
    """True when ``a`` is ``b`` or a directory above it (both resolved)."""
    return a == b or a in b.parents


def protected_reason(out: Path, inputs: Iterable[Path] = ()) -> str | None:
    """Why ``out`` must never be replaced, or None. Pure apart from resolving paths."""
    target = _resolved(out)
    if target == Path("/"):
        return "it is the root directory"
    home = os.environ.get("HOME")
    if home and _is_ancestor_or_same(target, _resolved(Path(home))):
        return ("it is your home directory ($HOME)" if target == _resolved(Path(home))
                else "it contains your home directory ($HOME)")
    cwd = _resolved(Path.cwd())
    if _is_ancestor_or_same(target, cwd):
        return ("it is the current directory" if target == cwd
                else "it contains the current directory")
    for src in inputs:
        s = _resolved(src)
        if target == s:
            return f"it is the input {src}"
        if target in s.parents:
            return f"it contains the input {src}"
    return None


def check_out(out: Path, *, force: bool, inputs: Iterable[Path] = ()) -> Path:
    """Validate ``--out`` before any work: raise a UsageError that says what to do, else return
    ``out`` (expanded). A missing or empty directory is fine; a non-empty one needs ``--force``
    and must be one mldebug wrote."""
    out = out.expanduser()
    if out.is_symlink():
        raise UsageError(f"--out {out} is a symbolic link; mldebug does not write through links.",
                         "Pass the real directory path, or a new one.")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a directory.",
                         "Pass a directory path (a new one is created).")
    reason = protected_reason(out, inputs)
    if reason:
        raise UsageError(f"--out {out} cannot be written: {reason}, which mldebug never replaces.",
                         "Pass a new directory, e.g. --out ./tiny-out.")
    if not out.exists() or not any(out.iterdir()):
        return out
    if not force:
        raise UsageError(f"{out} already exists and is not empty.",
                         "Pass --force to replace it (only a directory mldebug wrote), "
                         "or another --out.")
    if not (out / MARKER).is_file():
        raise UsageError(
            f"--force refused: {out} was not written by mldebug (no {MARKER} inside), so it "
            "is not replaced.", f"Pass another --out, or remove it yourself (rm -r {out}).")
    return out


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


@contextmanager
def staged(out: Path, *, command: str = "") -> Iterator[Path]:
    """Yield a temporary directory beside ``out`` (holding ``MARKER``); it replaces ``out`` only
    when the block finishes without an exception, so a failed run leaves nothing half-written.
    Call ``check_out`` first: this replaces whatever ``out`` is."""
    tmp: Path | None = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        tmp.chmod(0o755)
        (tmp / MARKER).write_text(json.dumps({"written_by": "mldebug", "command": command}) + "\n")
        yield tmp
        if out.is_dir() and not out.is_symlink():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except MldebugError:
        raise
    except Exception as e:
        err = write_error(out, e)
        if err is None:
            raise
        raise err from e
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
