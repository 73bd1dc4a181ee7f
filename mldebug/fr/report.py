"""Human output (rich) of an Analysis, whose findings analysis built; the timeline view for --all."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mldebug.findings import render_findings
from mldebug.fr.analyze import call_site, describe
from mldebug.fr.model import Analysis, DumpSet
from mldebug.render import fold_ints

if TYPE_CHECKING:
    from rich.console import Console

def render(a: Analysis, console: Console) -> None:
    """The header, one line per process group, the findings and the culprit line."""
    from rich.text import Text

    head = Text()
    head.append(f"{len(a.ranks)} dump(s)", style="bold")
    head.append(f" (ranks {fold_ints(a.ranks)}" if a.ranks else " (")
    head.append(f", world size {a.world_size}" if a.world_size else "")
    head.append(f", {a.timelines} distinct timeline(s))")
    console.print(head)
    for g in a.groups:
        wait = ""
        if g.waiting_in:
            by_seq: dict[int, list[int]] = {}
            for r, s in g.waiting_in.items():
                by_seq.setdefault(s, []).append(r)
            wait = "; waiting in " + ", ".join(f"#{s}: ranks {fold_ints(rs)}"
                                               for s, rs in sorted(by_seq.items()))
        console.print(Text(f"  group {g.pg} ({g.desc or '-'}): ranks {fold_ints(g.ranks)} "
                           f"[{g.membership}], collectives #{g.compared_from}-#{g.compared_to} "
                           f"compared{wait}", style="dim"))
    if a.straggler_window:
        from mldebug.fr.stragglers import MIN_COLLECTIVES

        named = ", ".join(f"rank {st.rank}" for st in a.stragglers) or (
            "none" if a.straggler_window >= MIN_COLLECTIVES else "too few to judge")
        console.print(Text(f"  stragglers over {a.straggler_window} matched collective(s): "
                           f"{named}", style="dim"))
    for note in a.notes[:8]:
        console.print(Text(f"  note: {note}", style="dim"))
    render_findings(a.findings, console, empty="No mismatch: every rank recorded the same "
                    "collectives in the same order.")
    if a.culprits:
        console.print(Text(f"Culprit rank(s): {fold_ints(a.culprits)}", style="bold red"))


def render_timeline(ds: DumpSet, console: Console, frames: int = 2,
                    rank: int | None = None) -> None:
    """Every entry, side by side per distinct timeline (ranks sharing one are folded)."""
    from rich.table import Table
    from rich.text import Text

    cols = [(tl, sorted(tl.ranks)) for tl in ds.timelines
            if rank is None or rank in tl.ranks]
    table = Table(title="flight-recorder timeline (per group and seq)", show_lines=False)
    table.add_column("group:seq")
    for _, rs in cols:
        table.add_column(f"ranks {fold_ints(rs)}" if len(rs) > 1 else f"rank {rs[0]}")
    keys: dict[tuple[str, int, int], None] = {}
    cells: list[dict[tuple[str, int, int], str]] = []
    for tl, _ in cols:
        cell: dict[tuple[str, int, int], str] = {}
        for e in tl.entries:
            key = (e.pg_name, 1 if e.is_p2p else 0, e.p2p_seq if e.is_p2p else e.seq)
            text = f"{describe(e)} [{e.state}]"
            site = call_site(e, frames)
            if site:
                text += "\n  " + "\n  ".join(site)
            cell[key] = cell[key] + "\n" + text if key in cell else text
            keys.setdefault(key, None)
        cells.append(cell)
    for key in sorted(keys, key=lambda k: (k[0], k[1], k[2])):
        label = f"{key[0]}:{'p2p ' if key[1] else ''}#{key[2]}"
        table.add_row(label, *[Text(c.get(key, "-")) for c in cells])  # no markup: "[state]"
    console.print(table)
