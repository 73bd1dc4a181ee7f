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
from array import array
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from mldebug.fr.model import DumpSet, Straggler, packed, pick, picker

WINDOW = 1000  # the latest matched collectives per group that are compared
MIN_COLLECTIVES = 10  # fewer: no verdict (a one-off stall is not a straggler)
LAST_SHARE = 0.5  # last at this share of the collectives at least ...
MIN_LATE_MS = 5.0  # ... by at least this much (median, behind the median rank)


@dataclass
class Matched:
    """One group's collectives that every member recorded: its ranks, the sequence numbers,
    and per rank its enqueue times (ns) at those collectives, aligned with ``seqs``."""

    ranks: list[int]
    seqs: list[int]
    times: list[array[int]]


def arrival_times(ds: DumpSet, since: dict[str, int] | None = None,
                  window: int = WINDOW) -> dict[str, Matched]:
    """pg -> the latest ``window`` collectives every member recorded, with enqueue times.

    ``since``: per group, only collectives after that sequence number (``fr watch`` passes
    the last ones of its first dump so the statistics cover the window between the two).
    Ranks that share a timeline share the choice of entries; only their times are read, a
    column at a time (no per-rank dictionaries: 16,384 ranks x 1,000 collectives)."""
    # pg -> [(ranks, seqs, entry index of each seq)] per timeline holding collectives of the group
    found: dict[str, list[tuple[list[int], array[int], tuple[int, ...]]]] = defaultdict(list)
    for tl in ds.timelines:
        ranks = [r for r in tl.ranks if len(ds.dumps[r].created) == len(tl)]
        if not ranks:
            continue
        for pg, gi in tl.groups.items():
            if not gi.seqs or gi.seqs[-1] < 0:
                continue
            after = -1 if since is None else since.get(pg, -1)
            # coalesced: the last entry's time; seqs are sorted, so a slice drops the old ones
            first = bisect_right(gi.seqs, max(after, -1))
            ends = gi.starts[first + 1:]
            found[pg].append((ranks, gi.seqs[first:],
                              pick(gi.order, tuple(map((-1).__add__, ends)))))
    out: dict[str, Matched] = {}
    for pg, parts in found.items():
        if sum(len(rs) for rs, _, _ in parts) < 2:
            continue
        ref = parts[0][1]
        if all(s == ref for _, s, _ in parts):  # the usual case: all recorded the same ones
            seqs = ref.tolist()
            sels = [at for _, _, at in parts]
        else:
            common = set(ref)
            for _, s, _ in parts[1:]:
                common.intersection_update(s)
            seqs = sorted(common)
            sels = [pick(dict(zip(s, at, strict=True)), seqs) for _, s, at in parts]
        ranks, times = [], []
        for (rs, _, _), sel in zip(parts, sels, strict=True):
            at = picker(sel)  # one getter for every rank of the timeline (16,384 in SPMD)
            for r in rs:
                ranks.append(r)
                times.append(packed("q", at(ds.dumps[r].created)))
        unknown = {k for v in times if v and min(v) <= 0 for k, t in enumerate(v) if t <= 0}
        keep = [k for k in range(len(seqs)) if k not in unknown][-window:]
        if not keep:
            continue
        if len(keep) != len(seqs):
            seqs = [seqs[k] for k in keep]
            times = [packed("q", pick(v, keep)) for v in times]
        out[pg] = Matched(ranks, seqs, times)
    return out


def _host_offsets(m: Matched, hosts: list[str]) -> dict[str, float]:
    """Each host's clock minus the reference host's, from the hosts' earliest arrivals."""
    span: dict[str, list[int]] = defaultdict(list)
    for i, h in enumerate(hosts):
        span[h].append(i)
    ref = min(span)
    earliest = {h: [min(col) for col in zip(*(m.times[i] for i in idx), strict=True)]
                for h, idx in span.items()}
    base = earliest[ref]
    return {h: float(statistics.median(t - b for t, b in zip(e, base, strict=True)))
            for h, e in earliest.items()}


@dataclass
class Arrivals:
    """One group's matched collectives as the straggler statistics compared them: the enqueue
    times, each member's host-clock shift (ns) and each collective's median aligned time."""

    pg: str
    matched: Matched
    shift: list[float]
    mids: list[float]


def find_stragglers(ds: DumpSet, since: dict[str, int] | None = None,
                    arrivals: list[Arrivals] | None = None) -> tuple[list[Straggler], int]:
    """Ranks consistently last at matched collectives, and how many collectives were compared.

    Lateness of a rank at one collective = its aligned enqueue time minus the median rank's.
    A rank is named when it was last at ``LAST_SHARE`` of at least ``MIN_COLLECTIVES``
    collectives by a median of ``MIN_LATE_MS`` or more.
    """
    last: dict[int, int] = defaultdict(int)
    count: dict[int, int] = defaultdict(int)
    compared = 0
    kept = []
    for pg, m in arrival_times(ds, since).items():
        hosts = [ds.dumps[r].host or "" for r in m.ranks]
        offsets = _host_offsets(m, hosts)
        shift = [offsets[h] for h in hosts]
        mids = []
        aligned: Sequence[float]
        shifted = any(shift)  # one host (or no host names): the times as they are
        for col in zip(*m.times, strict=True):  # one collective: every member's time
            aligned = [t - s for t, s in zip(col, shift, strict=True)] if shifted else col
            mids.append(statistics.median(aligned))
            last[m.ranks[aligned.index(max(aligned))]] += 1  # the first of the latest
        for r in m.ranks:
            count[r] += len(m.seqs)
        kept.append((m, shift, mids))
        if arrivals is not None:  # kept for the HTML view's heat map (no second pass)
            arrivals.append(Arrivals(pg, m, shift, mids))
        compared += len(m.seqs)
    # only a rank that was last often enough can be named: its lateness is all that is kept
    # (a 16,384-rank job would otherwise hold 16,384 x 1,000 numbers)
    late: dict[int, list[float]] = {r: [] for r, n in count.items()
                                    if n >= MIN_COLLECTIVES and last[r] >= LAST_SHARE * n}
    for m, shift, mids in kept:
        for r, times, sh in zip(m.ranks, m.times, shift, strict=True):
            if r in late:
                late[r].extend([((t - sh) - mid) / 1e6 for t, mid in zip(times, mids,
                                                                         strict=True)])
    named = []
    for r, values in late.items():
        n = len(values)
        values.sort()
        med = statistics.median(values)
        if med < MIN_LATE_MS:
            continue
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        named.append(Straggler(r, ds.dumps[r].host, n, last[r], med, p90,
                               sum(values) / len(values)))
    named.sort(key=lambda s: (-s.times_last, s.rank))
    return named, compared
