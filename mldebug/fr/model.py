"""Plain data for flight-recorder analysis: entries, per-rank dumps, timelines, results.

A *timeline* is the list of entries one or more ranks recorded. Ranks of an SPMD job
usually record identical timelines, so the loader keeps one copy per distinct timeline and
the list of ranks that share it; analysis then costs what the distinct timelines cost, not
what 1,024 copies of the same one would.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from mldebug.findings import Finding

# Operation names whose sizes legitimately differ across ranks (torch's own rules).
ALL_TO_ALL = frozenset({"all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall",
                        "alltoall_base"})
ROOT_INPUT_ONLY = frozenset({"scatter"})  # only the root passes inputs
ROOT_OUTPUT_ONLY = frozenset({"gather"})  # only the root receives outputs
P2P_OPS = frozenset({"send", "recv"})


@dataclass(frozen=True)
class CallFrame:
    name: str
    filename: str
    line: int

    def __str__(self) -> str:
        return f"{self.name} at {self.filename}:{self.line}"


@dataclass(slots=True)
class Entry:
    """One recorded operation, normalised across format versions 2.3-2.10."""

    record_id: int
    pg_id: int | None
    pg_name: str
    pg_desc: str
    seq: int  # collective_seq_id
    p2p_seq: int
    profiling_name: str  # e.g. "nccl:all_reduce", "gloo:barrier", "nccl:send 0->1"
    backend: str
    op: str  # e.g. "all_reduce", "send", "coalesced"
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_dtypes: tuple[str, ...]
    state: str
    is_p2p: bool
    frames: tuple[CallFrame, ...] = ()
    src: int | None = None  # group-local peers of send/recv
    dst: int | None = None
    time_created_ns: int | None = None
    time_started_ns: int | None = None
    time_completed_ns: int | None = None
    timeout_ms: int | None = None

    def label(self) -> str:
        sizes = ",".join("x".join(map(str, s)) or "scalar" for s in self.input_sizes)
        return f"{self.op}[{sizes}]" if sizes else self.op


@dataclass
class PgStatus:
    last_enqueued: int | None = None
    last_started: int | None = None
    last_completed: int | None = None


@dataclass
class RankDump:
    """What one rank's dump says about itself (entries live in its Timeline)."""

    rank: int
    file: str
    version: str
    host: str | None = None
    pid: int | None = None
    world_size: int | None = None
    reason: str | None = None
    rank_from: str = "content"  # "content" or "filename"
    # pg name -> (desc, ranks or None when the dump does not say)
    pg_config: dict[str, tuple[str, tuple[int, ...] | None]] = field(default_factory=dict)
    pg_status: dict[str, PgStatus] = field(default_factory=dict)  # key: pg_id as str
    timeline: int = -1  # index into DumpSet.timelines
    entry_count: int = 0
    # this rank's own enqueue times (time_created_ns, -1 when absent), aligned with its
    # timeline's entries: ranks that share a timeline share entries but not times
    created: array[int] = field(default_factory=lambda: array("q"))


@dataclass
class Timeline:
    ranks: list[int]
    entries: list[Entry]


@dataclass
class LoadProblem:
    file: str
    error: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "error": self.error}


@dataclass
class DumpSet:
    """Everything loaded from a directory or a list of files."""

    dumps: dict[int, RankDump] = field(default_factory=dict)
    timelines: list[Timeline] = field(default_factory=list)
    problems: list[LoadProblem] = field(default_factory=list)
    duplicates: dict[int, list[str]] = field(default_factory=dict)

    def entries_of(self, rank: int) -> list[Entry]:
        return self.timelines[self.dumps[rank].timeline].entries


@dataclass
class SignatureGroup:
    """Ranks that recorded the same thing at one aligned position."""

    ranks: list[int]
    description: str  # e.g. "all_reduce in=[[4]] out=[[4]] Float" or "(not enqueued)"
    call_site: list[str] = field(default_factory=list)
    state: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "what": self.description, "call_site": self.call_site,
                "state": self.state}


