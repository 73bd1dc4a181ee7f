"""Render a hang report: jobs first, each with its verdict and groups, then the findings.

One screen at any scale: ranks fold into ranges, groups that differ only in line numbers
fold into one (the lines listed), and long lists stop at a cap with "N more" (``--all``
shows everything). Long C++ template names are shortened here; the JSON keeps them whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from mldebug.findings import Finding, finding_lines, render_findings
from mldebug.hang.analyze import s_label
from mldebug.hang.frames import frame_kind
from mldebug.hang.model import Group, Job, Report, StackFrame, fold_ranks, join_labels, proc_label
from mldebug.hosts import collapse
from mldebug.render import Line, write_lines

if TYPE_CHECKING:
    from rich.console import Console

_FRAME_STYLE = {"user": "bold", "torch": "dim", "library": "dim", "native": "dim italic",
                "mldebug": "dim"}
MAX_WORKER_FRAMES = 12
MAX_GROUPS = 6
MAX_SUSPECTS = 8
MAX_ERRORS = 8
MAX_FRAMES = 30
MAX_NAME = 100


def short_name(name: str, limit: int = MAX_NAME) -> str:
    """A C++ symbol with its template arguments elided: ``f<...>::g<...>(...)``."""
    if len(name) <= limit:
        return name
    out, depth = [], 0
    for ch in name:
        if ch in "<(":
            if depth == 0:
                out.append(ch + "...")
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
            if depth == 0:
                out.append(ch)
        elif depth == 0:
            out.append(ch)
    s = "".join(out)
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _frame_line(f: StackFrame) -> Line:
    name = short_name(f.name) if f.native else f.name
    loc = f"{name} ({f.display_file})" if f.native else f"{name} ({f.display_file}:{f.line})"
    return [(f"    {loc}", _FRAME_STYLE[frame_kind(f)])]


@dataclass
class _Shown:
    """Groups folded for display: those that differ only in line numbers become one."""

    group: Group
    ranks: list[int]
    pids: list[tuple[str, int]]
    hosts: set[str]
    lines: set[int]


def fold_groups(groups: list[Group]) -> list[_Shown]:
    shown: dict[tuple, _Shown] = {}
    for g in groups:
        key = (g.collective, g.state, g.locals_key,
               tuple((f.display_file, f.name) for f in g.frames))
        s = shown.get(key)
        user_line = next((f.line for f in g.frames if frame_kind(f) == "user"), None)
        if s is None:
            s = shown[key] = _Shown(g, [], [], set(), set())
        s.ranks.extend(g.ranks)
        s.pids.extend(g.pids)
        s.hosts.update(h for h in g.hosts if h)
        if user_line is not None:
            s.lines.add(user_line)
    return sorted(shown.values(), key=lambda s: -len(s.pids))


def _who(ranks: list[int], pids: list[tuple[str, int]]) -> str:
    if ranks and len(ranks) == len(pids):
        return f"rank{'s' if len(ranks) > 1 else ''} {fold_ranks(ranks)}"
    return join_labels((proc_label(h, p) for h, p in pids), 6)


def thread_lines(job: Job, pids: list[tuple[str, int]], *, show_all: bool = False
                 ) -> list[Line]:
    """With --all-threads: the other threads of the group's first process, each with where it
    is and its stack (the holder of a lock, the producer of a queue, a stuck helper)."""
    from mldebug.hang.frames import is_background, where

    first = next((p for p in job.processes if (p.host, p.pid) == pids[0]), None) if pids else None
    if first is None:
        return []
    mt = first.main_thread()
    others = [t for t in first.threads if t is not mt]
    ours = [t for t in others if t.name.startswith("mldebug") or (
        t.frames and all(frame_kind(f) in ("mldebug", "library", "native") for f in t.frames)
        and any(frame_kind(f) == "mldebug" for f in t.frames))]
    others = [t for t in others if t not in ours]
    if not others and not ours:
        return []
    lines: list[Line] = [[(f"  other threads of {first.label} (pid {first.pid}):", "bold")]]
    if ours:
        lines.append([(f"  {len(ours)} thread{'s' if len(ours) != 1 else ''} of mldebug itself "
                       f"({join_labels((t.name or '?' for t in ours), 4)}) not shown", "dim")])
    cap = None if show_all else MAX_WORKER_FRAMES
    for t in others:
        shown = [f for f in t.frames if not (f.native and f.name.startswith("0x"))]
        tag = " (background)" if is_background(t) else ""
        state = " active" if t.active else " idle" if t.active is False else ""
        tid = t.os_thread_id if t.os_thread_id is not None else t.thread_id
        lines.append([(f"  thread {t.name or '?'!r} (tid {tid}{state}){tag}", "bold magenta"),
                      (f"  at {where(shown)}", "")])
        for f in shown[:cap]:
            line = _frame_line(f)
            lines.append([("  " + line[0][0], line[0][1])])
        if cap is not None and len(shown) > cap:
            lines.append([(f"      ... {len(shown) - cap} more frames (--all)", "dim")])
    return lines


def job_lines(job: Job, *, show_all: bool = False, heading: bool = False,
              all_threads: bool = False) -> list[Line]:
    lines: list[Line] = []
    if heading:
        lines.append([])
        desc = ", ".join(x for x in (job.launcher, f"{len(job.processes)} ranks"
                                     + (f" of {job.world_size}" if job.world_size else ""),
                                     f"on {collapse([h for h in job.hosts if h])}"
                                     if any(job.hosts) else "") if x)
        lines.append([("Job ", "bold"), (job.key or "(unnamed)", "bold magenta"),
                      (f"  ({desc})", "")])
    lines.append([("Verdict: ", "bold"), (job.verdict.title, job.kind.style)])
    if job.verdict.fix:
        lines.append([("  fix: ", "green"), (job.verdict.fix, "")])
    cap = None if show_all else MAX_SUSPECTS
    for sus in job.suspects[:cap]:
        line: Line = [("  suspect ", "red"), (s_label(sus), "bold")]
        if sus.call_site:
            line.append((f"  at {sus.call_site}", ""))
        if sus.activity:
            line.append((f"  [{sus.activity}]", "red" if sus.activity == "spinning" else "yellow"))
        lines.append(line)
    if cap is not None and len(job.suspects) > cap:
        rest = job.suspects[cap:]
        ranks = [x.rank for x in rest if x.rank is not None]
        lines.append([(f"  ... {len(rest)} more suspects"
                       + (f" (ranks {fold_ranks(ranks)})" if len(ranks) == len(rest) else "")
                       + " (--all lists them)", "dim")])
    shown = fold_groups(job.groups)
    gcap = None if show_all else MAX_GROUPS
    for i, s in enumerate(shown[:gcap], 1):
        g = s.group
        lines.append([])
        head: Line = [(f"Group {i}: ", "bold"), (_who(s.ranks, s.pids), "bold magenta")]
        if s.hosts:
            head.append((f"  on {collapse(sorted(s.hosts))}", ""))
        if g.collective:
            head.append((f"  - waiting in {g.collective}", "yellow"))
        else:
            head.append(("  - not in a collective", "red"))
            if g.wait:
                head.append((f" (waits in {g.wait})", "red"))
        if g.state:
            head.append((f"  [{g.state}]", {"moving": "green", "spinning": "yellow"}.get(g.state, "red")))
        lines.append(head)
        if len(s.lines) > 1:
            lines.append([(f"    at lines {', '.join(map(str, sorted(s.lines)[:20]))}"
                           + (" ..." if len(s.lines) > 20 else "")
                           + " of the innermost user frame (one group per line folded)", "cyan")])
        if g.locals_key:
            lines.append([("    locals: " + ", ".join(f"{k}={v}" for k, v in g.locals_key),
                           "cyan")])
        if g.ours:
            lines.append([(f"    {g.ours}", "cyan")])
        # bare native addresses (0x7f...) differ per process and say nothing: JSON keeps them
        frames = [f for f in g.frames if not (f.native and f.name.startswith("0x"))]
        for f in frames[:MAX_FRAMES]:
            lines.append(_frame_line(f))
        if len(frames) > MAX_FRAMES:
            lines.append([(f"    ... {len(frames) - MAX_FRAMES} more frames", "dim")])
        if g.hidden:
            lines.append([(f"    ({g.hidden} frame{'s' if g.hidden != 1 else ''} of mldebug "
                           "itself hidden)", "dim")])
        if all_threads:
            lines.extend(thread_lines(job, s.pids, show_all=show_all))
        lines.extend(worker_lines(job, s.pids, show_all=show_all))
    if gcap is not None and len(shown) > gcap:
        rest_pids = sum(len(s.pids) for s in shown[gcap:])
        lines.append([])
        lines.append([(f"... {len(shown) - gcap} more groups ({rest_pids} ranks; --all shows "
                       "them)", "dim")])
    if job.missing_ranks:
        lines.append([])
        miss: Line = [("Missing ranks: ", "bold red"), (fold_ranks(job.missing_ranks), "")]
        hosts_m = sorted({job.missing_hosts[r] for r in job.missing_ranks
                          if r in job.missing_hosts})
        if hosts_m:
            miss.append((f"  (expected on {collapse(hosts_m)})", ""))
        lines.append(miss)
    return lines


def worker_lines(job: Job, pids: list[tuple[str, int]], *, show_all: bool = False,
                 ) -> list[Line]:
    """The DataLoader workers (and other rank-carrying children) of these ranks, folded by
    stack like the ranks: who, then the stack of the first of them."""
    from mldebug.hang.analyze import thread_signature

    wanted = set(pids)
    folded: dict[tuple, tuple[list[str], list[StackFrame]]] = {}
    for p in job.processes:
        if (p.host, p.pid) not in wanted:
            continue
        for w in p.workers:
            mt = w.main_thread()
            if mt is None:
                continue
            key = thread_signature(mt)
            label = f"{p.label} (pid {w.pid})" if p.rank is not None else proc_label(w.host, w.pid)
            folded.setdefault(key, ([], mt.frames))[0].append(label)
    lines: list[Line] = []
    cap = None if show_all else MAX_WORKER_FRAMES
    for who, frames in folded.values():
        shown = [f for f in frames if not (f.native and f.name.startswith("0x"))]
        from mldebug.hang.frames import where

        lines.append([("  worker process" + ("es" if len(who) > 1 else "") + " of ", "bold"),
                      (join_labels(who, 6), "bold magenta"), (f"  at {where(shown)}", "")])
        for f in shown[:cap]:
            line = _frame_line(f)
            lines.append([("  " + line[0][0], line[0][1])])
        if cap is not None and len(shown) > cap:
            lines.append([(f"      ... {len(shown) - cap} more frames (--all)", "dim")])
    return lines


def report_lines(report: Report, *, show_all: bool = False) -> list[Line]:
    """Everything but the findings, as styled lines."""
    lines: list[Line] = []
    n = len(report.processes)
    hosts = sorted({p.host for p in report.processes})
    where = collapse([h for h in hosts if h]) if any(hosts) else "unknown"
    world = f" of {report.world_size}" if report.world_size else ""
    jobs = f"{len(report.jobs)} jobs found: " if len(report.jobs) > 1 else ""
    lines.append([(f"mldebug hang: {jobs}{n} rank process{'es' if n != 1 else ''}{world} on "
                   f"{len(hosts)} host{'s' if len(hosts) != 1 else ''} ({where})", "bold")])
    if not report.jobs:
        lines.append([])
        lines.append([("Verdict: ", "bold"), (report.verdict, "red")])
    for job in report.jobs:
        if len(report.jobs) == 1:
            lines.append([])
        lines.extend(job_lines(job, show_all=show_all, heading=len(report.jobs) > 1,
                               all_threads=report.all_threads))
    if report.notes:
        lines.append([])
        lines.append([(f"Notes ({len(report.notes)}):", "bold")])
        lines.extend([(f"  {n.host}: {n.error}", "dim")] for n in report.notes[:MAX_ERRORS])
    if report.errors:
        lines.append([])
        lines.append([(f"Errors ({len(report.errors)}):", "bold red")])
        by_msg: dict[str, list[str]] = {}
        for e in report.errors:
            by_msg.setdefault(e.error, []).append(
                (e.host or "?") + (f" pid {e.pid}" if e.pid is not None else ""))
        cap = None if show_all else MAX_ERRORS
        for msg, who in list(by_msg.items())[:cap]:
            names = collapse(who) if all(" " not in w for w in who) else join_labels(who, 4)
            lines.append([(f"  {names}: {msg}", "")])
        if cap is not None and len(by_msg) > cap:
            lines.append([(f"  ... {len(by_msg) - cap} more kinds of error (--all)", "dim")])
    return lines


def _hint_findings(report: Report) -> list[Finding]:
    """The findings not already shown as a job's verdict line."""
    skip = ({j.verdict for j in report.jobs} | {j.named_verdict() for j in report.jobs}
            | ({report.findings[0]} if not report.jobs else set()))
    return [f for f in report.findings if f not in skip]


