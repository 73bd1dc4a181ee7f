"""Plain data for hang analysis: processes, threads, frames, jobs and the resulting report."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from mldebug.dist import Identity
from mldebug.findings import Finding, Severity, findings_to_json


@dataclass(frozen=True)
class StackFrame:
    """One frame of a py-spy stack (innermost first in a thread)."""

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
    frames: list[StackFrame] = field(default_factory=list)  # innermost first


@dataclass(frozen=True)
class ProcSample:
    """One /proc sample of a rank (mldebug.hang.node.proc_sample): the main thread's state and
    CPU ticks, the process's ticks, its read+write bytes (None when unreadable)."""

    t: float
    state: str
    ticks: int
    proc_ticks: int = 0
    io: int | None = None


@dataclass(frozen=True)
class KernelWait:
    """Where a rank's main thread waits in the kernel (mldebug.hang.node.kernel_wait): the
    system call it is blocked in, the file its fd argument names, the kernel function it
    sleeps in, and for a file lock the process holding it (from /proc/locks)."""

    syscall: str | None = None  # "futex", "read", "flock", "openat", ...
    file: str | None = None  # "socket:[123]", "pipe:[45]", "/data/ckpt.lock"
    fd: int | None = None
    wchan: str | None = None  # "pipe_read", "futex_wait_queue", "locks_lock_inode_wait"
    lock_kind: str | None = None  # "FLOCK", "POSIX" (the lock it waits for)
    lock_holder: int | None = None  # the pid holding that lock
    lock_holder_comm: str | None = None


# What a Process knows of its place in the job: mldebug.dist.Identity's fields (host aside),
# copied flat so the JSON of a dump stays one level deep.
IDENTITY_FIELDS = tuple(f for f in Identity.FIELDS if f != "host")


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
    # The job this process belongs to, as the node saw it (mldebug.ranks.job_of); None
    # for pasted or old dumps, which then fall back to the run id.
    job: str | None = None
    job_launcher: str | None = None  # "torchrun", "deepspeed", "srun", ... when known
    lone: bool = False  # carries a rank variable but no job is around it
    workers: list[Process] = field(default_factory=list)  # its DataLoader workers, dumped too
    # /proc samples: before and after the dumps, and after the second round with --watch
    samples: list[ProcSample] = field(default_factory=list)
    clk_tck: int = 100
    # how its stacks were read: "py-spy", "debug-server" (torch's per-rank debug server),
    # "python" / "faulthandler" (--signal); None for saved dumps of older versions
    route: str | None = None
    route_detail: str | None = None  # the debug server's handler: pyspy_dump, dump_traceback
    # the pid the process has in its own pid namespace (a container, unshare --pid) when it
    # differs from ``pid`` (this node's): what the rank prints and names its files with
    ns_pid: int | None = None
    kernel: KernelWait | None = None  # where the main thread waits in the kernel
    # the second dump (threads_later) was the one-snapshot re-check, this many seconds after
    # the first, not --watch's
    recheck: float | None = None

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else proc_label(self.host, self.pid)

    @property
    def job_key(self) -> str:
        """The key grouping processes into jobs ('' when nothing tells jobs apart)."""
        if self.job:
            return self.job
        return f"run:{self.run_id}" if self.run_id else ""

    def main_thread(self) -> Thread | None:
        return main_thread(self.threads, self.pid)


def join_labels(labels: Iterable[str], limit: int = 8) -> str:
    """``a, b, c and N more``: at most ``limit`` labels, repeats counted once (``pid 42 (x10)``,
    as when the same paste is read twice). One wording for every list of processes."""
    counts: dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    shown = [f"{k} (x{n})" if n > 1 else k for k, n in list(counts.items())[:limit]]
    more = f" and {len(counts) - limit} more" if len(counts) > limit else ""
    return ", ".join(shown) + more


