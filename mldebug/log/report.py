"""Render a ``mldebug log`` report: the verdict first, then one row per group of ranks."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from mldebug.findings import render_findings
from mldebug.log.model import LogReport, RankLog
from mldebug.render import fold_ints
from mldebug.text import sanitize

if TYPE_CHECKING:
    from rich.console import Console

MAX_ROWS = 12


def _state(st: RankLog) -> str:
    if st.first_primary is not None:
        ev = st.first_primary
        where = f" at {ev.frame}" if ev.frame else ""
        return f"{ev.kind}: {ev.message[:90]}{where}"
    if st.timeouts:
        t = st.timeouts[0]
        seq = f" #{t.seq}" if t.seq is not None else ""
        return f"timed out in {t.op or 'a collective'}{seq} (pg {t.pg})"
    if st.first_event is not None:
        return f"{st.first_event.kind}: {st.first_event.message[:90]}"
    if st.exitcode is not None:
        return f"no error; exit code {st.exitcode}"
    return "no error, no timeout"


def render(report: LogReport, console: Console) -> None:
    from rich.text import Text

    p = report.parsed
    seen = f"{len(p.ranks)} ranks seen."
    if p.ranks_lower_bound:  # the sample of a large log missed ranks: say so, and what it saw
        seen = (f"at least {len(p.ranks)} ranks seen (rank prefixes are sampled in a large log;"
                 f" the highest rank number seen is {max(p.ranks)}"
                 + (f", a line states world size {p.world_hint}" if p.world_hint else "") + ").")
    console.print(Text(f"Read {'at least ' if p.lines_lower_bound else ''}{p.lines} lines from {len(p.sources)} input(s); "
                       + seen, style="dim"))
    if report.verdict is not None:
        console.print(Text("Verdict:", style="bold"))
    render_findings(report.findings, console)
    for note in p.notes[:10]:
        console.print(Text(f"note: {sanitize(note)}", style="dim"))
    rows: dict[str, list[int]] = defaultdict(list)
    for r, st in p.ranks.items():
        rows[_state(st)].append(r)
    if not rows:
        return
    console.print(Text("\nRanks:", style="bold"))
    ordered = sorted(rows.items(), key=lambda kv: (len(kv[1]), min(kv[1])))
    for state, ranks in ordered[:MAX_ROWS]:
        label = f"rank{'s' if len(ranks) > 1 else ''} {fold_ints(ranks)}"
        console.print(Text(f"  {label:<18} {sanitize(state)}"))
    if len(ordered) > MAX_ROWS:
        console.print(Text(f"  ... {len(ordered) - MAX_ROWS} more groups (--json has every rank)",
                           style="dim"))