def all_lines(report: Report, *, show_all: bool = False) -> list[Line]:
    lines = report_lines(report, show_all=show_all)
    hints = _hint_findings(report)
    if hints:
        lines.append([])
        lines.extend(finding_lines(hints))
    return lines


def render(report: Report, console: Console | None = None, *, show_all: bool = False) -> None:
    """The human report: jobs, verdicts and groups, then the findings with their fixes.

    Without a console, plain text on stdout when it is not a terminal (rich is not even
    imported: it costs more than a small job's dumps) and styled text on a terminal."""
    if console is None:
        write_lines(all_lines(report, show_all=show_all))
        return
    from rich.text import Text

    for line in report_lines(report, show_all=show_all):
        text = Text()
        for part, style in line:
            text.append(part, style=style or None)
        console.print(text, soft_wrap=True)
    hints = _hint_findings(report)
    if hints:
        console.print()
        render_findings(hints, console)


def render_text(report: Report, *, show_all: bool = False) -> str:
    """The report as plain text (for --out)."""
    return "".join("".join(t for t, _ in line) + "\n" for line in all_lines(report, show_all=show_all))


def write_json(doc: dict[str, Any], file: IO[str] | None = None) -> None:
    """The ``--json`` document, one top-level key per line and one list element per line.

    Equivalent to an indented dump, but every value goes through json's C encoder (an
    indented dump takes the pure-Python path: 3-4x slower on 16,384 ranks)."""
    import json
    import sys

    from mldebug.render import _default  # the same fallbacks as every other --json

    out = file or sys.stdout
    enc = json.JSONEncoder(separators=(",", ":"), default=_default)
    items = list(doc.items())
    out.write("{\n")
    for i, (k, v) in enumerate(items):
        sep = "," if i < len(items) - 1 else ""
        if isinstance(v, list) and v:
            out.write(f"  {json.dumps(k)}: [\n")
            out.write(",\n".join("    " + enc.encode(x) for x in v))
            out.write(f"\n  ]{sep}\n")
        else:
            out.write(f"  {json.dumps(k)}: {enc.encode(v)}{sep}\n")
    out.write("}\n")
    out.flush()