def fold_ranks(ranks: Iterable[int], limit: int = 12) -> str:
    """Ranks folded into ranges (``0-3,7``), at most ``limit`` ranges then "and N more"."""
    from mldebug.render import fold_ints

    values = sorted(set(ranks))
    parts = fold_ints(values).split(",") if values else []
    if len(parts) <= limit:
        return ",".join(parts)
    shown = parts[:limit]
    n_shown = sum(int(p.split("-")[1]) - int(p.split("-")[0]) + 1 if "-" in p else 1
                  for p in shown)
    return ",".join(shown) + f" and {len(values) - n_shown} more"


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
    gpu: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # host -> GPU polls
    # (job key, rank) -> why a live rank has no stacks (stopped, traced, py-spy failed): such a
    # rank is alive, never "exited"
    undumped: dict[tuple[str, int], str] = field(default_factory=dict)
    # what a node's answer says about the node without being an error: it answered under
    # another name (an IP, an ssh alias; ``nodetrust.check_host``) - it did answer
    notes: list[CollectError] = field(default_factory=list)
    # (job key, rank) -> (host, pid) of a live rank that is stopped (state T: SIGSTOP, job
    # control); such a rank is also in ``undumped``
    stopped: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    recheck: float | None = None  # the one-snapshot re-check's interval, when one ran


class VerdictKind(str, enum.Enum):
    """What a job's verdict says; the verdict finding's ``code`` is the value."""

    SUSPECTS = "suspects"
    SAME_PLACE = "same-place"
    AMBIGUOUS = "ambiguous"
    NO_PROCESSES = "no-processes"
    PROGRESS = "progress"  # --watch saw every rank move: slow, not stuck

    @property
    def severity(self) -> Severity:
        """Suspects named (or nothing found) is an error; no odd one out is a warning."""
        bad = self in (VerdictKind.SUSPECTS, VerdictKind.NO_PROCESSES)
        return Severity.ERROR if bad else Severity.WARNING

    @property
    def style(self) -> str:
        return self.severity.style


class HangClass(str, enum.Enum):
    """What kind of hang a job's verdict names first (docs/hang.md, "Classes")."""

    DESYNC = "desync"  # ranks in different collectives, or some in one and the rest not
    BLOCKED = "blocked"  # a rank outside any collective, asleep (lock, I/O, queue, worker)
    SPINNING = "spinning"  # a rank outside any collective burning CPU (state R, ticks grow)
    OUTSIDE = "outside-collective"  # outside any collective, CPU not sampled (saved dumps)
    DEBUGGER = "debugger"  # a rank waits in mldebug.breakpoint's barrier
    COLLECTIVE_IDLE = "collective-idle"  # all in one collective, idle on the host
    SAME_COLLECTIVE = "same-collective"  # all in one collective, CPU not sampled
    DEVICE_WEDGE = "device-wedge"  # GPU signals (not collected yet: reserved)
    DEAD_RANK = "dead-rank"  # a rank's process is gone or never started
    STOPPED = "stopped"  # a rank's process is stopped (state T: SIGSTOP, job control)
    EXCEPTION = "exception"  # a rank's main thread runs sys.excepthook: raising, exiting
    LAUNCH = "launch"  # ranks stuck in start-up: init_process_group, the store, rendezvous
    SLOW = "slow"  # --watch saw every rank make progress
    SAME_PLACE = "same-place"  # all ranks at one place outside any collective
    NONE = "none"  # no rank processes

    @property
    def headline(self) -> str:
        return CLASS_TITLES[self]


CLASS_TITLES = {
    HangClass.DESYNC: "Collective mismatch",
    HangClass.BLOCKED: "Blocked outside any collective",
    HangClass.SPINNING: "Spinning outside any collective",
    HangClass.OUTSIDE: "Outside any collective",
    HangClass.DEBUGGER: "Waiting for the debugger",
    HangClass.COLLECTIVE_IDLE: "Every rank idle in the same collective (network or device side)",
    HangClass.SAME_COLLECTIVE: "Every rank in the same collective",
    HangClass.DEVICE_WEDGE: "Device-side wedge",
    HangClass.DEAD_RANK: "Dead or missing rank",
    HangClass.STOPPED: "Stopped rank",
    HangClass.EXCEPTION: "A rank is raising",
    HangClass.LAUNCH: "Stuck in start-up",
    HangClass.SLOW: "Slow, not stuck",
    HangClass.SAME_PLACE: "Every rank at the same place",
    HangClass.NONE: "No ranks",
}


