"""From per-rank log state to a verdict (pure).

The verdict rules run in order; the first that matches names the culprit. Adding a rule is
one function and one entry in ``RULES``. Rules see ``Facts``: the parsed logs plus what is
derived once (who timed out, who failed, who said nothing).
"""

from __future__ import annotations

import dataclasses
import re
import signal
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from mldebug.findings import Finding, Severity
from mldebug.log.model import Event, LogReport, ParsedLogs, RankLog
from mldebug.render import fold_ints

FAILURE_KINDS = ("exception", "cuda-oom", "cuda-error", "nccl-error", "overflow", "dataloader-killed")
FATAL_SIGNALS = {-int(s) for s in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE)}


@dataclass
class Facts:
    parsed: ParsedLogs
    ranks: dict[int, RankLog]
    known: set[int]  # every rank the logs mention
    waited: set[int] = field(default_factory=set)  # ranks that timed out or lost a peer
    failed: list[tuple[int, Event]] = field(default_factory=list)  # first real failure per rank

    @classmethod
    def of(cls, parsed: ParsedLogs) -> Facts:
        ranks = parsed.ranks
        known = set(ranks)
        if parsed.world_size:
            known |= set(range(min(parsed.world_size, 1 << 20)))
        elif parsed.world_hint and ranks and parsed.world_hint > max(ranks):
            known |= set(range(parsed.world_hint))  # a line stated the world size
        elif len(ranks) > 2 and max(ranks) < 1 << 20 and len(ranks) * 4 >= (max(ranks) + 1) * 3:
            # ranks are numbered 0..N-1: a few gaps among many present ranks are ranks too (a
            # paste of some ranks leaves more gaps than ranks: then nothing is inferred)
            known |= set(range(max(ranks) + 1))
        f = cls(parsed, ranks, known)
        for r, st in ranks.items():
            if st.consequences or st.timeouts:
                f.waited.add(r)
            ev = st.first_primary
            if ev is not None and ev.kind in FAILURE_KINDS:
                f.failed.append((r, ev))
        return f

    def others(self, culprits: set[int]) -> str:
        rest = sorted(self.waited - culprits)
        if not rest:
            return ""
        return (f"Then rank{'s' if len(rest) > 1 else ''} {fold_ints(rest)} timed out or lost "
                f"their peer: consequences, not causes.")


@dataclass
class Verdict:
    finding: Finding
    culprits: list[int]
    how: str = ""  # how the rule decided (said in the verdict)
    sure: str = "high"  # high / medium / low


Rule = Callable[[Facts], "Verdict | None"]


def _order(ev: Event, use_time: bool) -> tuple[float, int]:
    return ((ev.time or 0.0) if use_time else 0.0, ev.line)


def _hosts(facts: Facts, ranks: list[int]) -> tuple[str, ...]:
    return tuple(sorted({h for r in ranks if (st := facts.ranks.get(r)) and (h := st.host)}))


_FIXES = {
    "exception": "Fix the error at {where}; the other ranks only stopped because this rank "
                 "left the collective.",
    "cuda-oom": "Out of GPU memory on this rank: lower its batch/sequence size or activation "
                "memory (activation checkpointing), check for imbalance across ranks "
                "(mldebug mem top), and set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                "against fragmentation.",
    "cuda-error": "Rerun with CUDA_LAUNCH_BLOCKING=1 (and TORCH_USE_CUDA_DSA builds) so the "
                  "error points at the kernel that caused it; an illegal memory access is "
                  "usually an out-of-range index or a bad custom kernel on this rank.",
    "nccl-error": "Rerun with NCCL_DEBUG=INFO and read that output with `mldebug nccl-log`: "
                  "the WARN line before 'unhandled ... error' names the cause.",
    "dataloader-killed": "A DataLoader worker of this rank was killed (SIGKILL: the host's OOM "
                         "killer, not GPU memory): lower num_workers and prefetch_factor, avoid "
                         "copying the dataset into each worker (share it, or use memory-mapped "
                         "files), and check `dmesg -T | grep -i oom` and the job's memory limit; "
                         "`mldebug mem peak -- CMD` measures the peak.",
    "overflow": "inf/nan on this rank: DebugUnderflowOverflow's report above the traceback names "
                "the first module and tensor (lower the learning rate, check the input batch, "
                "or run that module in fp32); the other ranks stopped because all_ranks_stop=True.",
}


def first_failure(facts: Facts) -> Verdict | None:
    """The rank whose real error (not a timeout) came first."""
    if not facts.failed:
        return None
    use_time = all(ev.time is not None for _, ev in facts.failed)
    rank, ev = min(facts.failed, key=lambda x: _order(x[1], use_time))
    same = sorted(r for r, e in facts.failed if r != rank and e.message == ev.message)
    where = ev.frame or ev.source
    detail = [f"at {where} ({ev.source})"]
    if same:
        detail.append(f"Rank{'s' if len(same) > 1 else ''} {fold_ints(same)} failed with the same error later.")
    other = sorted({r for r, _ in facts.failed} - {rank} - set(same))
    if other:
        detail.append(f"Also failed (later): rank{'s' if len(other) > 1 else ''} {fold_ints(other)}.")
    tail = facts.others({rank, *same, *other})
    if tail:
        detail.append(tail)
    detail.append("Order: " + ("by the times on the lines." if use_time else
                                "by position in the log (the lines carry no times)."))
    blamed = facts.parsed.named_by_peers
    how = "the first real error (not a timeout) " + ("by time" if use_time else "by line order")
    sure = "high" if use_time or len(facts.failed) == 1 else "medium"
    if blamed:
        top = max(blamed.values())
        named = sorted(r for r, n in blamed.items() if n == top)
        how += f"; the other ranks' messages name rank {fold_ints(named)} ({top} of them)"
        sure = "high" if rank in named else "low"
    return Verdict(Finding(
        Severity.ERROR, f"rank {rank} failed first: {ev.message[:200]}", "\n".join(detail),
        _FIXES[ev.kind].format(where=where), code=f"log-first-failure-{ev.kind}",
        hosts=_hosts(facts, [rank])), [rank], how, sure)


def killed(facts: Facts) -> Verdict | None:
    """A rank ended by SIGKILL: the kernel's OOM killer leaves nothing else behind."""
    ranks = sorted(r for r, st in facts.ranks.items()
                   if st.exitcode == -int(signal.SIGKILL)
                   or (st.first_primary is not None and st.first_primary.kind == "killed"))
    if not ranks:
        return None
    hosts = _hosts(facts, ranks)
    on = f" on {', '.join(hosts)}" if hosts else ""
    detail = [f"Exit code -9 (SIGKILL){on}, no Python traceback: nothing in the process chose "
              "to exit."]
    tail = facts.others(set(ranks))
    if tail:
        detail.append(tail)
    return Verdict(Finding(
        Severity.ERROR, f"rank{'s' if len(ranks) > 1 else ''} {fold_ints(ranks)} killed by SIGKILL",
        "\n".join(detail),
        "Most often the kernel OOM killer (host RAM, not GPU memory): run "
        "`dmesg -T | grep -i -E 'out of memory|killed process'` on the host, check the job's "
        "memory limit (cgroup, SLURM --mem), and measure the peak with `mldebug mem peak -- CMD`; "
        "DataLoader workers and pinned memory are the usual growth.",
        code="log-killed", hosts=hosts), ranks)


