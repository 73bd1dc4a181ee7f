"""The join: every reader's evidence items in, one verdict and its evidence chain out. Pure.

The rules (docs/why.md, "How the verdict is decided"):

1. A claim rests on a rank's own record (DIRECT: its exception, its dump's missing
   collective, its sentinel record), on an inference (INFERRED: from silence, from the others'
   waits, from a missing dump), names no rank (GENERIC: "every rank timed out") or says all is
   well (HEALTHY). A DIRECT claim whose culprits all lie outside its own source's scope (fr
   blaming ranks it has no dump of) is an inference.
2. The claim that names ranks and rests on the most wins: DIRECT over INFERRED, then the
   reader's confidence, then the order log, elastic, fr, numerics, hang (a process's own
   error is the cause; a missing collective is what the others saw of it).
3. Every other claim that names a winning rank agrees: each raises the confidence one step.
   A claim naming other ranks conflicts: it is shown beside the winner, with why it lost; a
   conflict on the same footing caps the confidence at medium.
4. A rank the job had (another source saw it, or a dump's world size says so) but that left
   no artifact of its own in a per-rank source (no FR dump, no stack dump) is evidence: named
   in the chain, and the suspect when no claim names a rank.
5. Claims that name no rank are context; all sources healthy: no suspect at all.
6. A torchrun ``--log-dir`` run restarted (``--max-restarts``): its last attempt's evidence
   decides; each earlier attempt is one line of the chain ("attempt 0: rank 1 raised
   RuntimeError at train.py:12; restarted") and votes for nothing.
7. A launcher's "Root Cause" (torchrun's first observed failure) never votes: it names the
   first rank to *exit*. The verdict says what it is: agreeing, a consequence (the rank was
   aborted by its watchdog, SIGTERMed by the agent, or its own lines show only a reaction to a
   peer) with the real failure put first, a claim the evidence contradicts, or no fault at all.
8. Flight-recorder dumps written while the job ran (on SIGTERM, on a trigger) with the ranks
   a collective apart are a cut through a running job, no culprit - unless stack dumps beside
   them say the job is stuck (any stack claim but a healthy one: `mldebug hang` asked for the
   dumps because it hangs), then the dumps' mismatch is the claim.
"""

from __future__ import annotations

from collections.abc import Sequence

from mldebug.render import fold_ints
from mldebug.why.model import DIRECT, GENERIC, HEALTHY, INFERRED, Evidence, Link, WhyVerdict

BASIS_ORDER = {DIRECT: 3, INFERRED: 2, GENERIC: 1, HEALTHY: 0}
CONFIDENCE_ORDER = {"high": 2, "medium": 1, "low": 0}
CONFIDENCE_NAMES = ("low", "medium", "high")
READER_ORDER = {"log": 4, "elastic": 3, "fr": 2, "numerics": 1, "hang": 0}
NOUN = {"fr": "flight-recorder dump", "hang": "stack dump", "numerics": "sentinel record",
        "log": "log line", "elastic": "error file"}


def ranks_text(ranks: Sequence[int] | set[int]) -> str:
    rs = sorted(set(ranks))
    return f"rank{'s' if len(rs) > 1 else ''} {fold_ints(rs)}" if rs else "no rank"


def settle(e: Evidence) -> Evidence:
    """Rule 1's second half: a DIRECT claim about ranks outside the source's own scope is an
    inference (the source has nothing of those ranks; it reasons from their absence)."""
    if e.basis == DIRECT and e.culprits and not set(e.culprits) & set(e.scope):
        from dataclasses import replace

        return replace(e, basis=INFERRED)
    return e


def _rank(e: Evidence) -> tuple[int, int, int]:
    return (BASIS_ORDER.get(e.basis, 0), CONFIDENCE_ORDER.get(e.confidence or "low", 0),
            READER_ORDER.get(e.source.reader, -1))


def _label(e: Evidence) -> str:
    return f"{e.source.reader} {e.source.path}"


def _link(e: Evidence, text: str) -> Link:
    return Link(text, e.source.path, e.source.reader)


def gaps(items: Sequence[Evidence]) -> list[tuple[Evidence, list[int]]]:
    """Rule 4: per-rank sources and the ranks of the job they have nothing of."""
    seen: set[int] = set()
    for e in items:
        seen.update(e.scope)
        seen.update(e.expected or ())
    out = []
    for e in items:
        if not e.per_rank:
            continue
        missing = sorted((seen | set(e.expected or ())) - set(e.scope))
        if missing:
            out.append((e, missing))
    return out


