"""Plain data for ``mldebug trace show``: each rank's recorded events and the comparison."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mldebug.findings import Finding, findings_to_json


@dataclass(frozen=True)
class Loc:
    """One place in the source: file, line, function, and the line's text when known."""

    file: str
    line: int
    func: str
    text: str = ""

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.file, self.line, self.func)

    @property
    def where(self) -> str:
        base = self.file.rsplit("/", 1)[-1]
        return f"{base}:{self.line} in {self.func}"

    def describe(self) -> str:
        return f"{self.where}" + (f"  `{self.text}`" if self.text else "")


@dataclass
class RankTrace:
    host: str
    pid: int
    rank: int | None
    kind: str  # "calls" | "lines"
    reason: str
    events: list[Loc] = field(default_factory=list)  # the main thread's, oldest first
    threads: int = 1
    source: str = ""
    world_size: int | None = None  # as the rank recorded it (its identity)

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"{self.host}:{self.pid}"


@dataclass
class TraceGroup:
    """Ranks whose recorded path ends at the same place."""

    ranks: list[int]
    labels: list[str]
    last: list[Loc]  # the tail of the first member, oldest first


@dataclass
class Divergence:
    """Where one rank's path left the others': the shared event before, the first own one."""

    ranks: list[int]
    labels: list[str]
    branch: Loc | None
    left_at: Loc
    others: list[int]


@dataclass
class MissingRank:
    """A rank the job had (by the rings' world size or dump+abort's notes) with no ring here."""

    rank: int | None
    pid: int | None
    reason: str


@dataclass
class TraceReport:
    traces: list[RankTrace]
    groups: list[TraceGroup] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    missing: list[MissingRank] = field(default_factory=list)
    world_size: int | None = None  # expected ranks, when the rings or the notes tell
    job: str | None = None  # live: the job's key (as 'mldebug hang' names jobs)
    live: bool = False  # the rings were asked for now (trace show --pid/--job), not read from DIR
    progress: bool = False  # live: every rank's ring moved between two reads (analyze.moved)
    busy: list[int] = field(default_factory=list)  # live: the minority that moved, the rest not

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "live": self.live,
            "progress": self.progress,
            "busy": self.busy,
            "ranks": [{"host": t.host, "pid": t.pid, "rank": t.rank, "events": t.kind,
                       "reason": t.reason, "recorded": len(t.events), "threads": t.threads,
                       "last": asdict(t.events[-1]) if t.events else None}
                      for t in self.traces],
            "groups": [{"ranks": g.ranks, "labels": g.labels,
                        "last": [asdict(x) for x in g.last]} for g in self.groups],
            "divergences": [{"ranks": d.ranks, "labels": d.labels,
                             "branch": asdict(d.branch) if d.branch else None,
                             "left_at": asdict(d.left_at), "others": d.others}
                            for d in self.divergences],
            "world_size": self.world_size,
            "missing": [asdict(m) for m in self.missing],
            "findings": findings_to_json(self.findings),
            "errors": self.errors,
        }