def fatal_signal(facts: Facts) -> Verdict | None:
    """A crash by signal (segfault, bus error) or an abort that no timeout explains."""
    hits = []
    abort = -int(signal.SIGABRT)
    # a communicator's watchdog SIGABRTs every rank whose collective timed out: when the ranks
    # that exited all died of SIGABRT and the job's lines show watchdog timeouts, a SIGABRT
    # rank with no failure line of its own is one more of those aborts, not a crash
    exited = [st.exitcode for st in facts.ranks.values() if st.exitcode not in (None, 0)]
    watchdog_aborts = bool(exited) and all(c == abort for c in exited) and any(
        st.timeouts for st in facts.ranks.values())
    for r, st in facts.ranks.items():
        code = st.exitcode
        if code is None:
            continue
        if code in FATAL_SIGNALS or (code == abort and not st.timeouts and not st.consequences
                                     and not (watchdog_aborts and st.first_primary is None)):
            hits.append((r, code))
    if not hits:
        return None
    ranks = sorted(r for r, _ in hits)
    names = sorted({signal.Signals(-c).name for _, c in hits})
    return Verdict(Finding(
        Severity.ERROR, f"rank{'s' if len(ranks) > 1 else ''} {fold_ints(ranks)} crashed "
        f"({', '.join(names)})", facts.others(set(ranks)),
        "A native crash: run that rank under `PYTHONFAULTHANDLER=1` (Python stack at the "
        "crash) or gdb; look for a bad custom op, a driver problem or a corrupted shared-memory "
        "segment (/dev/shm too small).", code="log-crash", hosts=_hosts(facts, ranks)), ranks)


def stalled(facts: Facts) -> Verdict | None:
    """mldebug's watchdog fired: no beat for its timeout, stacks dumped (exit code 54 with
    ``on_stall="dump+abort"``). The first rank to stall is the one the others waited for."""
    from mldebug.log.parse import STALL_EXIT_CODE

    hits: list[tuple[int, Event | None]] = []
    for r, st in facts.ranks.items():
        ev = st.first_primary if st.first_primary and st.first_primary.kind == "stall" else None
        if ev is not None or st.exitcode == STALL_EXIT_CODE:
            hits.append((r, ev))
    if not hits:
        return None
    timed = [(r, ev) for r, ev in hits if ev is not None]
    use_time = bool(timed) and all(ev.time is not None for _, ev in timed)
    if timed:
        first = min(timed, key=lambda x: _order(x[1], use_time))  # type: ignore[arg-type]
        ranks = [first[0]]
    else:
        ranks = sorted(r for r, _ in hits)
    cmds = [c for c in facts.parsed.evidence if c.startswith("mldebug hang analyze")]
    where = cmds[0] if cmds else "mldebug hang analyze DIR (the watchdog's dir=)"
    others = sorted(r for r, _ in hits if r not in ranks)
    detail = ["mldebug.watchdog() saw no beat() for its timeout on "
              f"rank{'s' if len(ranks) > 1 else ''} {fold_ints(ranks)} and dumped every thread's "
              f"stack (exit code {STALL_EXIT_CODE} with on_stall='dump+abort')."]
    if others:
        detail.append(f"Rank{'s' if len(others) > 1 else ''} {fold_ints(others)} stalled later "
                      "(waiting for it).")
    tail = facts.others(set(ranks) | set(others))
    if tail:
        detail.append(tail)
    return Verdict(Finding(
        Severity.ERROR, f"rank{'s' if len(ranks) > 1 else ''} {fold_ints(ranks)} stalled "
        "(mldebug watchdog: no beat, stacks dumped)", "\n".join(detail),
        f"Read the stacks: `{where}` groups the ranks by where they stood and names the one "
        "outside the collective.", code="log-watchdog-stall", hosts=_hosts(facts, ranks)), ranks,
        "mldebug's watchdog lines and exit code 54" + (", first by time" if use_time and len(timed) > 1 else ""),
        "high" if len(hits) == 1 or use_time else "medium")


def monitored_barrier(facts: Facts) -> Verdict | None:
    """torch.distributed.monitored_barrier (gloo) names the rank that did not arrive: rank 0
    names the ranks it did not hear from; a rank that arrived but got errors from rank 0 points
    at rank 0 (PyTorch: 'Please check rank 0 logs for faulty rank')."""
    mb = facts.parsed.monitored
    if mb.by_rank0:
        culprits = sorted(mb.by_rank0)
        how, sure = "rank 0's monitored_barrier message names the ranks that did not check in", "high"
        said = (f"Rank 0's monitored_barrier did not hear from rank{'s' if len(culprits) > 1 else ''} "
                f"{fold_ints(culprits)} within its timeout ('failed to pass monitoredBarrier').")
    elif mb.reporters:
        culprits = [0]
        how = (f"rank{'s' if len(mb.reporters) > 1 else ''} {fold_ints(sorted(mb.reporters))} reached "
               "monitored_barrier and got errors from rank 0")
        sure = "medium"
        said = (f"Rank{'s' if len(mb.reporters) > 1 else ''} {fold_ints(sorted(mb.reporters))} reached "
                "monitored_barrier but got errors while waiting for rank 0 ('received errors while "
                "waiting for send/recv from rank 0'): rank 0 failed or left first; its own log says why.")
    else:
        return None
    tail = facts.others(set(culprits) | mb.reporters)
    detail = said + ("\n" + tail if tail else "")
    return Verdict(Finding(
        Severity.ERROR,
        f"rank{'s' if len(culprits) > 1 else ''} {fold_ints(culprits)} did not pass monitored_barrier",
        detail,
        "Read the named rank's own output for what kept it from the barrier (an exception, data "
        "loading or preprocessing done only there, a slower step); while it hangs, `mldebug hang` "
        "shows its stack. Raise the barrier's timeout only for work known to be long on that rank.",
        code="log-monitored-barrier", hosts=_hosts(facts, culprits)), culprits, how, sure)