def _why_lost(win: Evidence, e: Evidence) -> str:
    if BASIS_ORDER[win.basis] > BASIS_ORDER[e.basis]:
        return ("a rank's own record beats an inference" if win.basis == DIRECT
                else "a claim that names ranks beats one that names none")
    if CONFIDENCE_ORDER.get(win.confidence or "low", 0) > CONFIDENCE_ORDER.get(
            e.confidence or "low", 0):
        return f"{win.source.reader}'s confidence is {win.confidence}, {e.source.reader}'s " \
               f"{e.confidence or 'unstated'}"
    return (f"on equal footing the order is log, elastic, fr, numerics, hang "
            f"({win.source.reader} first)")


def _gap_links(found: list[tuple[Evidence, list[int]]], culprits: set[int],
               decided: bool) -> list[Link]:
    out = []
    for e, missing in found:
        who = ranks_text(missing)
        if not decided:
            tail = "missing evidence, not a fault (every source is healthy)"
        elif set(missing) & culprits:
            tail = "prime suspect" if set(missing) <= culprits else \
                f"{ranks_text(set(missing) & culprits)} among them: prime suspect"
        else:
            tail = "its dump is missing too: look at it next"
        out.append(_link(e, f"{who} left no {NOUN.get(e.source.reader, 'artifact')} in "
                            f"{e.source.path} ({e.source.reader} covers "
                            f"{ranks_text(e.scope)}): {tail}"))
    return out


def uncut(items: Sequence[Evidence]) -> list[Evidence]:
    """Rule 8: with a stack claim that is not healthy among ``items``, each flight-recorder
    claim read as a cut is replaced by the claim its mismatch makes, saying why."""
    if not any(e.source.reader == "hang" and e.basis != HEALTHY for e in items):
        return list(items)
    from dataclasses import replace

    return [replace(e.if_stuck, fact=f"{e.if_stuck.fact} (dumped while the stacks show the "
                                     "job stuck: not a running job's cut)")
            if e.if_stuck is not None else e for e in items]


def history(items: Sequence[Evidence]) -> tuple[list[Evidence], list[Evidence]]:
    """Rule 6: (the evidence of each run's last attempt and of no attempt, the evidence of
    earlier attempts of a torchrun run: they failed and were restarted)."""
    last: dict[str, int] = {}
    for e in items:
        if e.source.attempt is not None:
            last[e.source.run] = max(last.get(e.source.run, -1), e.source.attempt)
    now = [e for e in items if e.source.attempt is None or e.source.attempt == last[e.source.run]]
    past = [e for e in items if e.source.attempt is not None
            and e.source.attempt < last[e.source.run]]
    return now, past


def _past_links(past: list[Evidence]) -> list[Link]:
    best: dict[tuple[str, int], Evidence] = {}
    for e in sorted(past, key=_rank, reverse=True):
        best.setdefault((e.source.run, e.source.attempt or 0), e)
    return [_link(e, f"attempt {key[1]}: {e.fact}; restarted")
            for key, e in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][0]))]


def join(items: Sequence[Evidence]) -> WhyVerdict:
    """One verdict from every source's evidence (rules in the module docstring)."""
    now, past = history(items)
    v = _join(uncut(now))
    said = next((e for e in now if e.launcher is not None), None)
    if said is not None:
        correct(v, said)
    v.chain += _past_links(past)
    return v


