"""Read the inputs of ``mldebug log``: files, directories of per-rank logs, standard input.

Streams line by line (memory does not grow with the file), caps each line's length, skips
symlinks and special files inside directories, and takes a rank from a per-rank file's path
(``rank3.log``, torchrun ``--log-dir``'s ``attempt_0/3/stderr.log``).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from mldebug.errors import UsageError
from mldebug.log.model import ParsedLogs
from mldebug.log.parse import GREP_PATTERN, MAX_LINE, LogParser
from mldebug.names import trailing_number
from mldebug.text import CONTROL_BYTES

MAX_FILES = 100_000
MAX_DEPTH = 6


def rank_from_path(path: Path) -> int | None:
    """The rank a per-rank log belongs to, when its path says so; else None (the lines'
    prefixes decide)."""
    number = trailing_number(path.stem)  # the rule hang and fr use for file names
    if number is not None and re.search(r"rank[_-]?\d+$", path.stem, re.IGNORECASE):
        return number
    if path.parent.name.isdecimal() and path.name in ("stdout.log", "stderr.log", "error.json"):
        return int(path.parent.name)
    return None


CHUNK = 8 << 20  # bytes read at a time: memory is this plus one line, whatever the file
SNIFF = 1 << 16


def _chunks(stream: object, name: str | None = None,
            nuls: list[int] | None = None) -> Iterator[bytes]:
    """Whole lines, CHUNK bytes at a time; a line over MAX_LINE bytes is cut there (the rest
    of it skipped), so memory stays bounded for a file without a single newline. ``name``:
    the first block is sniffed (raw) before anything is yielded. NUL bytes are dropped (a
    crashed node's unwritten blocks; the lines after them are the ones that matter) and
    counted into ``nuls``: [bytes dropped, line of the first]."""
    read = stream.read  # type: ignore[attr-defined]
    tail = b""
    skipping = False
    first = True
    newlines = 0  # newlines before this block (the line of a NUL run)
    while True:
        block = read(CHUNK)
        if not block:
            break
        if first and name is not None:
            sniff(block[:SNIFF], name)  # the head: a first line over MAX_LINE is cut, not refused
        first = False
        if b"\x00" in block:
            if nuls is not None:
                if not nuls[0]:
                    nuls[1] = newlines + block.count(b"\n", 0, block.find(b"\x00")) + 1
                nuls[0] += block.count(b"\x00")
            block = block.replace(b"\x00", b"")
        if nuls is not None:
            newlines += block.count(b"\n")
        if skipping:
            i = block.find(b"\n")
            if i < 0:
                continue
            block, skipping = block[i + 1:], False
        buf = tail + block if tail else block
        cut = buf.rfind(b"\n")
        tail = buf[cut + 1:]
        if len(tail) > MAX_LINE:
            yield buf[:cut + 1] + tail[:MAX_LINE] + b"\n"
            tail, skipping = b"", True
        elif cut >= 0:
            yield buf[:cut + 1]
    if tail:
        yield tail


_NUL_RUN = re.compile(rb"\x00+")


def sniff(head: bytes, name: str) -> None:
    """Refuse what is not a text log, in one line: binary, compressed, no line breaks."""
    fix = "Pass the job's text log (the launcher's output or per-rank files)."
    if head[:2] == b"\x1f\x8b":
        raise UsageError(f"{name}: gzip-compressed, not a text log.", f"zcat {name} | mldebug log -")
    if head[:4] in (b"\x28\xb5\x2f\xfd", b"PK\x03\x04") or head[:3] == b"BZh":
        raise UsageError(f"{name}: a compressed archive, not a text log.", "Unpack it first. " + fix)
    sample = head[:SNIFF]
    text = sample.replace(b"\x00", b"") if b"\x00" in sample else sample
    # a block of NULs (a crashed node's unwritten pages) is damage, read past it; NULs
    # scattered through the data, or control bytes, are a binary file (ELF, pickle, a struct)
    if (sample[:1] == b"\x80" and b"\n" not in sample[:64]) or sample[:4] == b"\x7fELF" \
            or (text is not sample and len(_NUL_RUN.findall(sample)) > 16) \
            or len(CONTROL_BYTES.findall(text)) * 20 > len(text):
        raise UsageError(f"{name}: binary data (NUL or control bytes throughout, or a pickle), "
                         "not a text log.", fix + " Flight-recorder dumps go to `mldebug fr analyze`.")
    sample = text
    bad = sample.decode("utf-8", "replace").count("\ufffd")
    if bad * 10 > len(sample):
        raise UsageError(f"{name}: not UTF-8 text ({bad} undecodable bytes in the first "
                         f"{len(sample)}).", fix)
    if len(head) >= CHUNK and b"\n" not in head:
        raise UsageError(f"{name}: no line break in the first {CHUNK >> 20} MiB: not a text log.", fix)


def _walk(root: Path, depth: int = 0) -> Iterator[Path]:
    if depth > MAX_DEPTH:
        return
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        if e.is_symlink():
            continue
        if e.is_dir(follow_symlinks=False):
            yield from _walk(Path(e.path), depth + 1)
        elif e.is_file(follow_symlinks=False):
            yield Path(e.path)


_ATTEMPT = re.compile(r"attempt_(\d{1,6})")


def last_attempt(files: list[Path], skipped: list[str] | None = None) -> list[Path]:
    """torchrun --log-dir keeps each restart in RUN/attempt_N/: read only the last attempt of
    each run (earlier attempts failed and were restarted; mixing them would blend failures)."""
    last: dict[Path, int] = {}
    for f in files:
        for part in f.parents:
            m = _ATTEMPT.fullmatch(part.name)
            if m:
                last[part.parent] = max(last.get(part.parent, -1), int(m[1]))
                break
    if not last:
        return files
    keep = []
    for f in files:
        for part in f.parents:
            m = _ATTEMPT.fullmatch(part.name)
            if m:
                if int(m[1]) == last[part.parent]:
                    keep.append(f)
                elif skipped is not None and str(part) not in skipped and len(skipped) < 100:
                    skipped.append(str(part))
                break
        else:
            keep.append(f)
    return keep


def inputs(paths: Sequence[str], skipped: list[str] | None = None) -> list[Path | None]:
    """Expand directories (the last torchrun attempt of each run: the earlier ones are listed
    in ``skipped``); ``None`` stands for standard input. Raises UsageError for a path that
    does not exist or is neither a file nor a directory."""
    out: list[Path | None] = []
    for p in paths:
        if p == "-":
            out.append(None)
            continue
        path = Path(p)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise UsageError(f"{p}: no such file or directory.",
                             "Pass the launcher's log, per-rank log files or a directory of them.") from None
        except OSError as e:
            raise UsageError(f"{p}: cannot read ({e.strerror}).", "Check the path and permissions.") from None
        if stat.S_ISDIR(st.st_mode):
            found = list(_walk(path))
            if not found:
                raise UsageError(f"{p}: the directory holds no files.", "Pass the log files themselves.")
            out.extend(last_attempt(found, skipped)[:MAX_FILES])
        elif stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode) or p.startswith("/dev/std") \
                or p.startswith("/dev/fd/") or p.startswith("/proc/self/fd/"):
            out.append(path)  # regular files, FIFOs, /dev/stdin: read as streams
        else:  # /dev/zero, /dev/urandom, a disk: endless or not a log
            raise UsageError(f"{p} is a device or socket, not a log file.",
                             "Pass a log file, a FIFO, or '-' to read standard input.")
    return out


GREP_MIN = 4 << 20  # files at least this big are prefiltered by grep (when on PATH)
GREP_MEMORY = 1 << 30  # address space grep may use (a line of many GB makes it fail: Python then)
RANK_SAMPLE_GREP = 256 << 10  # bytes sampled for rank prefixes per CHUNK of a file grep reads


def _grep_rlimit() -> None:  # runs in the child before exec
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (GREP_MEMORY, GREP_MEMORY))


def _feed_grep(parser: LogParser, path: Path, source: str, file_rank: int | None, size: int,
               grep: str) -> bool:
    """The prefilter in GNU grep (one C pass over the file; about a tenth of the CPU of the
    Python passes). Hits come with their line number and byte offset; a traceback's window is
    read from the file at that offset. False when grep failed (Python then reads the file)."""
    import subprocess

    parser.start_source(source, file_rank)
    done = 0  # offset up to which the file was read line by line (a traceback's window)
    last_line = 0
    with open(path, "rb") as f:
        head = f.read(SNIFF)
        sniff(head, source)
        if b"\n" not in head and b"\n" not in f.read(CHUNK):
            sniff(b"x" * CHUNK, source)  # raises: no line break
        for at in range(0, size, CHUNK):
            f.seek(at)
            parser.sample_ranks(b"\n" + f.read(RANK_SAMPLE_GREP),
                                whole=min(size - at, CHUNK) <= RANK_SAMPLE_GREP)
        proc = subprocess.Popen(
            [grep, "-a", "-n", "-b", "-F", "-e", GREP_PATTERN, "--", str(path)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            env={"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            preexec_fn=_grep_rlimit)
        assert proc.stdout is not None
        try:
            readline = proc.stdout.readline
            while True:
                out = readline(MAX_LINE + 64)
                if not out:
                    break
                if not out.endswith(b"\n"):  # an over-long line: cut, skip the rest of it
                    while True:
                        more = readline(MAX_LINE)
                        if not more or more.endswith(b"\n"):
                            break
                c1 = out.find(b":")
                c2 = out.find(b":", c1 + 1)
                if c1 <= 0 or c2 <= c1:
                    continue
                line_no, offset = int(out[:c1]), int(out[c1 + 1:c2])
                if offset < done:
                    continue
                line = out[c2 + 1:].rstrip(b"\n")
                parser.count_lines(line_no - last_line)
                last_line = line_no
                parser.line_bytes(line, line_no, source, file_rank)
                if parser.needs_context:  # read the window from the file itself
                    f.seek(offset + len(line) + 1)
                    pos = offset + len(line) + 1
                    n = line_no
                    while parser.needs_context:
                        raw = f.readline(MAX_LINE)
                        if not raw:
                            break
                        pos += len(raw)
                        if not raw.endswith(b"\n"):
                            while (more := f.readline(MAX_LINE)) and not more.endswith(b"\n"):
                                pos += len(more)
                            pos += len(more)
                        n += 1
                        parser.line_bytes(raw.rstrip(b"\r\n"), n, source, file_rank)
                        if not parser.context_step():
                            break
                    parser.end_window()
                    parser.count_lines(n - last_line)
                    last_line = n
                    done = pos
        finally:
            proc.stdout.close()
            rc = proc.wait()
    if rc not in (0, 1):  # 1: no line matched; else grep failed (memory limit, I/O)
        parser.parsed.lines -= last_line
        parser.parsed.sources.pop()
        return False
    parser.parsed.lines_lower_bound = True
    parser.end_source()
    return True


def _feed(parser: LogParser, stream: object, source: str, file_rank: int | None) -> None:
    parser.start_source(source, file_rank)
    line = 1
    for chunk in _chunks(stream, source, parser.nuls):
        line += parser.feed_chunk(chunk, source, file_rank, line)
    parser.end_source()


def feed_file(parser: LogParser, path: Path, source: str, file_rank: int | None, *,
              grep_min: int = GREP_MIN) -> None:
    """One file into ``parser`` as input ``source`` (grep's prefilter for a big one)."""
    size = path.stat().st_size if path.is_file() else 0
    grep = shutil.which("grep") if parser.prefilter and size >= grep_min else None
    if grep and _feed_grep(parser, path, source, file_rank, size, grep):
        return
    with open(path, "rb") as f:
        _feed(parser, f, source, file_rank)


def load(paths: Sequence[str], world_size: int | None = None, *, prefilter: bool = True,
         grep_min: int = GREP_MIN, pods: Callable[[LogParser], None] | None = None) -> ParsedLogs:
    """Read every input. ``prefilter=False`` parses every line (the reference the prefilter is
    tested against); ``grep_min`` is the file size from which grep runs the prefilter;
    ``pods`` feeds more inputs after the files (``mldebug log --k8s``: the pods' logs)."""
    parser = LogParser(prefilter=prefilter)
    skipped: list[str] = []
    found = inputs(paths, skipped)
    parser.parsed.notes += [f"skipped the earlier torchrun attempt {d} (the last attempt is read)"
                            for d in skipped[:20]]
    explicit = {Path(p) for p in paths if p != "-"}
    for path in found:
        if path is None:
            _feed(parser, sys.stdin.buffer, "<stdin>", None)
            continue
        try:
            feed_file(parser, path, str(path), rank_from_path(path), grep_min=grep_min)
        except UsageError as e:
            if path in explicit:
                raise
            parser.parsed.notes.append(f"skipped {e.message}"[:300])  # one bad file in a directory
        except OSError as e:
            raise UsageError(f"{path}: cannot read ({e.strerror}).", "Check the path and permissions.") from None
    if pods is not None:
        pods(parser)
    parser.parsed.world_size = world_size
    return parser.parsed