def size_mismatch(facts: Facts) -> Verdict | None:
    """gloo: 'op.preamble.length <= op.nbytes. A vs B. Received data size doesn't match expected
    size': a rank got A bytes for a tensor of B - the ranks passed different sizes to the same
    collective (a mismatch: gloo then aborts that rank with SIGABRT, which is no crash)."""
    saw = {r for r, st in facts.ranks.items()
           if st.first_event is not None and st.first_event.kind == "size-mismatch"}
    loose = [e for e in facts.parsed.launcher_events if e.kind == "size-mismatch"]
    if loose:  # C++ 'terminate called' lines carry no rank: the ranks gloo aborted printed them
        saw |= {r for r, st in facts.ranks.items() if st.exitcode == -int(signal.SIGABRT)}
    if not saw and not loose:
        return None
    ev = loose[0] if loose else next(facts.ranks[r].first_event for r in sorted(saw))
    sizes = re.search(r"(\d+) vs (\d+)", ev.message if ev else "")
    reporters = sorted(saw)
    rest = sorted(facts.known - saw)
    world = len(facts.known)
    apis = Counter(st.wait_site.api for st in facts.ranks.values()
                   if st.wait_site is not None and st.wait_site.api)
    api = apis.most_common(1)[0][0] if apis else None
    either: list[int] = []
    sure = "medium"
    if api in (None, "all_reduce") and reporters and world > 2 and facts.known == set(range(world)):
        # gloo's ring all_reduce (gloo/allreduce.cc): each rank receives from rank + 1 and
        # sends to rank - 1; the size check fails on the receiver, so an aborted rank r holds
        # the odd (smaller) size itself, or its sender r + 1 holds a larger one
        cands = set.intersection(*({r, (r + 1) % world} for r in reporters))
        assumed = "" if api else " (assuming the collective was an all_reduce: no rank's traceback says)"
        if len(cands) == 1:
            culprits = sorted(cands)
            how = (f"gloo's ring all_reduce (each rank receives from rank+1): an aborted rank r "
                   f"holds the odd size or receives it from rank r+1; the one suspect common to "
                   f"ranks {fold_ints(reporters)}{assumed}")
            sure = "medium" if api else "low"
        elif len(cands) == 2:
            r = reporters[0]
            sites = Counter(_site(st.wait_site) for st in facts.ranks.values() if st.wait_site)
            common = [site for site, n in sites.items() if n >= 2 and n == max(sites.values())]
            at_common = {c for c in cands if (st := facts.ranks.get(c)) is not None
                         and st.wait_site is not None and common and _site(st.wait_site) == common[0]}
            if len(at_common) == 1:
                culprits = sorted(cands - at_common)
                how = (f"gloo aborted rank {r}: its own tensor or its ring sender's (rank "
                       f"{(r + 1) % world}) is the odd one{assumed}; rank {min(at_common)} waits at "
                       "the call site the other ranks share, so the other one")
                sure = "low"
            else:
                culprits, either = [], sorted(cands)
                how = (f"gloo aborted rank {r} only: either its tensor is smaller, or its ring "
                       f"sender's (rank {(r + 1) % world}) is larger; these lines do not say "
                       f"which{assumed}")
                sure = "low"
        else:
            culprits, how = [], "gloo's size check (the aborted ranks are not ring neighbours)"
            sure = "low"
    elif len(reporters) == 1 and world > 2:
        culprits, how = reporters, (f"the only rank gloo aborted in {api}: its tensor is "
                                    "smaller than the sender's")
    elif len(rest) == 1 and len(reporters) > 1:
        culprits, how = rest, "the one rank that did not report the size (it sent the odd size)"
    else:
        culprits, how = [], "gloo's size check (which rank passed the odd size is not in these lines)"
        sure = "low"
    got = f" ({sizes[1]} bytes arrived for a tensor of {sizes[2]})" if sizes else ""
    on = (f" on rank{'s' if len(reporters) > 1 else ''} {fold_ints(reporters)}" if reporters
          else " (which rank is not in these lines)")
    detail = (f"gloo's size check failed ('op.preamble.length <= op.nbytes', 'Received data size "
              f"doesn't match expected size'){got}{on}: the ranks "
              "called the same collective with tensors of different sizes (or different "
              "collectives). gloo aborts (SIGABRT) the rank that notices: not a crash.")
    tail = facts.others(set(reporters) | set(culprits))
    if tail:
        detail += "\n" + tail
    title = ("collective size mismatch" + (f": rank{'s' if len(culprits) > 1 else ''} "
                                           f"{fold_ints(culprits)} passed another tensor size"
                                           if culprits else
                                           f": rank {either[0]} or rank {either[1]} passed another "
                                           "tensor size (cannot tell which)" if either else
                                           " between ranks"))
    if either:
        detail += ("\nWhat would tell: TORCH_DISTRIBUTED_DEBUG=DETAIL (names each rank's shape "
                   "and dtype before the collective runs), or printing the tensor's shape and "
                   f"dtype before the collective on ranks {either[0]} and {either[1]}.")
    return Verdict(Finding(
        Severity.ERROR, title, detail,
        "Print each rank's tensor shape before the collective (or rerun with "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL, which names the mismatching ranks and shapes); uneven "
        "last batches and rank-dependent shapes are the usual cause.",
        code="log-size-mismatch", hosts=_hosts(facts, culprits or reporters)), culprits, how,
        sure if culprits else "low")


def launcher_failed(facts: Facts) -> Verdict | None:
    """No rank failed, but the launcher did (before or while starting ranks)."""
    evs = [e for e in facts.parsed.launcher_events if e.primary]
    if not evs or any(st.first_primary for st in facts.ranks.values()):
        return None
    ev = evs[0]
    low = ev.message.lower()
    if "eaddrinuse" in low or "address already in use" in low:
        fix = ("The master port is taken: another job (or a leftover process of the last run) "
               "listens on it. Find it with `ss -ltnp | grep PORT`, or pass another "
               "--master-port (torchrun --rdzv-endpoint HOST:PORT), or let torchrun pick one "
               "with --standalone on one node.")
        code = "log-launcher-port-in-use"
    elif ev.kind in _FIXES:  # one process's log, no rank in it: the error itself, no culprit
        where = ev.frame or ev.source
        return Verdict(Finding(
            Severity.ERROR, f"failed (no rank in these lines): {ev.message[:200]}",
            f"at {where} ({ev.source})", _FIXES[ev.kind].format(where=where),
            code=f"log-first-failure-{ev.kind}"), [], "the first real error; the lines name no rank",
            "medium")
    else:
        fix = ("The launcher failed before the ranks ran: fix the error it names (rendezvous "
               "endpoint, --nnodes, the store's host and port) and rerun.")
        code = "log-launcher-failed"
    return Verdict(Finding(
        Severity.ERROR, f"the launcher failed: {ev.message[:200]}", f"at {ev.source}; no rank "
        "reported an error.", fix, code=code), [], "an error outside every rank's lines", "high")


