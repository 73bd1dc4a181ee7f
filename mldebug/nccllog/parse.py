"""Read NCCL_DEBUG=INFO output, line by line, into ``ParsedLog``s (the only I/O of nccl-log).

Line shapes NCCL has printed (src/debug.cc over the years), after any launcher or logger
prefix (``mldebug.logprefix``)::

    host:pid:tid [cudaDev] NCCL INFO <message>
    host:pid:tid [cudaDev] file.cc:123 NCCL WARN <message>
    host:pid:tid [cudaDev] file.cc:123 (func) NCCL WARN <message>            (with function)
    host:pid:tid [0] INFO NET : Using interface ...                           (2.3/2.4: no NCCL)
    host:pid:tid [0] include/socket.h:311 WARN ...                            (old: no NCCL)
    host:XXXX [5] ibvwrap.c:262 NCCL WARN ...      pod-id:num:num [3] ...     (redacted ids)
    [3] include/shm.h:28 NCCL WARN ...   include/shm.h:28 NCCL WARN ...       (no host:pid:tid)
    NCCL version 2.7.8+cuda11.1                                               (bare version)

Any other line containing ``NCCL WARN``/``NCCL INFO`` is still counted and its WARN kept.
Some failure texts are looked for in every line (PyTorch's ``unhandled system error``,
NCCL's ``Last error:`` text): see ``SIGNALS``.

PyTorch's wrappers of an NCCL failure (c10d ProcessGroupNCCL.cpp / NCCLUtils.hpp), often the
only thing pasted::

    torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/.../ProcessGroupNCCL.cpp:1970,
        internal error - please report this issue to the NCCL developers, NCCL version 2.19.3
    ncclInternalError: Internal check failed.
    Last error:
    socketStartConnect: Connect to 10.0.0.2<45678> failed : Software caused connection abort

``Last error:`` carries ncclGetLastError(), the text of NCCL's last WARN: on the next line
(torch's own layout) or on the same line (flattened logs, issue titles). It becomes a WARN of
a traceback process (``ParsedLog.tracebacks``, one per launcher rank, origin
``FROM_TRACEBACK``, not one of the NCCL processes) with the wrapper's NCCL version, and goes
through the same rules and catalogue as a WARN line; the failure signals of the same
traceback take it as the WARN before them.

Reading is streamed and bounded: lines are cut at ``MAX_LINE`` bytes and a file is read up
to ``max_bytes``; every regular expression is anchored and free of nested repetition.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from mldebug.errors import UsageError
from mldebug.logprefix import split_prefix
from mldebug.nccllog import diag, ras
from mldebug.nccllog.model import (
    FROM_TRACEBACK,
    MAX_NETS,
    MAX_SIGNAL_EXAMPLES,
    CommInit,
    NetChoice,
    ParsedLog,
    ProcessLog,
    Signal,
    normalise,
)
from mldebug.nccllog.versions import MAX_GPUS, gpu_from_line
from mldebug.text import CONTROL_BYTES, drop_nuls

MAX_LINE = 64 << 10
BINARY_PROBE = 64 << 10  # NUL bytes or a compression magic in the first 64 KiB: not a text log
MAX_BYTES = 16 << 30
MAX_NRANKS = 1 << 22  # a communicator size beyond this is not believed
UNKNOWN_HOST = "(no host in line)"

HEAD = re.compile(
    r"(?:(?P<id>[^\s\[\]]{1,256}) )?\[(?P<dev>\d{1,9})\] "
    r"(?:\d{1,12}\.\d{1,9} )?"
    r"(?:(?P<src>[\w./+-]{1,200}:\d{1,6})(?: \([^)\s]{1,100}\))? )?"
    r"(?:NCCL )?(?P<level>INFO|WARN|TRACE|CALL|ABORT)\b ?(?P<msg>.*)", re.S)
NOHEAD = re.compile(
    r"(?P<src>[\w./+-]{1,200}\.(?:cc|cu|h|c|cpp|hpp):\d{1,6})(?: \([^)\s]{1,100}\))? "
    r"(?:NCCL )?(?P<level>WARN|INFO)\b ?(?P<msg>.*)", re.S)
OLD_SRC = re.compile(r"[\w./+-]{1,200}\.(?:cc|cu|h|c|cpp|hpp):\d{1,6}")
VERSION = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+\S{0,40})")
NET = re.compile(r"NET/(?!Plugin\b)(?P<plugin>[\w.-]{1,40}) ?: Using (?P<rest>.*)", re.S)
OLD_NET_IF = re.compile(r"NET : Using interface (?P<item>\S{1,200})")
OLD_IB = re.compile(r"NET/IB: \[\d+\] (?P<item>\S{1,200})")
BOOTSTRAP = re.compile(r"Bootstrap ?: Using (?P<rest>.*)", re.S)
USING_NETWORK = re.compile(r"Using (?:internal )?[Nn]etwork (?P<name>[\w.-]{1,60})")
ENVSET = re.compile(r"(?P<var>[A-Z][A-Z0-9_]{1,60}) set by environment to (?P<value>.{0,500})")
INIT = re.compile(r"comm (?P<comm>0x[0-9a-fA-F]{1,16}) rank (?P<rank>\d{1,9}) "
                  r"nranks (?P<nranks>\d{1,9})")
COMMID = re.compile(r"commId (?P<id>0x[0-9a-fA-F]{1,16})")
COLL = re.compile(r"(?P<op>[A-Za-z]{1,40}): opCount (?P<opc>[0-9a-fA-F]{1,16}) ")
ITEM = re.compile(r"\[\d{1,4}\]=?\{?\s?(?P<item>[^\s\[;,{}=]{1,200})")
DRIVER = re.compile(r"cudaDriverVersion (?P<v>\d{1,9})")
PLUGIN_PATH = re.compile(r"Plugin Path : (?P<path>\S{1,400})")
P2P_PLUGIN = re.compile(r"P2P plugin (?P<name>\S{1,100})")
MTU = re.compile(r"NET/IB ?: Dev \d{1,4} Port \d{1,4} qpn \d{1,12} mtu (?P<mtu>\d{1,6})")
LOADED_PLUGIN = re.compile(r"NET/Plugin ?: Loaded (?:net|coll) plugin (?P<name>.{1,100})")
# torch's wrappers: 'NCCL error in: FILE:LINE, <reason>, NCCL version X.Y.Z', then
# 'ncclXxxError: <what the code means>', then 'Last error:' and NCCL's WARN text
TORCH_ERROR_IN = "NCCL error in: "
TORCH_VERSION = re.compile(r", NCCL version (?P<v>\d{1,3}\.\d{1,3}\.\d{1,4})")
NCCL_RESULT = re.compile(r"\bnccl(?:InternalError|SystemError|RemoteError|UnhandledCudaError|"
                         r"InvalidUsage|InvalidArgument)\b")
LAST_ERROR = "Last error:"
TORCH_WINDOW = 8  # a 'Last error:' this many lines after a wrapper line belongs to it
MAX_REAL_WARNS = 4096  # WARN kinds of NCCL's own lines remembered per file (bounded)

# kind -> texts that mean it, looked for in every line (NCCL's or the application's).
SIGNALS: dict[str, tuple[str, ...]] = {
    "unhandled system error": ("unhandled system error", "ncclSystemError"),
    "unhandled cuda error": ("unhandled cuda error", "ncclUnhandledCudaError"),
    "internal error": ("internal error - please report", "ncclInternalError"),
    "invalid usage": ("invalid usage", "ncclInvalidUsage"),
    "remote error": ("ncclRemoteError", "remote process exiting prematurely"),
    "no interface": ("is neither AF_INET(2) nor AF_INET6(10)",
                     "Socket creation failed : Address family not supported",
                     "no socket interface found", "No socket interface found"),
    "cuda driver too old": ("CUDA driver version is insufficient",),
    "no kernel for gpu": ("no kernel image is available", "named symbol not found",
                          "maxSharedMem", "unknown compute capability"),
    # PyTorch's ProcessGroupNCCL watchdog, not NCCL itself: `mldebug log` reads these
    "torch watchdog": ("Watchdog caught collective operation timeout", "last enqueued NCCL work"),
}
_NEEDLES = [(kind, needle) for kind, needles in SIGNALS.items() for needle in needles]
# the SIGNALS texts that NCCL itself prints at INFO level (2.25: 'NCCL INFO ncclMaxSharedMem
# 82240 exceeds device/fn maxSharedMem 79856'); other INFO lines are not scanned
INFO_NEEDLES = ("maxSharedMem", "rror")


# the time a line's prefix carries: NCCL_DEBUG_TIMESTAMP_FORMAT (2.26+, default '[%F %T] ',
# on WARN lines by default; '%Nf' adds N digits of subseconds) or a logger's
TIME_TEXT = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?|"
                       r"\b\d\d:\d\d:\d\d(?:[.,]\d{1,9})?\b|\b\d{10}(?:\.\d{1,9})?\b")
DEV_FIELD = re.compile(r" \[\d{1,9}\] ")  # ' [cudaDev] ' after host:pid:tid
MAX_TIME_PREFIX = 128
MAX_RAS_LINES = 256

# INFO lines that say what NCCL was setting up (the context of a WARN that follows):
# not the '<file>:<line> -> <code>' unwinding lines nor the per-collective lines.
_UNWIND = re.compile(r"[\w./+-]{1,200}:\d{1,6} -> ")
MAX_CONTEXT = 300


def _iface_name(item: str) -> str:
    return item.split(":", 1)[0].split("<", 1)[0].split("/", 1)[0]


class _Parser:
    """Feeds lines into one ``ParsedLog``; keeps the little state between lines."""

    def __init__(self, source: str, split: re.Pattern[str] | None) -> None:
        self.log = ParsedLog(source)
        self.split = split
        self.slice_no = 0
        self.last_warn: str | None = None
        self.last_warn_origin: str | None = None
        self.last_proc: ProcessLog | None = None
        # torch's NCCL error wrapper: line number of the last one, its NCCL version, and the
        # prefix of a 'Last error:' whose text is on the next line
        self.wrapper_at = -(1 << 30)
        self.wrapper_version: str | None = None
        self.pending_last: str | None = None
        self.pending_left = 0
        self.real_warns: set[str] = set()
        self.ras_text: ras.RasText | None = None

    def feed(self, raw: str) -> None:
        log = self.log
        log.lines += 1
        line = raw.rstrip("\r\n")
        if len(line) > MAX_LINE:
            line = line[:MAX_LINE]
            log.long_lines += 1
        if self.split is not None and self.split.search(line):
            self.slice_no += 1
        if self.pending_last is not None:
            self._last_error_next(line)
        if "rror" in line or "ncclInvalid" in line:
            self._torch(line)
        if "NCCL" not in line and "WARN" not in line and "INFO" not in line:
            self._scan(line)
            return
        label: str | None = None
        rest = line
        when: str | None = None
        m = HEAD.match(line)  # the common case: no prefix at all
        if m is None:
            label, rest = split_prefix(line)
            m = HEAD.match(rest) or NOHEAD.match(rest)
            if m is None:  # a custom NCCL_DEBUG_TIMESTAMP_FORMAT: '<time> host:pid:tid [0] ...'
                m, when = _custom_time(rest)
            elif len(rest) < len(line):
                t = TIME_TEXT.search(line, 0, min(len(line) - len(rest), MAX_TIME_PREFIX))
                when = t[0] if t else None
        # NCCL's own INFO lines carry none of the failure texts but the shared-memory one:
        # they skip the scan (most lines of a log)
        if m is None or m["level"] != "INFO" or any(n in line for n in INFO_NEEDLES):
            self._scan(line)
        if m is None:
            v = VERSION.match(rest)
            if v is not None:  # NCCL <= 2.8 printed it bare, right after rank 0's NET lines
                if v["v"] not in log.bare_versions and len(log.bare_versions) < 16:
                    log.bare_versions.append(v["v"])
                if self.last_proc is not None and self.last_proc.version is None:
                    self.last_proc.version = v["v"]
                return
            if diag.NEEDLE in rest:  # NCCL 2.31 diagnostics: '<host>:<pid> NCCL DIAG ...'
                if len(log.diag) < diag.MAX_LINES and (d := diag.read_line(rest)) is not None:
                    log.diag.append(d)
                return
            self._catch_all(line)
            return
        log.nccl_lines += 1
        proc = self.last_proc = self._process(m.groupdict().get("id"), m.groupdict().get("dev"))
        if when is not None:
            proc.first_time = proc.first_time or when
            proc.last_time = when
        if label is not None and label.isdecimal():
            proc.launcher_rank = int(label)
        msg = m["msg"].strip()
        if m["level"] == "WARN":
            proc.add_warn(msg, m["src"], proc.last_info)
            self.last_warn = msg
            self.last_warn_origin = None
            if len(self.real_warns) < MAX_REAL_WARNS:
                self.real_warns.add(normalise(msg))
        elif _parse_info(proc, msg, self.slice_no):
            proc.last_info = msg if len(msg) <= MAX_CONTEXT else msg[:MAX_CONTEXT]

    # ---------------------------------------------------------------- torch's wrappers
    def _torch(self, line: str) -> None:
        at = line.find(TORCH_ERROR_IN)
        if at >= 0 or NCCL_RESULT.search(line):
            self.wrapper_at = self.log.lines
            if at >= 0:
                v = TORCH_VERSION.search(line, at)
                self.wrapper_version = v["v"] if v else None
        at = line.find(LAST_ERROR)
        if at < 0:
            return
        head = line[:at]
        if head.strip() and self.log.lines - self.wrapper_at > TORCH_WINDOW \
                and "NCCL" not in head and not split_prefix(line)[1].startswith(LAST_ERROR):
            return  # some other program's 'Last error:'
        text = line[at + len(LAST_ERROR):].strip()
        label = head.rsplit(None, 1)[-1] if head.strip() else ""
        if label and text.startswith(label + " "):  # flattened: '10: Last error: 10: <text>'
            text = text[len(label):].strip()
        if text:
            self._traceback_warn(line, text)
        else:
            self.pending_last, self.pending_left = head, 2

    def _last_error_next(self, line: str) -> None:
        """The line after a bare 'Last error:': NCCL's WARN text under the same prefix."""
        head = self.pending_last or ""
        if "NCCL INFO" in line or "NCCL WARN" in line:  # NCCL's own line: nothing was carried
            self.pending_last = None
            return
        text = line[len(head):] if head and line.startswith(head) else split_prefix(line)[1]
        text = text.strip()
        if not text:
            self.pending_left -= 1
            if self.pending_left <= 0:
                self.pending_last = None
            return
        self.pending_last = None
        self._traceback_warn(line, text)

    def _traceback_warn(self, line: str, text: str) -> None:
        """NCCL's WARN text as torch's 'Last error:' carried it: a WARN of a traceback process
        (unless an NCCL WARN line of this file already said it) and the cause of the failure
        signals of the same traceback."""
        text = text[:MAX_CONTEXT * 4]
        near = self.log.lines - self.wrapper_at <= TORCH_WINDOW
        if normalise(text) not in self.real_warns:
            label = split_prefix(line)[0]
            rank = int(label) if label is not None and label.isdecimal() \
                and len(label) <= 9 else None
            # one made-up process per launcher rank; never a real pid
            key = f"{UNKNOWN_HOST}:{-(1 << 40) - (rank if rank is not None else -1)}"
            proc = self.log.tracebacks.get(key)
            if proc is None:
                host, pid = key.rsplit(":", 1)
                proc = self.log.tracebacks[key] = ProcessLog(host, int(pid), [self.log.source],
                                                             launcher_rank=rank, traceback=True)
            if near and self.wrapper_version and proc.version is None:
                proc.version = self.wrapper_version
            proc.add_warn(text, origin=FROM_TRACEBACK)
        if near:  # the wrapper's 'internal error' ... came before its WARN text
            for sig in self.log.signals.values():
                if sig.preceding_warn is None:
                    sig.preceding_warn, sig.warn_origin = text, FROM_TRACEBACK
        self.last_warn, self.last_warn_origin = text, FROM_TRACEBACK

    def _scan(self, line: str) -> None:
        if ("CUDA capability sm_" in line or "cudaArch " in line or 'sm="' in line
                or "NVIDIA " in line) and len(self.log.gpus) < MAX_GPUS:
            gpu = gpu_from_line(line)
            if gpu is not None:
                self.log.gpus.setdefault(gpu[0], gpu[1])
        if "PEER_DEAD: " in line and len(self.log.ras) < MAX_RAS_LINES:  # ncclras -m (2.29+)
            self.log.ras.append(line.strip()[:300])
        if ras.TEXT_START in line:  # an `ncclras` text report: the newest one of a file is kept
            self.log.ras = [r for r in self.log.ras if not isinstance(r, ras.RasText)]
            self.ras_text = ras.RasText(self.log.source, version=(
                self.log.bare_versions[-1] if self.log.bare_versions else None))
            self.log.ras.append(self.ras_text)
        elif self.ras_text is not None:
            self.ras_text.feed(split_prefix(line)[1])
        for kind, needle in _NEEDLES:
            if needle in line:
                self._signal(kind, line)
                return

    def _process(self, ident: str | None, dev: str | None) -> ProcessLog:
        devno = int(dev) if dev is not None else None
        if ident:
            parts = ident.split(":")
            host = parts[0] or UNKNOWN_HOST
            pid_text = parts[1] if len(parts) > 1 else ""
        else:
            host, pid_text = UNKNOWN_HOST, ""
        # A redacted or missing pid: one process per GPU index (negative, never a real pid).
        # isdecimal: '¹' is a digit to isdigit() but not a number int() reads
        pid = int(pid_text) if pid_text.isdecimal() and len(pid_text) <= 9 else -1 - (devno or 0)
        key = f"{host}:{pid}"
        proc = self.log.processes.get(key)
        if proc is None:
            proc = self.log.processes[key] = ProcessLog(host, pid, [self.log.source])
        if devno is not None and devno < 1024:
            proc.devices.add(devno)
        return proc

    def _catch_all(self, line: str) -> None:
        log = self.log
        at = line.find(" WARN ")
        if at > 0 and "NCCL WARN" not in line:  # old 'file.h:311 WARN ...' after any host text
            src = line[line.rfind(" ", 0, at) + 1:at]
            if OLD_SRC.fullmatch(src):
                log.unparsed_nccl += 1
                if len(log.unparsed_examples) < MAX_SIGNAL_EXAMPLES:
                    log.unparsed_examples.append(line[:300])
                msg = line[at + 6:].strip()
                self._process(None, None).add_warn(msg)
                self.last_warn = msg
                self.last_warn_origin = None
                return
        for level in ("WARN", "INFO"):
            at = line.find(f"NCCL {level}")
            if at < 0:
                continue
            log.unparsed_nccl += 1
            if len(log.unparsed_examples) < MAX_SIGNAL_EXAMPLES:
                log.unparsed_examples.append(line[:300])
            proc = self._process(None, None)
            msg = line[at + 10:].strip()
            if level == "WARN":
                proc.add_warn(msg)
                self.last_warn = msg
                self.last_warn_origin = None
            else:
                _parse_info(proc, msg, self.slice_no)
            return

    def _signal(self, kind: str, line: str) -> None:
        sig = self.log.signals.get(kind)
        if sig is None:
            sig = self.log.signals[kind] = Signal(kind, preceding_warn=self.last_warn,
                                                  warn_origin=self.last_warn_origin)
        sig.count += 1
        if len(sig.examples) < MAX_SIGNAL_EXAMPLES:
            sig.examples.append(line.strip()[:300])


