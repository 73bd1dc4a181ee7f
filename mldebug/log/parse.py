"""Turn log lines into per-rank state, one line at a time (pure: no I/O).

Reads what PyTorch, torchrun and NCCL print when a job dies:

- Python tracebacks, attributed to a rank by the launcher prefix (``[rank3]:``,
  ``[default3]:``, ``3: ``, ``[1,3]<stderr>:``) or by the file they came from;
- ProcessGroupNCCL's watchdog: ``[Rank N] Watchdog caught collective operation timeout:
  WorkNCCL(SeqNum=S, OpType=OP, ..., Timeout(ms)=T)`` and ``[PG P Rank N] Exception (either an
  error or timeout) detected by watchdog at work: W, last enqueued NCCL work: E, last
  completed NCCL work: C`` (also ``Timeout at NCCL work: ...``);
- torchrun's ``ChildFailedError`` table (rank, host, exitcode, signal);
- ``NCCL WARN`` lines (counted and grouped) and a bare ``Killed`` from the shell.

Memory is bounded by the number of ranks, not the number of lines: a traceback keeps only
its last user frame, WARN messages are grouped and their rank lists capped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from mldebug.log.model import Event, LauncherFailure, ParsedLogs, StoreFacts, WatchdogTimeout
from mldebug.logprefix import strip_prefix
from mldebug.ours import user_file
from mldebug.text import sanitize

MAX_LINE = 16384  # characters of one line that are looked at
MAX_CONTEXT = 100_000  # lines read one by one while a traceback stays open (a cut log)
RANK_SAMPLE = 1 << 20  # bytes of each chunk whose launcher prefixes are scanned for ranks
MAX_SAMPLED_RANKS = 1 << 16  # ranks the sample adds (memory: one RankLog each); then it stops
MAX_WARN_GROUPS = 200
MAX_WARN_RANKS = 4096

# The prefilter: a line is parsed only when it holds one of these words (plain strings: grep
# -F matches them all in one pass). Everything the parser reacts to on a line of its own is
# here; a traceback's frames and last line are read because "Traceback" opens a window that
# reads every line until it ends (and "Failures:" the launcher's table).
PREFILTER_WORDS = (
    "Error", "ERROR", "EADDRINUSE",  # RuntimeError: ..., gloo's ERROR, the launcher's port
    "xception", "xitcode",  # Exception / exception, torchrun's exitcode
    "xiting via",  # torchrun: "Unable to shutdown process P via 15, forcefully exiting via 9"
    "Traceback", "Watchdog", "watchdog", "NCCL WARN", "NCCL work", "Killed",
    "mldebug",  # mldebug's own hooks
    "Signal", "SIGKILL", "SIGABRT", "SIGSEGV", "SIGBUS", "SIGTERM", "SIGILL", "SIGFPE", "Failures:", "Fatal", "Root Cause", "Received data size",
    "op.preamble.length",  # gloo's size check before its message said so (gloo#456)
    "DebugUnderflowOverflow", "Detected mismatch",
    "monitoredBarrier",  # gloo's monitored_barrier names the rank that did not arrive
    "WORLD_SIZE", "world_size", "world size",
    "torch==", "torch version", "PyTorch version",  # the version, for the known-issue table
    # phases a rank enters on its own (the tie break between waiting ranks)
    "alidat", "valuat", "heckpoint", "StopIteration", "end of data", "end of epoch",
)
_PHASE = re.compile(r"(?P<p>[Vv]alidat|[Ee]valuat|[Cc]heckpoint|StopIteration|end of data|end of epoch)")
PHASES = {"validat": "validation", "evaluat": "evaluation",
          "checkpoint": "checkpoint", "stopiteration": "end of data", "end of data": "end of data",
          "end of epoch": "end of data"}


def _by_first_char(words: tuple[str, ...]) -> list[re.Pattern[bytes]]:
    """One regex per first character: a literal-prefixed regex is one memchr-speed pass over
    the bytes, where one alternation of every word is 10x slower in ``re``."""
    import os.path

    groups: dict[str, list[str]] = {}
    for w in words:
        groups.setdefault(w[0], []).append(w)
    out = []
    for group in groups.values():
        head = os.path.commonprefix(group)  # the longer the literal prefix, the fewer candidates
        rest = [re.escape(w[len(head):]) for w in group]
        out.append(re.compile((re.escape(head) + "(?:" + "|".join(rest) + ")").encode()))
    return out


_PREFILTER: list[re.Pattern[bytes]] = []  # compiled on first use (grep reads big files)


def prefilter_patterns() -> list[re.Pattern[bytes]]:
    if not _PREFILTER:
        _PREFILTER.extend(_by_first_char(PREFILTER_WORDS))
    return _PREFILTER


GREP_PATTERN = "\n".join(PREFILTER_WORDS)  # grep -F: one word per line

_TIME_GLOG = re.compile(r"^\[?[EWIFD](?P<md>\d{3,4}) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d(?:\.\d+)?)")
_TIME_ISO = re.compile(r"(?P<y>\d{4})-(?P<mo>\d\d)-(?P<d>\d\d)[ T_](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d(?:[.,]\d+)?)")

_WD_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\(")
_SEQ = re.compile(r"SeqNum=(\d{1,18})")
_OP = re.compile(r"OpType=(\w{1,40})")
_TMO = re.compile(r"Timeout\(ms\)=(\d{1,12})")
_NUMEL = re.compile(r"NumelIn=(\d{1,18})")
# TORCH_DISTRIBUTED_DEBUG=DETAIL (ProcessGroupWrapper): "Rank 0 is running collective:
# CollectiveFingerPrint(SequenceNumber=5, OpType=ALLREDUCE, TensorShape=[20, 10], TensorDtypes=Float, ...)"
_FP = re.compile(r"Rank (?P<rank>\d{1,7}) is running collective: CollectiveFingerPrint\((?P<fp>[^\n]{0,2000}?)\)(?=, but|\.|$)")
_FP_FIELD = re.compile(r"(SequenceNumber)=(\d{1,20})|(OpType|TensorShape|TensorDtypes)=(\[[^\]]{0,500}\]|[\w.]{1,60})")
_PG_RANK = re.compile(r"\[PG (?:ID )?(?P<pg>\d{1,9})[^\]]{0,200}?Rank (?P<rank>\d{1,7})\]")
_RANK_ONLY = re.compile(r"\[Rank (?P<rank>\d{1,7})\]")
_ENQ = re.compile(r"last enqueued (?:NCCL )?work: (?P<enq>-?\d{1,18}), last completed (?:NCCL )?work: (?P<comp>-?\d{1,18})")

_TB_START = "Traceback (most recent call last):"
# launcher prefixes that carry a rank, for the rank sample (bracketed forms only: "12: " could
# be anything): [rank3]: [default3]: [1,3]<stdout>: and mldebug's own [host:3], also behind
# kubectl logs --timestamps' RFC 3339 time (mldebug log --k8s reads the pods with it)
_RANK_SAMPLE = re.compile(rb"\n(?:\d{4}-\d\d-\d\dT[\d:.]{8,20}(?:Z|[+-]\d\d:\d\d) )?"
                          rb"(?:\[(?:rank|default)(\d{1,7})\]:|\[\d{1,7},(\d{1,7})\]<std"
                          rb"|\[[A-Za-z][\w.-]{0,62}:(\d{1,7})\] )")
_TB_FILE = re.compile(r'^\s+File "(?P<file>[^"]{1,1000})", line (?P<line>\d+), in (?P<func>\S+)')
# the line that ends a traceback: any class name (OverflowDetected, DistNetworkError, ...)
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]{0,200})(?::\s?(?P<msg>.*))?$")
# after other output came between a traceback's lines, only a name that looks like an exception
# class ends it (a dotted path, or a class name ending like one): "Note: ..." does not
_EXC_CLASS = re.compile(r"\.[A-Z]\w*$|^[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Detected|Failure"
                        r"|Timeout|Warning|Iteration|Abort|Aborted)$")
# lines of other output a traceback stays open through (stdout between stderr's lines)
MAX_FOREIGN = 200
MAX_STACK = 8  # user frames of a traceback kept (the innermost)

_TABLE_ENTRY = re.compile(r"^\[(?P<idx>\d{1,7})\]:\s*$")
_TABLE_FIELD = re.compile(r"^\s+(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<val>.*)$")
_TABLE_RANK = re.compile(r"^(?P<rank>\d{1,7})\b")
_TABLE_EXIT = re.compile(r"^(?P<code>-?\d{1,4})\b(?: \(pid: (?P<pid>\d{1,10})\))?")
# one table entry squeezed onto one line, as issue pages render it once the layout's spaces and
# newlines are gone: "rank2 (local rank: 2)exitcode: -9 (pid: 36071)error file: <N/A>"
_TABLE_FLAT = re.compile(r"\brank\s*:?\s*(?P<rank>\d{1,7})\s*\(local[_ ]rank:\s*\d{1,7}\)\s*"
                         r"exitcode\s*:\s*(?P<code>-?\d{1,4})(?:\s*\(pid:\s*(?P<pid>\d{1,10})\))?")

_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")
_SRC_TAG = re.compile(r"\[[^\]\s]{1,300}\.(?:cc|cpp|h|hpp|cu|py):\d+\] ")  # [/path/pair.cc:553]

# What a rank says when a PEER failed: these never make a rank the culprit on their own.
_CONSEQUENCE = re.compile(
    r"timed out|timeout|watchdog caught|connection closed by peer|connection reset by peer"
    r"|broken pipe|communicator was aborted|remote worker|remote process|some nccl operations"
    r"|ncclremoteerror|sigterm|heartbeat monitor|store->get|recvbytes failed|sendbytes failed"
    r"|socket has failed to connect|processgroupnccl is aborted|terminating the process"
    r"|stops this rank too",
    re.IGNORECASE,
)


def classify(message: str) -> tuple[str, bool]:
    """(kind, primary) of an error message: is it a failure, or a reaction to a peer's?"""
    low = message.lower()
    if "out of memory" in low and ("cuda" in low or "outofmemory" in low or "hip" in low):
        return "cuda-oom", True
    if "received data size doesn't match expected size" in low or "op.preamble.length <= op.nbytes" in low:
        return "size-mismatch", False  # gloo: the peer sent another size: a mismatch, not a crash
    if "eaddrinuse" in low or "address already in use" in low:
        return "launcher", True
    if "dataloader worker" in low and "killed by signal" in low:
        return "dataloader-killed", True
    if "debugunderflowoverflow" in low and "inf/nan detected" in low:
        return "overflow", True
    if "illegal memory access" in low or "device-side assert" in low:
        return "cuda-error", True
    if _CONSEQUENCE.search(message):
        return ("timeout" if "time" in low else "peer-lost"), False
    if "cuda error" in low or "cublas_status" in low or "cudnn_status" in low or "cudaerror" in low:
        return "cuda-error", True
    if ("nccl error" in low or "unhandled system error" in low or "unhandled cuda error" in low
            or "ncclinternalerror" in low or "ncclsystemerror" in low or "ncclinvalidusage" in low):
        return "nccl-error", True
    return "exception", True