def behind(facts: Facts) -> Verdict | None:
    """PyTorch's enqueued/completed work numbers: the ranks that never enqueued what others did."""
    by_pg: dict[str, dict[int, int]] = defaultdict(dict)
    for r, st in facts.ranks.items():
        for pg, e0 in st.enqueued.items():
            by_pg[pg][r] = e0
    for pg in sorted(by_pg, key=lambda p: (p != "0", p)):
        enq = by_pg[pg]
        top = max(enq.values())
        late = sorted(r for r, e in enq.items() if e < top)
        if late and len(late) < len(enq):
            ahead = sorted(r for r, e in enq.items() if e == top)
            low = min(enq[r] for r in late)
            return Verdict(Finding(
                Severity.ERROR,
                f"rank{'s' if len(late) > 1 else ''} {fold_ints(late)} never enqueued NCCL work "
                f"#{low + 1} of process group {pg}",
                f"Their last enqueued work is {fold_ints(sorted({enq[r] for r in late}))}; ranks "
                f"{fold_ints(ahead)} reached #{top} and waited for them until the timeout.",
                "The others waited for these ranks: find what they did instead (a data loader, a "
                "rank-dependent branch, a slow host). Next time run `mldebug hang` while it hangs, "
                "or add `mldebug.watchdog()` to dump every rank's stack at a stall.",
                code="log-rank-behind", hosts=_hosts(facts, late)), late)
    return None


def mismatch(facts: Facts) -> Verdict | None:
    """Ranks that timed out in a different collective type at the same sequence number."""
    at: dict[tuple[str, int], dict[int, str]] = defaultdict(dict)
    for r, st in facts.ranks.items():
        for t in st.timeouts:
            if t.seq is not None and t.op:  # same seq: another op or another size is a mismatch
                at[(t.pg, t.seq)][r] = t.op + (f" of {t.numel} elements" if t.numel is not None else "")
    ops_only: dict[str, dict[int, str]] = defaultdict(dict)
    for r, st in facts.ranks.items():
        for t in st.timeouts:
            if t.seq is None and t.op:
                ops_only[t.pg][r] = t.op
    groups: list[tuple[tuple[str, int], dict[int, str]]] = list(at.items())
    groups += [((pg, -1), v) for pg, v in ops_only.items()]
    for (pg, seq), ops in groups:
        count = Counter(ops.values())
        if len(count) < 2:
            continue
        major, _ = count.most_common(1)[0]
        odd = sorted(r for r, op in ops.items() if op != major)
        odd_ops = sorted({ops[r] for r in odd})
        where = f"#{seq} of process group {pg}" if seq >= 0 else f"process group {pg}"
        return Verdict(Finding(
            Severity.ERROR,
            f"rank{'s' if len(odd) > 1 else ''} {fold_ints(odd)} issued {', '.join(odd_ops)} "
            f"where the others issued {major} ({where})",
            f"{count[major]} ranks timed out in {major}; {len(odd)} in {', '.join(odd_ops)}. "
            "Collectives must be called in the same order on every rank.",
            "Find the rank-dependent branch that calls a different collective (often code run "
            "only on rank 0: logging, checkpointing, evaluation, or uneven data at the end of an "
            "epoch). `mldebug fr` on flight-recorder dumps shows the call sites.",
            code="log-collective-mismatch", hosts=_hosts(facts, odd)), odd)
    return None