def _custom_time(rest: str) -> tuple[re.Match[str] | None, str | None]:
    """A line whose host:pid:tid follows a time in a format of the user's
    (NCCL_DEBUG_TIMESTAMP_FORMAT='%s.%3f ', '%H:%M:%S ' ...): its match and that time."""
    d = DEV_FIELD.search(rest, 0, 400)
    if d is None:
        return None, None
    sp = rest.rfind(" ", 0, d.start())
    if sp <= 0 or sp > MAX_TIME_PREFIX or not any(c.isdigit() for c in rest[:sp]):
        return None, None
    m = HEAD.match(rest, sp + 1)
    return (m, rest[:sp].strip()) if m is not None else (None, None)


def _parse_info(proc: ProcessLog, msg: str, slice_no: int) -> bool:
    """Read one INFO message into ``proc``; True if it may say what NCCL was setting up (not
    a collective call, not a '<file>:<line> -> <code>' unwinding line)."""
    m: re.Match[str] | None
    if m := COLL.match(msg):
        proc.coll[slice_no][m["op"]] += 1
        return False
    elif m := VERSION.match(msg):
        proc.version = m["v"]
    elif m := NET.match(msg):
        rest, _, oob = m["rest"].partition("; OOB ")
        items = [i["item"] for i in ITEM.finditer(rest)]
        if len(proc.nets) < MAX_NETS:
            proc.nets.append(NetChoice(m["plugin"], [_iface_name(i) for i in items], items,
                                       oob.strip() or None))
    elif m := BOOTSTRAP.match(msg):
        items = [i["item"] for i in ITEM.finditer(m["rest"])] or m["rest"].split()[:16]
        proc.bootstrap = [_iface_name(i) for i in items]
        proc.bootstrap_items = items
    elif m := OLD_NET_IF.match(msg):  # NCCL 2.3/2.4: one line per socket interface
        if len(proc.bootstrap) < 16:
            proc.bootstrap.append(_iface_name(m["item"]))
            proc.bootstrap_items.append(m["item"])
    elif m := OLD_IB.match(msg):
        if not proc.nets:
            proc.nets.append(NetChoice("IB", [], []))
        if len(proc.nets[0].items) < 32:
            proc.nets[0].items.append(m["item"])
            proc.nets[0].interfaces.append(_iface_name(m["item"]))
    elif m := USING_NETWORK.match(msg):
        if m["name"] not in proc.networks:
            proc.networks.append(m["name"])
    elif m := ENVSET.match(msg):
        proc.env[m["var"]] = m["value"].strip().rstrip(".")
    elif m := DRIVER.search(msg):
        proc.cuda_driver = int(m["v"])
    elif msg.startswith(("NET/Plugin", "Plugin Path", "P2P plugin")):
        _parse_plugin(proc, msg)
    elif msg.startswith("NET/IB") and " mtu " in msg:
        if proc.mtu is None and (mm := MTU.match(msg)):
            proc.mtu = int(mm["mtu"])
    elif "GPU Direct RDMA Disabled for HCA" in msg:
        if len(proc.gdr_disabled) < 16:
            proc.gdr_disabled.append(msg.split("HCA", 1)[1].strip())
    else:
        _parse_init(proc, msg)
        if " -> " in msg and _UNWIND.match(msg):
            return False
    if "(80FE/" in msg or "GID fe80" in msg:
        proc.gid_link_local = True
    return True