def time_key(text: str) -> float | None:
    """Seconds since the start of the year from a glog (``E0321 02:07:08.4``) or ISO time at
    the start of ``text``; the year is ignored (logs carry it rarely)."""
    m = _TIME_GLOG.match(text) or _TIME_ISO.match(text)
    if not m:
        return None
    try:
        secs = float(m["s"].replace(",", "."))
        md = m.groupdict().get("md")
        mo, d = (int(md[:-2]), int(md[-2:])) if md else (int(m["mo"]), int(m["d"]))
        return (((mo * 31 + d) * 24 + int(m["h"])) * 60 + int(m["mi"])) * 60 + secs
    except ValueError:
        return None


def line_prefix(line: str) -> tuple[int | None, float | None, str]:
    """(rank from the launcher prefix, time if a prefix carried one, the rest of the line);
    prefixes are stripped by ``mldebug.logprefix``, shared with ``nccl-log``."""
    rest, _label, rank, _host, _pid, when = strip_prefix(line, True)
    return rank, (time_key(when) if when else None), rest


# A rank named inside the message when no prefix gave one: "[Rank 3]", "[PG 0 Rank 3]",
# "Rank 3 is running collective", gloo's "rank=3, size=4", a dump file "host-rank3-PID".
_MSG_RANK = re.compile(r"\[(?:PG (?:ID )?0[^\]]{0,200}?)?Rank (?P<a>\d{1,7})\]|\bRank (?P<b>\d{1,7}) is running"
                       r"|\brank=(?P<c>\d{1,7}), size=|-rank(?P<d>\d{1,7})-\d+\.json"
                       r"|^mldebug\.fr: rank (?P<e>\d{1,7}) wrote ")