def fingerprint_mismatch(facts: Facts) -> Verdict | None:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL mismatch messages: the odd rank by majority over every
    rank the messages name (each message names only two)."""
    fps = facts.parsed.fingerprints
    groups = [(f"sequence number {seq}" if seq.isdecimal() else "the messages give no sequence number",
               fps[seq]) for seq in
              sorted(fps, key=lambda s: (not s.isdecimal(), int(s) if s.isdecimal() else 0))]
    every = {r: (f"#{seq} " if len(fps) > 1 else "") + fp for seq, at in fps.items() for r, fp in at.items()}
    groups.append(("different sequence numbers", every))  # ranks out of step: no common seq
    for where, by_rank in groups:
        count = Counter(by_rank.values())
        if len(count) < 2:
            continue
        (major, n_major), *rest = count.most_common()
        tie = bool(rest) and rest[0][1] == n_major
        odd = sorted(by_rank) if tie else sorted(r for r, fp in by_rank.items() if fp != major)
        if tie:
            detail = ("The ranks named disagree and no collective has a majority: "
                      + "; ".join(f"rank {r}: {by_rank[r]}" for r in odd[:8])
                      + ". More ranks' messages (every rank's log) would show the odd one.")
        else:
            detail = (f"{n_major} of {len(by_rank)} ranks named run {major} ({where}); "
                      + "; ".join(f"rank {r}: {by_rank[r]}" for r in odd[:8]) + ".")
        return Verdict(Finding(
            Severity.ERROR,
            (f"rank{'s' if len(odd) > 1 else ''} {fold_ints(odd)} ran another collective "
             f"({where})" if not tie else
             f"ranks {fold_ints(odd)} ran different collectives ({where}; no majority)"),
            detail,
            "Collectives must be the same on every rank, in the same order, with the same shapes "
            "and dtypes: find the rank-dependent branch on the odd rank (evaluation or logging "
            "only on some ranks, uneven last batch, a sequence split that does not divide).",
            code="log-fingerprint-mismatch", hosts=_hosts(facts, odd)), [] if tie else odd,
            f"TORCH_DISTRIBUTED_DEBUG=DETAIL fingerprints, majority of {len(by_rank)} ranks",
            "low" if tie else ("high" if n_major >= 2 else "medium"))
    return None


def terminated(facts: Facts) -> Verdict | None:
    """The launcher itself got a signal (torchrun's SignalException: the scheduler's time limit or
    preemption, scancel, a user's kill) before any rank failed or waited: no rank is to blame."""
    sig = facts.parsed.terminated
    if sig is None:
        return None
    before = [r for r, st in facts.ranks.items()
              if (st.first_primary is not None and st.first_primary.line < sig.line
                  and st.first_primary.kind in FAILURE_KINDS)
              or (st.first_event is not None and not st.first_event.primary and st.first_event.line < sig.line)]
    if before:
        return None  # a rank failed or waited first: the rules below name it
    num = re.search(r"got signal: (\d+)", sig.message)
    name = ""
    if num is not None:
        try:
            name = f" ({signal.Signals(int(num[1])).name})"
        except ValueError:
            pass
    return Verdict(Finding(
        Severity.WARNING, f"the job was terminated from outside: the launcher got signal "
        f"{num[1] if num else '?'}{name}",
        f"{sig.message} ({sig.source}). No rank failed or waited in a collective before it; the "
        "ranks' own exits after it are the launcher stopping them.",
        "Nothing in the job failed: ask the scheduler why it stopped the job (SLURM: `sacct -j "
        "JOBID --format=JobID,State,ExitCode,Elapsed,Timelimit` shows TIMEOUT, PREEMPTED or "
        "CANCELLED by a user); resume from the last checkpoint, and save one on SIGTERM so a "
        "preemption loses less.", code="log-terminated"), [],
        "the launcher's SignalException, before any rank's error or timeout", "high")


def unresponsive(facts: Facts) -> Verdict | None:
    """A rank that never reported a timeout of its own and outlived the launcher's SIGTERM
    (torchrun: 'Unable to shutdown process P via 15, forcefully exiting via 9'): it could not
    run at all - stopped (SIGSTOP, a debugger, state T) or in a C call that holds the GIL."""
    pids = facts.parsed.unkillable
    if not pids or not facts.waited:
        return None
    ranks = sorted(r for r, st in facts.ranks.items()
                   if st.pid in pids and r not in facts.waited and st.first_primary is None)
    if not ranks:
        return None
    s = "s" if len(ranks) > 1 else ""
    return Verdict(Finding(
        Severity.ERROR, f"rank{s} {fold_ints(ranks)} never reached the collective and did not "
        "end on the launcher's SIGTERM (SIGKILLed after the grace period)",
        f"Ranks {fold_ints(sorted(facts.waited))} timed out or lost their peer; rank{s} "
        f"{fold_ints(ranks)} reported nothing and ignored SIGTERM until torchrun killed "
        f"{'them' if s else 'it'} ('Unable to shutdown process ... forcefully exiting via 9'): "
        "not running Python at all - stopped (SIGSTOP, Ctrl-Z, a debugger: state T) or inside a "
        "C call that holds the GIL or an uninterruptible read. The SIGKILL is the launcher's, "
        "not the cause.",
        "Next time, while it hangs: `ps -o pid,stat,wchan -p PID` (T = stopped: `kill -CONT`; "
        "D = kernel I/O), and `mldebug hang` (py-spy shows a native frame holding the GIL).",
        code="log-silent-rank", hosts=_hosts(facts, ranks)), ranks,
        "quiet ranks the launcher had to SIGKILL after SIGTERM", "high")


_KEY_RANK = re.compile(r"/(\d{1,7})$")


def store_launch(facts: Facts) -> Verdict | None:
    """The ranks never got past the store (init_process_group's TCPStore, torchrun's
    rendezvous, a store.wait): who never arrived, when the lines say."""
    store = facts.parsed.store
    if not store.errors:
        return None
    if any(st.timeouts or st.wait_site is not None and st.wait_site.api not in (None, "wait")
           for st in facts.ranks.values()):
        return None  # the ranks got as far as collectives: a store error is no launch failure
    fix = ("Every rank must start, reach the same store (MASTER_ADDR:MASTER_PORT, the same "
           "--rdzv-endpoint) and agree on the world size: check the launch command on every "
           "node, the scheduler's task count, and that no rank's code overrides MASTER_PORT, "
           "WORLD_SIZE or RANK.")
    rdzv = [e for e in store.errors if e.message.startswith("Rendezvous")]
    if rdzv:
        e = rdzv[0]
        return Verdict(Finding(
            Severity.ERROR, f"torchrun's rendezvous failed: {e.message[:160]}",
            f"{e.message} ({e.source}): the launcher gave up waiting for the other nodes "
            "(--nnodes) to join; no rank ran. Which node stayed away is not in this node's log.",
            "Start the job on every node (--nnodes N needs N launchers with the same --rdzv-id "
            "and --rdzv-endpoint), check that each reaches the endpoint, or raise --rdzv-conf "
            "join_timeout when nodes start slowly.", code="log-launch"), [],
            "torchrun's rendezvous error", "high")
    seen = {r for r, st in facts.ranks.items() if st.lines or st.exitcode is not None}
    if store.joined is not None:
        k, w = store.joined
        missing = sorted(set(range(w)) - seen) if w <= 1 << 16 else []
        named = missing if len(missing) == w - k else []
        s = "s" if len(named) > 1 else ""
        return Verdict(Finding(
            Severity.ERROR,
            (f"rank{s} {fold_ints(named)} never joined the store ({k} of {w} ranks did)" if named
             else f"{w - k} of {w} ranks never joined the store (which: not in these lines)"),
            f"The store's server (rank 0) timed out waiting for its clients: '{k}/{w} clients "
            "joined'. " + (f"Rank{s} {fold_ints(named)} left no line at all: never started or "
                           "never reached init_process_group." if named else
                           f"The lines name ranks {fold_ints(sorted(seen))}."),
            fix, code="log-launch", hosts=_hosts(facts, named)), named,
            "the store's 'K/W clients joined' and the ranks seen", "high" if named else "low")
    # every rank waited for the same keys: the ranks those keys belong to never set them
    keys = {k: who for k, who in store.waits.items()}
    if not keys:
        return None
    owners = {k: int(m[1]) for k in keys if (m := _KEY_RANK.search(k))}
    waited = sorted({r for who in keys.values() for r in who if r is not None})
    if len(keys) == 1 and len(owners) == 1:
        key, owner = next(iter(owners.items()))
        launched = max(facts.known) + 1 if facts.known else 0
        if launched and owner >= launched:
            return Verdict(Finding(
                Severity.ERROR, f"the world size in the code is larger than the launch: every "
                f"rank waits for rank {owner}, and ranks 0-{launched - 1} were launched",
                f"Each rank's store wait timed out on key {key} (rank {owner}'s address in "
                f"init_process_group): no rank {owner} exists. No rank is the culprit: the "
                "world_size (or rank) the code passes does not match what the launcher started.",
                "Let init_process_group read WORLD_SIZE and RANK from the launcher's environment "
                "(pass neither), or launch as many ranks as the code expects.",
                code="log-launch"), [], "the store key every rank waited for names a rank "
                "beyond the launched ones", "medium")
        return Verdict(Finding(
            Severity.ERROR, f"rank {owner} never registered in the store: every other rank "
            "waited for its key",
            f"The ranks' store waits timed out on key {key} (rank {owner}'s entry"
            + (f"; the waiting ranks: {fold_ints(waited)}" if waited else "")
            + f"): rank {owner} never reached the store the others used (another MASTER_ADDR / "
            "MASTER_PORT, a network it cannot reach, or it never called init_process_group).",
            fix, code="log-launch", hosts=_hosts(facts, [owner])), [owner],
            "the one store key every waiting rank named", "medium")
    return Verdict(Finding(
        Severity.ERROR, f"the ranks timed out waiting for {len(keys)} store keys; which key was "
        "never set is not in these lines",
        f"Keys waited for: {', '.join(sorted(keys)[:8])}{' ...' if len(keys) > 8 else ''}. A "
        "store wait names every key it waits for, set or not, so these lines cannot tell "
        "which rank did not set its key. What would tell: `store.check([key])` for each key "
        "(or a log line after each rank's store.set).",
        "Make every rank set its key before any rank waits (a rank-dependent early return or an "
        "exception before store.set leaves its key missing); print store.check per key to find "
        "the missing one.", code="log-launch"), [],
        "the keys every rank waited for (all of them: no single missing key)", "low")


def exited_early(facts: Facts) -> Verdict | None:
    """A rank missing from torchrun's failure table (a rank that exited 0 is not listed) between
    listed ranks, that never waited itself, while the others timed out or lost their peer: it
    left the job early (sys.exit(0), a return from main), and the others waited for it."""
    table = {f.rank for f in facts.parsed.launcher}
    if len(table) < 2 or not facts.waited:
        return None
    lo, hi = min(table), max(table)
    gone = sorted(r for r in facts.known if lo < r < hi and r not in table
                  and r not in facts.waited
                  and ((st := facts.ranks.get(r)) is None or st.first_primary is None))
    if not gone or len(gone) * 2 >= len(table):
        return None
    s = "s" if len(gone) > 1 else ""
    lost = sorted(r for r in facts.waited
                  if (ev := facts.ranks[r].first_event) is not None
                  and ("closed by peer" in ev.message or "reset by peer" in ev.message))
    return Verdict(Finding(
        Severity.ERROR, f"rank{s} {fold_ints(gone)} left the job early (exit code 0) while the "
        "others were still training",
        f"torchrun's failure table lists ranks {fold_ints(sorted(table))} and not rank{s} "
        f"{fold_ints(gone)}: a rank that exited with code 0 is not a failure to torchrun. "
        + (f"Rank{'s' if len(lost) > 1 else ''} {fold_ints(lost)} saw the connection closed "
           "by the peer; " if lost else "")
        + f"{'r' if lost else 'R'}anks {fold_ints(sorted(facts.waited))} timed out or lost their peer waiting for "
        f"{'them' if s else 'it'}.",
        "Find the early exit on that rank (sys.exit(0), an early-stopping or end-of-data return "
        "taken by one rank only): every rank must leave the loop together - agree on the stop "
        "flag with an all_reduce before leaving.", code="log-exit-no-traceback",
        hosts=_hosts(facts, gone)), gone,
        "a rank missing from torchrun's failure table among the listed ones", "medium")


def _site(ev: Event) -> str:
    return f"{ev.api or 'a collective'} at {ev.frame}"


def wait_sites(facts: Facts) -> dict[str, list[int]]:
    """The waiting ranks grouped by where their own timeout traceback stood: the collective
    (``all_reduce``, ``broadcast``, ``send``, ...) and the user frame that called it."""
    groups: dict[str, list[int]] = defaultdict(list)
    for r in sorted(facts.waited):
        st = facts.ranks[r]
        if st.first_primary is None and st.wait_site is not None:
            groups[_site(st.wait_site)].append(r)
    return dict(groups)


def _line_of(frame: str) -> tuple[str, int] | None:
    """("file.py in func", line) of a "file.py:12 in func" frame."""
    head, sep, func = frame.partition(" in ")
    file, _, line = head.rpartition(":")
    return (f"{file} in {func}", int(line)) if sep and line.isdecimal() else None


def _behind_all(facts: Facts, groups: list[list[int]]) -> list[int] | None:
    """Among several odd groups, the one still waiting at a line every other waiting rank has
    passed: the same callers, the same function, an earlier line (straight-line code within
    one call). It cannot be waiting for a slower peer; the others can be waiting for it."""
    stacks = {r: st.wait_site.stack for r, st in facts.ranks.items()
              if st.wait_site is not None and r in facts.waited and st.first_primary is None}
    if not stacks or any(not s for s in stacks.values()) or len({s[:-1] for s in stacks.values()}) != 1:
        return None
    where = {r: _line_of(s[-1]) for r, s in stacks.items()}
    lines = {r: w[1] for r, w in where.items() if w is not None}
    if len(lines) != len(where) or len({w[0] for w in where.values() if w}) != 1:
        return None
    low = min(lines.values())
    first = sorted(r for r, n in lines.items() if n == low)
    return first if any(set(first) == set(g) for g in groups) else None


def call_sites(facts: Facts) -> Verdict | None:
    """Every rank timed out, but their own tracebacks stand at different call sites (another
    collective, or the same one called from another line): the ranks left the common order.
    The minority is the culprit; two sides of one size are a tie (cannot tell)."""
    groups = wait_sites(facts)
    if len(groups) < 2:
        return None
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    (major, majority), rest = ordered[0], ordered[1:]
    tie = len(rest[0][1]) == len(majority)
    listing = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {fold_ints(rs)} in {site}"
                        for site, rs in ordered[:8])
    fr = [c for c in facts.parsed.evidence if c.startswith("mldebug fr analyze")]
    tell = ("TORCH_DISTRIBUTED_DEBUG=DETAIL (it checks each collective's op, shape and dtype "
            "across ranks before it runs and names the odd rank)"
            + (f", or the flight-recorder dumps the ranks wrote: `{fr[0]}`" if fr else
               ", or flight-recorder dumps (`mldebug fr analyze`)"))
    fix = ("Collectives must be called in the same order, from the same code path, on every "
           "rank: find the branch that only the odd rank took (a skipped or extra collective, "
           "another op, a rank-dependent condition such as a NaN skip, uneven data, evaluation "
           "or logging on one rank). ")
    if tie:
        sides = [rs for _, rs in ordered if len(rs) == len(majority)]
        roots = ""
        for at, rs in ordered:
            evs = [facts.ranks[r].wait_site for r in rs]
            if len(rs) > 1 and at.startswith("broadcast ") and all(
                    ev is not None and "for send operation" in ev.message for ev in evs):
                roots = (f" Ranks {fold_ints(rs)} all wait to send in the same broadcast: each "
                         "acts as its source, so the ranks disagree on src (one of them is odd).")
        return Verdict(Finding(
            Severity.ERROR,
            f"the ranks waited at different call sites: {' vs '.join(fold_ints(rs) for rs in sides)} "
            "(no majority: cannot tell which side is out of step)",
            f"Their own timeout tracebacks stand at: {listing}. No call site holds a majority, "
            f"so these lines do not say which side left the common order.{roots} What would "
            f"tell: {tell}.",
            fix + f"To find which side: {tell}.", code="log-collective-mismatch"), [],
            "the call sites of the ranks' own timeout tracebacks (a tie)", "low")
    odd_groups = [rs for _, rs in rest]
    culprits = sorted(r for rs in odd_groups for r in rs)
    how = "the call sites of the ranks' own timeout tracebacks: the minority"
    sure = "high" if len(majority) >= 2 and len(culprits) < len(majority) else "medium"
    extra = ""
    if len(odd_groups) > 1:
        first = _behind_all(facts, odd_groups)
        if first is not None:
            others = sorted(set(culprits) - set(first))
            extra = (f" Rank{'s' if len(first) > 1 else ''} {fold_ints(first)} still "
                     f"wait{'' if len(first) > 1 else 's'} at a line every other rank passed "
                     f"(same callers, same function): out of step; rank"
                     f"{'s' if len(others) > 1 else ''} {fold_ints(others)} wait"
                     f"{'' if len(others) > 1 else 's'} further on, for {'them' if len(first) > 1 else 'it'}.")
            culprits = first
            how += ", then the one still at a line every other rank passed"
            sure = "medium"
        else:
            sure = "low"
    site = next(site for site, rs in ordered if set(culprits) <= set(rs)) \
        if any(set(culprits) <= set(rs) for _, rs in ordered) else None
    title = (f"rank{'s' if len(culprits) > 1 else ''} {fold_ints(culprits)} waited in "
             + (site if site else "other collectives")
             + f" while {'the others' if len(majority) > 1 else f'rank {majority[0]}'} waited in {major}")
    detail = (f"Their own timeout tracebacks stand at: {listing}. The ranks did not call the "
              f"same collective from the same place: the odd one{'s' if len(culprits) > 1 else ''} "
              "left the common order, the others timed out waiting." + extra)
    return Verdict(Finding(
        Severity.ERROR, title, detail,
        fix + f"To confirm: {tell}.", code="log-collective-mismatch",
        hosts=_hosts(facts, culprits)), culprits, how, sure)