def _parse_plugin(proc: ProcessLog, msg: str) -> None:
    m = PLUGIN_PATH.match(msg) or P2P_PLUGIN.match(msg) or LOADED_PLUGIN.match(msg)
    if m is not None:
        value = m.groupdict().get("path") or m.groupdict().get("name") or ""
        proc.plugin = value.rsplit("/", 1)[-1].strip().rstrip(".")
    elif proc.plugin is None and ("No plugin found" in msg or "Could not find" in msg
                                  or "returned 2" in msg):
        proc.plugin = "none"


def _parse_init(proc: ProcessLog, msg: str) -> None:
    at = msg.find("comm 0x")
    if at < 0:
        return
    m = INIT.match(msg, at)
    if m is None:
        return
    nranks = int(m["nranks"])
    if nranks > MAX_NRANKS:
        return
    c = proc.comms.get(m["comm"])
    if c is None:
        c = proc.comms[m["comm"]] = CommInit(m["comm"], int(m["rank"]), nranks)
    cid = msg.find("commId 0x", m.end())
    if cid >= 0 and (idm := COMMID.match(msg, cid)):
        c.comm_id = idm["id"]
    if " - Init START" in msg:
        c.started = True
    elif " - Init COMPLETE" in msg:
        c.completed = True


def parse_lines(lines: Iterable[str], source: str = "<text>",
                split: re.Pattern[str] | None = None) -> ParsedLog:
    """Parse one log given as lines; ``split`` starts a new COLL slice on each matching line."""
    p = _Parser(source, split)
    for line in lines:
        p.feed(line)
    return p.log


