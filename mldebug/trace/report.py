"""Render ``mldebug trace show``: findings, then the ranks side by side as groups."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mldebug.findings import render_findings
from mldebug.trace.analyze import _ranks_text
from mldebug.trace.model import TraceReport

if TYPE_CHECKING:
    from rich.console import Console


def render(report: TraceReport, console: Console) -> None:
    from rich.text import Text

    n = len(report.traces)
    kinds = sorted({t.kind for t in report.traces})
    hosts = sorted({t.host for t in report.traces})
    console.print(Text(f"mldebug trace: {n} rank{'s' if n != 1 else ''} on {len(hosts)} "
                       f"host{'s' if len(hosts) != 1 else ''}, {'/'.join(kinds) or 'no'} "
                       "events", style="bold"))
    console.print()
    render_findings(report.findings, console, empty="All ranks followed the same path.")
    for i, g in enumerate(report.groups[:20], 1):
        console.print()
        console.print(Text(f"Group {i}: {_ranks_text(g.labels, g.ranks)} - last "
                           f"{len(g.last)} events, newest last", style="bold"))
        for loc in g.last:
            console.print(Text(f"    {loc.describe()}"))
    if len(report.groups) > 20:
        console.print(Text(f"... and {len(report.groups) - 20} more groups", style="dim"))
    for e in report.errors[:20]:
        console.print(Text(f"skipped {e}", style="yellow"))