@dataclass
class Group:
    ranks: list[int]
    pids: list[tuple[str, int]]  # (host, pid)
    hosts: list[str]
    where: str  # innermost user frame, e.g. "buggy (collective_mismatch.py:31)"
    collective: str | None
    frames: list[StackFrame]
    state: str | None = None  # "stuck", "spinning", "moving", "mixed" with --watch
    locals_key: tuple[tuple[str, str], ...] = ()
    wait: str | None = None  # what the innermost frame that matters waits in ("queue.get")
    wait_at: str | None = None  # that frame's location
    ours: str | None = None  # "in mldebug: waiting for the debugger on rank 0" (frames hidden)
    hidden: int = 0  # mldebug frames taken out of the stack shown
    kernel: bool = False  # wait/wait_at come from /proc (a live run only), not the frames


@dataclass(frozen=True)
class Suspect:
    rank: int | None
    host: str
    pid: int | None  # None: a rank with no process (gone, never started)
    reason: str
    call_site: str | None = None
    job: str = ""
    activity: str | None = None  # "spinning" / "blocked" / "stopped", from the /proc samples
    ns_pid: int | None = None  # its pid inside its own pid namespace, when that differs


@dataclass
class Job:
    """One job's processes and its own verdict: jobs are never analysed together."""

    key: str
    launcher: str | None
    processes: list[Process]
    groups: list[Group]
    suspects: list[Suspect]
    missing_ranks: list[int]
    missing_hosts: dict[int, str]  # missing rank -> host that should have had it
    world_size: int | None
    verdict: Finding
    kind: VerdictKind
    findings: list[Finding] = field(default_factory=list)  # verdict first, then hints
    hang_class: HangClass = HangClass.SAME_PLACE

    @property
    def hosts(self) -> list[str]:
        return sorted({p.host for p in self.processes})

    def named_verdict(self) -> Finding:
        """The verdict as a report of several jobs lists it: titled with this job's key."""
        return dataclasses.replace(self.verdict,
                                   title=f"Job {self.key or '(unnamed)'}: {self.verdict.title}")


@dataclass
class Report:
    jobs: list[Job]
    errors: list[CollectError]
    lone: list[Process] = field(default_factory=list)  # a rank variable but no job
    findings: list[Finding] = field(default_factory=list)  # every job's, then the report's
    watch: float | None = None
    dead_hosts: list[str] = field(default_factory=list)  # asked, never answered
    gpu: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # host -> GPU polls
    notes: list[CollectError] = field(default_factory=list)  # Collection.notes
    all_threads: bool = False  # --all-threads: the text report shows every thread

    # The single-job view most callers (and the first schema) use; with several jobs the
    # first job's verdict leads and processes/suspects are every job's.
    @property
    def processes(self) -> list[Process]:
        return [p for j in self.jobs for p in j.processes]

    @property
    def groups(self) -> list[Group]:
        return [g for j in self.jobs for g in j.groups]

    @property
    def suspects(self) -> list[Suspect]:
        return [s for j in self.jobs for s in j.suspects]

    @property
    def missing_ranks(self) -> list[int]:
        return self.jobs[0].missing_ranks if len(self.jobs) == 1 else []

    @property
    def missing_hosts(self) -> dict[int, str]:
        return self.jobs[0].missing_hosts if len(self.jobs) == 1 else {}

    @property
    def world_size(self) -> int | None:
        return self.jobs[0].world_size if len(self.jobs) == 1 else None

    @property
    def verdict_finding(self) -> Finding:
        return self.findings[0]

    @property
    def verdict(self) -> str:
        return self.verdict_finding.title

    @property
    def verdict_kind(self) -> str:
        return self.jobs[0].kind.value if len(self.jobs) == 1 else self.verdict_finding.code
        # (no jobs: "no-processes"; several: "jobs")

    @property
    def hints(self) -> list[Finding]:
        return self.findings[1:]

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document (docs/hang.md, "JSON"): each distinct stack is written
        once under ``stacks`` and threads and groups refer to it by index."""
        stacks = StackTable()
        jobs = []
        for j in self.jobs:
            jobs.append({
                "key": j.key, "launcher": j.launcher, "world_size": j.world_size,
                "hosts": j.hosts, "ranks": len(j.processes),
                "verdict": {"kind": j.kind.value, "class": j.hang_class.value,
                            **j.verdict.to_dict()},
                "suspects": [asdict(s) for s in j.suspects],
                "missing_ranks": j.missing_ranks,
                "missing": [{"rank": r, "expected_host": j.missing_hosts.get(r)}
                            for r in j.missing_ranks],
                "findings": findings_to_json(j.findings),
            })
        return {
            "schema": "mldebug.hang/2",
            "verdict": {"kind": self.verdict_kind, "summary": self.verdict,
                        "code": self.verdict_finding.code,
                        "class": (self.jobs[0].hang_class.value if len(self.jobs) == 1 else
                                  "jobs" if self.jobs else HangClass.NONE.value)},
            "world_size": self.world_size,
            "watch_seconds": self.watch,
            "jobs": jobs,
            "findings": findings_to_json(self.findings),
            "suspects": [asdict(s) for s in self.suspects],
            "missing_ranks": self.missing_ranks,
            "missing": [{"rank": r, "expected_host": self.missing_hosts.get(r)}
                        for r in self.missing_ranks],
            "groups": [group_to_dict(g, stacks, j.key) for j in self.jobs for g in j.groups],
            "processes": [process_to_dict(p, stacks) for p in self.processes],
            "lone_processes": [process_to_dict(p, stacks) for p in self.lone],
            "dead_hosts": self.dead_hosts,
            "gpu": self.gpu,
            "errors": [asdict(e) for e in self.errors],
            "notes": [asdict(e) for e in self.notes],
            "stacks": stacks.rows,
        }


class StackTable:
    """Distinct stacks, each kept once; a stack's index is how the JSON refers to it."""

    def __init__(self) -> None:
        self.rows: list[list[dict[str, Any]]] = []
        self._index: dict[tuple[StackFrame, ...], int] = {}
        self._by_list: dict[int, tuple[list[StackFrame], int]] = {}  # ranks share lists

    def ref(self, frames: list[StackFrame]) -> int:
        seen = self._by_list.get(id(frames))
        if seen is not None and seen[0] is frames:
            return seen[1]
        key = tuple(frames)
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.rows)
            self.rows.append([frame_to_dict(f) for f in frames])
        self._by_list[id(frames)] = (frames, i)
        return i