def parse_text(text: str, source: str = "<text>", split: re.Pattern[str] | None = None) -> ParsedLog:
    """Parse one log held in memory (tests, small inputs)."""
    return parse_lines(text.splitlines(), source, split)


def read_lines(fh: BinaryIO, log: ParsedLog, max_bytes: int = MAX_BYTES) -> Iterator[str]:
    """Lines of a binary stream, each cut at MAX_LINE bytes, stopping after ``max_bytes``."""
    total = 0
    lineno = 0
    while True:
        chunk = fh.readline(MAX_LINE)
        if not chunk:
            return
        lineno += 1
        if total < BINARY_PROBE and log.binary is None:
            if total == 0 and chunk.startswith((b"\x1f\x8b", b"\x28\xb5\x2f\xfd", b"BZh")):
                log.binary = "compressed"
            elif b"\x00" in chunk and chunk.strip(b"\x00\n") and \
                    (CONTROL_BYTES.search(chunk.replace(b"\x00", b"")) or chunk.count(b"\x00") < 4):
                log.binary = "binary"  # NULs among control bytes or scattered: not a NUL block
        total += len(chunk)
        chunk, nuls = drop_nuls(chunk)  # a crashed node's unwritten blocks: the line read on
        if nuls:
            log.nul_line = log.nul_line or lineno
            log.nul_bytes += nuls
        if len(chunk) == MAX_LINE and not chunk.endswith(b"\n"):
            log.long_lines += 1
            while True:  # skip the rest of an over-long line
                more = fh.readline(MAX_LINE)
                total += len(more)
                if not more or more.endswith(b"\n") or total > max_bytes:
                    break
        yield chunk.decode("utf-8", "replace")
        if total > max_bytes:
            log.truncated = True
            return