def silent(facts: Facts) -> Verdict | None:
    """Ranks that said nothing while the others timed out: they never reached the collective."""
    if not facts.waited:
        return None
    quiet = sorted(r for r in facts.known - facts.waited
                   if (st := facts.ranks.get(r)) is None or st.first_primary is None)
    if not quiet or len(quiet) >= len(facts.known):
        return None
    waits = Counter((t.op, t.seq) for r in facts.waited for t in facts.ranks[r].timeouts)
    what = ""
    if waits:
        (op, seq), _ = waits.most_common(1)[0]
        what = f" ({op or 'a collective'}{f' #{seq}' if seq is not None else ''})"
    sites = wait_sites(facts)
    if len(sites) == 1:
        what = f" ({next(iter(sites))})"
    also = ""
    if len(sites) > 1:
        also = ("\nThe waiting ranks also stand at different call sites ("
                + "; ".join(f"{fold_ints(rs)}: {site}" for site, rs in sorted(sites.items())[:6])
                + "): the ranks may be out of step too, and a rank the launcher stopped before "
                "its own timeout leaves no line either; the flight-recorder dumps or "
                "TORCH_DISTRIBUTED_DEBUG=DETAIL would tell.")
    return Verdict(Finding(
        Severity.ERROR,
        f"rank{'s' if len(quiet) > 1 else ''} {fold_ints(quiet)} never reached the collective "
        f"the others timed out in{what}",
        f"Ranks {fold_ints(sorted(facts.waited))} timed out or lost their peer; rank"
        f"{'s' if len(quiet) > 1 else ''} {fold_ints(quiet)} reported neither an error nor a "
        "timeout: stuck outside any collective until the launcher stopped "
        f"{'them' if len(quiet) > 1 else 'it'}. (A launcher's 'Root Cause' names the first rank "
        "to exit, which is one of the waiting ranks.)" + also,
        "Find what these ranks were doing: next time run `mldebug hang` while the job hangs, or "
        "add `mldebug.watchdog()` so each rank dumps its stack at a stall.",
        code="log-silent-rank", hosts=_hosts(facts, quiet)), quiet,
        "ranks absent while the others timed out; the world size "
        + ("from --world-size" if facts.parsed.world_size else
           "from a line that states it" if facts.parsed.world_hint else
           "from the rank numbering" if any(r not in facts.ranks for r in quiet) else
           "from the ranks seen"),
        "high" if facts.parsed.world_size or all(r in facts.ranks for r in quiet) else "medium")