def correct(v: WhyVerdict, e: Evidence) -> None:
    """Rule 7: what the launcher's Root Cause (``e.launcher``) is beside the verdict; sets
    ``v.correction`` and puts its line in the chain (after the winner's, so the real failure
    stays first)."""
    rc = e.launcher
    assert rc is not None
    what, consequence = rc.meaning, rc.consequence
    culprits = set(v.culprits)
    if culprits and rc.rank is not None and rc.rank in culprits:
        status, text = "agrees", f"{rc.said}: it agrees ({what})"
    elif culprits:
        who = ranks_text(culprits)
        if consequence:
            status = "consequence"
            text = (f"{rc.said}: a consequence, not the cause - {what}; the real failure is "
                    f"{who}'s (first line)")
        else:
            status = "contradicted"
            text = (f"{rc.said}: {what}; the evidence names {who} instead (the launcher "
                    "reports the first rank to exit, not the first to fail)")
    elif v.kind == "ok":
        status = "no-fault"
        text = f"{rc.said}: {what} - no rank's fault: {v.summary}"
    elif consequence:
        status = "consequence"
        text = (f"{rc.said}: a consequence, not the cause - {what}; the cause is not that "
                f"rank's: {v.summary}")
    else:
        status = "unconfirmed"
        text = f"{rc.said}: {what}; no other evidence confirms that rank"
    v.correction = {**rc.fields, "status": status, "meaning": what, "text": text}
    link = _link(e, f"{e.source.reader} {e.source.path}: {text}")
    if status in ("consequence", "contradicted") and v.chain:
        win = v.winner
        v.chain.insert(2 if win is not None and win.consequences else 1, link)
    else:
        v.chain.append(link)


def _join(items: Sequence[Evidence]) -> WhyVerdict:
    items = [settle(e) for e in items]
    if not items:
        return WhyVerdict("undecided", "no source could be read: nothing to decide", [], None,
                          None, "why-nothing-read")
    accusing = sorted((e for e in items if e.culprits), key=_rank, reverse=True)
    generic = [e for e in items if not e.culprits and e.basis != HEALTHY]
    healthy = [e for e in items if not e.culprits and e.basis == HEALTHY]
    found = gaps(items)
    chain: list[Link] = []
    if accusing:
        win = accusing[0]
        culprits = set(win.culprits)
        chain.append(_link(win, f"{_label(win)}: {win.fact}"))
        if win.consequences:
            chain.append(_link(win, f"{_label(win)}: {win.consequences}: consequences"))
        agree = [e for e in accusing[1:] if set(e.culprits) & culprits]
        conflict = [e for e in accusing[1:] if not set(e.culprits) & culprits]
        for e in agree:
            chain.append(_link(e, f"{_label(e)}: {e.fact} (agrees: "
                                  f"{ranks_text(set(e.culprits) & culprits)})"))
        for e in conflict:
            chain.append(_link(e, f"{_label(e)}: {e.fact} - conflicts: it names "
                                  f"{ranks_text(e.culprits)}, {_label(win)} names "
                                  f"{ranks_text(culprits)}; {win.source.reader} wins: "
                                  f"{_why_lost(win, e)}"))
        for e in generic:
            chain.append(_link(e, f"{_label(e)}: {e.fact} (names no rank)"))
        chain += _gap_links(found, culprits, True)
        level = CONFIDENCE_ORDER.get(win.confidence or "low", 0) + len(agree)
        if any(_rank(e)[:2] == _rank(win)[:2] for e in conflict):
            level = min(level, 1)
        cls = win.cls or next((e.cls for e in agree if e.cls), None)
        summary = win.fact
        if agree:
            summary += f" ({', '.join(sorted({e.source.reader for e in agree}))} agrees)"
        return WhyVerdict("culprits", summary, sorted(culprits), cls,
                          CONFIDENCE_NAMES[min(level, 2)], win.code, chain, win.fix, win)
    troubled = bool(generic)
    for e in generic:
        chain.append(_link(e, f"{_label(e)}: {e.fact} (names no rank)"))
    if troubled and found:
        missing = sorted({r for _, m in found for r in m})
        chain += _gap_links(found, set(missing), True)
        first = found[0][0]
        summary = (f"{ranks_text(missing)} left no {NOUN.get(first.source.reader, 'artifact')} "
                   f"while the others report trouble: prime suspect")
        return WhyVerdict("culprits", summary, missing, generic[0].cls, "medium",
                          "why-no-evidence", chain,
                          "Look at what those ranks did: their own log lines, their host "
                          "(dmesg: OOM killer), or run `mldebug hang` while the job hangs.")
    if troubled:
        best = max(generic, key=_rank)
        return WhyVerdict("undecided", best.fact, [], best.cls, "low", best.code, chain,
                          best.fix, best)
    for e in healthy:
        chain.append(_link(e, f"{_label(e)}: {e.fact}"))
    chain += _gap_links(found, set(), False)
    said = next((e.fact for e in healthy if e.fact), "")
    return WhyVerdict("ok", "no suspect rank: " + (said or "every source is healthy"), [],
                      "healthy", "high" if len(healthy) > 1 else "medium", "why-healthy", chain)