# World size stated by a line: WORLD_SIZE=8, world_size=8, "world size 8", gloo "size=8".
_WORLD = re.compile(r"(?:WORLD_SIZE|world_size|world size|\brank=\d{1,7}, size)\s*[=:]?\s*(?P<n>\d{1,7})\b")

# What mldebug's own hooks print (mldebug/capture/stall.py, handler.py, trace/full.py,
# fr/recorder.py, debugger/hooks.py, wait.py, numerics/detector.py).
_MLD_STALL = re.compile(r"mldebug\.capture: no beat for (?P<s>[\d.]+)s.{0,80}?: stacks in (?P<path>\S{1,4000})")
_MLD_ABORT = re.compile(r"mldebug\.capture: on_stall=dump\+abort: exiting with code (?P<code>\d{1,4})")
_MLD_TRACE = re.compile(r"mldebug\.trace: tracing into (?P<path>\S{1,4000})")
_MLD_FR = re.compile(r"mldebug\.fr: .{0,200}?(?P<path>/\S{1,4000})")
_MLD_PDB = re.compile(r"mldebug\.(?:breakpoint|ForkedPdb): ")
# torch.distributed.monitored_barrier (ProcessGroupGloo.cpp): rank 0 names the ranks that did
# not check in ("[Rank 0]: Rank 3 failed to pass monitoredBarrier in 1000 ms", "[Rank 0]: Ranks
# 1, 3 failed to pass ..."); the others, when rank 0 itself failed ("Rank 2 successfully reached
# monitoredBarrier, but received errors while waiting for send/recv from rank 0")
_MB_FAILED = re.compile(r"Ranks? (?P<ranks>\d{1,7}(?:, \d{1,7}){0,4095}) failed to pass monitoredBarrier")
_MB_FROM0 = re.compile(r"Rank (?P<r>\d{1,7}) successfully reached monitoredBarrier, but received errors")
_OVERFLOW_PEER = re.compile(r"DebugUnderflowOverflow: rank\(s\) (?P<ranks>[\d, ]{1,2000}) detected inf/nan")
_EXIT_LINE = re.compile(r"failed \(exitcode: (?P<code>-?\d{1,4})\) local_rank: (?P<rank>\d{1,7})")
_TORCH_VERSION = re.compile(r"(?:torch==|[Tt]orch version:? |PyTorch version:? )v?(?P<v>\d{1,2}\.\d{1,3}(?:\.\d{1,3})?)")
# torchrun's agent when a rank outlived SIGTERM (multiprocessing/api.py, torch 2.13)
_UNKILLABLE = re.compile(r"Unable to shutdown process (?P<pid>\d{1,10}) via \d{1,3}, forcefully exiting via 9")
# c10d's store (TCPStore.cpp, socket.cpp, torch 2.13): a wait that timed out names its keys; the
# store's server names how many clients joined when it gave up waiting for them
_STORE_WAIT_MARK = re.compile(r"(?:\S*Error: )?wait timeout after \d{1,12}ms, keys: ")
_STORE_KEY = re.compile(r"[^\s,()]{1,512}")
_STORE_JOINED = re.compile(r"waiting for clients\. (?P<k>\d{1,7})/(?P<w>\d{1,7}) clients joined")
STALL_EXIT_CODE = 54  # mldebug.capture.stall.STALL_EXIT_CODE (not imported: no torch, no capture)


