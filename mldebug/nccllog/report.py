"""Human output for ``mldebug nccl-log``: findings, process rows (identical rows folded),
communicator init, collective counts. ``--json`` is ``NcclLogReport.to_dict()``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mldebug.findings import fold_hosts, render_findings
from mldebug.nccllog.model import NcclLogReport
from mldebug.render import fold_ints

if TYPE_CHECKING:
    from rich.console import Console

MAX_ROWS = 20  # process rows shown; the rest are counted


def render(report: NcclLogReport, console: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    console.print(Text(f"mldebug nccl-log: {len(report.files)} file(s), {report.lines} line(s), "
                       f"{len(report.processes)} NCCL process(es)", style="bold"))
    render_findings(report.findings, console)
    if report.groups:
        console.print()
        folded = len(report.groups) < len(report.processes)
        t = Table(title="Processes" + (" (identical rows folded)" if folded else ""),
                  title_justify="left")
        for col in ("ranks", "procs", "hosts", "gpu", "NCCL", "transport", "interfaces",
                    "bootstrap", "WARN"):
            t.add_column(col, overflow="fold")
        for g in report.groups[:MAX_ROWS]:
            cells = [fold_ints(g.ranks) or "?", str(g.count), fold_hosts(g.hosts),
                     fold_ints(g.devices) if g.devices else "", g.version, g.transport,
                     g.interfaces, g.bootstrap, str(g.warnings) if g.warnings else ""]
            t.add_row(*(Text(c) for c in cells))  # Text: '[0]mlx5_0' is not rich markup
        console.print(t)
        if len(report.groups) > MAX_ROWS:
            console.print(Text(f"... {len(report.groups) - MAX_ROWS} more distinct rows "
                               "(--json lists every process)", style="dim"))
    if report.comms:
        console.print()
        t = Table(title="Communicator init", title_justify="left")
        for col in ("commId", "ranks", "complete", "started, not complete", "no log"):
            t.add_column(col, overflow="fold")
        for c in report.comms[:MAX_ROWS]:
            t.add_row(c.comm_id, str(c.nranks), fold_ints(c.completed) or "-",
                      Text(fold_ints(c.started_not_completed) or "-",
                           style="bold red" if c.started_not_completed else ""),
                      fold_ints(c.absent) or "-")
        console.print(t)
        if len(report.comms) > MAX_ROWS:
            console.print(Text(f"... {len(report.comms) - MAX_ROWS} more communicators",
                               style="dim"))
    if report.collectives:
        console.print()
        ops = sorted({op for c in report.collectives.values() for op in c})
        console.print(Text("Collective calls (NCCL_DEBUG_SUBSYS=COLL lines, all processes)",
                           style="italic"))
        t = Table()
        if report.split:
            t.add_column("slice")
        for op in ops:
            t.add_column(op, justify="right")
        if report.split:
            for s, counts in report.collectives.items():
                t.add_row(str(s), *(str(counts.get(op, 0)) for op in ops))
        else:
            total = {op: sum(c.get(op, 0) for c in report.collectives.values()) for op in ops}
            t.add_row(*(str(total[op]) for op in ops))
        console.print(t)