def phase_tiebreak(facts: Facts) -> Verdict | None:
    """Every rank waited, but some entered a phase the others did not (validation,
    evaluation, a checkpoint, the end of their data): the job hung because those ranks left
    the common path. What each rank printed last breaks the tie."""
    if not facts.waited:
        return None
    phases = {r: st.phase[0] if st.phase else None for r, st in facts.ranks.items()
              if r in facts.known}
    count = Counter(phases.values())
    if len(count) < 2:
        return None
    common, _ = count.most_common(1)[0]
    odd = sorted(r for r, ph in phases.items() if ph != common and ph is not None)
    if not odd or len(odd) * 2 > len(phases):
        return None
    what = sorted({ph for r in odd if (ph := phases[r])})
    st0 = facts.ranks[odd[0]]
    line = st0.phase[1] if st0.phase else ""
    return Verdict(Finding(
        Severity.ERROR,
        f"rank{'s' if len(odd) > 1 else ''} {fold_ints(odd)} entered {', '.join(map(str, what))} "
        "while the others waited in the collective",
        f"Last such line of rank {odd[0]}: {line!r}. The other ranks "
        f"({'no such phase' if common is None else common}) timed out waiting.",
        "Code that runs only on some ranks (validation or evaluation on rank 0, a checkpoint "
        "save, a rank whose data ran out first) must not contain collectives, or every rank must "
        "enter it: put a barrier around it, run it on every rank, or drop_last / pad the data.",
        code="log-phase-tiebreak", hosts=_hosts(facts, odd)), odd,
        "what each rank printed last (a phase only these ranks entered)", "medium")


def all_waiting(facts: Facts) -> Verdict | None:
    """Every rank timed out in the same collective: the collective itself never finished."""
    if not facts.waited:
        return None
    waits = Counter((t.pg, t.op, t.seq) for r in facts.waited for t in facts.ranks[r].timeouts[:1])
    desc = ""
    if waits:
        (pg, op, seq), _ = waits.most_common(1)[0]
        desc = f" ({op or 'collective'}{f' #{seq}' if seq is not None else ''}, process group {pg})"
    else:
        sites = wait_sites(facts)
        if len(sites) == 1:
            desc = f" ({next(iter(sites))})"
    gloo = "gloo" in facts.parsed.backends and "nccl" not in facts.parsed.backends
    if len(facts.waited) == 1 and len(facts.known) <= 1:
        (r,) = facts.waited
        return Verdict(Finding(
            Severity.WARNING, f"rank {r} timed out in a collective{desc}; no other rank's lines "
            "are in these logs",
            f"Only rank {r}'s lines are here: they say it waited, not for whom. Whether every "
            "rank waited, or one stayed away, is in the other ranks' lines.",
            "Pass every rank's log (the launcher's whole output, torchrun --log-dir, srun "
            "--output=log-%t) to `mldebug log`.", code="log-all-waiting"), [],
            "one rank's lines only", "low")
    if gloo:
        fix = ("No rank failed or stayed away in these lines: look for a rank whose lines are "
               "missing (another node's log), or one the launcher stopped before its own "
               "timeout; next time run `mldebug hang` while it hangs (it names the rank outside "
               "the collective). For gloo's transport itself, check GLOO_SOCKET_IFNAME.")
    else:
        fix = ("The collective itself did not complete: a rank missing from these logs, or the "
               "network. Check the NCCL WARN lines (`mldebug nccl-log`), rerun with "
               "NCCL_DEBUG=INFO, and set TORCH_NCCL_DUMP_ON_TIMEOUT=1 to get flight-recorder "
               "dumps for `mldebug fr analyze`.")
    missing = sorted(facts.known - set(facts.ranks))
    unsized = ""
    if not facts.parsed.world_size and not facts.parsed.world_hint:
        # nothing says how many ranks ran: a rank stuck outside the collective that printed
        # nothing (killed by the launcher before any timeout of its own) is not in the lines
        n = len(facts.known)
        unsized = (f" No line states the world size: if the job had more than {n} ranks, the "
                   "ones absent from these lines printed nothing, never reached the "
                   "collective and are the suspects; pass --world-size N to tell.")
    return Verdict(Finding(
        Severity.WARNING, f"every rank timed out in the same collective{desc}",
        f"Ranks {fold_ints(sorted(facts.waited))} all waited; no rank failed or stayed away in "
        "these logs." + unsized, fix, code="log-all-waiting"), [],
        "every rank's own timeout at the same place", "low" if missing or unsized else "medium")


