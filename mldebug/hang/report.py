"""Render a hang report: the verdict first, then one block per group, then what failed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mldebug.hang.analyze import frame_kind, s_label
from mldebug.hang.model import Frame, Group, Report, proc_label
from mldebug.hosts import collapse
from mldebug.render import fold_ints

if TYPE_CHECKING:
    from rich.console import Console

_FRAME_STYLE = {"user": "bold", "torch": "dim", "library": "dim", "native": "dim italic"}


def _ranks(g: Group) -> str:
    if g.ranks and len(g.ranks) == len(g.pids):
        return f"rank{'s' if len(g.ranks) > 1 else ''} {fold_ints(g.ranks)}"
    shown = ", ".join(proc_label(h, p) for h, p in g.pids[:6])
    return shown + (f" and {len(g.pids) - 6} more" if len(g.pids) > 6 else "")


def _frame_line(f: Frame) -> tuple[str, str]:
    kind = frame_kind(f)
    return f"    {f.location}", _FRAME_STYLE[kind]


def render(report: Report, console: Console, *, max_frames: int = 30) -> None:
    from rich.text import Text

    world = f" of {report.world_size}" if report.world_size else ""
    n = len(report.processes)
    hosts = sorted({p.host for p in report.processes})
    console.print(Text(f"mldebug hang: {n} rank process{'es' if n != 1 else ''}{world} on "
                       f"{len(hosts)} host{'s' if len(hosts) != 1 else ''} "
                       f"({collapse(hosts) if any(hosts) else 'unknown'})", style="bold"))
    style = {"suspects": "bold red", "ambiguous": "yellow", "same-place": "yellow",
             "no-processes": "red"}[report.verdict_kind]
    console.print()
    console.print(Text("Verdict: ", style="bold") + Text(report.verdict, style=style))
    for s in report.suspects:
        line = Text("  suspect ", style="red")
        line.append(s_label(s), style="bold")
        if s.call_site:
            line.append(f"  at {s.call_site}")
        console.print(line)
    for h in report.hints:
        console.print(Text(f"  hint: {h}", style="cyan"))

    for i, g in enumerate(report.groups, 1):
        console.print()
        head = Text(f"Group {i}: ", style="bold")
        head.append(_ranks(g), style="bold magenta")
        if any(g.hosts):
            head.append(f"  on {collapse([h for h in g.hosts if h])}")
        if g.collective:
            head.append(f"  - waiting in {g.collective}", style="yellow")
        else:
            head.append("  - not in a collective", style="red")
        if g.state:
            head.append(f"  [{g.state}]", style="green" if g.state == "moving" else "red")
        console.print(head)
        if g.locals_key:
            console.print(Text("    locals: " + ", ".join(f"{k}={v}" for k, v in g.locals_key),
                               style="cyan"))
        frames = g.frames[:max_frames]
        for f in frames:
            text, st = _frame_line(f)
            console.print(Text(text, style=st))
        if len(g.frames) > max_frames:
            console.print(Text(f"    ... {len(g.frames) - max_frames} more frames", style="dim"))

    if report.missing_ranks:
        console.print()
        miss = Text("Missing ranks: ", style="bold red")
        miss.append(fold_ints(report.missing_ranks))
        hosts_m = {report.missing_hosts[r] for r in report.missing_ranks if r in report.missing_hosts}
        if hosts_m:
            miss.append(f"  (expected on {', '.join(sorted(hosts_m))})")
        console.print(miss)
    if report.errors:
        console.print()
        console.print(Text(f"Errors ({len(report.errors)}):", style="bold red"))
        for e in report.errors:
            who = (e.host or "?") + (f" pid {e.pid}" if e.pid is not None else "")
            console.print(Text(f"  {who}: {e.error}"))


def render_text(report: Report) -> str:
    """The report as plain text (for --out)."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    render(report, Console(file=buf, no_color=True, width=120, highlight=False))
    return buf.getvalue()
