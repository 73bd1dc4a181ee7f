"""``mldebug hang --fr``: the flight recorder of the same ranks beside the stacks.

Triggers a flight-recorder dump on every rank that called ``mldebug.fr.enable()``, analyses
the dumps across ranks, and renders that analysis after the hang report.

When the stacks cannot tell who caused a collective mismatch (the ``passed-collective``
hint: a subgroup collective whose other member skipped it, or ranks matched a call out of
order), ``mldebug hang`` asks the recorders without ``--fr`` and ``settle`` (pure: a hang
``Report`` and an ``mldebug.fr`` ``Analysis``) makes the recorder's culprits among the job's
ranks the job's suspects. This module is the one place hang reads fr (tests/test_layers.py).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mldebug.fanout import FanoutOptions
from mldebug.findings import Finding, Severity
from mldebug.hang.frames import call_site
from mldebug.hang.model import HangClass, Report, Suspect, VerdictKind
from mldebug.render import fold_ints

if TYPE_CHECKING:
    from rich.console import Console


@dataclass
class FlightRecord:
    doc: dict[str, Any]  # the trigger result (and the analysis) for --json
    analysis: Any = None  # mldebug.fr.analyze's result, None when no rank answered
    dumps: Any = None  # the DumpSet it analysed (mldebug.fr.loader), None likewise

    def to_dict(self) -> dict[str, Any]:
        return self.doc


def collect(target: FanoutOptions, out: Path | None, timeout: float, *,
            fr_dir: str | None = None, pids: list[int] | None = None) -> FlightRecord:
    """Trigger the flight recorders of the job's rank processes (``pids``) on the same nodes -
    in ``fr_dir`` and in every directory their environments name - and analyse the dumps."""
    from mldebug.fr.collect import for_hang

    where = out / "fr" if out else Path(tempfile.mkdtemp(prefix="mldebug-hang-fr-"))
    doc, analysis, dumps = for_hang(target, where, timeout, fr_dir, pids)
    if out is None and not doc.get("files"):
        try:
            os.rmdir(where)  # the empty directory made here: nothing came back to keep
            doc["out_dir"] = None
        except OSError:
            pass
    return FlightRecord(doc, analysis, dumps)


def render(record: FlightRecord, console: Console) -> None:
    doc = record.doc
    console.print()
    if doc.get("out_dir"):
        console.print(f"Flight recorder: {len(doc['files'])} dump(s) in {doc['out_dir']}/",
                      soft_wrap=True)
    else:
        console.print("Flight recorder: no dump came back", soft_wrap=True)
    if record.analysis is None:
        console.print(f"  {doc.get('hint')}", soft_wrap=True)
        return
    from mldebug.fr.report import render as fr_render

    fr_render(record.analysis, console)


NEEDS_FR = "passed-collective"  # the hint whose question the flight recorder answers
SETTLED = "fr-settled"


def needs_fr(report: Report) -> bool:
    """Whether a job's stacks left the culprit of a collective mismatch open."""
    return any(f.code == NEEDS_FR for j in report.jobs for f in j.findings)


def settle(report: Report, analysis: Any) -> bool:
    """Make the flight recorder's culprits the suspects of a job whose stacks could not tell;
    True when it changed. Only a report of one job: the dumps of several jobs' ranks share
    rank numbers and cannot be told apart. The job is left as it was when the recorder names
    no culprit, or one that is not among the job's rank processes."""
    from mldebug.fr.diagnose import mismatch_finding

    if len(report.jobs) != 1 or not needs_fr(report):
        return False
    j = report.jobs[0]
    mismatches = [m for m in analysis.mismatches if m.culprit_ranks]
    culprits = sorted({r for m in mismatches for r in m.culprit_ranks})
    by_rank = {p.rank: p for p in j.processes if p.rank is not None}
    if not culprits or not set(culprits) <= set(by_rank):
        return False
    said = mismatch_finding(mismatches[0])
    where = {r: call_site(g.frames) for g in j.groups for r in g.ranks}
    suspects = [Suspect(rank=r, host=by_rank[r].host, pid=by_rank[r].pid,
                        ns_pid=by_rank[r].ns_pid, job=j.key, call_site=where.get(r),
                        reason=f"the flight recorder: {said.title}")
                for r in culprits]
    victims = sorted(s.rank for s in j.suspects if s.rank is not None and s.rank not in culprits)
    who = ", ".join(f"rank {s.rank} ({s.host}, pid {s.pid})" for s in suspects[:4])
    if len(suspects) > 4:
        who += f" and {len(suspects) - 4} more"
    title = (f"Collective mismatch, told by the flight recorder: Suspect: {who} - {said.title}"
             + (f"; rank {fold_ints(victims)} only wait{'s' if len(victims) == 1 else ''} "
                "for it" if victims else ""))
    verdict = dataclasses.replace(j.verdict, title=title, severity=Severity.ERROR)
    told = Finding(Severity.HINT, "The flight recorder settles what the stacks could not.",
                   said.detail, "mldebug hang --fr shows the recorder's whole analysis; "
                   "mldebug fr analyze reads saved dumps.", SETTLED,
                   tuple(sorted({s.host for s in suspects})))
    swap = {id(j.verdict): verdict,
            **{id(f): told for f in j.findings if f.code == NEEDS_FR}}
    j.verdict, j.suspects = verdict, suspects
    j.kind, j.hang_class = VerdictKind.SUSPECTS, HangClass.DESYNC
    j.findings = [swap.get(id(f), f) for f in j.findings]
    report.findings = [swap.get(id(f), f) for f in report.findings]
    return True