def _read_ras(fh: BinaryIO, log: ParsedLog) -> None:
    """A RAS JSON document, bounded; one that cannot be read is kept as its reason."""
    data = fh.read(ras.MAX_DOC + 1)
    try:
        log.ras.append(ras.read_doc(data, log.source))
    except ras.NotRas as e:
        log.ras.append(ras.Unreadable(log.source, str(e)))


def _inputs(paths: Sequence[str | Path]) -> list[str]:
    """The files to read: '-' and /dev/stdin, FIFOs, regular files, a directory's files."""
    out: list[str] = []
    for raw in paths:
        name = str(raw)
        if name in ("-", "/dev/stdin"):
            out.append("-")
            continue
        try:
            st = os.stat(name)
        except FileNotFoundError:
            raise UsageError(f"{name} does not exist.",
                             "Pass NCCL log files, e.g. the NCCL_DEBUG_FILE outputs or a job "
                             "log, or '-' to read standard input.") from None
        except OSError as e:
            raise UsageError(f"cannot read {name}: {e.strerror}.",
                             "Check the path and its permissions.") from None
        if stat.S_ISDIR(st.st_mode):
            with os.scandir(name) as it:  # regular files only: no links, FIFOs or devices
                out += sorted(e.path for e in it if e.is_file(follow_symlinks=False))
        elif stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            out.append(name)
        else:
            raise UsageError(f"{name} is a device or socket, not a log file.",
                             "Pass a file, a FIFO, or '-' to read standard input.")
    if not out:
        raise UsageError("no log files found.", "Pass files or a directory that holds them.")
    return out


