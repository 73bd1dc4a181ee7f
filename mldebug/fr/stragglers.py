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

from mldebug.fr.loader import rank_times
from mldebug.fr.model import NOT_RECORDED, DumpSet, Straggler, packed, pick, picker

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
    # per member, the entry index (of its timeline) of each collective, aligned with ``seqs``
    # (the last entry when coalesced; shared by the members of one timeline)
    at: list[tuple[int, ...]] | None = None


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
        ranks, times, where = [], [], []
        for (rs, _, _), sel in zip(parts, sels, strict=True):
            at = picker(sel)  # one getter for every rank of the timeline (16,384 in SPMD)
            for r in rs:
                ranks.append(r)
                times.append(packed("q", at(ds.dumps[r].created)))
                where.append(sel)
        unknown = {k for v in times if v and min(v) <= 0 for k, t in enumerate(v) if t <= 0}
        keep = [k for k in range(len(seqs)) if k not in unknown][-window:]
        if not keep:
            continue
        if len(keep) != len(seqs):
            seqs = [seqs[k] for k in keep]
            times = [packed("q", pick(v, keep)) for v in times]
            cut = {id(w): pick(w, keep) for w in where}
            where = [cut[id(w)] for w in where]
        out[pg] = Matched(ranks, seqs, times, where)
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
    collectives by a median of ``MIN_LATE_MS`` or more: of all its collectives, or of those
    at one position of the step (one group's collectives of one op, sizes and call site: a
    rank late only at the first of three all_reduces per step). Each named rank gets its
    ``phase`` (see ``phase_of``).
    """
    last: dict[int, int] = defaultdict(int)
    count: dict[int, int] = defaultdict(int)
    # per position (group, static id): collectives, and who was last how often there
    pos_count: dict[tuple[str, int], int] = defaultdict(int)
    pos_last: dict[tuple[int, tuple[str, int]], int] = defaultdict(int)
    compared = 0
    kept = []
    for pg, m in arrival_times(ds, since).items():
        hosts = [ds.dumps[r].host or "" for r in m.ranks]
        offsets = _host_offsets(m, hosts)
        shift = [offsets[h] for h in hosts]
        keys = _positions(ds, m)
        mids = []
        aligned: Sequence[float]
        shifted = any(shift)  # one host (or no host names): the times as they are
        for col, sid in zip(zip(*m.times, strict=True), keys, strict=True):  # one collective
            aligned = [t - s for t, s in zip(col, shift, strict=True)] if shifted else col
            mids.append(statistics.median(aligned))
            r = m.ranks[aligned.index(max(aligned))]  # the first of the latest
            last[r] += 1
            pos_count[pg, sid] += 1
            pos_last[r, (pg, sid)] += 1
        for r in m.ranks:
            count[r] += len(m.seqs)
        kept.append((pg, m, shift, mids, keys))
        if arrivals is not None:  # kept for the HTML view's heat map (no second pass)
            arrivals.append(Arrivals(pg, m, shift, mids))
        compared += len(m.seqs)
    # only a rank that was last often enough can be named: its lateness is all that is kept
    # (a 16,384-rank job would otherwise hold 16,384 x 1,000 numbers)
    late: dict[int, list[float]] = {r: [] for r, n in count.items()
                                    if n >= MIN_COLLECTIVES and last[r] >= LAST_SHARE * n}
    at_pos: dict[tuple[int, tuple[str, int]], list[float]] = {
        (r, key): [] for (r, key), n in pos_last.items()
        if r not in late and pos_count[key] >= MIN_COLLECTIVES
        and n >= LAST_SHARE * pos_count[key]}
    wanted = set(late) | {r for r, _ in at_pos}
    for pg, m, shift, mids, keys in kept:
        for r, times, sh in zip(m.ranks, m.times, shift, strict=True):
            if r not in wanted:
                continue
            values = [((t - sh) - mid) / 1e6 for t, mid in zip(times, mids, strict=True)]
            if r in late:
                late[r].extend(values)
            for k, v in enumerate(values):
                got = at_pos.get((r, (pg, keys[k])))
                if got is not None:
                    got.append(v)
    named: list[tuple[Straggler, tuple[str, int] | None]] = []
    for r, values in late.items():
        st = _straggler(ds, r, values, last[r], None)
        if st is not None:
            named.append((st, None))
    by_rank: dict[int, tuple[Straggler, tuple[str, int] | None]] = {}
    for (r, where), values in at_pos.items():
        st = _straggler(ds, r, values, pos_last[r, where], where)
        best = by_rank.get(r)
        if st is not None and (best is None or (st.times_last, st.late_ms_median)
                               > (best[0].times_last, best[0].late_ms_median)):
            by_rank[r] = (st, where)
    named.extend(by_rank.values())
    for st, at_key in named:
        _explain(ds, st, at_key, kept)
    out = [st for st, _ in named]
    out.sort(key=lambda s: (-s.times_last, s.rank))
    return out, compared


def _positions(ds: DumpSet, m: Matched) -> list[int]:
    """Each matched collective's position in the step: the static id (op, sizes, dtypes,
    call site) of its entry on the first member's timeline."""
    if m.at is None:
        return [0] * len(m.seqs)
    return list(pick(ds.timelines[ds.dumps[m.ranks[0]].timeline].sid, m.at[0]))


