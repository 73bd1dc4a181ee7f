"""Plain data for hang analysis: processes, threads, frames, and the resulting report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from mldebug.dist import Identity


@dataclass(frozen=True)
class Frame:
    name: str
    filename: str
    line: int
    short: str = ""  # py-spy's short_filename (e.g. torch/distributed/distributed_c10d.py)
    native: bool = False
    locals: tuple[tuple[str, str], ...] = ()  # (name, repr) when collected with --locals

    @property
    def display_file(self) -> str:
        return self.short or self.filename

    @property
    def location(self) -> str:
        if self.native:
            return f"{self.name} ({self.display_file})"
        return f"{self.name} ({self.display_file}:{self.line})"


@dataclass
class Thread:
    name: str
    thread_id: int = 0
    os_thread_id: int | None = None
    active: bool | None = None
    owns_gil: bool | None = None
    frames: list[Frame] = field(default_factory=list)  # innermost first


# What a Process knows of its place in the job: mldebug.dist.Identity's fields (host aside),
# copied flat so the JSON of a dump stays one level deep.
IDENTITY_FIELDS = tuple(f.name for f in fields(Identity) if f.name != "host")


@dataclass
class Process:
    host: str
    pid: int
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    node_rank: int | None = None
    launcher: str | None = None
    run_id: str | None = None
    cmdline: list[str] = field(default_factory=list)
    threads: list[Thread] = field(default_factory=list)
    threads_later: list[Thread] | None = None  # second dump with --watch

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else proc_label(self.host, self.pid)

    def main_thread(self) -> Thread | None:
        return main_thread(self.threads, self.pid)


def proc_label(host: str, pid: int) -> str:
    """host:pid, or "pid N" when the host is unknown (pasted single-host dumps)."""
    return f"{host}:{pid}" if host else f"pid {pid}"


def main_thread(threads: list[Thread], pid: int) -> Thread | None:
    for t in threads:
        if t.name == "MainThread" or t.os_thread_id == pid:
            return t
    return threads[0] if threads else None


@dataclass(frozen=True)
class CollectError:
    host: str
    pid: int | None
    error: str


@dataclass
class Collection:
    """Everything collected, before analysis."""

    processes: list[Process] = field(default_factory=list)
    errors: list[CollectError] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)  # hosts asked (for "did not answer")
    watch: float | None = None


@dataclass
class Group:
    ranks: list[int]
    pids: list[tuple[str, int]]  # (host, pid)
    hosts: list[str]
    where: str  # innermost user frame, e.g. "buggy (collective_mismatch.py:31)"
    collective: str | None
    frames: list[Frame]
    state: str | None = None  # "stuck", "moving", "mixed" with --watch
    locals_key: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Suspect:
    rank: int | None
    host: str
    pid: int
    reason: str
    call_site: str | None = None


@dataclass
class Report:
    processes: list[Process]
    groups: list[Group]
    suspects: list[Suspect]
    missing_ranks: list[int]
    missing_hosts: dict[int, str]  # missing rank -> host that should have had it
    errors: list[CollectError]
    verdict: str
    verdict_kind: str  # "suspects" | "same-place" | "no-processes" | "ambiguous"
    world_size: int | None
    hints: list[str] = field(default_factory=list)
    watch: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "mldebug.hang/1",
            "verdict": {"kind": self.verdict_kind, "summary": self.verdict},
            "world_size": self.world_size,
            "watch_seconds": self.watch,
            "processes": [process_to_dict(p) for p in self.processes],
            "groups": [group_to_dict(g) for g in self.groups],
            "suspects": [asdict(s) for s in self.suspects],
            "missing_ranks": self.missing_ranks,
            "missing": [
                {"rank": r, "expected_host": self.missing_hosts.get(r)} for r in self.missing_ranks
            ],
            "errors": [asdict(e) for e in self.errors],
            "hints": self.hints,
        }


def frame_to_dict(f: Frame) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": f.name, "filename": f.filename, "short_filename": f.short, "line": f.line,
        "native": f.native,
    }
    if f.locals:
        d["locals"] = {k: v for k, v in f.locals}
    return d


def thread_to_dict(t: Thread) -> dict[str, Any]:
    return {
        "name": t.name, "thread_id": t.thread_id, "os_thread_id": t.os_thread_id,
        "active": t.active, "owns_gil": t.owns_gil,
        "frames": [frame_to_dict(f) for f in t.frames],
    }


def process_to_dict(p: Process) -> dict[str, Any]:
    d: dict[str, Any] = {
        "host": p.host, "pid": p.pid, **{k: getattr(p, k) for k in IDENTITY_FIELDS},
        "cmdline": p.cmdline, "threads": [thread_to_dict(t) for t in p.threads],
    }
    if p.threads_later is not None:
        d["threads_later"] = [thread_to_dict(t) for t in p.threads_later]
    return d


def group_to_dict(g: Group) -> dict[str, Any]:
    return {
        "ranks": g.ranks,
        "processes": [{"host": h, "pid": pid} for h, pid in g.pids],
        "hosts": g.hosts,
        "where": g.where,
        "collective": g.collective,
        "state": g.state,
        "locals": {k: v for k, v in g.locals_key} if g.locals_key else None,
        "frames": [frame_to_dict(f) for f in g.frames],
    }
