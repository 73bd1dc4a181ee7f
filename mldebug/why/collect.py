"""The inputs of ``mldebug why``: walk the paths (bounded, no symlink followed, no device or
FIFO opened) and sniff each file by its content, not its name, for the reader that reads it."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from mldebug.errors import UsageError

MAX_FILES = 10_000
MAX_DEPTH = 8
HEAD = 1 << 16  # bytes sniffed of each file

# what a file is, by content
FR_PICKLE, FR_JSON, HANG, NUMERICS, TEXT = "fr-pickle", "fr-json", "hang", "numerics", "text"
ELASTIC = "elastic-error"  # a TORCHELASTIC_ERROR_FILE (mldebug.why.elastic)
READER = {FR_PICKLE: "fr", FR_JSON: "fr", HANG: "hang", NUMERICS: "numerics", TEXT: "log",
          ELASTIC: "elastic"}
HANG_FORMAT = "mldebug.hang.dump/1"  # mldebug.hang.collect.DUMP_FORMAT
SENTINEL_KINDS = ("nonfinite", "replica", "scaler_skip")  # mldebug.numerics.records._KINDS


@dataclass
class Found:
    """A file to read, its kind, its size and the argument it was found under."""

    path: Path
    kind: str
    size: int
    root: str


def attempt_of(path: Path) -> tuple[str, int] | None:
    """(run directory, attempt) of a file in a torchrun --log-dir tree (RUN/attempt_N/...)."""
    from mldebug.why.elastic import where

    run, attempt, _ = where(path)
    return None if attempt is None else (run, attempt)


def split_attempts(files: list[Found]) -> tuple[list[Found], dict[tuple[str, int], list[Found]]]:
    """The files of each run's last attempt (and those in no attempt), and the earlier
    attempts' files by (run, attempt): those failed and were restarted (mldebug.log.collect.
    last_attempt's rule)."""
    last: dict[str, int] = {}
    for f in files:
        if (ra := attempt_of(f.path)) is not None:
            last[ra[0]] = max(last.get(ra[0], -1), ra[1])
    current: list[Found] = []
    earlier: dict[tuple[str, int], list[Found]] = {}
    for f in files:
        ra = attempt_of(f.path)
        if ra is None or ra[1] == last[ra[0]]:
            current.append(f)
        else:
            earlier.setdefault(ra, []).append(f)
    return current, dict(sorted(earlier.items()))


@dataclass
class Inputs:
    files: list[Found] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _kind_of_special(mode: int) -> str | None:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if not stat.S_ISREG(mode):
        return "not a regular file"
    return None


def _json_start(head: bytes) -> bool:
    """Whether the head starts like a JSON document ('[rank0]: ...' log lines do not)."""
    s = head.lstrip()
    if s[:1] == b"{":
        return s[1:].lstrip()[:1] in (b'"', b"}")
    if s[:1] == b"[":
        return s[1:].lstrip()[:1] in (b"{", b"[", b"]", b'"')
    return False


def sniff(head: bytes) -> str | None:
    """The kind of a file from its first bytes; None: JSON of no format ``why`` reads."""
    if head[:1] == b"\x80":
        return FR_PICKLE  # a pickle: the fr loader decides (restricted unpickler)
    if _json_start(head):
        from mldebug.why.elastic import sniff as elastic

        if elastic(head):
            return ELASTIC
        line = head.split(b"\n", 1)[0]
        try:
            first = json.loads(line)
        except ValueError:
            first = None
        if isinstance(first, dict) and first.get("kind") in SENTINEL_KINDS and "rank" in first:
            return NUMERICS
        if HANG_FORMAT.encode() in head:
            return HANG
        s = head.lstrip()
        if s[:1] == b"[" and (b'"thread_id"' in head or b'"frames"' in head):
            return HANG  # py-spy dump --json: a list of threads
        if b'"entries"' in head or b'"pg_config"' in head:
            return FR_JSON
        return None
    return TEXT


def _add(out: Inputs, path: Path, root: str, st: os.stat_result, follow: bool = False) -> None:
    if st.st_size == 0:
        out.notes.append(f"{path}: empty; skipped")
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
                     | (0 if follow else os.O_NOFOLLOW))
    except OSError as e:
        out.notes.append(f"{path}: cannot read ({e.strerror}); skipped")
        return
    try:
        if _kind_of_special(os.fstat(fd).st_mode):  # replaced since the listing
            out.notes.append(f"{path}: no longer a regular file; skipped")
            return
        head = os.read(fd, HEAD)
    except OSError as e:
        out.notes.append(f"{path}: cannot read ({e.strerror}); skipped")
        return
    finally:
        os.close(fd)
    kind = sniff(head)
    if kind is None:
        out.notes.append(f"{path}: JSON, but not a flight-recorder dump, a stack dump, a "
                         "sentinel record or an elastic error file; skipped")
        return
    out.files.append(Found(path, kind, st.st_size, root))


def _walk(out: Inputs, d: Path, root: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        out.notes.append(f"{d}: deeper than {MAX_DEPTH} directory levels; not read")
        return
    try:
        entries = sorted(os.scandir(d), key=lambda e: e.name)
    except OSError as e:
        out.notes.append(f"{d}: cannot list ({e.strerror}); skipped")
        return
    from mldebug.paths import own_outputs

    own = {n for n in own_outputs(d) if any(e.name == n for e in entries)}
    if own:
        out.notes.append(f"{d}: {', '.join(sorted(own))}: mldebug's own output, not evidence "
                         "(the dumps beside it are read); skipped")
    for ent in entries:
        if ent.name in own:
            continue
        if len(out.files) >= MAX_FILES:
            out.notes.append(f"more than {MAX_FILES} files: the rest under {root} not read")
            return
        p = Path(ent.path)
        try:
            st = ent.stat(follow_symlinks=False)
        except OSError as err:
            out.notes.append(f"{p}: cannot stat ({err.strerror}); skipped")
            continue
        if stat.S_ISLNK(st.st_mode):
            out.notes.append(f"{p}: a symlink (not followed); skipped")
        elif stat.S_ISDIR(st.st_mode):
            _walk(out, p, root, depth + 1)
        elif (special := _kind_of_special(st.st_mode)) is not None:
            out.notes.append(f"{p}: {special}; skipped")
        else:
            _add(out, p, root, st)


def collect(paths: list[str]) -> Inputs:
    """Every file under ``paths`` with its kind; what was skipped, in ``notes``. A path that
    does not exist is a usage error; a named FIFO or device is skipped with a note."""
    out = Inputs()
    for raw in paths:
        p = Path(raw)
        try:
            st = p.stat()  # a path named on the command line is the user's: followed
        except FileNotFoundError:
            raise UsageError(f"{raw}: no such file or directory.",
                             "Pass the job's logs, flight-recorder dumps, stack dumps or "
                             "sentinel records (files or directories).") from None
        except OSError as e:
            raise UsageError(f"{raw}: cannot read ({e.strerror}).",
                             "Check the path and its permissions.") from None
        if stat.S_ISDIR(st.st_mode):
            _walk(out, p, raw, 0)
        elif (special := _kind_of_special(st.st_mode)) is not None:
            out.notes.append(f"{raw}: {special}; skipped (why reads files: save it first)")
        else:
            _add(out, p, raw, st, follow=True)
    return out
