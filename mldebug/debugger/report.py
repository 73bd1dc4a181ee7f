"""Rendering of ``mldebug pdb list``: a row per session, grouped by place when there are many."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import TYPE_CHECKING

from mldebug.debugger.model import Session, SessionList
from mldebug.hosts import collapse
from mldebug.render import fold_ints

if TYPE_CHECKING:
    from rich.console import Console

MAX_ROWS = 20


def _rank(s: Session) -> str:
    return "-" if s.rank is None else str(s.rank)


def _where(s: Session) -> str:
    return f"{os.path.basename(s.file or '?')}:{s.line if s.line is not None else '?'}" + (
        f" in {s.function}" if s.function else "")


def text_lines(sl: SessionList) -> list[str]:
    """The table as plain lines (also what the rich rendering prints)."""
    if not sl.sessions:
        return []
    if len(sl.sessions) <= MAX_ROWS:
        rows = [("rank", "host", "pid", "kind", "stopped at", "connect")]
        rows += [(_rank(s), s.host, str(s.pid), s.kind, _where(s), s.target) for s in sl.sessions]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    groups: dict[tuple[str, str], list[Session]] = defaultdict(list)
    for s in sl.sessions:
        groups[(s.kind, _where(s))].append(s)
    lines = []
    for (kind, where), members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        ranks = fold_ints(s.rank for s in members if s.rank is not None) or "-"
        lines.append(f"{len(members)} {kind} session(s): ranks {ranks} on "
                     f"{collapse([s.host for s in members])} at {where}")
    lines.append("connect: mldebug pdb connect RANK (with the same --nodes), or HOST:PORT "
                 "from --json")
    return lines


def render(report: SessionList, console: Console) -> None:
    from rich.text import Text

    from mldebug.findings import render_findings

    n = len(report.sessions)
    console.print(Text(f"mldebug pdb: {n} open session(s) on {len(report.hosts)} node(s)",
                       style="bold"))
    for line in text_lines(report):
        console.print(Text(line))
    if report.findings:
        render_findings(report.findings, console)
