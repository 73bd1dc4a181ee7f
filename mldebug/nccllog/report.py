"""Human output for ``mldebug nccl-log``: findings, then per-process table, init, counts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mldebug.nccllog.parse import NcclLogReport
from mldebug.findings import render_findings
from mldebug.render import fold_ints

if TYPE_CHECKING:
    from rich.console import Console


def render(report: NcclLogReport, console: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    console.print(Text(f"mldebug nccl-log: {len(report.files)} file(s), "
                       f"{len(report.processes)} NCCL process(es)", style="bold"))
    render_findings(report.findings, console)
    if report.processes:
        console.print()
        t = Table(title="Processes", title_justify="left")
        for col in ("rank", "host:pid", "gpu", "NCCL", "transport", "interfaces", "bootstrap",
                    "WARN"):
            t.add_column(col)
        for p in report.processes:
            net = p.nets[0] if p.nets else None
            cells = ["?" if p.rank is None else str(p.rank), p.key,
                     fold_ints(p.devices) if p.devices else "", p.version or "",
                     p.transport or "", " ".join(net.items) if net else "",
                     ",".join(p.bootstrap), str(len(p.warns)) if p.warns else ""]
            t.add_row(*(Text(c) for c in cells))  # Text: '[0]mlx5_0' is not rich markup
        console.print(t)
    if report.comms:
        console.print()
        t = Table(title="Communicator init", title_justify="left")
        for col in ("commId", "ranks", "complete", "started, not complete", "no log"):
            t.add_column(col)
        for c in report.comms:
            t.add_row(c.comm_id, str(c.nranks), fold_ints(c.completed) or "-",
                      Text(fold_ints(c.started_not_completed) or "-",
                           style="bold red" if c.started_not_completed else ""),
                      fold_ints(c.absent) or "-")
        console.print(t)
    if report.collectives:
        console.print()
        ops = sorted({op for c in report.collectives.values() for op in c})
        t = Table(title="Collective calls (NCCL_DEBUG_SUBSYS=COLL lines, all processes)",
                  title_justify="left")
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
