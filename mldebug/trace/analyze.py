"""Pure analysis of the ranks' recorded paths: group them by where they stopped, and find
where a rank's path left the others' (the event only a minority of ranks reached, and the
shared event just before it - typically a rank-dependent ``if``)."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict

from mldebug.findings import Finding, Severity
from mldebug.render import fold_ints
from mldebug.trace.model import (
    Divergence,
    Loc,
    MissingRank,
    RankTrace,
    TraceGroup,
    TraceReport,
)

TAIL = 6
MAX_FINDINGS = 5  # one screen at 8,000 ranks: the rest are in --json
MAX_WORLD = 1 << 17  # a larger world size or rank, recorded or noted, is not believed


def _ranks_text(labels: list[str], ranks: list[int]) -> str:
    if ranks and len(ranks) == len(labels):
        return f"rank{'s' if len(ranks) > 1 else ''} {fold_ints(ranks)}"
    return ", ".join(labels[:6]) + (f" and {len(labels) - 6} more" if len(labels) > 6 else "")


def group(traces: list[RankTrace]) -> list[TraceGroup]:
    """Ranks grouped by their last recorded event, biggest group first."""
    by_last: dict[tuple[str, int, str] | None, list[RankTrace]] = defaultdict(list)
    for t in traces:
        by_last[t.events[-1].key if t.events else None].append(t)
    groups = [TraceGroup(ranks=[t.rank for t in ts if t.rank is not None],
                         labels=[t.label for t in ts], last=ts[0].events[-TAIL:])
              for ts in by_last.values()]
    groups.sort(key=lambda g: -len(g.labels))
    return groups


def divergences(traces: list[RankTrace]) -> list[Divergence]:
    """For each rank, the latest run of events that at most half of the ranks reached."""
    n = len(traces)
    if n < 2:
        return []
    reached: Counter[tuple[str, int, str]] = Counter()
    for t in traces:
        reached.update({e.key for e in t.events})
    majority = n / 2
    found: dict[tuple[tuple[str, int, str] | None, tuple[str, int, str]], Divergence] = {}
    for t in traces:
        ev = t.events
        j = len(ev) - 1
        while j >= 0 and reached[ev[j].key] > majority:
            j -= 1
        if j < 0:
            continue
        i = j
        while i > 0 and reached[ev[i - 1].key] <= majority:
            i -= 1
        branch: Loc | None = ev[i - 1] if i > 0 else None
        left = ev[i]
        key = (branch.key if branch else None, left.key)
        d = found.get(key)
        if d is None:
            d = found[key] = Divergence(ranks=[], labels=[], branch=branch, left_at=left,
                                        others=[])
        if t.rank is not None:
            d.ranks.append(t.rank)
        d.labels.append(t.label)
    seen = {id(t): {e.key for e in t.events} for t in traces}
    for d in found.values():
        mine = set(d.labels)
        d.others = [t.rank for t in traces if t.label not in mine and t.rank is not None
                    and d.left_at.key not in seen[id(t)]]
    return sorted(found.values(), key=lambda d: len(d.labels))


NO_RING = ("no ring file here, and no dump+abort note says why (the ring not enabled on "
           "that rank, the rank killed before it wrote, or its file on another node)")


NOT_HERE = ("not among the job's rank processes on this host (on another node, or already "
            "gone): a live 'trace show' asks this host's ranks only")


def missing(traces: list[RankTrace], notes: list[tuple[int | None, int, str]],
            unnoted: str = NO_RING) -> tuple[int | None, list[MissingRank]]:
    """The expected world size (the largest the rings recorded, or one past the highest rank
    the notes name) and the ranks with no ring: the notes' reason where they give one."""
    have_ranks = {t.rank for t in traces if t.rank is not None}
    have_pids = {t.pid for t in traces}
    sizes = [t.world_size for t in traces if t.world_size and 0 < t.world_size <= MAX_WORLD]
    noted = [r for r, _, _ in notes if r is not None and 0 <= r < MAX_WORLD]
    world = max(sizes + [r + 1 for r in noted], default=None)
    why = {r: (pid, reason) for r, pid, reason in notes if r is not None}
    out = [MissingRank(r, why[r][0] if r in why else None, why[r][1] if r in why else unnoted)
           for r in range(world or 0) if r not in have_ranks]
    out += [MissingRank(r, pid, reason) for r, pid, reason in notes
            if r is not None and not 0 <= r < MAX_WORLD and r not in have_ranks]
    out += [MissingRank(None, pid, reason) for r, pid, reason in notes
            if r is None and pid not in have_pids]
    return world, out