@dataclass
class Mismatch:
    """The first place where the ranks of one process group disagree."""

    pg: str
    pg_desc: str
    seq: int
    kind: str  # type | size | dtype | syntax | missing | p2p
    culprit_ranks: list[int]
    reasoning: str
    groups: list[SignatureGroup]
    p2p: bool = False
    began_at: int | None = None  # earlier seq where the culprit's call sites start to differ

    def to_dict(self) -> dict[str, Any]:
        return {
            "pg": self.pg, "pg_desc": self.pg_desc, "seq": self.seq, "p2p": self.p2p,
            "kind": self.kind, "culprit_ranks": self.culprit_ranks, "began_at": self.began_at,
            "reasoning": self.reasoning,
            "call_sites": [{"ranks": g.ranks, "frames": g.call_site} for g in self.groups
                           if g.call_site],
            "groups": [g.to_dict() for g in self.groups],
        }


@dataclass
class Lag:
    pg: str
    pg_desc: str
    rank: int
    last_enqueued: int
    behind_by: int
    last_completed: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"pg": self.pg, "pg_desc": self.pg_desc, "rank": self.rank,
                "last_enqueued": self.last_enqueued, "behind_by": self.behind_by,
                "last_completed": self.last_completed}


@dataclass
class Straggler:
    """A rank that arrived last at matched collectives far more often than chance."""

    rank: int
    host: str | None
    collectives: int  # matched collectives compared
    times_last: int
    late_ms_median: float  # behind the median rank's arrival, host clocks aligned
    late_ms_p90: float
    late_ms_mean: float

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "collectives": self.collectives,
                "times_last": self.times_last, "late_ms_median": round(self.late_ms_median, 3),
                "late_ms_p90": round(self.late_ms_p90, 3),
                "late_ms_mean": round(self.late_ms_mean, 3)}


@dataclass
class GroupSummary:
    pg: str
    desc: str
    ranks: list[int]
    membership: str  # "pg_config" | "default group" | "inferred from entries"
    compared_from: int | None  # first aligned collective seq compared
    compared_to: int | None
    waiting_in: dict[int, int] = field(default_factory=dict)  # rank -> first not-completed seq

    def to_dict(self) -> dict[str, Any]:
        return {"pg": self.pg, "desc": self.desc, "ranks": self.ranks,
                "membership": self.membership, "compared_seq": [self.compared_from,
                                                                  self.compared_to]}


@dataclass
class Analysis:
    ranks: list[int]
    world_size: int | None
    missing_ranks: list[int]  # expected, but no readable dump
    never_enqueued: list[int]  # union of culprits of 'missing' mismatches
    mismatches: list[Mismatch]
    lagging: list[Lag]
    groups: list[GroupSummary]
    problems: list[LoadProblem]
    duplicates: dict[int, list[str]]
    timelines: int
    notes: list[str] = field(default_factory=list)
    stragglers: list[Straggler] = field(default_factory=list)
    straggler_window: int = 0  # matched collectives the straggler statistics cover
    findings: list[Finding] = field(default_factory=list)  # built by analysis (fr.diagnose)

    @property
    def culprits(self) -> list[int]:
        found: set[int] = set()
        for m in self.mismatches:
            found.update(m.culprit_ranks)
        if not found:
            found.update(lag.rank for lag in self.lagging)
        return sorted(found)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "mldebug.fr.analysis/1",
            "ranks": self.ranks,
            "world_size": self.world_size,
            "missing_ranks": self.missing_ranks,
            "never_enqueued": self.never_enqueued,
            "culprit_ranks": self.culprits,
            "mismatches": [m.to_dict() for m in self.mismatches],
            "lagging": [lag.to_dict() for lag in self.lagging],
            "groups": [g.to_dict() for g in self.groups],
            "problems": [p.to_dict() for p in self.problems],
            "duplicates": {str(k): v for k, v in self.duplicates.items()},
            "distinct_timelines": self.timelines,
            "notes": self.notes,
            "stragglers": [st.to_dict() for st in self.stragglers],
            "straggler_collectives": self.straggler_window,
            "findings": [f.to_dict() for f in self.findings],
        }