def load(paths: Sequence[str | Path], split: str | None = None,
         max_bytes: int = MAX_BYTES) -> list[ParsedLog]:
    """Read log files (a directory means every regular file in it; '-' is standard input)."""
    pattern = None
    if split:
        try:
            pattern = re.compile(split)
        except re.error as e:
            raise UsageError(f"--split {split!r} is not a valid regular expression ({e}).",
                             "Pass e.g. --split 'iteration: '.") from None
    logs = []
    for name in _inputs(paths):
        p = _Parser("<stdin>" if name == "-" else name, pattern)
        if name == "-":
            for line in read_lines(sys.stdin.buffer, p.log, max_bytes):
                p.feed(line)
        else:
            try:
                fh = open(name, "rb")  # noqa: SIM115 - closed below, streamed
            except OSError as e:
                raise UsageError(f"cannot read {name}: {e.strerror}.",
                                 "Check the path and its permissions.") from None
            with fh:
                head = fh.peek(4096)[:4096] if hasattr(fh, "peek") else b""
                if ras.sniff(head):  # `ncclras -f json` output (NCCL 2.28.7+)
                    _read_ras(fh, p.log)
                else:
                    for line in read_lines(fh, p.log, max_bytes):
                        p.feed(line)
        logs.append(p.log)
    binary = [log for log in logs if log.binary and not log.nccl_lines]
    if binary and len(binary) == len(logs):
        log = binary[0]
        raise UsageError(
            f"{log.source} is {'a compressed file' if log.binary == 'compressed' else 'binary'}"
            ", not a text log.",
            "decompress it first (e.g. zcat FILE | mldebug nccl-log -)"
            if log.binary == "compressed" else
            "pass the NCCL_DEBUG=INFO text output (NCCL_DEBUG_FILE files or the job's log).")
    return logs
