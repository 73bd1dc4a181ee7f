"""When the stacks cannot tell, the flight recorder can: a job's ``passed-collective`` case.

A rank waits in a collective at a line the majority already went past. From the stacks alone
either it is a subgroup collective whose other member skipped it (the waiting rank is the
victim) or ranks matched a call out of order; ``rules.passed_collective_hint`` says so. The
ranks' flight recorders (``mldebug.fr.enable()``) know each collective's group, members and
sequence number, so ``mldebug hang`` asks them (as ``--fr`` does) and, when their analysis
names culprits among the job's ranks, those become the job's suspects.

Pure: takes a hang ``Report`` and an ``mldebug.fr`` ``Analysis``; collection is in the CLI.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mldebug.findings import Finding, Severity
from mldebug.hang.model import HangClass, Report, Suspect, VerdictKind
from mldebug.render import fold_ints

NEEDS_FR = "passed-collective"  # the hint whose question the flight recorder answers
SETTLED = "fr-settled"


def needs_fr(report: Report) -> bool:
    """Whether a job's stacks left the culprit of a collective mismatch open."""
    return any(f.code == NEEDS_FR for j in report.jobs for f in j.findings)


def settle(report: Report, analysis: Any) -> bool:
    """Make the flight recorder's culprits the suspects of each job whose stacks could not
    tell; True when a job changed. A job is left as it was when the recorder names no culprit,
    or names one that is not among the job's own rank processes (another job's dump)."""
    from mldebug.fr.diagnose import mismatch_finding

    mismatches = [m for m in analysis.mismatches if m.culprit_ranks]
    culprits = sorted({r for m in mismatches for r in m.culprit_ranks})
    if not culprits:
        return False
    changed = False
    for j in report.jobs:
        if not any(f.code == NEEDS_FR for f in j.findings):
            continue
        by_rank = {p.rank: p for p in j.processes if p.rank is not None}
        if not set(culprits) <= set(by_rank):
            continue
        said = mismatch_finding(mismatches[0])
        where = {s.rank: s.call_site for s in j.suspects}
        for g in j.groups:
            for r in g.ranks:
                where.setdefault(r, g.where)
        suspects = [Suspect(rank=r, host=by_rank[r].host, pid=by_rank[r].pid,
                            ns_pid=by_rank[r].ns_pid, job=j.key, call_site=where.get(r),
                            reason=f"the flight recorder: {said.title}")
                    for r in culprits]
        victims = sorted(s.rank for s in j.suspects if s.rank is not None
                         and s.rank not in culprits)
        who = ", ".join(f"rank {s.rank} ({s.host}, pid {s.pid})" for s in suspects[:4])
        if len(suspects) > 4:
            who += f" and {len(suspects) - 4} more"
        title = (f"Collective mismatch, told by the flight recorder: Suspect: {who} - "
                 f"{said.title}"
                 + (f"; rank {fold_ints(victims)} only wait{'s' if len(victims) == 1 else ''} "
                    "for it" if victims else ""))
        verdict = dataclasses.replace(j.verdict, title=title, severity=Severity.ERROR)
        told = Finding(Severity.HINT, "The flight recorder settles what the stacks could not.",
                       said.detail, "mldebug hang --fr shows the recorder's whole analysis; "
                       "mldebug fr analyze reads saved dumps.", SETTLED,
                       tuple(sorted({s.host for s in suspects})))
        several = len(report.jobs) > 1
        if several:
            told = dataclasses.replace(told, title=f"Job {j.key or '(unnamed)'}: {told.title}")
        old_verdict, old_named = j.verdict, j.named_verdict().title
        j.verdict, j.suspects = verdict, suspects
        j.kind, j.hang_class = VerdictKind.SUSPECTS, HangClass.DESYNC
        swap = {id(f): told for f in j.findings if f.code == NEEDS_FR}
        j.findings = [verdict, *(swap.get(id(f), f) for f in j.findings[1:])]
        new_verdict = j.named_verdict() if several else verdict
        report.findings = [new_verdict if f is old_verdict or (several and f.title == old_named)
                           else swap.get(id(f), f) for f in report.findings]
        changed = True
    return changed
