"""Plain data for flight-recorder analysis: entries, per-rank dumps, timelines, results.

A *timeline* is the list of entries one or more ranks recorded. Ranks of an SPMD job
usually record identical timelines, so the loader keeps one copy per distinct timeline and
the list of ranks that share it; analysis then costs what the distinct timelines cost, not
what 1,024 copies of the same one would.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, overload

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


@dataclass(frozen=True)
class BlockedIn:
    """The torch.distributed call the rank's main thread was in when it dumped (mldebug's
    recorder reads it from the stack): the op, the peer or root it names (a global rank,
    None when not given) and the user frames that called it, innermost first."""

    op: str
    peer: int | None
    frames: tuple[CallFrame, ...] = ()


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
    blocked_in: BlockedIn | None = None
    dumped_at: float | None = None  # mldebug's "time": when the rank dumped (its clock)
    rank_from: str = "content"  # "content" or "filename"
    # pg name -> (desc, ranks or None when the dump does not say)
    pg_config: dict[str, tuple[str, tuple[int, ...] | None]] = field(default_factory=dict)
    pg_status: dict[str, PgStatus] = field(default_factory=dict)  # key: pg_id as str
    timeline: int = -1  # index into DumpSet.timelines
    entry_count: int = 0
    # this rank's own enqueue times (time_created_ns, -1 when absent), aligned with its
    # timeline's entries: ranks that share a timeline share entries but not times
    created: array[int] = field(default_factory=lambda: array("q"))
    # its own start and completion times (NOT_RECORDED when absent), aligned the same way
    started: array[int] = field(default_factory=lambda: array("q"))
    completed: array[int] = field(default_factory=lambda: array("q"))


NOT_RECORDED = -(1 << 63)  # a number column's "the dump did not say"


@dataclass(frozen=True, slots=True)
class Static:
    """The fields that many entries share (op, group, sizes, dtypes, call site), normalised
    once: a timeline stores only the index of its entry's Static."""

    pg_id: int | None
    pg_name: str
    pg_desc: str
    profiling_name: str
    backend: str
    op: str
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_dtypes: tuple[str, ...]
    is_p2p: bool
    frames: tuple[CallFrame, ...]
    src: int | None
    dst: int | None

    @property
    def collective(self) -> bool:
        return not self.is_p2p and self.op not in P2P_OPS


@dataclass
class GroupIndex:
    """One process group's entries in one timeline: the collectives by sequence number
    (``seqs`` sorted, the entries of ``seqs[k]`` are ``order[starts[k]:starts[k+1]]``;
    several when coalesced) and the sends and receives by (is a send, group-local peer),
    each in the order posted."""

    seqs: array[int]
    starts: array[int]
    order: array[int]
    p2p: dict[tuple[bool, int], array[int]]

    def positions(self) -> dict[int, int]:
        return dict(zip(self.seqs, range(len(self.seqs)), strict=True))


class Timeline:
    """The entries one or more ranks recorded, stored as columns.

    A pipeline-parallel job records as many timelines as it has ranks, so entries are not
    kept as objects: each is an index into the shared ``statics`` table plus its numbers
    (sequence ids, state, times), about 60 bytes. ``entries`` builds ``Entry`` objects on
    demand for the few places that show them; analysis reads the columns and ``groups``.
    """

    __slots__ = ("ranks", "statics", "states", "sid", "seq", "p2p_seq", "record_id", "state",
                 "started", "completed", "timeout", "created", "groups", "_used")

    def __init__(self, ranks: list[int], statics: list[Static], states: list[str],
                 sid: array[int], seq: array[int], p2p_seq: array[int], record_id: array[int],
                 state: array[int], started: array[int], completed: array[int],
                 timeout: array[int], created: array[int],
                 groups: dict[str, GroupIndex], used: list[int] | None = None) -> None:
        self.ranks = ranks
        self.statics = statics  # shared by every timeline of a DumpSet
        self.states = states  # shared too: state id -> name
        self.sid, self.seq, self.p2p_seq, self.record_id = sid, seq, p2p_seq, record_id
        self.state, self.started, self.completed, self.timeout = state, started, completed, timeout
        self.created = created  # the first rank's enqueue times
        self.groups = groups  # process group name -> its entries here
        self._used = used

    def __len__(self) -> int:
        return len(self.sid)

    @property
    def used(self) -> list[int]:
        """The static ids its entries have, ascending (the loader knows them: no pass over
        ``sid``)."""
        if self._used is None:
            self._used = sorted(set(self.sid))
        return self._used

    def entry(self, i: int) -> Entry:
        st = self.statics[self.sid[i]]
        return Entry(
            record_id=self.record_id[i], pg_id=st.pg_id, pg_name=st.pg_name,
            pg_desc=st.pg_desc, seq=self.seq[i], p2p_seq=self.p2p_seq[i],
            profiling_name=st.profiling_name, backend=st.backend, op=st.op,
            input_sizes=st.input_sizes, output_sizes=st.output_sizes,
            input_dtypes=st.input_dtypes, output_dtypes=st.output_dtypes,
            state=self.states[self.state[i]], is_p2p=st.is_p2p, frames=st.frames, src=st.src,
            dst=st.dst, time_created_ns=_opt(self.created, i, -1),
            time_started_ns=_opt(self.started, i), time_completed_ns=_opt(self.completed, i),
            timeout_ms=_opt(self.timeout, i))

    @property
    def entries(self) -> EntryView:
        return EntryView(self)