def store_keys(msg: str) -> list[str]:
    """The keys a store wait's timeout names (at most 64). Ranks that fail at the same instant
    interleave their lines: one line may carry two messages ('keys: /pg/0/2torch.distributed.
    DistStoreError: wait timeout after 8000ms, keys: /pg/0/2'), so each list ends where the next
    message starts; a key ends at a space, a comma or a bracket."""
    marks = list(_STORE_WAIT_MARK.finditer(msg))
    out: list[str] = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(msg)
        for part in msg[m.end():end].split(", "):
            k = _STORE_KEY.match(part.strip())
            if k is not None and len(out) < 64:
                out.append(k.group())
    return out


def evidence_dir(path: str) -> str:
    """The directory ``mldebug hang analyze`` takes for a dump file the watchdog named."""
    parts = path.rstrip("/").split("/")
    if len(parts) >= 3 and parts[-2] in ("dumps", "faulthandler"):
        return "/".join(parts[:-2]) or "/"
    return "/".join(parts[:-1]) or path


def _user_frame(file: str, line: str, func: str) -> str | None:
    """``file:line in func`` of a frame of the user's code; None for libraries, torch and
    mldebug's own hooks (``mldebug.ours``: a rank that raised inside the NanSentinel's check
    is the user's step that called it, not sentinel.py)."""
    if not user_file(file):
        return None
    return f"{file.rsplit('/', 1)[-1]}:{line} in {func}"


@dataclass
class _Stream:
    """Traceback state of one rank (or of the unattributed stream)."""

    in_tb: bool = False
    frame: str | None = None
    any_frame: str | None = None
    foreign: int = 0  # lines of other output read since the traceback's last frame
    mixed: bool = False  # other output came between this traceback's lines
    api: str | None = None  # the first torch.distributed frame below the last user frame
    stack: list[str] = field(default_factory=list)  # user frames, outermost first (capped)
    last: Event | None = None  # the event its last traceback ended in
    original: Event | None = None  # a DataLoader worker's "Original Traceback" refines this event
    thread: str | None = None  # the traceback is a thread's (its name, or "" when unnamed)
    thread_next: str | None = None  # "Exception in thread NAME:" names the next traceback's