def frame_to_dict(f: StackFrame) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": f.name, "filename": f.filename, "short_filename": f.short, "line": f.line,
        "native": f.native,
    }
    if f.locals:
        d["locals"] = {k: v for k, v in f.locals}
    return d


def thread_to_dict(t: Thread, stacks: StackTable) -> dict[str, Any]:
    return {
        "name": t.name, "thread_id": t.thread_id, "os_thread_id": t.os_thread_id,
        "active": t.active, "owns_gil": t.owns_gil, "stack": stacks.ref(t.frames),
    }


def process_to_dict(p: Process, stacks: StackTable) -> dict[str, Any]:
    d: dict[str, Any] = {
        "host": p.host, "pid": p.pid, **{k: getattr(p, k) for k in IDENTITY_FIELDS},
        "job": p.job_key, "cmdline": p.cmdline, "route": p.route,
        "threads": [thread_to_dict(t, stacks) for t in p.threads],
    }
    if p.route_detail:
        d["route_detail"] = p.route_detail
    if p.threads_later is not None:
        d["threads_later"] = [thread_to_dict(t, stacks) for t in p.threads_later]
    if p.workers:
        d["workers"] = [process_to_dict(w, stacks) for w in p.workers]
    if p.samples:
        d["samples"] = [asdict(x) for x in p.samples]
    if p.ns_pid is not None:
        d["ns_pid"] = p.ns_pid
    if p.kernel is not None:
        k = p.kernel
        d["kernel"] = {"syscall": k.syscall, "file": k.file, "fd": k.fd, "wchan": k.wchan}
        if k.lock_holder is not None:
            d["kernel"]["lock"] = {"kind": k.lock_kind, "holder": k.lock_holder,
                                   "holder_comm": k.lock_holder_comm}
    if p.recheck is not None:
        d["recheck"] = p.recheck
    return d


def group_to_dict(g: Group, stacks: StackTable, job: str) -> dict[str, Any]:
    return {
        "job": job,
        "ranks": g.ranks,
        "processes": [{"host": h, "pid": pid} for h, pid in g.pids],
        "hosts": g.hosts,
        "where": g.where,
        "collective": g.collective,
        "wait": g.wait,
        "wait_at": g.wait_at,
        "state": g.state,
        "mldebug": g.ours,
        "locals": {k: v for k, v in g.locals_key} if g.locals_key else None,
        "stack": stacks.ref(g.frames),
    }