MISSING_FIX = ("Run `mldebug hang analyze DIR` for the missing ranks' dumps; if dump+abort's wait "
               "ended first, raise MLDEBUG_ABORT_WAIT; enable the ring on every rank "
               "(mldebug.trace.enable()) and pass every node's directory.")
LIVE_MISSING_FIX = ("Act on each rank's reason: every rank needs mldebug.trace.enable() and a "
                    "dump handler (mldebug.install_dump_handler() or mldebug.watchdog()); "
                    "'mldebug hang --pid PID' shows a silent rank's stack (py-spy).")


def _missing_finding(world: int | None, miss: list[MissingRank], n: int,
                     fix: str = MISSING_FIX) -> Finding:
    by_reason: dict[str, list[MissingRank]] = defaultdict(list)
    for m in miss:
        by_reason[m.reason].append(m)
    parts = []
    for reason, ms in list(by_reason.items())[:MAX_FINDINGS]:
        ranks = [m.rank for m in ms if m.rank is not None]
        pids = [str(m.pid) for m in ms if m.rank is None]
        who = (f"rank{'s' if len(ranks) > 1 else ''} {fold_ints(ranks)}" if ranks else "")
        who += (", " if who and pids else "") + (f"pid {', '.join(pids[:6])}" if pids else "")
        parts.append(f"{who}: {reason}")
    if len(by_reason) > MAX_FINDINGS:
        parts.append(f"{len(by_reason) - MAX_FINDINGS} more reasons in --json (missing)")
    ranks = [m.rank for m in miss if m.rank is not None]
    who = (f"rank{'s' if len(ranks) > 1 else ''} {fold_ints(ranks)}" if ranks
           else f"{len(miss)} process(es)")
    of = f" of {world}" if world else ""
    return Finding(
        Severity.WARNING, f"{who} missing: {n}{of} ranks' rings here",
        detail="; ".join(parts) + ". The comparison below is of the ranks that wrote a ring: "
               "a missing rank is often the one that hung.",
        fix=fix, code="trace-rank-missing")


def findings(traces: list[RankTrace], groups: list[TraceGroup],
             divs: list[Divergence], miss: list[MissingRank] | None = None,
             world: int | None = None, live: bool = False) -> list[Finding]:
    out: list[Finding] = []
    if miss:
        out.append(_missing_finding(world, miss, len(traces),
                                    LIVE_MISSING_FIX if live else MISSING_FIX))
    for d in divs[:MAX_FINDINGS]:
        who = _ranks_text(d.labels, d.ranks)
        after = f" after {d.branch.describe()}" if d.branch else ""
        others = (f"rank {fold_ints(d.others)} never reached it in its recorded events"
                  if len(d.others) == 1 else
                  f"ranks {fold_ints(d.others)} never reached it in their recorded events"
                  if d.others else "the other ranks did not reach it in their recorded events")
        out.append(Finding(
            Severity.WARNING,
            f"{who} left the others' path at {d.left_at.where}",
            detail=f"{who} went to {d.left_at.describe()}{after}; {others}.",
            fix=(f"Look at the condition at {d.branch.where}" if d.branch
                 else f"Look at how {who} got to {d.left_at.where}")
            + ": a rank-dependent branch that adds, skips or delays a collective on some "
              "ranks hangs the others; make every rank issue the same collectives.",
            code="trace-path-diverged"))
    if len(divs) > MAX_FINDINGS:
        rest = divs[MAX_FINDINGS:]
        out.append(Finding(
            Severity.WARNING, f"{len(rest)} more places where ranks left the others' path",
            detail=f"{sum(len(d.labels) for d in rest)} more ranks; see --json (divergences).",
            fix="Start with the smallest groups above: the fewer ranks took a path, the more "
                "likely it is the odd one out.", code="trace-path-diverged-more"))
    if len(groups) > 1 and not divs:
        out.append(Finding(
            Severity.HINT, f"the ranks stopped in {len(groups)} different places",
            detail="; ".join(f"{_ranks_text(g.labels, g.ranks)} at "
                             f"{g.last[-1].where if g.last else '(nothing recorded)'}"
                             for g in groups[:5]),
            fix="Compare the groups' last events below; the smaller group is the suspect.",
            code="trace-different-places"))
    if not traces:
        out.append(Finding(Severity.ERROR, "no ring files could be read",
                           fix=("See each rank's reason above." if live else
                                "Check the errors below; pass the watchdog's directory."),
                           code="trace-nothing-read"))
    return out