@dataclass
class LogParser:
    """Feed lines with ``feed``; read the result from ``parsed``."""

    parsed: ParsedLogs = field(default_factory=ParsedLogs)
    _streams: dict[int | None, _Stream] = field(default_factory=dict)
    _table: LauncherFailure | None = None
    _in_table: bool = False
    _root_section: bool = False
    _last_time: dict[int | None, float] = field(default_factory=dict)
    _open_tb: int = 0
    _context_lines: int = 0
    _file_rank: int | None = None
    nuls: list[int] = field(default_factory=lambda: [0, 0])  # NUL bytes dropped, line of the first
    _ranks_unsaturated: bool = False  # this source's last rank sample may have missed ranks
    prefilter: bool = True  # False: parse every line (the reference the prefilter is tested against)

    def feed_source(self, lines: Iterable[str], source: str, file_rank: int | None = None) -> None:
        """Every line of one input; ``file_rank`` is the rank a per-rank file belongs to."""
        self.start_source(source, file_rank)
        data = "\n".join(s.rstrip("\r\n") for s in lines).encode("utf-8", "replace")
        if data:
            self.feed_chunk(data + b"\n", source, file_rank)
        self._flush_table()

    def feed_chunk(self, chunk: bytes, source: str, file_rank: int | None = None,
                   first_line: int = 1) -> int:
        """Lines ``chunk`` holds (whole lines, ending in a newline but for the last chunk), read
        through the prefilter: only lines that hold one of the ``PREFILTER`` words are decoded
        and parsed, plus every line while a traceback or the launcher's table is open. Returns
        the number of lines in the chunk (``first_line`` is the number of its first)."""
        p = self.parsed
        n = chunk.count(b"\n")
        if chunk and not chunk.endswith(b"\n"):
            n += 1
        p.lines += n
        self.sample_ranks(chunk)
        if not self.prefilter:
            starts: list[int] = []
            pos = 0
            while pos < len(chunk):
                starts.append(pos)
                nl = chunk.find(b"\n", pos)
                pos = len(chunk) if nl < 0 else nl + 1
        else:
            found: set[int] = set()
            rfind = chunk.rfind
            for rx in prefilter_patterns():
                for m in rx.finditer(chunk):
                    found.add(rfind(b"\n", 0, m.start()) + 1)
            starts = sorted(found)
        done = 0  # bytes of the chunk already parsed
        line_no, counted = first_line, 0
        find, count = chunk.find, chunk.count
        for start in starts:
            if start < done:
                continue
            pos = start
            line_no += count(b"\n", counted, pos)
            counted = pos
            while True:
                nl = find(b"\n", pos)
                end = len(chunk) if nl < 0 else nl
                self.line_bytes(chunk[pos:min(end, pos + MAX_LINE)], line_no, source, file_rank)
                pos = end + 1
                if nl < 0 or not self.needs_context:
                    self._context_lines = 0
                    break
                line_no += 1
                counted = pos
                if not self.context_step():
                    break
            done = pos
        return n

    def line_bytes(self, raw: bytes, line_no: int, source: str, file_rank: int | None) -> None:
        """One line as read from the file (its number counts from 1 in ``source``)."""
        if b"\x00" in raw:  # a crashed node's unwritten block glued to a line: damage, dropped
            if not self.nuls[0]:
                self.nuls[1] = line_no
            self.nuls[0] += raw.count(b"\x00")
            raw = raw.replace(b"\x00", b"")
        self.line(raw[:MAX_LINE].decode("utf-8", "replace"), f"{source}:{line_no}", file_rank)

    def count_lines(self, n: int) -> None:
        self.parsed.lines += n

    def end_window(self) -> None:
        self._context_lines = 0

    def context_step(self) -> bool:
        """One more line read inside a window; False (and the window closed) past MAX_CONTEXT."""
        self._context_lines += 1
        if self._context_lines > MAX_CONTEXT:  # a traceback never closed: give up on it
            self.close_streams()
            self._context_lines = 0
            return False
        return True

    def sample_ranks(self, chunk: bytes, whole: bool | None = None) -> None:
        """Ranks from the launcher prefixes of the first MiB of each chunk: a rank that printed
        only lines the prefilter skips still counts as present (not silent). ``whole``: the
        sample is the whole of its part of the file (default: unless the chunk was cut). A
        cut sample still finding new ranks in its second half (a log of 1,000,001 ranks: each
        line a new one) has missed some: the count becomes a lower bound (``ranks_lower_bound``)."""
        if self._file_rank is not None:
            return
        head = chunk[:RANK_SAMPLE]
        ranks = self.parsed.ranks
        if len(ranks) >= MAX_SAMPLED_RANKS:  # the memory bound: more may be there, unsampled
            self._ranks_unsaturated = self._ranks_unsaturated or b"\n[" in head
            return
        last_new = -1
        for m in _RANK_SAMPLE.finditer(head):
            r = int(m[1] or m[2] or m[3])
            if r not in ranks:
                self.parsed.rank(r)
                last_new = m.start()
        cut = not whole if whole is not None else len(chunk) > len(head)
        self._ranks_unsaturated = cut and last_new > len(head) // 2

    def start_source(self, source: str, file_rank: int | None) -> None:
        self.parsed.sources.append(source)
        self._streams.clear()
        self._open_tb = 0
        self._context_lines = 0
        self._file_rank = file_rank
        self.nuls = [0, 0]
        self._ranks_unsaturated = False
        if file_rank is not None:  # an empty per-rank file still says the rank existed
            self.parsed.rank(file_rank)

    def end_source(self) -> None:
        self._flush_table()
        self.parsed.ranks_lower_bound = self.parsed.ranks_lower_bound or self._ranks_unsaturated
        count, line = self.nuls
        if count:
            self.parsed.notes.append(f"{self.parsed.sources[-1]}: {count} NUL byte{'s' * (count != 1)}"
                                     f" at line {line} (a crashed node's unwritten blocks?) skipped")

    def feed(self, raw: str, where: str, file_rank: int | None = None) -> None:
        p = self.parsed
        p.lines += 1
        self.line(raw, where, file_rank)

    def line(self, raw: str, where: str, file_rank: int | None = None) -> None:
        """One line (already counted in ``parsed.lines``)."""
        p = self.parsed
        if len(raw) > MAX_LINE:
            raw = raw[:MAX_LINE]
        raw = raw.rstrip("\r\n")
        if "\r" in raw:  # a progress bar redrawn with \r: what follows the last one is the line
            raw = raw.rpartition("\r")[2]
        if self._in_table and _TABLE_ENTRY.match(raw.strip()):  # "[0]:" is no rank prefix here
            self._table_line(raw)
            return
        text, _label, rank, host, _pid, tprefix = strip_prefix(raw, True)
        glued = text.rfind("]:", 6)
        if glued > 0 and text.find("[", 1, glued) > 0:
            rest = _unglue(text)  # another rank's line glued behind this one's prompt
            if rest is not text:
                text, _label, rank, host, _pid, tprefix = strip_prefix(rest, True)
        when = time_key(tprefix) if tprefix else None
        if rank is None:
            rank = file_rank
        if rank is None and "ank" in text:
            m = _MSG_RANK.search(text)
            if m is not None:
                rank = int(m["a"] or m["b"] or m["c"] or m["d"] or m["e"])
        stripped = text.lstrip()
        if when is None and stripped[:1] in "[EWIFD" and len(stripped) > 12:
            when = time_key(stripped)
        if when is not None:
            self._last_time[rank] = when
        if rank is not None:
            st = p.rank(rank)
            st.lines += 1
            if host is not None and st.host is None:
                st.host = host[:200]

        if "is running collective" in text:
            self._fingerprints(text)
        if "monitoredBarrier" in text:
            self._monitored(text)
        # torchrun's ChildFailedError table (printed by the launcher, no rank prefix).
        if self._table_line(text):
            return
        stream = self._streams.get(rank)
        if stream is None:
            stream = self._streams[rank] = _Stream()
        original = None
        if stripped.startswith("Original Traceback") and not stream.in_tb \
                and stream.last is not None and "Caught " in stream.last.message:
            original = stream.last  # the worker's own traceback, re-raised by the DataLoader
        if stripped.startswith("Exception in thread ") and not stream.in_tb:
            stream.thread_next = stripped[20:].rstrip(":")[:100]  # Python's own thread hook
            return
        if original is not None or stripped.startswith(_TB_START):
            if not stream.in_tb:
                self._open_tb += 1
            stream.original = original
            stream.thread, stream.thread_next = stream.thread_next, None
            stream.in_tb, stream.frame, stream.any_frame = True, None, None
            stream.foreign, stream.mixed, stream.api = 0, False, None
            stream.stack.clear()
            return
        if stream.in_tb:
            m = _TB_FILE.match(text)
            if m:
                uf = _user_frame(m["file"], m["line"], m["func"])
                stream.any_frame = f"{m['file'].rsplit('/', 1)[-1]}:{m['line']} in {m['func']}"
                if uf:
                    stream.frame, stream.api = uf, None
                    if len(stream.stack) >= MAX_STACK:
                        del stream.stack[0]
                    stream.stack.append(uf)
                elif stream.api is None and m["file"].endswith("distributed_c10d.py"):
                    stream.api = m["func"]  # the collective the user frame called
                elif m["func"] == "_bootstrap_inner" and stream.thread is None:
                    stream.thread = ""  # threading.py: a thread's exception (its hook printed it)
                stream.foreign = 0
                return
            if text.startswith((" ", "\t")) or not text.strip():
                return
            if text.startswith(("During handling", "The above exception")):
                return
            m = _EXC_LINE.match(text)
            if (m is None or (stream.mixed and not _EXC_CLASS.search(m["type"]))) \
                    and stream.foreign < MAX_FOREIGN:
                # the same rank's other output between the traceback's lines (its stdout and
                # stderr in one log: a report printed while the exception propagates); read
                # it as any line, and keep the traceback open for its last line
                stream.foreign += 1
                stream.mixed = True
                self._scan(rank, text, where, when)
                return
            stream.in_tb = False
            self._open_tb -= 1
            name = m["type"].rsplit(".", 1)[-1] if m else ""
            if m and (m["msg"] is not None or name[:1].isupper()):
                if m["type"].endswith("ChildFailedError"):
                    return  # the launcher's own traceback; its table follows
                msg = f"{name}: {m['msg'] or ''}".strip().rstrip(":")
                if stream.thread is not None:
                    msg += f" (in thread {stream.thread})" if stream.thread else " (in a thread)"
                    stream.thread = None
                outer, stream.original = stream.original, None
                if outer is not None:  # the DataLoader worker's own error and frame
                    wrapper = outer.message.partition(" in ")[2].rstrip(".")
                    outer.message = sanitize(_SRC_TAG.sub("", msg), limit=400)[:400] + (
                        f" (in {wrapper})" if wrapper else "")
                    outer.frame = stream.frame or stream.any_frame or outer.frame
                    outer.source = where
                    return
                stream.last = self._event(rank, msg, where, when, stream.frame or stream.any_frame,
                                          api=stream.api, stack=tuple(stream.stack))
                if m["msg"]:
                    self._mldebug_lines(rank, m["msg"], where, when)
                return
        self._scan(rank, text, where, when)

    @property
    def needs_context(self) -> bool:
        """A traceback or the launcher's table is open: the next lines must all be read."""
        return self._open_tb > 0 or self._in_table

    def close_streams(self) -> None:
        """Forget open tracebacks (the prefilter gave up waiting for their last line)."""
        for stream in self._streams.values():
            stream.in_tb = False
        self._open_tb = 0

    # -- single lines ------------------------------------------------------------------
    def _scan(self, rank: int | None, text: str, where: str, when: float | None) -> None:
        p = self.parsed
        if "NCCL WARN" in text or (" WARN " in text and "NCCL" not in text and ".cc:" in text):
            self._nccl_warn(rank, text)
            return
        if "Watchdog" in text or "NCCL work" in text or "watchdog" in text:
            if self._watchdog(rank, text, where, when):
                return
        if "xiting via" in text:
            u = _UNKILLABLE.search(text)
            if u is not None and len(p.unkillable) < 4096:
                p.unkillable.add(int(u["pid"]))
            return
        if text.strip() == "Killed":
            self._event(rank, "Killed (SIGKILL from the kernel or the scheduler)", where, when,
                        None, kind="killed")
            return
        if "size" in text or "SIZE" in text:
            w = _WORLD.search(text)
            if w is not None:
                n = int(w["n"])
                if 0 < n <= 1 << 20 and n > (p.world_hint or 0):
                    p.world_hint = n
        if rank is not None and ("alidat" in text or "valuat" in text or "heckpoint" in text
                                 or "StopIteration" in text or "end of " in text):
            ph = _PHASE.search(text)
            if ph is not None:
                p.rank(rank).phase = (PHASES.get(ph["p"].lower(), ph["p"].lower()), text.strip()[:200])
        if "orch" in text:
            v = _TORCH_VERSION.search(text)
            if v is not None and p.torch_version is None:
                p.torch_version = v["v"]
        if "mldebug" in text or "DebugUnderflowOverflow" in text:
            if self._mldebug_lines(rank, text, where, when):
                return
        if "xitcode" in text and "local" in text and "failed (exitcode:" not in text:
            fm = _TABLE_FLAT.search(text)
            if fm is not None:
                self._flush_table()
                self.parsed.launcher.append(LauncherFailure(
                    rank=int(fm["rank"]), exitcode=int(fm["code"]),
                    pid=int(fm["pid"]) if fm["pid"] else None, root=self._root_section))
                st = p.rank(int(fm["rank"]))
                st.exitcode = int(fm["code"])
                st.pid = st.pid or (int(fm["pid"]) if fm["pid"] else None)
                return
        if "failed (exitcode:" in text:
            m = _EXIT_LINE.search(text)
            if m is not None:  # torchrun's one-line summary; the table, when there, says the same
                st = p.rank(int(m["rank"]))
                if st.exitcode is None:
                    st.exitcode = int(m["code"])
            return
        low = text.lower()
        if ("received data size doesn't match" in low or "op.preamble.length <= op.nbytes" in low
                or ("error" in low or "exception" in low) and (
                "cuda out of memory" in low or "cuda error" in low
                or "terminated with exception" in low or "nccl error" in low
                or "received data size doesn't match" in low or "eaddrinuse" in low)):
            msg = text.strip()
            cut = msg.find("] ")
            if msg.startswith("[") and 0 < cut < 200:
                msg = msg[cut + 2:]
            self._event(rank, msg, where, when, None)

    def _mldebug_lines(self, rank: int | None, text: str, where: str, when: float | None) -> bool:
        """Lines of mldebug's own hooks: point to the command that reads their evidence."""
        p = self.parsed
        m = _MLD_STALL.search(text)
        if m is not None:
            if rank is None:
                rm = _MSG_RANK.search(m["path"])
                rank = int(rm["d"]) if rm and rm["d"] else None
            d = evidence_dir(m["path"])
            self._evidence(rank, f"mldebug hang analyze {d}")
            self._event(rank, f"mldebug watchdog: no beat for {m['s']}s, stacks in {m['path']}"[:500],
                        where, when, None, kind="stall", primary=True)
            return True
        m = _MLD_ABORT.search(text)
        if m is not None:
            if rank is not None:
                st = p.rank(rank)
                st.exitcode = st.exitcode if st.exitcode is not None else int(m["code"])
            return True
        m = _MLD_TRACE.search(text)
        if m is not None:
            self._evidence(rank, f"mldebug trace show {m['path'].rsplit('/', 1)[0] or '/'}")
            return True
        m = _MLD_FR.search(text)
        if m is not None and "mldebug.fr:" in text:
            self._evidence(rank, f"mldebug fr analyze {m['path'].rstrip('.,;')}")
            return True
        if _MLD_PDB.search(text):
            if len(p.notes) < 20:
                p.notes.append(f"{where}: {text.strip()[:300]}")
            return True
        m = _OVERFLOW_PEER.search(text)
        if m is not None:
            for r in m["ranks"].replace(" ", "").split(","):
                if r.isdecimal() and len(p.named_by_peers) < 4096:
                    p.named_by_peers[int(r)] = p.named_by_peers.get(int(r), 0) + 1
            return False
        return False

    def _monitored(self, text: str) -> None:
        """monitored_barrier's verdict: rank 0 names the ranks that did not arrive (``by_rank0``);
        a rank that did arrive but heard errors from rank 0 points at rank 0 (``from_peers``)."""
        mb = self.parsed.monitored
        m = _MB_FAILED.search(text)
        if m is not None:
            for r in m["ranks"].split(", "):
                if len(mb.by_rank0) < 4096:
                    mb.by_rank0[int(r)] = mb.by_rank0.get(int(r), 0) + 1
            return
        m = _MB_FROM0.search(text)
        if m is not None and len(mb.reporters) < 4096:
            mb.reporters.add(int(m["r"]))

    def _fingerprints(self, text: str) -> None:
        """Each rank's collective fingerprint named by a DETAIL mismatch message (any rank may
        print it; the ranks it names are what count)."""
        fps = self.parsed.fingerprints
        for m in _FP.finditer(text):
            fields = {a or c: b or d for a, b, c, d in _FP_FIELD.findall(m["fp"])}
            seq = fields.get("SequenceNumber", "?")
            key = ", ".join(f"{k}={fields[k]}" for k in ("OpType", "TensorShape", "TensorDtypes") if k in fields)
            at = fps.get(seq)
            if at is None:
                if len(fps) >= 1000:
                    continue
                at = fps[seq] = {}
            if len(at) < 1 << 16:
                at[int(m["rank"])] = key or m["fp"][:200]

    def _evidence(self, rank: int | None, command: str) -> None:
        ev = self.parsed.evidence
        if command not in ev and len(ev) < 50:
            ev[command] = []
        ranks = ev.get(command)
        if ranks is not None and rank is not None and rank not in ranks and len(ranks) < 4096:
            ranks.append(rank)

    def _watchdog(self, rank: int | None, text: str, where: str, when: float | None) -> bool:
        m = _PG_RANK.search(text)
        pg = m["pg"] if m else "0"
        if m is None:
            m = _RANK_ONLY.search(text)
        msg_rank = int(m["rank"]) if m else None
        r = rank if rank is not None else (msg_rank if pg == "0" else None)
        if _WD_TIMEOUT.search(text):
            seq = _SEQ.search(text)
            op = _OP.search(text)
            tmo = _TMO.search(text)
            if r is not None:
                numel = _NUMEL.search(text)
                self.parsed.rank(r).timeouts.append(WatchdogTimeout(
                    pg, int(seq.group(1)) if seq else None, op.group(1) if op else None,
                    int(tmo.group(1)) if tmo else None, self.parsed.lines,
                    int(numel.group(1)) if numel else None))
            what = f"collective timeout in {op.group(1) if op else 'a collective'}"
            if seq:
                what += f" #{seq.group(1)}"
            self._event(r, what, where, when, None, kind="timeout", primary=False)
            return True
        e = _ENQ.search(text)
        if e and r is not None:
            st = self.parsed.rank(r)
            st.enqueued[pg] = int(e["enq"])
            st.completed[pg] = int(e["comp"])
            if "Timeout at" in text or "detected by watchdog" in text:
                self._event(r, f"watchdog: timeout or error at NCCL work {e['comp']}+1 (process group {pg})",
                            where, when, None, kind="timeout", primary=False)
            return True
        return False

    def _nccl_warn(self, rank: int | None, text: str) -> None:
        p = self.parsed
        p.nccl_warn_lines += 1
        if rank is not None:
            p.rank(rank).nccl_warns += 1
        i = text.find("WARN ")
        msg = _NUMBERS.sub("N", text[i + 5:].strip())[:300]
        ranks = p.nccl_warns.get(msg)
        if ranks is None:
            if len(p.nccl_warns) >= MAX_WARN_GROUPS:
                return
            ranks = p.nccl_warns[msg] = []
        if rank is not None and len(ranks) < MAX_WARN_RANKS:
            ranks.append(rank)

    def _event(self, rank: int | None, msg: str, where: str, when: float | None,
               frame: str | None, *, kind: str | None = None, primary: bool | None = None,
               api: str | None = None, stack: tuple[str, ...] = ()) -> Event:
        p = self.parsed
        if "gloo" in msg:
            p.backends.add("gloo")
        elif "NCCL" in msg or "nccl" in msg:
            p.backends.add("nccl")
        k, prim = classify(msg)
        msg = sanitize(_SRC_TAG.sub("", msg), limit=500)  # outside text: controls shown escaped
        ev = Event(kind or k, msg[:500], self.parsed.lines, where,
                   when if when is not None else self._last_time.get(rank), frame,
                   prim if primary is None else primary, api, stack)
        if "Dist" in msg or "Rendezvous" in msg or "clients joined" in msg:
            _store_facts(p.store, rank, ev)
        if rank is None:
            if msg.startswith("SignalException") and p.terminated is None:
                p.terminated = ev  # the launcher itself was signalled (the scheduler, a user)
            if len(p.launcher_events) < 1000:
                p.launcher_events.append(ev)
        else:
            p.rank(rank).add(ev)
        return ev

    # -- torchrun's failure table -------------------------------------------------------
    def _table_line(self, text: str) -> bool:
        s = text.strip()
        if s.startswith("Failures:"):
            self._in_table, self._root_section = True, False
            return True
        if s.startswith("Root Cause (first observed failure)"):
            self._flush_table()
            self._in_table, self._root_section = True, True
            return True
        if not self._in_table:
            return False
        if _TABLE_ENTRY.match(s):
            self._flush_table()
            self._table = LauncherFailure(rank=-1, root=self._root_section)
            return True
        m = _TABLE_FIELD.match(text)
        if m and self._table is not None:
            key, val = m["key"], m["val"].strip()
            t = self._table
            if key == "rank":
                rm = _TABLE_RANK.match(val)
                t.rank = int(rm["rank"]) if rm else -1
            elif key == "exitcode":
                em = _TABLE_EXIT.match(val)
                if em:
                    t.exitcode = int(em["code"])
                    t.pid = int(em["pid"]) if em["pid"] else None
            elif key == "host":
                t.host = val[:200]
            elif key == "time":
                t.time = val[:40]
            elif key == "traceback":
                t.message = val[:300]
            return True
        if s.startswith(("---", "===", "<NO_OTHER_FAILURES>")):
            if s.startswith("===") and self._root_section:
                self._flush_table()
                self._in_table = False
            return True
        self._flush_table()
        self._in_table = False
        return False

    def _flush_table(self) -> None:
        t = self._table
        self._table = None
        if t is None or t.rank < 0:
            return
        self.parsed.launcher.append(t)
        st = self.parsed.rank(t.rank)
        st.exitcode = t.exitcode
        st.exit_time = t.time
        st.host = st.host or t.host
        st.pid = st.pid or t.pid


