"""Turn an Analysis into Findings and human output (rich); the timeline view for --all."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mldebug.findings import Finding, Severity, render_findings
from mldebug.fr.analyze import call_site, describe
from mldebug.fr.model import Analysis, DumpSet, Mismatch
from mldebug.render import fold_ints

if TYPE_CHECKING:
    from rich.console import Console

_KIND_TITLE = {
    "type": "collective type mismatch",
    "size": "size mismatch",
    "dtype": "dtype mismatch",
    "syntax": "shape/dtype rule broken",
    "missing": "not every rank enqueued the collective",
    "p2p": "send/recv mismatch",
    "state": "state mismatch",
}
_KIND_FIX = {
    "type": "Make every rank issue the same collectives in the same order: look for a "
            "collective under a rank-dependent branch at the culprit's call site.",
    "size": "Make the tensors passed at this call the same shape on every rank (or pad them); "
            "for all_gather/reduce_scatter the output must be group-size times the input.",
    "dtype": "Pass tensors of one dtype on every rank (check autocast / .half() on some ranks).",
    "syntax": "Fix the tensor shapes at the call site so they satisfy the collective's rule.",
    "missing": "Find why the culprit ranks never reached this collective: run 'mldebug hang' "
               "to see where they are, or look for an early return/skip on those ranks.",
    "p2p": "Pair every send with a recv of the same size on the peer, in the same order.",
    "state": "Some ranks completed this collective and others did not: inspect the "
             "non-completed ranks with 'mldebug hang'.",
}


def mismatch_finding(m: Mismatch) -> Finding:
    where = f"process group {m.pg}" + (f" ({m.pg_desc})" if m.pg_desc and m.pg_desc != "undefined" else "")
    seq = f"p2p #{m.seq}" if m.p2p else f"collective #{m.seq}"
    lines = [m.reasoning]
    for g in m.groups:
        lines.append(f"rank(s) {fold_ints(g.ranks)}: {g.description}"
                     + (f"  [{g.state}]" if g.state else ""))
        for fr in g.call_site:
            lines.append(f"    {fr}")
    return Finding(
        Severity.ERROR,
        f"{_KIND_TITLE.get(m.kind, m.kind)} at {seq} in {where}: culprit rank(s) "
        f"{fold_ints(m.culprit_ranks) or '?'}",
        "\n".join(lines), _KIND_FIX.get(m.kind, ""), code=f"fr-{m.kind}")


def findings(a: Analysis) -> list[Finding]:
    out = [mismatch_finding(m) for m in a.mismatches]
    if a.missing_ranks:
        out.append(Finding(
            Severity.WARNING, f"no dump from rank(s) {fold_ints(a.missing_ranks)}",
            "These ranks are members of the job's process groups but no readable dump came "
            "from them: they may have died, been frozen, or never called mldebug.fr.enable().",
            "Collect again with 'mldebug fr trigger' (add the missing nodes), or run "
            "'mldebug hang' to see whether those processes still exist.", code="fr-missing-dump"))
    for lag_pg in sorted({lag.pg for lag in a.lagging}):
        lags = [lag for lag in a.lagging if lag.pg == lag_pg]
        worst = max(lag.behind_by for lag in lags)
        out.append(Finding(
            Severity.WARNING if not a.mismatches else Severity.INFO,
            f"lagging rank(s) {fold_ints(lag.rank for lag in lags)} in process group {lag_pg}: "
            f"up to {worst} collective(s) behind",
            "\n".join(f"rank {lag.rank}: last enqueued #{lag.last_enqueued}"
                      + (f", last completed #{lag.last_completed}" if lag.last_completed is not None else "")
                      for lag in lags[:16]),
            "The lagging ranks have not issued collectives the others already wait in; see "
            "where they are with 'mldebug hang'.", code="fr-lagging"))
    for p in a.problems:
        out.append(Finding(Severity.WARNING, f"skipped {p.file}", p.error, code="fr-bad-file"))
    for rank, files in a.duplicates.items():
        out.append(Finding(Severity.WARNING, f"several dumps claim rank {rank}",
                           "used the first: " + ", ".join(files),
                           "Analyse one job's dumps at a time (one directory per trigger).",
                           code="fr-duplicate-rank"))
    for n in a.notes:
        out.append(Finding(Severity.INFO, n, code="fr-note"))
    return out


def render(a: Analysis, console: Console) -> None:
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
    render_findings(findings(a), console, empty="No mismatch: every rank recorded the same "
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