def moved(before: list[RankTrace], after: list[RankTrace]) -> set[tuple[str, int]]:
    """The (host, pid) of the ranks whose ring changed between two reads (``trace show --pid``
    reads again when ranks diverge): those ran Python code in between. When every rank has
    moved, the job makes progress and a divergence is a branch some ranks take (a slow one),
    not where one is stuck. A rank missing from the second read, or whose recorded events are
    the same, did not move."""
    later = {(t.host, t.pid): t for t in after}
    out: set[tuple[str, int]] = set()
    for t in before:
        b = later.get((t.host, t.pid))
        if b is not None and [e.key for e in b.events] != [e.key for e in t.events]:
            out.add((t.host, t.pid))
    return out


def progress_finding(seconds: float) -> Finding:
    return Finding(
        Severity.INFO, f"every rank's ring moved between two reads {seconds:g}s apart: the job "
        "makes progress, nothing is stuck",
        detail="The places where ranks left the others' path below are branches some ranks "
               "take (a slow data source, rank-0 work), not where one stopped.",
        fix="If a step is slow, the rank that takes the branch is the slowest; time it "
            "(mldebug hang --watch 5 shows where each rank spends its time).",
        code="trace-progress")


def busy_finding(busy: list[RankTrace], still: list[RankTrace], seconds: float) -> Finding:
    who = _ranks_text([t.label for t in busy], [t.rank for t in busy if t.rank is not None])
    rest = _ranks_text([t.label for t in still], [t.rank for t in still if t.rank is not None])
    last = busy[0].events[-1].describe() if busy[0].events else "(nothing recorded)"
    return Finding(
        Severity.WARNING, f"{who} kept running Python code while {rest} stood still for "
        f"{seconds:g}s", detail=f"{who}'s ring moved between two reads (last at {last}); "
        f"{rest} recorded nothing new: they wait, most likely in a collective, for {who}.",
        fix=f"Look at what {who} is doing at {busy[0].events[-1].where if busy[0].events else 'its last event'} "
            "(an evaluation, a checkpoint, a loop): it runs longer than the others wait; "
            "mldebug hang --watch 5 shows its stack.", code="trace-busy-elsewhere")


def analyze(traces: list[RankTrace], errors: list[str] | None = None,
            notes: list[tuple[int | None, int, str]] | None = None, *,
            job: str | None = None, live: bool = False,
            unnoted: str | None = None, progress: float | None = None,
            busy: tuple[set[tuple[str, int]], float] | None = None) -> TraceReport:
    """``notes``: (rank, pid, why) of the ranks without a ring: dump+abort's notes, or with
    ``live`` the ranks a live ``trace show --pid/--job`` asked (``job``: that job's key);
    ``unnoted``: why a rank of the world size that no note names has no ring;
    ``progress``: the seconds between two reads in which every rank's ring moved (``moved``):
    the divergences are then branches, said so, and their warnings are hints; ``busy``: the
    (host, pid) of a minority of ranks that moved while the rest did not, and the seconds
    looked: they are the culprits (busy elsewhere while the others wait)."""
    groups = group(traces)
    divs = divergences(traces)
    world, miss = missing(traces, list(notes or ()),
                          unnoted or (NOT_HERE if live else NO_RING))
    found = findings(traces, groups, divs, miss, world, live)
    if progress is not None and not miss:
        found = [progress_finding(progress)] + [
            dataclasses.replace(f, severity=Severity.HINT) if f.code.startswith(
                "trace-path-diverged") else f for f in found]
    busy_ranks: list[int] = []
    if busy is not None and not miss and progress is None:
        movers = [t for t in traces if (t.host, t.pid) in busy[0]]
        still = [t for t in traces if (t.host, t.pid) not in busy[0]]
        if movers and still and len(movers) < len(traces) / 2:
            found = [busy_finding(movers, still, busy[1])] + found
            busy_ranks = sorted(t.rank for t in movers if t.rank is not None)
    return TraceReport(traces=traces, groups=groups, divergences=divs, findings=found,
                       errors=list(errors or ()), missing=miss, world_size=world, job=job,
                       live=live, progress=progress is not None and not miss, busy=busy_ranks)