def _unglue(raw: str) -> str:
    """A rank's output with no newline at its end (an ``input()`` prompt, a progress bar) glues
    the next rank's line onto it: ``Overwrite? [y/N] [rank0]: Traceback ...``. The line is what
    follows the last launcher prefix ``[rankN]:`` / ``[defaultN]:`` inside it."""
    for tag in ("[rank", "[default"):
        i = raw.rfind(tag, 1)
        while i > 0:
            j = i + len(tag)
            k = j
            while k < len(raw) and raw[k].isdigit() and k - j < 8:
                k += 1
            if k > j and raw.startswith("]:", k) and raw[i - 1] in " \t]:":
                return raw[i:]
            i = raw.rfind(tag, 1, i)
    return raw


def _store_facts(store: StoreFacts, rank: int | None, ev: Event) -> None:
    """What a store or rendezvous error says: the keys a rank waited for, how many clients the
    store's server saw join."""
    msg = ev.message
    if len(store.errors) < 1000:
        store.errors.append(ev)
    for key in store_keys(msg):
        who = store.waits.get(key)
        if who is None:
            if len(store.waits) >= 4096:
                continue
            who = store.waits[key] = set()
        if len(who) < 4096:
            who.add(rank)
    j = _STORE_JOINED.search(msg)
    if j is not None and store.joined is None:
        store.joined = (int(j["k"]), int(j["w"]))


def parse_lines(lines: Iterable[str], source: str = "<text>", file_rank: int | None = None) -> ParsedLogs:
    """Parse one input (a convenience for tests and pasted text)."""
    parser = LogParser()
    parser.feed_source(lines, source, file_rank)
    return parser.parsed
