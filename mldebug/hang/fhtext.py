"""Raw faulthandler text as saved stacks: what a watchdog leaves in ``DIR/faulthandler/`` when
no Python ran after the C-level dump (``dump+abort`` with the GIL held), or a faulthandler
text file given directly. Found and read here (bounded, never through a symlink, owner
checked), parsed by ``mldebug.stacks``, handed to the hang analysis as Processes.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

from mldebug.hang.model import CollectError, Process
from mldebug.hang.pyspy import threads_from_json
from mldebug.names import trailing_number
from mldebug.nodekit import read_fd
from mldebug.privdir import UnsafeDir, check_stat
from mldebug.stacks import faulthandler_dumps

MAX_FH_BYTES = 16 << 20  # the newest dumps: one is at most 100 threads x 100 frames x ~1 KB
# the watchdog's file names: <host>-rank<R>-<pid>.txt (signal), <...>.gil.txt (GIL held)
_NAME = re.compile(r"^(?P<host>.+?)(?:-rank(?P<rank>\d{1,9}))?-(?P<pid>\d{1,9})(?:\.gil)?\.txt$")
_OWN_THREAD = "mldebug/capture/handler.py"  # the watchdog's own thread: not a rank's stack
JOB_FIELDS = ("run_id", "world_size", "local_world_size", "launcher", "job", "job_launcher")


def stem(name: str) -> str:
    """The rank's file stem, shared by ``dumps/<stem>.json`` and ``faulthandler/<stem>.txt``."""
    for suffix in (".gil.txt", ".txt", ".json"):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def capture_texts(d: Path, covered: set[str]) -> tuple[list[Path], list[CollectError]]:
    """The non-empty texts in ``d/faulthandler`` of ranks that have no JSON dump (``covered``
    stems), the newest one per rank; and why others were skipped. The directory must not be
    a symlink nor writable by others, and each file must be a plain file of its owner."""
    fh = d / "faulthandler"
    try:
        st = os.lstat(fh)
    except OSError:
        return [], []
    try:
        check_stat(st, fh, owner=None)
    except UnsafeDir as e:
        return [], [CollectError(str(fh), None, f"{e.message} Skipped.")]
    newest: dict[str, tuple[float, Path]] = {}
    errors: list[CollectError] = []
    for name in sorted(os.listdir(fh)):
        if not name.endswith(".txt") or stem(name) in covered:
            continue
        try:
            fst = os.lstat(fh / name)
        except OSError:
            continue
        if stat.S_ISLNK(fst.st_mode):
            errors.append(CollectError(name, None, "a symbolic link: skipped"))
        elif not stat.S_ISREG(fst.st_mode) or fst.st_size == 0:
            continue  # an empty text: that rank was never asked (the usual case)
        elif fst.st_uid != st.st_uid:
            errors.append(CollectError(name, None, f"owned by uid {fst.st_uid}, not by the "
                                                   f"directory's owner: skipped"))
        elif fst.st_mtime > newest.get(stem(name), (-1.0, fh))[0]:
            newest[stem(name)] = (fst.st_mtime, fh / name)
    return [p for _, p in newest.values()], errors


def read_tail(path: Path, owner: int | None = None) -> bytes:
    """The last ``MAX_FH_BYTES`` of a text (from a line start), never through a symlink, never
    a FIFO or device; ``owner``: the uid the file must belong to. OSError says why not."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a plain file")
        if owner is not None and st.st_uid != owner:
            raise OSError(0, f"owned by uid {st.st_uid}, not by the directory's owner")
        if st.st_size <= MAX_FH_BYTES:
            return read_fd(fd, MAX_FH_BYTES)
        os.lseek(fd, st.st_size - MAX_FH_BYTES, os.SEEK_SET)
        data = read_fd(fd, MAX_FH_BYTES)
        return data[data.find(b"\n") + 1:]
    finally:
        os.close(fd)


def short_name(path: str) -> str:
    """py-spy's short file name without the process's ``sys.path``: the part after
    site-packages, else the base name of an absolute path (the script's directory is the
    first ``sys.path`` entry)."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return path.rsplit("/", 1)[1] if path.startswith("/") else path


def learned_prefixes(siblings: Sequence[Process]) -> list[str]:
    """The ``sys.path`` entries the ranks used, read back from their JSON dumps' frames
    (``filename`` = entry + "/" + ``short_filename``), so a raw text's frames get the same
    short names as theirs."""
    found: set[str] = set()
    seen: set[int] = set()
    for p in siblings:
        for t in p.threads:
            if id(t.frames) in seen:  # stacks are shared between ranks
                continue
            seen.add(id(t.frames))
            for f in t.frames:
                if f.short and f.short != f.filename and f.filename.endswith("/" + f.short):
                    found.add(f.filename[:-len(f.short) - 1])
    return sorted(found)


def process_from_text(text: str, name: str, prefixes: Sequence[str] = ()) -> Process | None:
    """The newest dump of a faulthandler text as one Process; host, rank and pid from a
    watchdog file name, else the pid from the name's trailing number. None: no dump.
    ``prefixes``: the ranks' ``sys.path`` entries when known (``learned_prefixes``)."""
    m = _NAME.match(name)
    host = m["host"] if m else ""
    pid = int(m["pid"]) if m else trailing_number(name.rsplit(".", 1)[0]) or 0
    dumps = faulthandler_dumps(text, pid, prefixes=list(prefixes), guess_main=True)
    if not dumps:
        return None
    threads = [t for t in dumps[-1]
               if not any(f["filename"].endswith(_OWN_THREAD) for f in t["frames"])]
    for t in threads:
        for f in t["frames"]:
            if f["short_filename"] == f["filename"]:
                f["short_filename"] = short_name(f["filename"])
    return Process(host=host, pid=pid, rank=int(m["rank"]) if m and m["rank"] else None,
                   threads=threads_from_json(threads))


def adopt_job(raw: Sequence[Process], siblings: Sequence[Process]) -> None:
    """A raw text says nothing of its job; the JSON dumps beside it (same capture directory)
    do. Each job field they all agree on is copied, so the ranks stay one job."""
    for key in JOB_FIELDS:
        values = {getattr(p, key) for p in siblings}
        if len(values) == 1 and None not in values:
            value = values.pop()
            for p in raw:
                setattr(p, key, value)
