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
from mldebug.stepclock import read_beside

WINDOW = 1000  # the latest matched collectives per group that are compared
MIN_COLLECTIVES = 10  # fewer: no verdict (a one-off stall is not a straggler)
LAST_SHARE = 0.5  # last at this share of the collectives at least ...
MIN_Z = 3.0  # ... this many standard deviations above chance (1 in n ranks: binomial) ...
MIN_LATE_MS = 2.0  # ... by at least this much (median, behind the other ranks' median)


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


def _mids(col: Sequence[float]) -> tuple[float, float, float]:
    """A collective's median arrival, and the median of the others for a rank above it
    (the column without its latest) and below it (without its earliest)."""
    v = sorted(col)
    n = len(v)

    def med(lo: int, hi: int) -> float:  # median of v[lo:hi]
        m = hi - lo
        return v[lo + m // 2] if m % 2 else (v[lo + m // 2 - 1] + v[lo + m // 2]) / 2

    return med(0, n), med(0, n - 1), med(1, n)


def find_stragglers(ds: DumpSet, since: dict[str, int] | None = None,
                    arrivals: list[Arrivals] | None = None) -> tuple[list[Straggler], int]:
    """Ranks consistently last at matched collectives, and how many collectives were compared.

    Lateness of a rank at one collective = its aligned enqueue time minus the median of the
    other members'. A rank is named when it was last at ``LAST_SHARE`` of at least
    ``MIN_COLLECTIVES`` collectives, ``MIN_Z`` standard deviations more often than chance
    (last 1 in n times in a group of n: with 2 ranks, last at half is chance), by a median of
    ``MIN_LATE_MS`` or more: of all its collectives, or of those
    at one position of the step (one group's collectives of one op, sizes and call site: a
    rank late only at the first of three all_reduces per step). Each named rank gets its
    ``phase`` (see ``phase_of``).
    """
    last: dict[int, int] = defaultdict(int)
    count: dict[int, int] = defaultdict(int)
    # per position (group, static id): collectives, and who was last how often there
    pos_count: dict[tuple[str, int], int] = defaultdict(int)
    pos_last: dict[tuple[int, tuple[str, int]], int] = defaultdict(int)
    pos_size: dict[tuple[str, int], int] = {}
    # last this often by chance (1 in n), and the variance of that count (binomial)
    chance: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    compared = 0
    kept = []
    for pg, m in arrival_times(ds, since).items():
        hosts = [ds.dumps[r].host or "" for r in m.ranks]
        offsets = _host_offsets(m, hosts)
        shift = [offsets[h] for h in hosts]
        keys = _positions(ds, m)
        mids = []
        others: list[tuple[float, float]] = []  # the others' median, for a late / early rank
        aligned: Sequence[float]
        shifted = any(shift)  # one host (or no host names): the times as they are
        for col, sid in zip(zip(*m.times, strict=True), keys, strict=True):  # one collective
            aligned = [t - s for t, s in zip(col, shift, strict=True)] if shifted else col
            mid, above, below = _mids(aligned)
            mids.append(mid)
            others.append((above, below))
            r = m.ranks[aligned.index(max(aligned))]  # the first of the latest
            last[r] += 1
            pos_count[pg, sid] += 1
            pos_last[r, (pg, sid)] += 1
        p = 1 / len(m.ranks)
        for r in m.ranks:
            count[r] += len(m.seqs)
            chance[r][0] += len(m.seqs) * p
            chance[r][1] += len(m.seqs) * p * (1 - p)
        for sid in set(keys):
            pos_size[pg, sid] = len(m.ranks)
        kept.append((pg, m, shift, mids, keys, others))
        if arrivals is not None:  # kept for the HTML view's heat map (no second pass)
            arrivals.append(Arrivals(pg, m, shift, mids))
        compared += len(m.seqs)
    # only a rank that was last often enough can be named: its lateness is all that is kept
    # (a 16,384-rank job would otherwise hold 16,384 x 1,000 numbers)
    def beyond_chance(k: int, n: int, mean: float, var: float) -> bool:
        return n >= MIN_COLLECTIVES and k >= LAST_SHARE * n and k - mean >= MIN_Z * var ** 0.5

    late: dict[int, list[float]] = {r: [] for r, n in count.items()
                                    if beyond_chance(last[r], n, *chance[r])}
    # per position too for a rank last at most collectives overall: late at one of three
    # all_reduces by 20 ms and on time at the other two, its median over all is ~0
    at_pos: dict[tuple[int, tuple[str, int]], list[float]] = {
        (r, key): [] for (r, key), n in pos_last.items()
        if pos_count[key] < count[r] and beyond_chance(
            n, pos_count[key], pos_count[key] / pos_size[key],
            pos_count[key] / pos_size[key] * (1 - 1 / pos_size[key]))}
    wanted = set(late) | {r for r, _ in at_pos}
    for pg, m, shift, mids, keys, others in kept:
        for r, times, sh in zip(m.ranks, m.times, shift, strict=True):
            if r not in wanted:
                continue
            # behind the median of the *other* ranks (with 2 ranks, the whole gap)
            values = [((t - sh) - (o[0] if t - sh > mid else o[1] if t - sh < mid else mid))
                      / 1e6 for t, mid, o in zip(times, mids, others, strict=True)]
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
    overall = {st.rank for st, _ in named}
    for (r, where), values in at_pos.items():
        if r in overall:
            continue
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


DATA = "data (waiting for the next batch: between its steps, step clock)"
STEP_COMPUTE = "compute (in its step, before the step's collectives: step clock)"
STEP_COMMUNICATION = ("communication (its collectives and what follows them in the step "
                      "are as long as the others', who wait there for it: step clock)")


@dataclass
class StepPhases:
    """Per matched collective, the phases of the step (of one rank's step clock) holding it,
    in ms; ``steps``: the distinct steps they came from."""

    data: list[float]
    compute: list[float]
    comm: list[float]
    period: list[float]
    steps: set[int]


def step_phases(enter: Sequence[int], exit_: Sequence[int], created: Sequence[int],
                at: Sequence[int], wanted: Sequence[bool], out: StepPhases) -> None:
    """Append, for each ``wanted`` collective (entry index ``at[k]`` into ``created``), the
    phases of the step whose [entry, exit] holds its enqueue time: data = the step's entry
    minus the previous step's exit, compute = the step's first collective's enqueue minus its
    entry, communication = its exit minus that enqueue, period = entry to the next entry.
    Collectives outside every step (before the clock started, between steps) are left out."""
    first: dict[int, int] = {}
    where: list[int] = []
    for i in at:
        c = created[i] if i < len(created) else -1
        s = bisect_right(enter, c) - 1 if c > 0 else -1
        if s < 0 or c > exit_[s]:
            s = -1
        where.append(s)
        if s >= 0 and (s not in first or c < first[s]):
            first[s] = c
    for k, s in enumerate(where):
        if not wanted[k] or s < 1:
            continue
        out.data.append((enter[s] - exit_[s - 1]) / 1e6)
        out.compute.append((first[s] - enter[s]) / 1e6)
        out.comm.append((exit_[s] - first[s]) / 1e6)
        if s + 1 < len(enter):
            out.period.append((enter[s + 1] - enter[s]) / 1e6)
        out.steps.add(s)


def _step_verdict(st: Straggler, mine: StepPhases, theirs: StepPhases, wanted_n: int) -> bool:
    """The phase from the step clocks; False when they do not cover the collectives."""
    if len(mine.data) < MIN_COLLECTIVES // 2 or len(theirs.data) < MIN_COLLECTIVES // 2:
        return False
    med = statistics.median
    st.data_ms, st.data_ms_others = med(mine.data), med(theirs.data)
    st.compute_ms, st.compute_ms_others = med(mine.compute), med(theirs.compute)
    st.step_comm_ms, st.step_comm_ms_others = med(mine.comm), med(theirs.comm)
    late = st.late_ms_median
    if theirs.period:
        st.step_ms = med(theirs.period)
        per_step = late * min(wanted_n, len(mine.data)) / max(1, len(mine.steps))
        st.step_ms_without = max(0.0, st.step_ms - per_step)
    d_data = st.data_ms - st.data_ms_others
    d_compute = st.compute_ms - st.compute_ms_others
    d_comm = st.step_comm_ms - st.step_comm_ms_others
    # host side: one of its own phases is longer by half its lateness, or the others'
    # communication is longer than its own by that much (they wait there for it); then the
    # longer of its data and compute phases (next to the others') is the one
    if max(d_data, d_compute) >= late / 2 or d_comm <= -late / 2:
        st.phase = DATA if d_data >= d_compute else STEP_COMPUTE
    else:
        # arriving last, its collectives should be the shortest (the others wait for it in
        # theirs): as long as theirs, its own are slow
        st.phase = STEP_COMMUNICATION
    return True


def _explain(ds: DumpSet, st: Straggler, at_key: tuple[str, int] | None,
             kept: list[tuple[str, Matched, list[float], list[float], list[int],
                              list[tuple[float, float]]]]) -> None:
    """``st``'s phase and the medians behind it: its own times at the collectives it was named
    for against up to ``OTHERS`` other members' per group (linear in those entries)."""
    gaps: list[float] = []
    comms: list[float] = []
    ogaps: list[float] = []
    ocomms: list[float] = []
    mine_steps = StepPhases([], [], [], [], set())
    their_steps = StepPhases([], [], [], [], set())
    wanted_n = 0
    for pg, m, _, _, keys, _ in kept:
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
            clock = read_beside(d.file, d.rank)  # the rank's step clock, when it has one
            if clock is not None:
                step_phases(clock.enter, clock.exit, d.created, m.at[j], wanted,
                            mine_steps if mine_ else their_steps)
        wanted_n += sum(wanted)
    med = statistics.median
    st.host_gap_ms = med(gaps) if gaps else None
    st.host_gap_ms_others = med(ogaps) if ogaps else None
    st.comm_ms = med(comms) if comms else None
    st.comm_ms_others = med(ocomms) if ocomms else None
    half = st.late_ms_median / 2
    if _step_verdict(st, mine_steps, their_steps, wanted_n):
        return
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