def _straggler(ds: DumpSet, r: int, values: list[float], times_last: int,
               key: tuple[str, int] | None) -> Straggler | None:
    values.sort()
    med = statistics.median(values)
    if med < MIN_LATE_MS:
        return None
    p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
    st = Straggler(r, ds.dumps[r].host, len(values), times_last, med, p90,
                   sum(values) / len(values))
    if key is not None:
        st.position = _label(ds, *key)
    return st


OTHERS = 32  # the other ranks' times: this many members of each group, evenly spaced
CANNOT_TELL = "the recorder's times cannot tell (no start/completion times in the dumps)"
COMPUTE = "compute or data (host side, between collectives)"
COMMUNICATION = "communication (its collectives themselves are slow: network/NIC)"
UNCLEAR = ("neither stands out: its host gap and communication time are like the others' "
           "(the recorder's times cannot tell)")


def _phases(dump_created: Sequence[int], started: Sequence[int], completed: Sequence[int],
            at: Sequence[int], seqs: list[int], wanted: Sequence[bool],
            gaps: list[float], comms: list[float]) -> None:
    """Append one rank's host gaps (previous collective's completion to this enqueue, when the
    previous matched collective is the group's one before) and communication times (start to
    completion) at the collectives ``wanted`` says, in ms; times not recorded, or out of
    order (a start before the enqueue), are left out."""
    prev_done = None
    prev_seq = None
    for k, i in enumerate(at):
        c = dump_created[i] if i < len(dump_created) else -1
        s = started[i] if i < len(started) else NOT_RECORDED
        d = completed[i] if i < len(completed) else NOT_RECORDED
        ok = c > 0 and s != NOT_RECORDED and d != NOT_RECORDED and c <= s <= d
        if wanted[k]:
            if ok:
                comms.append((d - s) / 1e6)
            if c > 0 and prev_done is not None and prev_seq == seqs[k] - 1:
                gaps.append(max(0, c - prev_done) / 1e6)
        prev_done, prev_seq = (d, seqs[k]) if ok else (None, None)


def _explain(ds: DumpSet, st: Straggler, at_key: tuple[str, int] | None,
             kept: list[tuple[str, Matched, list[float], list[float], list[int]]]) -> None:
    """``st``'s phase and the medians behind it: its own times at the collectives it was named
    for against up to ``OTHERS`` other members' per group (linear in those entries)."""
    gaps: list[float] = []
    comms: list[float] = []
    ogaps: list[float] = []
    ocomms: list[float] = []
    for pg, m, _, _, keys in kept:
        if st.rank not in m.ranks or m.at is None:
            continue
        if at_key is not None:
            mine = [k for k, key in enumerate(keys) if (pg, key) == at_key]
            if not mine:
                continue
            wanted = [False] * len(keys)
            for k in mine:
                wanted[k] = True
        else:
            wanted = [True] * len(keys)
        others = [j for j, r in enumerate(m.ranks) if r != st.rank]
        step = max(1, len(others) // OTHERS)
        for j in [m.ranks.index(st.rank), *others[::step][:OTHERS]]:
            d = ds.dumps[m.ranks[j]]
            mine_ = m.ranks[j] == st.rank
            started, completed = rank_times(d)  # read again for these few ranks only
            _phases(d.created, started, completed, m.at[j], m.seqs, wanted,
                    gaps if mine_ else ogaps, comms if mine_ else ocomms)
    med = statistics.median
    st.host_gap_ms = med(gaps) if gaps else None
    st.host_gap_ms_others = med(ogaps) if ogaps else None
    st.comm_ms = med(comms) if comms else None
    st.comm_ms_others = med(ocomms) if ocomms else None
    half = st.late_ms_median / 2
    if not (gaps and ogaps and comms and ocomms):
        st.phase = CANNOT_TELL
    elif med(gaps) - med(ogaps) >= half:
        st.phase = COMPUTE
    elif med(comms) - med(ocomms) > -half:
        # arriving last, it should wait least in its collectives (the others wait for it
        # there: their communication includes its lateness); as long as theirs, or longer,
        # and its own collectives are slow
        st.phase = COMMUNICATION
    else:
        st.phase = UNCLEAR


def _label(ds: DumpSet, pg: str, sid: int) -> str:
    label = ds.statics[sid]
    sizes = ",".join("x".join(map(str, s)) or "scalar" for s in label.input_sizes)
    return f"{label.op}[{sizes}] in group {pg}"
