"""The findings of a flight-recorder analysis: each mismatch, lag, missing dump and skipped
file as a ``mldebug.findings.Finding`` with a stable ``code`` and a fix (built by analysis,
so ``--json`` carries the same diagnosis the human output prints)."""

from __future__ import annotations

from mldebug.findings import Finding, Severity
from mldebug.fr.model import Analysis, Mismatch
from mldebug.render import fold_ints

_KIND_TITLE = {
    "type": "collective type mismatch",
    "size": "size mismatch",
    "dtype": "dtype mismatch",
    "syntax": "shape/dtype rule broken",
    "missing": "not every rank enqueued the collective",
    "skipped": "a rank skipped a collective of its group",
    "root": "ranks disagree on a collective's root",
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
    "skipped": "Make every member of the group issue this collective: look for a branch or an "
               "early exit on the culprit ranks between their previous collective in this group "
               "and the later one they wait in now.",
    "root": "Pass the same src/dst (root) to this collective on every rank: look for a "
            "rank-dependent expression in the root argument at the culprit's call site.",
    "p2p": "Pair every send with a recv of the same size on the peer, in the same order.",
    "state": "Some ranks completed this collective and others did not: inspect the "
             "non-completed ranks with 'mldebug hang'.",
}


def mismatch_finding(m: Mismatch) -> Finding:
    where = f"process group {m.pg}" + (f" ({m.pg_desc})" if m.pg_desc and m.pg_desc != "undefined" else "")
    seq = (f"p2p #{m.seq}" if m.seq > 0 else "a send/recv") if m.p2p else f"collective #{m.seq}"
    lines = [m.reasoning]
    for g in m.groups:
        lines.append(f"rank(s) {fold_ints(g.ranks)}: {g.description}"
                     + (f"  [{g.state}]" if g.state else ""))
        for fr in g.call_site:
            lines.append(f"    {fr}")
    return Finding(
        Severity.ERROR,
        f"{_KIND_TITLE.get(m.kind, m.kind)} at {seq} in {where}: culprit rank(s) "
        f"{fold_ints(m.culprit_ranks) or ('none here: rank(s) ' + fold_ints(m.blocked_elsewhere) + ' wait in an earlier collective of another group' if m.blocked_elsewhere else '?')}",
        "\n".join(lines), _KIND_FIX.get(m.kind, ""), code=f"fr-{m.kind}")


def build_findings(a: Analysis) -> list[Finding]:
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
    for st in a.stragglers:
        share = 100 * st.times_last / st.collectives
        where = f" {st.position}" if st.position else ""
        phase = f"; late in: {st.phase}" if st.phase else ""
        times = ""
        if st.host_gap_ms is not None or st.comm_ms is not None:
            times = (f" Per collective (median, this rank vs the others): host gap "
                     f"(previous completion to enqueue) {_ms(st.host_gap_ms)} vs "
                     f"{_ms(st.host_gap_ms_others)}, communication (start to completion) "
                     f"{_ms(st.comm_ms)} vs {_ms(st.comm_ms_others)}.")
        if st.data_ms is not None:
            times += (f" Per step (median, step clock, this rank vs the others): data "
                      f"{_ms(st.data_ms)} vs {_ms(st.data_ms_others)}, compute "
                      f"{_ms(st.compute_ms)} vs {_ms(st.compute_ms_others)}, communication "
                      f"{_ms(st.step_comm_ms)} vs {_ms(st.step_comm_ms_others)}.")
            if st.step_ms is not None and st.step_ms_without is not None:
                times += (f" Step time {_ms(st.step_ms)}; without its delay about "
                          f"{_ms(st.step_ms_without)}.")
        out.append(Finding(
            Severity.WARNING,  # a healthy but slow rank: never an error (#44)
            f"rank {st.rank}{f' ({st.host})' if st.host else ''} arrived last at {share:.0f}% "
            f"of {st.collectives}{where} collectives, by {st.late_ms_median:.0f} ms median"
            + phase,
            f"Behind the other ranks' median: median {st.late_ms_median:.1f} ms, p90 "
            f"{st.late_ms_p90:.1f} ms, mean {st.late_ms_mean:.1f} ms (enqueue times, host "
            f"clocks aligned). The others wait about {st.late_ms_median:.0f} ms for it per "
            f"collective{where}; the step would be about {st.late_ms_median:.0f} ms shorter "
            "per such collective without it." + times,
            f"Look at what rank {st.rank} does between collectives"
            + (f" and at host {st.host}" if st.host else "")
            + ": a slower GPU or NIC, a data loader on a busy host, extra work on that rank "
            "only. 'mldebug hang --pid' on it during a step shows where the time goes.",
            code="fr-straggler", hosts=(st.host,) if st.host else ()))
    for n in a.notes:
        out.append(Finding(Severity.INFO, n, code="fr-note"))
    return out


def _ms(v: float | None) -> str:
    return "not recorded" if v is None else f"{v:.1f} ms"
