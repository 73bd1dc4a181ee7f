"""Pure hang analysis: reduce stacks to signatures, group ranks, classify where each group
waits, and pick the suspects - the ranks that are not where the others are.

No I/O here: the same functions analyse live collections, saved directories and pasted
py-spy text, and are tested on fixtures.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from mldebug.findings import Finding, Severity
from mldebug.hang.frames import (
    _HEX,
    _SIMPLE_REPR,
    call_site,
    collective_of,
    frame_kind,
    is_background,
    our_role,
    user_frames,
    wait_of,
    where,
    without_ours,
)
from mldebug.hang.model import (
    Collection,
    Group,
    Job,
    KernelWait,
    Process,
    ProcSample,
    Report,
    StackFrame,
    Suspect,
    Thread,
    VerdictKind,
    fold_ranks,
    join_labels,
    main_thread,
    proc_label,
)
from mldebug.hosts import collapse


def frame_key(f: StackFrame) -> tuple[str, str, int]:
    return (f.short or f.filename, f.name, f.line)


def thread_signature(t: Thread, cache: dict[int, tuple] | None = None,
                     ) -> tuple[tuple[str, str, int], ...]:
    """The stack as (file, function, line) keys, native addresses left out. ``cache``, keyed by
    the id of the frames list, serves the stacks ranks share (mldebug.hang.pyspy)."""
    if cache is not None:
        hit = cache.get(id(t.frames))
        if hit is not None:
            return hit
    sig = tuple(frame_key(f) for f in t.frames if not (f.native and _HEX.match(f.name))
                and frame_kind(f) != "mldebug")  # mldebug's own frames never count
    if cache is not None:
        cache[id(t.frames)] = sig
    return sig



def process_signature(p: Process, all_threads: bool, threads: list[Thread] | None = None,
                      cache: dict[int, tuple] | None = None) -> tuple:
    ts = p.threads if threads is None else threads
    if all_threads:
        mt = main_thread(ts, p.pid)
        return tuple(sorted((t.name, thread_signature(t, cache)) for t in ts
                            if t is mt or not is_background(t)))
    mt = main_thread(ts, p.pid)
    return thread_signature(mt, cache) if mt else ()


def locals_key(frames: Sequence[StackFrame]) -> tuple[tuple[str, str], ...]:
    """Simple scalar locals of the innermost user frame (loop counters, flags)."""
    users = user_frames(frames)
    if not users:
        return ()
    return tuple((k, v) for k, v in users[0].locals if _SIMPLE_REPR.match(v.strip()))


# -- grouping --------------------------------------------------------------------------
def _frames_for(p: Process) -> list[StackFrame]:
    mt = p.main_thread()
    return without_ours(mt.frames) if mt else []


def ours_note(p: Process) -> str | None:
    """What mldebug itself does in this rank's main thread, when that is the fact worth
    saying: the debugger's wait names itself in the thread's name (mldebug.debugger.wait);
    a rank stopped in a pdb session is said so. The trace ring or watchdog frames are only
    hidden."""
    mt = p.main_thread()
    if mt is None:
        return None
    if mt.name.startswith("mldebug: "):
        return "in mldebug: " + mt.name.removeprefix("mldebug: ")[:200]
    role = our_role(mt.frames)
    if role and role.startswith("the debugger"):
        return "in mldebug: stopped in a debugger session (mldebug.breakpoint)"
    return None


# -- where a rank waits in the kernel (mldebug.hang.node.kernel_wait) ---------------------
_READS = frozenset({"read", "readv", "pread64", "recvfrom", "recvmsg"})


def kernel_label(k: KernelWait | None) -> tuple[str, str] | None:
    """(wait label, what it waits in) from the main thread's system call and kernel wait
    point, for a rank whose Python frames do not say (the call is written in C:
    ``fcntl.flock``, ``Lock.acquire``, ``socket.recv``, ``input``). None when it is not
    blocked in a call worth naming."""
    if k is None:
        return None
    sc, f, wchan = k.syscall or "", k.file or "", k.wchan or ""
    if sc == "restart_syscall" or sc.startswith("syscall "):  # a call resumed after a stop
        sc = ("futex" if "futex" in wchan else "nanosleep" if "nanosleep" in wchan
              else "poll" if "poll" in wchan or "select" in wchan else sc)
    fd = f"fd {k.fd}" if k.fd is not None else "an fd"
    if sc == "flock" or (sc == "fcntl" and k.lock_holder) or "lock_inode_wait" in wchan \
            or "flock_lock" in wchan:
        what = f"{sc or 'a file lock'} on {f or fd}"
        if k.lock_holder:
            comm = f", {k.lock_holder_comm}" if k.lock_holder_comm else ""
            what += f", held by pid {k.lock_holder}{comm}"
        return "file-lock", what
    if sc in _READS or sc == "poll" and f:
        if f.startswith("socket:"):
            return "socket-read", f"{sc} on a socket ({fd}: {f}) whose peer sends nothing"
        if f.startswith("pipe:"):
            if k.fd == 0:
                return "stdin", (f"{sc} on stdin ({fd}: a pipe): input() or sys.stdin waiting "
                                 "for a line nobody types")
            return "pipe-read", f"{sc} on a pipe ({fd}: {f}) nobody writes"
        if k.fd == 0:
            return "stdin", f"{sc} on stdin ({fd}: {f or 'unknown'})"
        if "pipe" in wchan or "fifo" in wchan:
            return "pipe-read", f"{sc} on the FIFO {f or fd}, which nobody writes"
        return "fs-read", f"{sc} of {f or fd}"
    if sc in ("open", "openat"):
        if "fifo" in wchan or "wait_for_partner" in wchan or "pipe" in wchan:
            return "fifo-open", "open of a FIFO that no process opens for writing"
        return "fs-read", f"{sc} (a file system that does not answer, wchan {wchan or '?'})"
    if sc == "futex" or "futex" in wchan:
        return "lock", "a futex: a lock or condition waited on in C code (Lock.acquire, a C " \
                       "extension's mutex)"
    if sc in ("nanosleep", "clock_nanosleep") or "nanosleep" in wchan:
        return "sleep", sc or "nanosleep"
    if sc in ("wait4", "waitid"):
        return "subprocess", f"{sc}: waiting for a child process"
    if sc in ("poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait") or (
            sc == "restart_syscall" and "poll" in wchan):
        return "poll", f"{sc} on file descriptors that never become ready"
    if sc in ("accept", "accept4", "connect"):
        return "socket-read", f"{sc} on a socket ({fd}: {f or '?'})"
    return None


# -- CPU and progress, from the /proc samples -------------------------------------------
def _cpu_between(p: Process, a: ProcSample, b: ProcSample) -> tuple[float, float, int] | None:
    """(CPU seconds used, seconds elapsed, ticks) of the main thread from sample ``a`` to
    ``b``; None for a bad pair (no time passed, or a reused pid's ticks went back)."""
    dt, ticks = b.t - a.t, b.ticks - a.ticks
    if dt <= 0 or ticks < 0:
        return None
    return ticks / max(p.clk_tck, 1), dt, ticks


def _spins(a: ProcSample, b: ProcSample, used: float, dt: float, ticks: int) -> bool:
    """Busy on the CPU: at least 30% of a core, or runnable at both samples with ticks."""
    return used / dt >= 0.3 or (a.state == "R" and b.state == "R" and ticks > 0)


def activity(p: Process) -> tuple[str, str] | None:
    """("spinning" | "blocked", evidence) from the samples around the dumps, or None when
    unsampled or unclear. Spinning: the main thread used CPU and was runnable at both
    samples, or used at least 30% of a core; blocked: asleep (S/D) with at most one tick."""
    if len(p.samples) < 2:
        return None
    a, b = p.samples[0], p.samples[1]
    cpu = _cpu_between(p, a, b)
    if cpu is None:
        return None
    used, dt, ticks = cpu
    states = f"{a.state}/{b.state}"
    if _spins(a, b, used, dt, ticks):
        return "spinning", f"CPU busy: {used:.2f}s of CPU in {dt:.2f}s, state {states}"
    if ticks <= 1 and not (a.state == "R" and b.state == "R"):
        return "blocked", f"asleep: {used:.2f}s of CPU in {dt:.2f}s, state {states}"
    return None


# in the reason (the same words for a live run and for saved dumps; figures are in samples[])
ACTIVITY_WORDS = {"spinning": "spinning (its main thread runnable and using CPU)",
                  "blocked": "blocked (its main thread asleep, no CPU used)"}


def io_moved(p: Process) -> bool:
    """With --watch: the process read or wrote (sockets included) over the watch."""
    if len(p.samples) < 3:
        return False
    a, b = p.samples[1], p.samples[-1]
    return a.io is not None and b.io is not None and b.io > a.io


def cpu_moved(p: Process) -> bool:
    """With --watch: the main thread kept using CPU between the dumps (a rank looping in the
    same stack), by the test ``activity`` applies around the first dump."""
    if len(p.samples) < 3:
        return False
    a, b = p.samples[1], p.samples[-1]
    cpu = _cpu_between(p, a, b)
    return cpu is not None and _spins(a, b, *cpu)


def _split_by_locals(members: list[Process]) -> dict[tuple, list[Process]]:
    """Split ranks with identical stacks by the loop state of their innermost user frame.

    Only locals that tell ranks apart for a reason count: values equal to the rank or local
    rank (``rank``, ``local_rank``...) and values every member shares are ignored. What is
    left (``step=1`` vs ``step=0``) shows ranks in different iterations of one loop.
    """
    per_proc = {id(p): dict(locals_key(_frames_for(p))) for p in members}
    names = set().union(*(d.keys() for d in per_proc.values())) if per_proc else set()
    telling = []
    for name in sorted(names):
        values = [per_proc[id(p)].get(name) for p in members]
        if len(set(values)) <= 1:
            continue
        if all(v is not None and v in (str(p.rank), str(p.local_rank))
               for v, p in zip(values, members, strict=True)):
            continue
        telling.append(name)
    out: dict[tuple, list[Process]] = defaultdict(list)
    for p in members:
        d = per_proc[id(p)]
        out[tuple((n, d.get(n, "?")) for n in telling)].append(p)
    return out


def group_processes(processes: Sequence[Process], all_threads: bool = False) -> list[Group]:
    by_code: dict[tuple, list[Process]] = defaultdict(list)
    cache: dict[int, tuple] = {}  # the processes keep every frames list alive meanwhile
    for p in processes:
        by_code[process_signature(p, all_threads, cache=cache)].append(p)
    buckets: dict[tuple, list[Process]] = {}
    for sig, members in by_code.items():
        if len(members) > 1 and any(f.locals for f in _frames_for(members[0])):
            for lkey, sub in _split_by_locals(members).items():
                buckets[(sig, lkey)] = sub
        else:
            buckets[(sig, ())] = members
    groups = []
    for (_, lkey), members in buckets.items():
        frames = _frames_for(members[0])
        ranks = sorted(p.rank for p in members if p.rank is not None)
        w = wait_of(frames)
        note = ours_note(members[0])
        mt = members[0].main_thread()
        coll = collective_of(frames)
        wait, wait_at = ("debugger", note) if note else (w[0], w[1].location) if w else \
            (None, None)
        kernel = False
        if wait is None and coll is None and frames:  # the call is in C: the kernel says
            kw = kernel_label(members[0].kernel)
            if kw is not None:
                (wait, wait_at), kernel = kw, True
        groups.append(Group(
            ranks=ranks,
            pids=sorted((p.host, p.pid) for p in members),
            hosts=sorted({p.host for p in members}),
            where=where(frames),
            collective=coll,
            frames=frames,
            locals_key=lkey,
            wait=wait,
            wait_at=wait_at,
            ours=note,
            hidden=len(mt.frames) - len(frames) if mt else 0,
            kernel=kernel,
        ))
    groups.sort(key=lambda g: (-len(g.pids), g.ranks[:1] or [1 << 62], g.pids[:1]))
    return groups


# -- missing ranks ---------------------------------------------------------------------
def _most_common(values: Iterable[int | None]) -> int | None:
    counts = Counter(v for v in values if v is not None)
    # the first of the most frequent, as most_common(1) (which imports heapq for it)
    return max(counts, key=counts.__getitem__) if counts else None


def missing_ranks(processes: Sequence[Process]) -> tuple[int | None, list[int], dict[int, str]]:
    """World size, ranks absent from the collection, and the host each should be on."""
    world = _most_common(p.world_size for p in processes)
    if world is None:
        return None, [], {}
    found = {p.rank for p in processes if p.rank is not None}
    missing = [r for r in range(world) if r not in found]
    expected: dict[int, str] = {}
    lws = _most_common(p.local_world_size for p in processes)
    by_node: dict[int, str] = {}
    for p in processes:
        node = p.node_rank
        if node is None and lws and p.rank is not None:
            node = p.rank // lws  # launchers place ranks on nodes in blocks of local size
        if node is not None:
            by_node.setdefault(node, p.host)
    spans: dict[str, tuple[int, int]] = {}
    for p in processes:
        if p.rank is None:
            continue
        lo, hi = spans.get(p.host, (p.rank, p.rank))
        spans[p.host] = (min(lo, p.rank), max(hi, p.rank))
    for r in missing:
        if lws and (r // lws) in by_node:
            expected[r] = by_node[r // lws]
            continue
        for host, (lo, hi) in spans.items():
            if lo <= r <= hi:
                expected[r] = host
                break
    return world, missing, expected




# -- jobs ------------------------------------------------------------------------------------
def split_jobs(processes: Sequence[Process]) -> tuple[dict[str, list[Process]], list[Process]]:
    """Processes by job key, and the lone ones (a rank variable but no job around them)."""
    jobs: dict[str, list[Process]] = {}
    lone: list[Process] = []
    for p in processes:
        if p.lone:
            lone.append(p)
        else:
            jobs.setdefault(p.job_key, []).append(p)
    return jobs, lone


def _apply_watch(processes: Sequence[Process], groups: list[Group], all_threads: bool) -> None:
    by_key = {(p.host, p.pid): p for p in processes}
    for g in groups:
        states = set()
        for key in g.pids:
            p = by_key[key]
            if p.threads_later is None:
                continue
            same = process_signature(p, all_threads) == process_signature(
                p, all_threads, p.threads_later)
            if not same or io_moved(p):
                states.add("moving")
            else:  # the same stack: burning CPU over the watch (a loop) or asleep
                states.add("spinning" if cpu_moved(p) else "stuck")
        if states:
            g.state = states.pop() if len(states) == 1 else "mixed"


def _elsewhere_later(procs: Sequence[Process], all_threads: bool) -> tuple[str, str] | None:
    """The ranks outside any collective at --watch's second dump while the others wait in
    one, and where they were: ("rank 2", "at slow_source (job.py:21)"); None otherwise."""
    later = [dataclasses.replace(p, threads=p.threads_later, threads_later=None)
             for p in procs if p.threads_later is not None]
    if len(later) < 2:
        return None
    groups = group_processes(later, all_threads)
    waiting = [g for g in groups if g.collective]
    out = [g for g in groups if not g.collective and g.frames]
    if not waiting or not out or sum(len(g.pids) for g in out) >= sum(
            len(g.pids) for g in waiting):
        return None
    labels = [p.label for g in out for p in later if (p.host, p.pid) in set(g.pids)]
    site = call_site(out[0].frames)
    return join_labels(labels), f"at {site}" if site else "not in any collective"


def _order(p: Process) -> tuple[int, str, int]:
    return (p.rank if p.rank is not None else 1 << 62, p.host, p.pid)


def _stopped_pid(why: str) -> int | None:
    """The pid of an undumped rank's reason (``pid N on HOST: ...``)."""
    head = why.split(" ", 2)
    return int(head[1]) if len(head) > 2 and head[0] == "pid" and head[1].isdigit() else None


def is_stopped_reason(why: str) -> bool:
    """An undumped rank's reason says its process is stopped (mldebug.hang.node's wording)."""
    return "the process is stopped" in why


def _absent_suspects(key: str, sit: Any, stopped: dict[int, tuple[str, int | None]],
                     others: str, with_gone: bool) -> list[Suspect]:
    """The ranks without stacks that the others wait for: a stopped rank always, a rank whose
    process is gone when no rank present is odd (``with_gone``)."""
    out = []
    for r in sit.missing:
        host = sit.expected.get(r, "")
        if r in stopped:
            h, pid = stopped[r]
            out.append(Suspect(rank=r, host=h or host, pid=pid, job=key, activity="stopped",
                               reason="stopped (state T: SIGSTOP or a job-control stop), so it "
                                      f"cannot run{others}"))
        elif with_gone and r not in sit.undumped:
            out.append(Suspect(rank=r, host=host, pid=None, job=key,
                               reason="its process is absent (it exited, was killed or never "
                                      f"started){others}"))
    return out


def _others_text(sit: Any) -> str:
    from mldebug.hang import rules

    if not sit.places:
        return ""
    return " while " + "; ".join(f"{rules.ranks_text(sit.groups, idx)} "
                                 f"{'wait' if sit.size(idx) > 1 else 'waits'} "
                                 f"{rules.place(sit.groups[idx[0]])}" for idx in sit.places[:3])


def analyze_job(key: str, procs: list[Process], *, all_threads: bool = False,
                watch: float | None = None, answered: frozenset[str] = frozenset(),
                gpu: dict[str, list[dict[str, Any]]] | None = None,
                undumped: dict[int, str] | None = None,
                stopped: dict[int, tuple[str, int | None]] | None = None,
                recheck: float | None = None) -> Job:
    """One job's groups, suspects and verdict (see mldebug.hang.rules).

    ``recheck``: the seconds between the first dump and the one-snapshot re-check (every
    rank dumped and sampled again because one snapshot would have named a suspect); its
    evidence is read as --watch's: a job whose every rank moved makes progress."""
    from mldebug.hang import rules

    procs = sorted(procs, key=_order)
    world, missing, expected = missing_ranks(procs)
    groups = group_processes(procs, all_threads)
    window = watch if watch is not None else recheck
    if window is not None:
        _apply_watch(procs, groups, all_threads)
    # A "place" is where a rank is, for the verdict: the collective and the user call site.
    # Groups whose stacks differ only inside torch (rank 0 hosting the store during init,
    # say) are in the same place.
    place_of: dict[tuple, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        place_of[(g.collective, g.where, g.locals_key)].append(i)
    places = sorted(place_of.values(), key=lambda idx: -sum(len(groups[i].pids) for i in idx))
    acts = {(p.host, p.pid): a for p in procs if (a := activity(p)) is not None}
    job_hosts = {p.host for p in procs}
    undumped_here = {r: why for r, why in (undumped or {}).items() if r in missing}
    stopped_here = {r: hp for r, hp in (stopped or {}).items() if r in missing}
    for r, why in undumped_here.items():  # the reason says so: a saved or older document
        if r not in stopped_here and is_stopped_reason(why):
            stopped_here[r] = (expected.get(r, ""), _stopped_pid(why))
    sit = rules.Situation(procs, groups, places, world, missing, expected, answered, watch,
                          all_threads, activity=acts,
                          gpu={h: v for h, v in (gpu or {}).items() if h in job_hosts},
                          undumped=undumped_here, stopped=sorted(stopped_here),
                          recheck=recheck)
    v = rules.verdict(sit)
    by_key = {(p.host, p.pid): p for p in procs}
    suspects = []
    for gi, reason in v.reasons.items():
        g = groups[gi]
        for host, pid in g.pids:
            p = by_key[(host, pid)]
            act = acts.get((host, pid)) if not g.collective else None
            suspects.append(Suspect(rank=p.rank, host=host, pid=pid, ns_pid=p.ns_pid,
                                    reason=reason + (f"; {ACTIVITY_WORDS[act[0]]}" if act
                                                     else ""),
                                    call_site=call_site(g.frames), job=key,
                                    activity=act[0] if act else None))
    text, kind = v.text, v.kind
    # ranks raising while another rank's process is gone most often raise because of it (the
    # gloo or NCCL connection to it closed): the gone rank is the suspect
    gone = [r for r in missing if r not in undumped_here]
    # the suspects are raising or exiting while a rank is gone: a crash spreading (gloo's
    # "Connection closed by peer"), not the cause of it - the gone ranks are the suspects
    reacting = bool(gone) and bool(v.reasons) and all(
        rules._raising(groups[i]) or rules._python_gone(sit, groups[i]) for i in v.reasons)
    if reacting:
        suspects = []
    # the ranks with no stacks that the others wait for: stopped ones, gone ones
    absent = _absent_suspects(key, sit, stopped_here, _others_text(sit),
                              with_gone=not suspects and kind is not VerdictKind.AMBIGUOUS)
    # the ranks whose stacks show them odd first, then the ones known only from /proc (a
    # stopped rank's place is unknown: it may have stopped while waiting beside the others)
    suspects.sort(key=lambda s: (s.rank if s.rank is not None else 1 << 62, s.host,
                                 s.pid or 0))
    suspects += sorted(absent, key=lambda s: (s.rank if s.rank is not None else 1 << 62,
                                              s.host, s.pid or 0))
    if not text and suspects:
        names = join_labels(s_label(s) for s in suspects)
        text = (f"Suspect{'s' if len(suspects) > 1 else ''}: {names} - "
                f"{suspects[0].reason}.")
    # every rank moved (stack or data) between the two dumps: progress, never a suspect
    if window is not None and not missing and groups and all(g.state == "moving" for g in groups):
        slowest = ""
        if suspects:
            names = join_labels(s_label(s) for s in suspects)
            slowest = (f" At the first dump {names} {'were' if len(suspects) > 1 else 'was'} "
                       f"elsewhere ({suspects[0].reason}): the slowest, not stuck.")
        elif watch is not None and (later := _elsewhere_later(procs, all_threads)):
            # the first dump caught every rank in the collective (the slow rank had just
            # arrived): the second dump, --watch seconds later, may show who comes last
            names, where = later
            slowest = (f" At the second dump {names} {'were' if ' and ' in names else 'was'} "
                       f"outside the collective the others waited in ({where}): the slowest, "
                       "not stuck.")
        if watch is not None:
            text = (f"Every rank moved within {watch:g}s (its stack changed or it sent or "
                    f"received data): the job makes progress.{slowest}")
        else:  # which rank was elsewhere at one instant says nothing of who is slowest
            first = ("The first dump had them at different places, as ranks between steps "
                     "are." if len(places) > 1 else "The first dump had every rank in one "
                     "place, as a job whose step is mostly one collective is at most instants.")
            text = (f"Every rank moved between two dumps {window:g}s apart (its stack changed "
                    f"or it sent or received data): the job makes progress, nothing is stuck. "
                    f"{first}")
        suspects, kind = [], VerdictKind.PROGRESS
    sit.suspects = suspects
    sit.progress = kind is VerdictKind.PROGRESS
    if missing:
        miss = fold_ranks(missing)
        hosts = sorted({expected[r] for r in missing if r in expected})
        where_txt = f" (expected on {collapse(hosts)})" if hosts else ""
        alive = [r for r in missing if r in sit.undumped]
        if stopped_here and len(stopped_here) == len(missing):
            text = (f"Rank{'s' if len(missing) > 1 else ''} {miss} of {world} "
                    f"{'are' if len(missing) > 1 else 'is'} alive{where_txt} but stopped "
                    "(state T: SIGSTOP or a job-control stop), and the others wait for it. "
                    + text)
        elif alive and len(alive) == len(missing):  # stopped or traced: there, not readable
            text = (f"Rank{'s' if len(missing) > 1 else ''} {miss} of {world} "
                    f"{'are' if len(missing) > 1 else 'is'} alive{where_txt} but could not be "
                    "read (see the hint), and the others may be waiting for it. " + text)
        else:
            text = (f"Rank{'s' if len(missing) > 1 else ''} {miss} of {world} "
                    f"{'are' if len(missing) > 1 else 'is'} missing{where_txt}: it may have "
                    "crashed or never started, and the others may be waiting for it. " + text)
        if kind is VerdictKind.SAME_PLACE:
            kind = VerdictKind.SUSPECTS
    cls = rules.hang_class(sit, kind, [] if reacting else [groups[i] for i in v.reasons])
    suspect_hosts = {s.host for s in suspects} | {expected[r] for r in missing if r in expected}
    fix = rules.CLASS_FIXES.get(cls) or rules.FIXES[kind]
    if cls is rules.HangClass.DEBUGGER and not missing:
        text, fix = rules.pdb_session(groups) or (text, fix)
    if cls is rules.HangClass.STOPPED:
        pids = sorted({x.pid for x in suspects if x.activity == "stopped" and x.pid})
        fix = fix.replace("kill -CONT PID", "kill -CONT " + " ".join(map(str, pids))
                          if pids else "kill -CONT PID")
    verdict = Finding(kind.severity, f"{cls.headline}: {text.strip()}", "", fix, kind.value,
                      rules._hosts(suspect_hosts))
    launcher = _most_common_str(p.job_launcher or p.launcher for p in procs)
    return Job(key=key, launcher=launcher, processes=procs, groups=groups, suspects=suspects,
               missing_ranks=missing, missing_hosts=expected, world_size=world,
               verdict=verdict, kind=kind, findings=[verdict, *rules.hints(sit)],
               hang_class=cls)


def _most_common_str(values: Iterable[str | None]) -> str | None:
    counts = Counter(v for v in values if v)
    return max(counts, key=counts.__getitem__) if counts else None


def analyze(collection: Collection, *, all_threads: bool = False,
            job: str | None = None) -> Report:
    """Split the processes into jobs, then group each job's ranks and name the odd ones out.

    ``job``: analyse only the job with this key (``--job``).
    """
    from mldebug.hang import rules

    jobs_procs, lone = split_jobs(collection.processes)
    if job is not None:
        jobs_procs = {k: v for k, v in jobs_procs.items() if k == job}
        lone = []
    answered = frozenset(p.host for p in collection.processes)
    asked = set(collection.hosts)
    errors = list(collection.errors)
    no_answer = {e.host for e in errors if e.pid is None}
    dead = sorted(h for h in asked if h in no_answer and h not in answered)
    jobs = [analyze_job(k, v, all_threads=all_threads, watch=collection.watch,
                        answered=answered | (asked - no_answer), gpu=collection.gpu,
                        undumped={r: why for (jk, r), why in collection.undumped.items()
                                  if jk == k},
                        stopped={r: (h, pid) for (jk, r), (h, pid) in collection.stopped.items()
                                 if jk == k},
                        recheck=collection.recheck if collection.watch is None else None)
            for k, v in jobs_procs.items()]
    jobs.sort(key=lambda j: (-len(j.processes), j.key))
    if len(jobs) > 1:  # several jobs: every hint names its job
        for j in jobs:
            j.findings = [j.verdict, *(dataclasses.replace(
                f, title=f"Job {j.key or '(unnamed)'}: {f.title}") for f in j.findings[1:])]
    findings: list[Finding] = []
    if not jobs:
        kind = VerdictKind.NO_PROCESSES
        if job is not None:
            title = f"No job with key {job!r} among the processes found."
        else:
            title = ("No rank processes were found"
                     + (" (see errors)." if errors else ": is the job running on these hosts? "
                        "Use --pid or --pattern if its processes carry no RANK variable."))
        findings.append(Finding(kind.severity, title, "", rules.FIXES[kind], kind.value))
    elif len(jobs) > 1:
        keys = ", ".join(j.key or "(unnamed)" for j in jobs[:6])
        findings.append(Finding(
            Severity.WARNING, f"{len(jobs)} jobs found: {keys}. Each is analysed alone.",
            "Ranks of different jobs are never grouped together; each job has its own verdict.",
            "Narrow to one job with --job KEY (or --pid LAUNCHER_PID).", "jobs"))
    for j in jobs:  # in the report's own list a verdict names its job too (--json readers)
        findings.extend(j.findings if len(jobs) == 1 else [j.named_verdict(), *j.findings[1:]])
    from mldebug.nodetrust import duplicate_rank_finding, duplicate_ranks

    dup = duplicate_rank_finding(duplicate_ranks(
        (j.key or "", p.rank, p.host, p.pid) for j in jobs for p in j.processes))
    if dup:
        findings.append(dup)
    if lone:
        findings.append(Finding(
            Severity.INFO, f"{len(lone)} process{'es' if len(lone) != 1 else ''} carry a rank "
            "variable but belong to no job; not analysed as ranks.",
            ", ".join(p.label + f" ({proc_label(p.host, p.pid)})" for p in lone[:6]),
            "If they are ranks, select them with --pid or --pattern: "
            f"mldebug hang --pid {lone[0].pid}"
            + (f" --nodes {lone[0].host}" if len({p.host for p in lone}) > 1 else "")
            + " (that process and its children), or mldebug hang --pattern REGEX (on their "
            "command lines).", "lone-processes",
            rules._hosts({p.host for p in lone})))
    if dead:
        findings.append(Finding(
            Severity.WARNING, f"{len(dead)} node{'s' if len(dead) != 1 else ''} did not answer: "
            f"{collapse(dead)}.", "Their ranks, if any, are not in this report.",
            "See the errors below for why; retry those nodes with --nodes.",
            "dead-nodes", (collapse(dead),)))
    route = route_finding([p for j in jobs for p in j.processes])
    if route is not None:
        findings.append(route)
    return Report(jobs=jobs, errors=errors, lone=sorted(lone, key=_order), findings=findings,
                  watch=collection.watch, dead_hosts=dead, gpu=collection.gpu,
                  notes=list(collection.notes), all_threads=all_threads)


def route_finding(processes: Sequence[Process]) -> Finding | None:
    """Which ranks answered through torch's debug server rather than py-spy: said, so a reader
    knows the stacks came from the ranks themselves (and, for dump_traceback, without native
    frames, thread names or the pid's own py-spy)."""
    served = [p for p in processes if p.route == "debug-server"]
    if not served:
        return None
    from mldebug.hang import rules
    from mldebug.hang.model import fold_ranks, join_labels

    ranks = [p.rank for p in served if p.rank is not None]
    who = (f"rank{'s' if len(ranks) != 1 else ''} {fold_ranks(ranks)}" if ranks
           else join_labels(proc_label(p.host, p.pid) for p in served))
    handlers = sorted({p.route_detail or "?" for p in served})
    others = sorted({p.route or "saved" for p in processes if p.route != "debug-server"})
    return Finding(
        Severity.INFO, f"Route: {who} answered through torch's debug server "
        f"({', '.join(handlers)}), not py-spy",
        "py-spy could not read these ranks (ptrace denied, py-spy missing, or their "
        "environment hidden), so each rank's own torch.distributed.debug worker server, "
        "found through the job's TCPStore, was asked"
        + (f"; the other ranks: {', '.join(others)}." if others else "."),
        "Nothing to do: the verdict uses these stacks. For py-spy's route (native frames with "
        "--native, every process): run as root or allow ptrace.", "route-debug-server",
        rules._hosts({p.host for p in served}))


def s_label(s: Suspect) -> str:
    own = f", {s.ns_pid} in its pid namespace" if s.ns_pid is not None else ""
    if s.pid is None:  # a rank with no process: its expected node
        return (f"rank {s.rank} (no process" + (f"; expected on {s.host})" if s.host else ")"))
    if s.rank is not None:
        return (f"rank {s.rank} ({s.host}, pid {s.pid}{own})" if s.host
                else f"rank {s.rank} (pid {s.pid}{own})")
    return proc_label(s.host, s.pid) + (f" ({s.ns_pid} in its pid namespace)" if own else "")
