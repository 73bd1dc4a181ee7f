"""The rank everybody waits for: lateness at matched collectives, from enqueue times (pure).

Every rank records when it enqueued each collective (``time_created_ns``). At a collective
that every member of a group recorded, the rank that enqueued last is the one the others
waited for. Across hosts the clocks differ, so times are compared within a host as they are,
and each other host's clock is aligned to the first host's by the median, over the
collectives, of the difference between the two hosts' *earliest* arrivals: a late rank never
moves its host's earliest arrival unless every rank of the host is late (then the host is the
straggler, and a clock offset of the same size could not be told from it). Nothing here reads
a file; ``analyze`` calls ``find_stragglers`` on a DumpSet.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from mldebug.fr.model import P2P_OPS, DumpSet, Straggler

WINDOW = 1000  # the latest matched collectives per group that are compared
MIN_COLLECTIVES = 10  # fewer: no verdict (a one-off stall is not a straggler)
LAST_SHARE = 0.5  # last at this share of the collectives at least ...
MIN_LATE_MS = 5.0  # ... by at least this much (median, behind the median rank)


def arrival_times(ds: DumpSet, since: dict[str, int] | None = None,
                  window: int = WINDOW) -> dict[str, dict[int, dict[int, int]]]:
    """pg -> seq -> rank -> enqueue time (ns), for collectives every member recorded.

    ``since``: per group, only collectives after that sequence number (``fr watch`` passes
    the last ones of its first dump so the statistics cover the window between the two)."""
    members: dict[str, set[int]] = defaultdict(set)
    times: dict[str, dict[int, dict[int, int]]] = defaultdict(lambda: defaultdict(dict))
    for tl in ds.timelines:
        index = [(i, e.pg_name, e.seq) for i, e in enumerate(tl.entries)
                 if not e.is_p2p and e.op not in P2P_OPS and e.seq >= 0]
        for r in tl.ranks:
            created = ds.dumps[r].created
            if len(created) != len(tl.entries):
                continue
            for i, pg, seq in index:
                members[pg].add(r)
                t = created[i]
                if t > 0 and (since is None or seq > since.get(pg, -1)):
                    times[pg][seq][r] = t
    out: dict[str, dict[int, dict[int, int]]] = {}
    for pg, by_seq in times.items():
        want = len(members[pg])
        if want < 2:
            continue
        full = sorted(s for s, rs in by_seq.items() if len(rs) == want)[-window:]
        if full:
            out[pg] = {s: by_seq[s] for s in full}
    return out


def _host_offsets(matched: list[dict[int, int]], host_of: dict[int, str]) -> dict[str, float]:
    """Each host's clock minus the reference host's, from the hosts' earliest arrivals."""
    diffs: dict[str, list[int]] = defaultdict(list)
    ref: str | None = None
    for arrivals in matched:
        earliest: dict[str, int] = {}
        for r, t in arrivals.items():
            h = host_of.get(r, "")
            if h not in earliest or t < earliest[h]:
                earliest[h] = t
        if ref is None:
            ref = min(earliest)
        if ref not in earliest:
            continue
        for h, t in earliest.items():
            diffs[h].append(t - earliest[ref])
    return {h: float(statistics.median(d)) for h, d in diffs.items()}


def find_stragglers(ds: DumpSet, since: dict[str, int] | None = None,
                    ) -> tuple[list[Straggler], int]:
    """Ranks consistently last at matched collectives, and how many collectives were compared.

    Lateness of a rank at one collective = its aligned enqueue time minus the median rank's.
    A rank is named when it was last at ``LAST_SHARE`` of at least ``MIN_COLLECTIVES``
    collectives by a median of ``MIN_LATE_MS`` or more.
    """
    host_of = {r: d.host or "" for r, d in ds.dumps.items()}
    late: dict[int, list[float]] = defaultdict(list)
    last: dict[int, int] = defaultdict(int)
    count: dict[int, int] = defaultdict(int)
    compared = 0
    for by_seq in arrival_times(ds, since).values():
        matched = list(by_seq.values())
        offsets = _host_offsets(matched, host_of)
        for arrivals in matched:
            aligned = {r: t - offsets.get(host_of.get(r, ""), 0.0) for r, t in arrivals.items()}
            mid = statistics.median(aligned.values())
            top = max(aligned, key=aligned.__getitem__)
            last[top] += 1
            for r, t in aligned.items():
                late[r].append((t - mid) / 1e6)
                count[r] += 1
        compared += len(matched)
    named = []
    for r, values in late.items():
        n = count[r]
        if n < MIN_COLLECTIVES or last[r] < LAST_SHARE * n:
            continue
        values.sort()
        med = statistics.median(values)
        if med < MIN_LATE_MS:
            continue
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        named.append(Straggler(r, ds.dumps[r].host, n, last[r], med, p90,
                               sum(values) / len(values)))
    named.sort(key=lambda s: (-s.times_last, s.rank))
    return named, compared