def pick(col: Sequence[Any] | Mapping[Any, Any], idx: Sequence[Any]) -> tuple[Any, ...]:
    """``col[i]`` for every ``i`` of ``idx``, in one call at C speed: a column read at a
    group's or a peer's entries (4-7x faster than ``map(col.__getitem__, idx)``)."""
    return picker(idx)(col)


def picker(idx: Sequence[Any]) -> Callable[[Any], tuple[Any, ...]]:
    """``pick`` at ``idx`` as a function of the column: built once, it reads the same entries
    of many columns (every rank of a shared timeline) without rebuilding its getter."""
    if len(idx) > 1:
        return itemgetter(*idx)
    if idx:
        one = idx[0]
        return lambda col: (col[one],)
    return lambda col: ()


def packed(code: str, values: Sequence[int]) -> array[int]:
    """``array(code, values)`` for integers that fit ``code``, 2-3x faster (``array`` parses
    every item with a format string; ``struct`` converts it directly); ``struct.error``
    when one does not fit."""
    out = array(code)
    if values:
        out.frombytes(struct.pack(f"{len(values)}{code}", *values))
    return out


def _opt(col: array[int], i: int, absent: int = NOT_RECORDED) -> int | None:
    v = col[i] if i < len(col) else absent
    return None if v == absent else v


class EntryView(Sequence[Entry]):
    """Entries of a timeline as ``Entry`` objects, built when read (not kept): all of them,
    or those at the indices ``idx`` (one side of a send/recv pair, say)."""

    __slots__ = ("_tl", "_idx")

    def __init__(self, tl: Timeline, idx: Sequence[int] | None = None) -> None:
        self._tl = tl
        self._idx: Sequence[int] = range(len(tl.sid)) if idx is None else idx

    def __len__(self) -> int:
        return len(self._idx)

    @overload
    def __getitem__(self, i: int) -> Entry: ...

    @overload
    def __getitem__(self, i: slice) -> list[Entry]: ...

    def __getitem__(self, i: int | slice) -> Entry | list[Entry]:
        if isinstance(i, slice):
            return [self._tl.entry(k) for k in self._idx[i]]
        return self._tl.entry(self._idx[i])  # IndexError and negative indices as a list's

    def __iter__(self) -> Iterator[Entry]:
        return map(self._tl.entry, self._idx)


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

    statics: list[Static] = field(default_factory=list)  # shared by the timelines
    states: list[str] = field(default_factory=list)

    def entries_of(self, rank: int) -> EntryView:
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
    kind: str  # type | size | dtype | syntax | missing | skipped | p2p
    culprit_ranks: list[int]
    reasoning: str
    groups: list[SignatureGroup]
    p2p: bool = False
    began_at: int | None = None  # earlier seq where the culprit's call sites start to differ
    # ranks that never enqueued it because they wait in another group's earlier collective
    blocked_elsewhere: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pg": self.pg, "pg_desc": self.pg_desc, "seq": self.seq, "p2p": self.p2p,
            "kind": self.kind, "culprit_ranks": self.culprit_ranks, "began_at": self.began_at,
            "blocked_elsewhere": self.blocked_elsewhere,
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
    # why it is late, from its own start/complete times (#44): "compute or data (...)",
    # "communication (...)", or that the recorder's times cannot tell
    phase: str = ""
    # medians per collective: completion of the previous one to this enqueue (host side)
    # and start to completion (communication), this rank's and the other ranks'
    host_gap_ms: float | None = None
    host_gap_ms_others: float | None = None
    comm_ms: float | None = None
    comm_ms_others: float | None = None
    position: str | None = None  # named at this one collective of the step only (op[sizes])
    # from the ranks' step clocks (``with mldebug.step():``), medians over the steps holding
    # the collectives it was named for: waiting for data (previous step's exit to this
    # entry), compute (entry to the step's first collective), communication (first
    # collective to exit), this rank's and the others'; the others' step period and what it
    # would be without this rank's delay
    data_ms: float | None = None
    data_ms_others: float | None = None
    compute_ms: float | None = None
    compute_ms_others: float | None = None
    step_comm_ms: float | None = None
    step_comm_ms_others: float | None = None
    step_ms: float | None = None
    step_ms_without: float | None = None

    def to_dict(self) -> dict[str, Any]:
        def r3(v: float | None) -> float | None:
            return None if v is None else round(v, 3)
        return {"rank": self.rank, "host": self.host, "collectives": self.collectives,
                "times_last": self.times_last, "late_ms_median": round(self.late_ms_median, 3),
                "late_ms_p90": round(self.late_ms_p90, 3),
                "late_ms_mean": round(self.late_ms_mean, 3),
                "phase": self.phase, "host_gap_ms": r3(self.host_gap_ms),
                "host_gap_ms_others": r3(self.host_gap_ms_others), "comm_ms": r3(self.comm_ms),
                "comm_ms_others": r3(self.comm_ms_others), "position": self.position,
                "data_ms": r3(self.data_ms), "data_ms_others": r3(self.data_ms_others),
                "compute_ms": r3(self.compute_ms),
                "compute_ms_others": r3(self.compute_ms_others),
                "step_comm_ms": r3(self.step_comm_ms),
                "step_comm_ms_others": r3(self.step_comm_ms_others),
                "step_ms": r3(self.step_ms), "step_ms_without": r3(self.step_ms_without)}


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
    # per group, the arrival times the straggler statistics compared (fr.stragglers.Arrivals);
    # not in --json: the HTML view's heat map draws them
    arrivals: list[Any] = field(default_factory=list, repr=False)

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
