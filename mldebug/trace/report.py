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
    of = f" of {report.world_size}" if report.world_size and report.missing else ""
    job = f" - job {report.job}" if report.job else ""
    console.print(Text(f"mldebug trace: {n}{of} rank{'s' if n != 1 else ''} on {len(hosts)} "
                       f"host{'s' if len(hosts) != 1 else ''}, {'/'.join(kinds) or 'no'} "
                       f"events{job}", style="bold"))
    console.print()
    render_findings(report.findings, console, empty="All ranks followed the same path.")
    if report.missing:
        console.print()
        console.print(Text(f"Missing ({len(report.missing)}): no ring "
                           + ("from the signal" if report.live else "file"), style="bold"))
        for m in report.missing[:20]:
            who = f"rank {m.rank}" if m.rank is not None else f"pid {m.pid}"
            pid = f" (pid {m.pid})" if m.rank is not None and m.pid else ""
            console.print(Text(f"    {who}{pid}: {m.reason}"))
        if len(report.missing) > 20:
            console.print(Text(f"    ... and {len(report.missing) - 20} more in --json (missing)",
                               style="dim"))
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
