"""Render a hang report: the verdict first, then one block per group, then what failed.

The report is built as styled lines (pure), then written through rich on a terminal or as
plain text elsewhere (``mldebug.render.write_lines``).
"""

from __future__ import annotations

from typing import IO

from mldebug.hang.analyze import frame_kind, s_label
from mldebug.hang.model import Frame, Group, Report, proc_label
from mldebug.hosts import collapse
from mldebug.render import Line, fold_ints, write_lines

_FRAME_STYLE = {"user": "bold", "torch": "dim", "library": "dim", "native": "dim italic"}
_VERDICT_STYLE = {"suspects": "bold red", "ambiguous": "yellow", "same-place": "yellow",
                  "no-processes": "red"}


def _ranks(g: Group) -> str:
    if g.ranks and len(g.ranks) == len(g.pids):
        return f"rank{'s' if len(g.ranks) > 1 else ''} {fold_ints(g.ranks)}"
    shown = ", ".join(proc_label(h, p) for h, p in g.pids[:6])
    return shown + (f" and {len(g.pids) - 6} more" if len(g.pids) > 6 else "")


def _frame_line(f: Frame) -> Line:
    return [(f"    {f.location}", _FRAME_STYLE[frame_kind(f)])]


def report_lines(report: Report, *, max_frames: int = 30) -> list[Line]:
    """The human report as styled lines."""
    lines: list[Line] = []
    world = f" of {report.world_size}" if report.world_size else ""
    n = len(report.processes)
    hosts = sorted({p.host for p in report.processes})
    where = collapse([h for h in hosts if h]) if any(hosts) else "unknown"
    lines.append([(f"mldebug hang: {n} rank process{'es' if n != 1 else ''}{world} on "
                   f"{len(hosts)} host{'s' if len(hosts) != 1 else ''} ({where})", "bold")])
    lines.append([])
    lines.append([("Verdict: ", "bold"), (report.verdict, _VERDICT_STYLE[report.verdict_kind])])
    for s in report.suspects:
        line: Line = [("  suspect ", "red"), (s_label(s), "bold")]
        if s.call_site:
            line.append((f"  at {s.call_site}", ""))
        lines.append(line)
    for h in report.hints:
        lines.append([(f"  hint: {h}", "cyan")])

    for i, g in enumerate(report.groups, 1):
        lines.append([])
        head: Line = [(f"Group {i}: ", "bold"), (_ranks(g), "bold magenta")]
        if any(g.hosts):
            head.append((f"  on {collapse([h for h in g.hosts if h])}", ""))
        if g.collective:
            head.append((f"  - waiting in {g.collective}", "yellow"))
        else:
            head.append(("  - not in a collective", "red"))
        if g.state:
            head.append((f"  [{g.state}]", "green" if g.state == "moving" else "red"))
        lines.append(head)
        if g.locals_key:
            lines.append([("    locals: " + ", ".join(f"{k}={v}" for k, v in g.locals_key),
                           "cyan")])
        for f in g.frames[:max_frames]:
            lines.append(_frame_line(f))
        if len(g.frames) > max_frames:
            lines.append([(f"    ... {len(g.frames) - max_frames} more frames", "dim")])

    if report.missing_ranks:
        lines.append([])
        miss: Line = [("Missing ranks: ", "bold red"), (fold_ints(report.missing_ranks), "")]
        hosts_m = {report.missing_hosts[r] for r in report.missing_ranks
                   if r in report.missing_hosts}
        if hosts_m:
            miss.append((f"  (expected on {', '.join(sorted(hosts_m))})", ""))
        lines.append(miss)
    if report.errors:
        lines.append([])
        lines.append([(f"Errors ({len(report.errors)}):", "bold red")])
        for e in report.errors:
            who = (e.host or "?") + (f" pid {e.pid}" if e.pid is not None else "")
            lines.append([(f"  {who}: {e.error}", "")])
    return lines


def render(report: Report, file: IO[str] | None = None, *, color: bool | None = None) -> None:
    write_lines(report_lines(report), file, color=color)


def render_text(report: Report) -> str:
    """The report as plain text (for --out)."""
    return "".join("".join(t for t, _ in line) + "\n" for line in report_lines(report))
