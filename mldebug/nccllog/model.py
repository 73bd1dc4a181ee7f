"""What one NCCL log says, as plain dataclasses: per process, per file, and the whole report.

Everything here is bounded whatever the input: a process keeps at most ``MAX_WARN_KINDS``
distinct WARN messages (and counts the rest), a file at most ``MAX_SIGNAL_EXAMPLES`` example
lines per signal, so a 400 MB log costs memory in proportion to its processes, not its size.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from mldebug.findings import Finding, findings_to_json

MAX_WARN_KINDS = 64
MAX_SIGNAL_EXAMPLES = 3
MAX_NETS = 8
# where a WARN text came from when it is not an NCCL_DEBUG line of NCCL's own
FROM_TRACEBACK = "torch's 'Last error:' line"

_NORMALISE = [
    (re.compile(r"0x[0-9a-fA-F]+"), "0x…"),
    (re.compile(r"<\d+>"), "<…>"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b"), "A.B.C.D"),
    (re.compile(r"/dev/shm/nccl-[\w-]+"), "/dev/shm/nccl-…"),
    (re.compile(r"nccl-shm-[\w-]+"), "nccl-shm-…"),
    (re.compile(r"\b\d{4,}\b"), "N"),
]


def normalise(msg: str) -> str:
    """The message with addresses, ports, sizes and segment names replaced: one key per kind."""
    for pat, rep in _NORMALISE:
        msg = pat.sub(rep, msg)
    return msg


@dataclass
class NetChoice:
    plugin: str  # IB, Socket, FastSocket, GPUDirectTCPX, IBext_v8 ...
    interfaces: list[str]  # names: mlx5_0, eth0 ...
    items: list[str]  # as printed: mlx5_0:1/IB, eth0:10.0.0.1<0>
    oob: str | None = None


@dataclass
class CommInit:
    comm: str
    rank: int
    nranks: int
    comm_id: str | None = None
    started: bool = False
    completed: bool = False


@dataclass
class ProcessLog:
    """Everything one process (host:pid) logged, bounded."""

    host: str
    pid: int
    sources: list[str] = field(default_factory=list)
    launcher_rank: int | None = None
    devices: set[int] = field(default_factory=set)
    version: str | None = None
    cuda_driver: int | None = None  # cudaDriverVersion 12040
    plugin: str | None = None  # "none" when NCCL said it found no net plugin, else its name
    nets: list[NetChoice] = field(default_factory=list)
    bootstrap: list[str] = field(default_factory=list)  # interface names
    bootstrap_items: list[str] = field(default_factory=list)  # as printed
    networks: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    comms: dict[str, CommInit] = field(default_factory=dict)  # comm address -> init
    warns: list[str] = field(default_factory=list)  # first message of each distinct kind
    warn_counts: Counter[str] = field(default_factory=Counter)  # normalised kind -> count
    warn_src: dict[str, str] = field(default_factory=dict)  # kind -> 'file.cc:123' (first)
    warn_context: dict[str, str] = field(default_factory=dict)  # kind -> INFO line before it
    gdr_disabled: list[str] = field(default_factory=list)  # "HCA 0 'mlx5_0' (no module)"
    gid_link_local: bool = False
    mtu: int | None = None  # NET/IB: Dev d Port p qpn q mtu N (the first)
    last_info: str | None = None  # the last setup INFO line (parser state, cut at 300)
    traceback: bool = False  # made up from torch's NCCL error text, not from NCCL's own lines
    warn_origin: dict[str, str] = field(default_factory=dict)  # kind -> FROM_TRACEBACK
    coll: dict[int, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    # NCCL_DEBUG_TIMESTAMP_FORMAT prefixes (2.26+: '[%F %T] ' on WARN lines by default), as
    # printed: of the first and the last line that carried one
    first_time: str | None = None
    last_time: str | None = None

    @property
    def key(self) -> str:
        return f"{self.host}:{self.pid}"

    @property
    def rank(self) -> int | None:
        if self.launcher_rank is not None:
            return self.launcher_rank
        world = max(self.comms.values(), key=lambda c: c.nranks, default=None)
        return world.rank if world else None

    @property
    def label(self) -> str:
        r = self.rank
        where = "torch traceback" if self.traceback else self.key
        return f"rank {r} ({where})" if r is not None else where

    @property
    def transport(self) -> str | None:
        """The network NCCL used: its own 'Using network X' line, else the first NET/<x>
        line that lists devices (``NET/IB : Using [RO]; OOB eno1`` lists none: not IB)."""
        if self.networks:
            return self.networks[0]
        for n in self.nets:
            if n.interfaces:
                return n.plugin
        return None

    @property
    def net(self) -> NetChoice | None:
        """The NET line of the transport in use (devices listed), if any."""
        t = self.transport
        for n in self.nets:
            if n.interfaces and (t is None or n.plugin == t or t.startswith(n.plugin)):
                return n
        return next((n for n in self.nets if n.interfaces), None)

    def add_warn(self, msg: str, src: str | None = None, context: str | None = None,
                 origin: str | None = None) -> None:
        """One WARN message; ``origin``: where its text came from when not from an NCCL_DEBUG
        line (``FROM_TRACEBACK``)."""
        key = normalise(msg)
        if key not in self.warn_counts and len(self.warn_counts) >= MAX_WARN_KINDS:
            key = "(more kinds of WARN than kept)"
        if key not in self.warn_counts:
            self.warns.append(msg)
            if src:
                self.warn_src[key] = src
            if context:
                self.warn_context[key] = context
            if origin:
                self.warn_origin[key] = origin
        self.warn_counts[key] += 1

    def to_dict(self) -> dict[str, Any]:
        net = self.net
        return {
            "host": self.host, "pid": self.pid, "rank": self.rank, "sources": self.sources,
            "from_traceback": self.traceback,
            "devices": sorted(self.devices), "nccl_version": self.version,
            "cuda_driver": self.cuda_driver, "net_plugin": self.plugin,
            "transport": self.transport,
            "net": [{"plugin": n.plugin, "interfaces": n.interfaces, "items": n.items,
                     "oob": n.oob} for n in self.nets],
            "interfaces": net.items if net else [],
            "bootstrap": self.bootstrap, "env": self.env,
            "comms": [c.__dict__ for c in self.comms.values()],
            "warnings": sum(self.warn_counts.values()),
            "gdr_disabled": self.gdr_disabled, "ib_mtu": self.mtu,
            "first_time": self.first_time, "last_time": self.last_time,
            "collectives": {op: sum(c[op] for c in self.coll.values())
                            for op in sorted({o for c in self.coll.values() for o in c})},
        }


@dataclass
class Signal:
    """A known failure text seen anywhere in a file (also outside NCCL's own lines)."""

    kind: str
    count: int = 0
    examples: list[str] = field(default_factory=list)
    preceding_warn: str | None = None  # the last NCCL WARN before the first occurrence
    warn_origin: str | None = None  # FROM_TRACEBACK: that WARN is torch's 'Last error:' text


@dataclass
class ParsedLog:
    source: str
    processes: dict[str, ProcessLog] = field(default_factory=dict)
    # WARN texts torch's tracebacks carried ('Last error:'), per launcher rank: not NCCL lines
    tracebacks: dict[str, ProcessLog] = field(default_factory=dict)
    lines: int = 0
    nccl_lines: int = 0
    unparsed_nccl: int = 0  # lines with 'NCCL INFO/WARN' in a shape we could not split
    unparsed_examples: list[str] = field(default_factory=list)
    bare_versions: list[str] = field(default_factory=list)  # 'NCCL version X' without prefix
    signals: dict[str, Signal] = field(default_factory=dict)
    long_lines: int = 0  # lines cut at the length bound
    nul_bytes: int = 0  # NUL bytes dropped (a crashed node's unwritten blocks)
    nul_line: int = 0  # the line of the first
    truncated: bool = False  # stopped at the size bound
    binary: str | None = None  # 'gzip' / 'binary' when the start of the file is not text
    # GPU compute capabilities the lines name (90, 120: 'sm_120', 'cudaArch 1200', sm="90"),
    # each with the first line that says it (versions.py)
    gpus: dict[int, str] = field(default_factory=dict)
    diag: list[Any] = field(default_factory=list)  # NCCL DIAG report lines (diag.DiagLine)
    ras: list[Any] = field(default_factory=list)  # ncclras JSON documents (ras.RasDoc)


@dataclass
class WarnGroup:
    message: str
    processes: list[str]
    count: int
    hosts: list[str] = field(default_factory=list)
    key: str = ""
    source: str = ""  # NCCL's file.cc:line of the first occurrence
    context: str = ""  # the NCCL INFO line its first printer logged just before it
    versions: list[str] = field(default_factory=list)  # NCCL versions of the printers
    origin: str = ""  # FROM_TRACEBACK when the text is torch's 'Last error:' line only

    def to_dict(self) -> dict[str, Any]:
        return {"message": self.message, "processes": self.processes, "count": self.count,
                "hosts": self.hosts, "source": self.source, "context": self.context,
                "nccl_versions": self.versions, "origin": self.origin or None}


@dataclass
class CommSummary:
    comm_id: str
    nranks: int
    completed: list[int]
    started_not_completed: list[int]
    absent: list[int]
    stuck_processes: list[str] = field(default_factory=list)  # host:pid of those ranks

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


@dataclass
class ProcessGroup:
    """Processes whose table rows are identical apart from rank, host and pid."""

    ranks: list[int]
    hosts: list[str]
    count: int
    devices: list[int]
    version: str
    transport: str
    interfaces: str
    bootstrap: str
    warnings: int

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


@dataclass
class NcclLogReport:
    files: list[str]
    processes: list[ProcessLog]
    comms: list[CommSummary]
    warnings: list[WarnGroup]
    collectives: dict[int, dict[str, int]]  # slice -> op -> count (all processes)
    findings: list[Finding]
    split: bool = False
    groups: list[ProcessGroup] = field(default_factory=list)
    lines: int = 0
    nccl_lines: int = 0
    tracebacks: list[ProcessLog] = field(default_factory=list)  # see ParsedLog.tracebacks

    def to_dict(self) -> dict[str, Any]:
        return {
            "tracebacks": [p.to_dict() for p in self.tracebacks],
            "files": self.files,
            "lines": self.lines,
            "nccl_lines": self.nccl_lines,
            "findings": findings_to_json(self.findings),
            "processes": [p.to_dict() for p in self.processes],
            "process_groups": [g.to_dict() for g in self.groups],
            "communicators": [c.to_dict() for c in self.comms],
            "warnings": [w.to_dict() for w in self.warnings],
            "collectives": {str(k): v for k, v in self.collectives.items()},
        }
