"""Plain data for ``mldebug log``: what each rank left in the logs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mldebug.findings import Finding, findings_to_json

# Kinds of events a rank can leave. "Primary" kinds can start a failure; the others are
# what a rank says when a peer failed (a timeout, a lost connection, an abort).
PRIMARY_KINDS = ("exception", "cuda-oom", "cuda-error", "nccl-error", "killed", "signal", "exit")


@dataclass
class Event:
    """One failure line (or the last line of a traceback) attributed to a rank."""

    kind: str  # exception, cuda-oom, cuda-error, nccl-error, overflow, stall, launcher, killed,
    # signal, exit, timeout, peer-lost, size-mismatch
    message: str
    line: int  # global order: line number across all inputs, in reading order
    source: str  # file:line
    time: float | None = None  # seconds since the start of the year, when the line had a time
    frame: str | None = None  # the user frame of its traceback: "file.py:12 in func"
    primary: bool = True
    # where the traceback stood: the torch.distributed call below the user frame (all_reduce,
    # broadcast, send, barrier, ...) and the user frames above it, outermost first (up to 8)
    api: str | None = None
    stack: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "source": self.source,
                "time": self.time, "frame": self.frame, "primary": self.primary,
                "api": self.api}


@dataclass
class WatchdogTimeout:
    """PyTorch's ProcessGroupNCCL watchdog: the collective a rank timed out in."""

    pg: str
    seq: int | None
    op: str | None
    timeout_ms: int | None
    line: int
    numel: int | None = None  # NumelIn: the size of the tensor (same seq, other size: a mismatch)


@dataclass
class RankLog:
    rank: int
    host: str | None = None
    pid: int | None = None
    lines: int = 0
    first_primary: Event | None = None
    first_event: Event | None = None
    consequences: int = 0
    timeouts: list[WatchdogTimeout] = field(default_factory=list)
    enqueued: dict[str, int] = field(default_factory=dict)  # pg -> last enqueued work
    completed: dict[str, int] = field(default_factory=dict)  # pg -> last completed work
    exitcode: int | None = None
    exit_time: str | None = None
    nccl_warns: int = 0
    phase: tuple[str, str] | None = None  # the last phase it entered (validation, checkpoint, ...) and the line
    wait_site: Event | None = None  # its first timeout / lost peer that came with a traceback

    def add(self, ev: Event) -> None:
        if self.first_event is None:
            self.first_event = ev
        if ev.primary:
            if self.first_primary is None:
                self.first_primary = ev
        else:
            self.consequences += 1
            if self.wait_site is None and ev.frame is not None:
                self.wait_site = ev

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "host": self.host, "pid": self.pid, "lines": self.lines,
            "first_error": self.first_primary.to_dict() if self.first_primary else None,
            "first_event": self.first_event.to_dict() if self.first_event else None,
            "timeouts": [{"pg": t.pg, "seq": t.seq, "op": t.op, "timeout_ms": t.timeout_ms}
                         for t in self.timeouts],
            "last_enqueued": self.enqueued, "last_completed": self.completed,
            "exitcode": self.exitcode, "nccl_warns": self.nccl_warns,
            "last_phase": self.phase[0] if self.phase else None,
            "wait_site": ({"frame": self.wait_site.frame, "api": self.wait_site.api}
                          if self.wait_site else None),
        }


@dataclass
class LauncherFailure:
    """One entry of torchrun's ChildFailedError table."""

    rank: int
    host: str | None = None
    exitcode: int | None = None
    pid: int | None = None
    time: str | None = None
    message: str = ""
    root: bool = False


@dataclass
class MonitoredBarrier:
    """What torch.distributed.monitored_barrier said (gloo)."""

    by_rank0: dict[int, int] = field(default_factory=dict)  # rank -> rank 0's messages naming it
    reporters: set[int] = field(default_factory=set)  # ranks that arrived but heard errors from 0


@dataclass
class StoreFacts:
    """What the c10d store said while the ranks met in init (TCPStore, rendezvous)."""

    waits: dict[str, set[int | None]] = field(default_factory=dict)  # keys waited for -> who waited
    joined: tuple[int, int] | None = None  # the store's "K/W clients joined" when it timed out
    errors: list[Event] = field(default_factory=list)  # DistStoreError, DistNetworkError, rendezvous


@dataclass
class ParsedLogs:
    """Everything read from the inputs, per rank; bounded by the number of ranks."""

    ranks: dict[int, RankLog] = field(default_factory=dict)
    launcher: list[LauncherFailure] = field(default_factory=list)
    launcher_events: list[Event] = field(default_factory=list)  # unattributed failures
    nccl_warns: dict[str, list[int]] = field(default_factory=dict)  # message -> ranks (capped)
    nccl_warn_lines: int = 0
    sources: list[str] = field(default_factory=list)
    lines: int = 0
    lines_lower_bound: bool = False  # grep read the file: lines = the last line that mattered
    ranks_lower_bound: bool = False  # the rank sample missed ranks (or hit its memory bound)
    world_size: int | None = None  # --world-size
    world_hint: int | None = None  # the largest world size a line stated
    torch_version: str | None = None  # from "PyTorch version: 2.3.1" / "torch==2.3.1" lines
    evidence: dict[str, list[int]] = field(default_factory=dict)  # command -> ranks it covers
    named_by_peers: dict[int, int] = field(default_factory=dict)  # rank -> peers that blamed it
    fingerprints: dict[str, dict[int, str]] = field(default_factory=dict)  # seq -> rank -> collective
    monitored: MonitoredBarrier = field(default_factory=lambda: MonitoredBarrier())
    notes: list[str] = field(default_factory=list)  # mldebug's debugger lines, attempts skipped
    backends: set[str] = field(default_factory=set)  # "gloo", "nccl": what the lines name
    unkillable: set[int] = field(default_factory=set)  # pids the launcher SIGKILLed after SIGTERM
    terminated: Event | None = None  # the launcher itself got a signal (SignalException)
    store: StoreFacts = field(default_factory=lambda: StoreFacts())

    def rank(self, r: int) -> RankLog:
        got = self.ranks.get(r)
        if got is None:
            got = self.ranks[r] = RankLog(r)
        return got


@dataclass
class LogReport:
    parsed: ParsedLogs
    findings: list[Finding]
    culprits: list[int] = field(default_factory=list)
    verdict: Finding | None = None  # the verdict rule's finding (also first in findings); None
    # when no rule matched: then the findings are only notes (NCCL warnings, nothing found)
    confidence: str | None = None  # the verdict rule's: high / medium / low

    def to_dict(self) -> dict[str, Any]:
        p = self.parsed
        return {
            "sources": p.sources,
            "lines": p.lines,
            "lines_lower_bound": p.lines_lower_bound,
            "ranks_lower_bound": p.ranks_lower_bound,
            "world_size": p.world_size,
            "culprits": self.culprits,
            "verdict": self.verdict.to_dict() if self.verdict else None,
            "confidence": self.confidence,
            "findings": findings_to_json(self.findings),
            "ranks": [p.ranks[r].to_dict() for r in sorted(p.ranks)],
            "launcher": [vars(f) for f in p.launcher],
            "nccl_warn_lines": p.nccl_warn_lines,
            "world_size_stated": p.world_hint,
            "torch_version": p.torch_version,
            "evidence": [{"command": c, "ranks": r} for c, r in p.evidence.items()],
            "notes": p.notes,
        }
