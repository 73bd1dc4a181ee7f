"""Rendering of every memory report (rich); ``--json`` uses each report's ``to_dict``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mldebug.findings import render_findings
from mldebug.memory.units import fmt_bytes

if TYPE_CHECKING:
    from rich.console import Console


def render(report: Any, console: Console) -> None:
    """Render any memory report by its type."""
    name = type(report).__name__
    renderers = {"SnapshotReport": _snapshot, "CompareReport": _compare, "PeakReport": _peak,
                 "ProbeReport": _probe, "TopReport": _top}
    renderers[name](report, console)


def _table(title: str, *cols: str) -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for i, c in enumerate(cols):
        t.add_column(c, justify="right" if i and c != "site" else "left")
    return t


def _snapshot(rep: Any, console: Console) -> None:
    console.print(f"[bold]Snapshot[/] {rep.file}: {rep.segments} segments, reserved "
                  f"{fmt_bytes(rep.reserved)}, allocated {fmt_bytes(rep.allocated)} at the end")
    for d in rep.devices:
        console.print(f"[bold]Device {d.device}[/]: {d.events} events; peak allocated "
                      f"{fmt_bytes(d.peak_allocated)} (event {d.peak_event}), peak reserved "
                      f"{fmt_bytes(d.peak_reserved)}; at the end {fmt_bytes(d.end_allocated)} "
                      f"allocated, {fmt_bytes(d.end_reserved)} reserved")
        t = _table("  Top allocation sites at the peak", "site", "bytes")
        for s in d.top_at_peak:
            t.add_row(s.site, fmt_bytes(s.bytes))
        console.print(t)
        if d.never_freed:
            t = _table("  Never freed by the end of the trace", "site", "bytes", "count",
                       "events")
            for s in d.never_freed:
                t.add_row(s.site, fmt_bytes(s.bytes), str(s.count),
                          f"{s.first_event}-{s.last_event}")
            console.print(t)
    if rep.worst_segments and rep.reserved:
        t = _table("Segments with the most free space", "segment", "size", "in use",
                   "largest free", "blocks")
        for s in rep.worst_segments[:5]:
            t.add_row(f"dev{s.device} {s.address:#x}", fmt_bytes(s.total), fmt_bytes(s.allocated),
                      fmt_bytes(s.largest_free), str(s.blocks))
        console.print(t)
    console.print()
    render_findings(rep.findings, console)


def _compare(rep: Any, console: Console) -> None:
    console.print(f"[bold]{rep.before}[/] -> [bold]{rep.after}[/]: allocated "
                  f"{fmt_bytes(rep.allocated_before)} -> {fmt_bytes(rep.allocated_after)} "
                  f"({fmt_bytes(rep.allocated_after - rep.allocated_before, signed=True)}), "
                  f"reserved {fmt_bytes(rep.reserved_before)} -> {fmt_bytes(rep.reserved_after)}")
    t = _table(f"Held at the end, by site (from the {rep.source})", "site", "before", "after",
               "change")
    for c in rep.changes:
        t.add_row(c.site, fmt_bytes(c.before), fmt_bytes(c.after), fmt_bytes(c.delta, signed=True))
    console.print(t)
    console.print()
    render_findings(rep.findings, console, empty="Nothing grew.")


def _peak(rep: Any, console: Console) -> None:
    from rich.text import Text

    cmd = " ".join(rep.cmd)
    console.print(Text(f"mldebug mem peak: {cmd[:100]}", style="bold"))
    console.print(f"  peak memory of the whole tree  {fmt_bytes(rep.peak)}   ({rep.method})")
    console.print(f"  largest single process         {fmt_bytes(rep.largest_process)}   "
                  "(what /usr/bin/time -f %M shows)")
    console.print(f"  wall {rep.wall:.2f}s   user {rep.user:.2f}s   sys {rep.sys:.2f}s   "
                  f"exit code {rep.exit_code}" + (f" ({rep.signal})" if rep.signal else "")
                  + ("" if rep.oom_kills is None else f"   OOM kills {rep.oom_kills}"))
    console.print(Text(f"  method: {rep.method_note}", style="dim"))
    console.print()
    render_findings(rep.findings, console)


def _probe(rep: Any, console: Console) -> None:
    console.print(f"[bold]mldebug mem probe[/] ({rep.device}): {fmt_bytes(rep.allocated)} "
                  f"allocated and touched in steps of {fmt_bytes(rep.step)}; stopped by "
                  f"{rep.stopped_by}")
    console.print(f"  max {fmt_bytes(rep.maximum)} (from {rep.max_from})"
                  + ("" if rep.available is None else f", available {fmt_bytes(rep.available)}")
                  + ("" if rep.cgroup_limit is None else
                     f", cgroup limit {fmt_bytes(rep.cgroup_limit)} ({rep.cgroup_path})"))
    console.print()
    render_findings(rep.findings, console)


def _top(rep: Any, console: Console) -> None:
    from mldebug.hosts import collapse

    hosts = collapse(sorted(rep.hosts)) if rep.hosts else "-"
    watch = f", watched {rep.watch:g}s" if rep.watch else ""
    console.print(f"[bold]mldebug mem top[/]: {len(rep.processes)} rank processes on {hosts}"
                  f"{watch}; GPU memory from {rep.gpu_source or 'nowhere (no nvidia-smi)'}")
    for j in rep.jobs:
        gpu = "" if j.gpu_median is None else (f"; GPU median {fmt_bytes(j.gpu_median)}, max "
                                               f"{fmt_bytes(j.gpu_max)}")
        console.print(f"  job {j.job}: {j.ranks} ranks on {collapse(j.hosts)}; RSS min "
                      f"{fmt_bytes(j.rss_min)}, median {fmt_bytes(j.rss_median)}, max "
                      f"{fmt_bytes(j.rss_max)}{gpu}")
    if rep.processes:
        shown = sorted(rep.processes, key=lambda r: -(r.rss_rate if rep.watch else r.rss))
        title = (f"Ranks by growth (top {rep.rows})" if rep.watch
                 else f"Ranks by RSS (top {rep.rows})")
        cols = ["host", "rank", "pid", "RSS", "USS", "GPU"] + (["RSS/s", "GPU/s"] if rep.watch else [])
        t = _table(title, *cols)
        for r in shown[:rep.rows]:
            row = [r.host, "-" if r.rank is None else str(r.rank), str(r.pid), fmt_bytes(r.rss),
                   fmt_bytes(r.uss), fmt_bytes(r.gpu)]
            if rep.watch:
                row += [fmt_bytes(r.rss_rate, signed=True), fmt_bytes(r.gpu_rate, signed=True)
                        if r.gpu is not None else "-"]
            t.add_row(*row)
        console.print(t)
    console.print()
    render_findings(rep.findings, console)