def exit_only(facts: Facts) -> Verdict | None:
    """A rank that exited non-zero without leaving a traceback in these logs."""
    ranks = sorted(r for r, st in facts.ranks.items()
                   if st.exitcode is not None and st.exitcode > 0 and st.first_primary is None
                   and not st.consequences)
    if not ranks:
        return None
    return Verdict(Finding(
        Severity.ERROR, f"rank{'s' if len(ranks) > 1 else ''} {fold_ints(ranks)} exited with "
        f"code {fold_ints(sorted({facts.ranks[r].exitcode or 0 for r in ranks}))} and no traceback "
        "in these logs", "",
        "Keep each rank's output: torchrun --tee 3 (or --log-dir), and decorate main() with "
        "torch.distributed.elastic.multiprocessing.errors.record so the traceback reaches the "
        "launcher.", code="log-exit-no-traceback", hosts=_hosts(facts, ranks)), ranks)


RULES: list[Rule] = [terminated, fingerprint_mismatch, monitored_barrier, first_failure, unresponsive,
                     killed, size_mismatch, fatal_signal, stalled, store_launch, behind, mismatch,
                     exited_early, silent, call_sites, exit_only, launcher_failed, phase_tiebreak,
                     all_waiting]


def _nccl_findings(parsed: ParsedLogs) -> list[Finding]:
    out = []
    for msg, ranks in sorted(parsed.nccl_warns.items(), key=lambda kv: -len(kv[1]))[:5]:
        who = f" (ranks {fold_ints(sorted(set(ranks)))})" if ranks else ""
        out.append(Finding(
            Severity.WARNING, f"NCCL WARN{who}: {msg[:160]}",
            f"{parsed.nccl_warn_lines} NCCL WARN lines in all.",
            "Run `mldebug nccl-log` on the same files: it names the cause of NCCL's warnings.",
            code="log-nccl-warn"))
    return out


def _launcher_note(parsed: ParsedLogs, culprits: list[int]) -> list[Finding]:
    from mldebug.log.rootcause import meaning, root_cause

    rc = root_cause(parsed)
    if rc is None or not culprits or rc.rank in culprits:
        return []
    what, consequence = meaning(rc)
    return [Finding(
        Severity.INFO,
        f"torchrun's 'Root Cause' names rank {rc.rank} (exit code {rc.exitcode}), not the culprit"
        + (": a consequence" if consequence else ""),
        f"{what}. torchrun reports the first rank to EXIT; a rank that waited for the culprit "
        "often exits first.", "Trust the verdict above; the launcher table only orders exits.",
        code="log-launcher-root")]


MAX_CATALOGUE_FINDINGS = 6


def _catalogue_findings(parsed: ParsedLogs, culprits: list[int]) -> list[Finding]:
    """What PyTorch's own strings say (mldebug/log/torch_messages.json): the component, its
    cause and fix, for the culprits' errors first, then the other ranks' and the launcher's;
    and a known PyTorch bug when the log states a version its range holds."""
    from mldebug.log import catalogue

    events: list[tuple[int | None, Event]] = []
    for rank in culprits + sorted(set(parsed.ranks) - set(culprits)):
        st = parsed.ranks.get(rank)
        for e in (st.first_primary, st.first_event) if st else ():
            if e is not None:
                events.append((rank, e))
    events += [(None, e) for e in parsed.launcher_events[:50]]
    out: list[Finding] = []
    seen: set[str] = set()
    looked: set[str] = set()  # 1,000 ranks mostly repeat a few messages: look each up once
    for r, ev in events[:5000]:
        if ev.message in looked:
            continue
        looked.add(ev.message)
        known = catalogue.known_for(ev.message, parsed.torch_version)
        if known is not None and known.signature not in seen:
            seen.add(known.signature)
            out.append(Finding(
                Severity.WARNING, f"known bug in torch {parsed.torch_version} ({known.affected}): "
                f"{known.title}", f"Fixed in {known.fixed_in}. Source: {known.source}",
                f"Upgrade torch to {known.fixed_in} or later.", code="log-torch-known-issue"))
        m = catalogue.match(ev.message)
        if m is None or m.message.component in seen:
            continue
        seen.add(m.message.component)
        who = f"rank {r}" if r is not None else "the launcher"
        out.append(Finding(
            Severity.INFO, f"PyTorch ({m.message.component}) on {who}: {m.cause}"[:300],
            f"The message is PyTorch's \"{m.message.text[:160]}\" ({m.message.source}; "
            f"torch {', '.join(m.message.versions)}).", m.fix, code=f"log-{m.code}"))
        if len(out) >= MAX_CATALOGUE_FINDINGS:
            break
    return out


def analyze(parsed: ParsedLogs) -> LogReport:
    facts = Facts.of(parsed)
    verdict: Verdict | None = None
    for rule in RULES:
        verdict = rule(facts)
        if verdict is not None:
            break
    findings: list[Finding] = []
    culprits: list[int] = []
    if verdict is not None:
        how = verdict.how or (verdict.finding.code or "").removeprefix("log-").replace("-", " ")
        f0 = verdict.finding
        verdict.finding = dataclasses.replace(f0, detail=((f0.detail + "\n") if f0.detail else "")
                                              + f"Decided by: {how}. Confidence: {verdict.sure}.")
        findings.append(verdict.finding)
        culprits = verdict.culprits
    elif parsed.nccl_warn_lines == 0:
        findings.append(Finding(
            Severity.INFO, f"no failure found in {parsed.lines} lines",
            "No traceback, watchdog timeout, launcher failure table or NCCL WARN line.",
            "Pass every rank's log (torchrun --log-dir / srun --output=log-%t) or the launcher's "
            "whole output; `-` reads standard input.", code="log-nothing"))
    findings += _nccl_findings(parsed)
    findings += _launcher_note(parsed, culprits)
    findings += _catalogue_findings(parsed, culprits)
    for cmd, ranks in parsed.evidence.items():
        who = f" (rank{'s' if len(ranks) > 1 else ''} {fold_ints(sorted(ranks))})" if ranks else ""
        findings.append(Finding(
            Severity.INFO, f"mldebug left evidence{who}: {cmd}",
            "mldebug's hooks wrote it while the job ran (watchdog stacks, trace rings, "
            "flight-recorder dumps).", f"Run `{cmd}`.", code="log-evidence"))
    return LogReport(parsed, findings, culprits, verdict.finding if verdict else None,
                     verdict.sure if verdict else None)
