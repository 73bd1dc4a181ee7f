"""Cross-rank flight-recorder analysis: pure functions from a DumpSet to an Analysis.

Per process group, entries are aligned across ranks by ``collective_seq_id`` (send/recv by
peer pair and order) and the first position where ranks disagree is reported with its kind,
the culprit ranks (minority vote, with the reasoning) and the user call sites. The checks are
those torch's ``torchfrtrace`` makes (type, sizes incl. all_gather/reduce_scatter shape rules,
all_to_all total numel, dtypes, missing ranks, p2p pairing) plus lag from ``pg_status``.
No I/O here: tested on synthetic dump sets and reused for live and saved data.
"""

from __future__ import annotations

import math
import re
from array import array
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from mldebug.fr.model import (
    ALL_TO_ALL,
    ROOT_INPUT_ONLY,
    ROOT_OUTPUT_ONLY,
    Analysis,
    CallFrame,
    DumpSet,
    Entry,
    EntryView,
    GroupSummary,
    Lag,
    Mismatch,
    SignatureGroup,
    Static,
    Timeline,
    packed,
    pick,
)

_TORCH_FRAME = re.compile(
    r"([/\\](site|dist)-packages[/\\]torch[/\\])|(^|[/\\])torch[/\\](distributed|nn|_dynamo|"
    r"_tensor\.py|utils|autograd|cuda|_ops\.py|_compile|amp|optim|fx|_C)([/\\.]|$)"
    r"|[/\\]typing_extensions\.py$")  # deprecated()'s wrapper around torch's calls

_GATHER_LIKE = frozenset({"all_gather", "all_gather_base", "_all_gather_base",
                          "all_gather_into_tensor", "all_gather_into_tensor_coalesced",
                          "all_gather_single"})
_SCATTER_LIKE = frozenset({"reduce_scatter", "_reduce_scatter_base", "reduce_scatter_base",
                           "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced",
                           "reduce_scatter_single"})
_IN_EQ_OUT = frozenset({"all_reduce", "allreduce", "allreduce_coalesced", "broadcast"})
_KIND_ORDER = {"type": 0, "size": 1, "dtype": 2, "state": 3}


def is_torch_frame(frame: CallFrame) -> bool:
    """Frames of torch's own collective plumbing (stripped from call sites)."""
    return bool(_TORCH_FRAME.search(frame.filename))


def call_site(entry: Entry, n: int = 2) -> list[str]:
    """The first ``n`` user frames (innermost first): the call, then its callers."""
    if n <= 0:
        return []
    user = [f for f in entry.frames if not is_torch_frame(f)]
    return [str(f) for f in user[:n]]


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def signature(e: Entry | Static) -> tuple[object, ...]:
    """What must agree across the ranks of one collective (torch's per-type rules)."""
    ins = None if e.op in ALL_TO_ALL or e.op in ROOT_INPUT_ONLY else e.input_sizes
    outs = None if e.op in ALL_TO_ALL or e.op in ROOT_OUTPUT_ONLY else e.output_sizes
    ind = None if e.op in ROOT_INPUT_ONLY else frozenset(e.input_dtypes) if e.input_sizes else None
    outd = (None if e.op in ROOT_OUTPUT_ONLY else
            frozenset(e.output_dtypes) if e.output_sizes else None)
    return (e.op, ins, outs, ind, outd)


def describe(e: Entry) -> str:
    dt = sorted(set(e.input_dtypes) | set(e.output_dtypes))
    text = f"{e.op} in={_fmt_sizes(e.input_sizes)} out={_fmt_sizes(e.output_sizes)}"
    return text + (f" {'/'.join(dt)}" if dt else "")


def _fmt_sizes(sizes: tuple[tuple[int, ...], ...]) -> str:
    return "[" + ",".join("[" + ",".join(map(str, s)) + "]" for s in sizes) + "]"


def syntax_error(e: Entry | Static, group_size: int) -> str | None:
    """A rule one rank's own entry breaks (torch's shape and dtype rules), else None."""
    if e.op in _GATHER_LIKE and e.input_sizes and e.output_sizes:
        i, o = _numel(e.input_sizes[0]), sum(_numel(s) for s in e.output_sizes)
        if o != i * group_size:
            return (f"{e.op}: output numel {o} != input numel {i} x group size {group_size}")
    if e.op in _SCATTER_LIKE and e.input_sizes and e.output_sizes:
        i, o = sum(_numel(s) for s in e.input_sizes), _numel(e.output_sizes[0])
        if i != o * group_size:
            return (f"{e.op}: input numel {i} != output numel {o} x group size {group_size}")
    if e.op in _IN_EQ_OUT and e.input_sizes and e.output_sizes and e.input_sizes != e.output_sizes:
        return f"{e.op}: input sizes {_fmt_sizes(e.input_sizes)} != output sizes {_fmt_sizes(e.output_sizes)}"
    if (e.op not in ROOT_INPUT_ONLY | ROOT_OUTPUT_ONLY | {"broadcast"} and e.input_dtypes
            and e.output_dtypes and e.input_sizes and e.output_sizes
            and set(e.input_dtypes) != set(e.output_dtypes)):
        return f"{e.op}: input dtypes {sorted(set(e.input_dtypes))} != output dtypes {sorted(set(e.output_dtypes))}"
    return None


def _sig_kind(a: tuple[object, ...], b: tuple[object, ...]) -> str:
    """Kind of disagreement between two positions (several entries when coalesced)."""
    if len(a) != len(b):
        return "type"
    kinds = [_classify(x, y) for x, y in zip(a, b, strict=True) if x != y]  # type: ignore[arg-type]
    return min(kinds, key=lambda k: _KIND_ORDER[k]) if kinds else "state"


def _classify(a: tuple[object, ...], b: tuple[object, ...]) -> str:
    if a[0] != b[0]:
        return "type"
    if a[1] != b[1] or a[2] != b[2]:
        return "size"
    if a[3] != b[3] or a[4] != b[4]:
        return "dtype"
    return "size"


@dataclass
class _Pg:
    name: str
    desc: str
    pg_id: int | None
    ranks: list[int]
    membership: str


def _default_group(name: str, desc: str) -> bool:
    return desc == "default_pg" or (name == "0" and desc in ("", "undefined", "default_pg"))


def _world_size(ds: DumpSet) -> int | None:
    sizes = [d.world_size for d in ds.dumps.values() if d.world_size]
    if sizes:
        return max(sizes)
    for d in ds.dumps.values():
        for name, (desc, ranks) in d.pg_config.items():
            if ranks and _default_group(name, desc):
                return len(ranks)
    return None


def _groups(ds: DumpSet, world: int) -> list[_Pg]:
    seen: dict[str, tuple[str, int | None]] = {}
    users: dict[str, set[int]] = defaultdict(set)
    for tl in ds.timelines:
        for sid in tl.used:  # ids are numbered in order of first appearance
            st = ds.statics[sid]
            seen.setdefault(st.pg_name, (st.pg_desc, st.pg_id))
        for name in tl.groups:
            users[name].update(tl.ranks)
    config: dict[str, tuple[str, tuple[int, ...]]] = {}
    for d in ds.dumps.values():
        for name, (desc, ranks) in d.pg_config.items():
            if ranks:
                config.setdefault(name, (desc, ranks))
    out = []
    for name, (desc, pg_id) in sorted(seen.items(), key=lambda kv: _natural(kv[0])):
        if name in config:
            out.append(_Pg(name, desc, pg_id, list(config[name][1]), "pg_config"))
        elif _default_group(name, desc):
            out.append(_Pg(name, desc, pg_id, list(range(world)), "default group"))
        else:
            out.append(_Pg(name, desc, pg_id, sorted(users[name]), "inferred from entries"))
    return out


def _natural(s: str) -> tuple[int, str]:
    return (int(s), "") if s.isdecimal() else (1 << 62, s)


def analyze(ds: DumpSet, frames: int = 2, since: dict[str, int] | None = None) -> Analysis:
    """Find the first divergence per process group, missing, lagging and straggling ranks.

    ``since`` (pg -> seq): straggler statistics only over collectives after these."""
    ranks = sorted(ds.dumps)
    world = _world_size(ds) or ((max(ranks) + 1) if ranks else 0)
    notes: list[str] = []
    empty = sorted(r for r in ranks if ds.dumps[r].entry_count == 0)
    if empty:
        from mldebug.render import fold_ints

        notes.append(f"rank(s) {fold_ints(empty)} recorded no entries: was TORCH_FR_BUFFER_SIZE "
                     "set there (mldebug.fr.enable() sets it)? They are left out of the votes.")
    for r in ranks:
        if ds.dumps[r].rank_from == "filename":
            notes.append(f"rank {r}: the dump does not say its rank; taken from the file name "
                         f"{ds.dumps[r].file}")
            break
    pgs = _groups(ds, world)
    expected = set(range(world))
    for pg in pgs:
        expected.update(pg.ranks)
    missing = sorted(expected - set(ranks))
    mismatches: list[Mismatch] = []
    lagging: list[Lag] = []
    summaries: list[GroupSummary] = []
    empty_set = set(empty)
    for pg in pgs:
        m, summary = _analyze_collectives(ds, pg, frames, empty_set)
        if m is not None:
            mismatches.append(m)
        p = _analyze_p2p(ds, pg, frames)
        if p is not None:
            mismatches.append(p)
        lagging.extend(_lags(ds, pg, summary, empty_set))
        summaries.append(summary)
    _blocked_elsewhere(ds, pgs, mismatches)
    from mldebug.fr.waits import p2p_waits, root_votes

    for i, m in enumerate(mismatches):
        rooted = root_votes(ds, m)
        if rooted is not None:
            mismatches[i] = rooted
    if pgs and not any(m.p2p for m in mismatches):
        world_pg = next((pg for pg in pgs if _default_group(pg.name, pg.desc)), pgs[0])
        waits = p2p_waits(ds, world_pg.name, world_pg.desc)
        if waits is not None:
            mismatches.append(waits)
    if since:
        notes.extend(_in_flight(mismatches, lagging, since))
    never = sorted({r for m in mismatches if m.kind == "missing" for r in m.culprit_ranks})
    result = Analysis(ranks=ranks, world_size=world or None, missing_ranks=missing,
                      never_enqueued=never, mismatches=mismatches, lagging=lagging,
                      groups=summaries, problems=list(ds.problems),
                      duplicates=dict(ds.duplicates), timelines=len(ds.timelines), notes=notes)
    from mldebug.fr.diagnose import build_findings
    from mldebug.fr.stragglers import find_stragglers

    result.stragglers, result.straggler_window = find_stragglers(ds, since, result.arrivals)
    result.findings = build_findings(result)
    return result


def _in_flight(mismatches: list[Mismatch], lagging: list[Lag],
               since: Mapping[str, int]) -> list[str]:
    """A second dump of a running job (``fr watch``: ``since`` holds each group's last
    collective in the first dumps) catches the slowest rank a collective or two short of the
    others: that is the dump's cut through a job in progress, not a skipped collective, when
    each such rank has itself issued collectives past the first dumps' last one. Those
    'missing' mismatches and their lags are taken out (changed in place); a note says so.
    A rank that stood still between the dumps keeps its mismatch: it is stuck."""
    lag_of = {(lag.pg, lag.rank): lag for lag in lagging}
    notes: list[str] = []
    for m in list(mismatches):
        if m.kind != "missing" or m.p2p or m.pg not in since or not m.culprit_ranks:
            continue
        lags = [lag_of.get((m.pg, r)) for r in m.culprit_ranks]
        if not all(lag is not None and lag.last_enqueued > since[m.pg] and lag.behind_by <= 2
                   for lag in lags):
            continue
        mismatches.remove(m)
        for lag in lags:
            if lag is not None:
                lagging.remove(lag)
        from mldebug.render import fold_ints

        notes.append(f"rank(s) {fold_ints(m.culprit_ranks)} had not yet reached collective "
                     f"#{m.seq} of process group {m.pg} when the second dumps were taken, but "
                     f"issued collectives since the first ones (up to #"
                     f"{max(lag.last_enqueued for lag in lags if lag is not None)}, past #"
                     f"{since[m.pg]}): the job is running and those ranks come last, not "
                     "a skipped collective (see the stragglers)")
    return notes


_Role = tuple[str, int]


def _blocked_elsewhere(ds: DumpSet, pgs: list[_Pg], mismatches: list[Mismatch]) -> None:
    """Across groups. A rank whose latest collective is #d of group H, while its last one in
    another group G is #c-1 and the other ranks issue G#c (G compared by role: description
    and size, so pair group 1 tells the order of pair group 2) before H#d, went on past G#c
    without it: it skipped G#c (kind ``skipped``, a desync), whether or not its partners left
    a dump. A rank that never enqueued G's #c while it waits in another group's collective
    that the others issue first is blocked there, a victim (``blocked_elsewhere``); so is a
    member of a group whose collective another member skipped. Updates ``mismatches`` in
    place; the ranks examined are the culprits of 'missing' mismatches and their groups'
    members with a dump, each distinct timeline once."""
    todo = [m for m in mismatches if m.kind == "missing" and not m.p2p and m.culprit_ranks]
    if not todo or len(pgs) < 2:
        return
    by_name = {pg.name: pg for pg in pgs}
    role_of = {pg.name: (pg.desc, len(pg.ranks)) for pg in pgs}

    def role(name: str) -> _Role | None:
        return role_of.get(name)

    def last_of(tl: Timeline) -> tuple[str, int] | None:
        """The group and seq of a timeline's latest collective (by record id)."""
        best: tuple[int, str, int] | None = None
        for name, gi in tl.groups.items():
            if not gi.seqs:
                continue
            i = gi.order[-1]
            if best is None or tl.record_id[i] > best[0]:
                best = (tl.record_id[i], name, gi.seqs[-1])
        return None if best is None else (best[1], best[2])

    def record(tl: Timeline, r: _Role, seq: int) -> int | None:
        for name, gi in tl.groups.items():  # a rank's few groups, not every group of a role
            if role(name) != r:
                continue
            k = bisect_left(gi.seqs, seq)
            if k < len(gi.seqs) and gi.seqs[k] == seq:
                return int(tl.record_id[gi.order[gi.starts[k]]])
        return None

    memo: dict[tuple[_Role, int, _Role, int], str | None] = {}

    def order(g: str, c: int, h: str, d: int) -> str | None:
        """'g' when the ranks that recorded both issue g#c first, 'h' when h#d, else None."""
        rg, rh = role(g), role(h)
        if rg is None or rh is None:
            return None
        key = (rg, c, rh, d)
        if key in memo:
            return memo[key]
        votes: dict[str, int] = defaultdict(int)
        for tl in ds.timelines[:256]:  # a sample: SPMD ranks agree on the order
            x, y = record(tl, rg, c), record(tl, rh, d)
            if x is not None and y is not None:
                votes["g" if x < y else "h"] += 1
        memo[key] = next(iter(votes)) if len(votes) == 1 else None
        return memo[key]

    pending: dict[tuple[str, int], bool] = {}

    def incomplete(h: str, d: int) -> bool:
        """Some member of group h has no dump or did not record h#d: it cannot have completed,
        so a rank whose latest collective it is still waits in it (gloo marks none done)."""
        if (h, d) not in pending:
            pending[(h, d)] = any(
                (dm := ds.dumps.get(r)) is None or not 0 <= dm.timeline < len(ds.timelines)
                or (gi := ds.timelines[dm.timeline].groups.get(h)) is None
                or (k := bisect_left(gi.seqs, d)) >= len(gi.seqs) or gi.seqs[k] != d
                for r in (by_name[h].ranks if h in by_name else ()))
        return pending[(h, d)]

    # the ranks to examine: the missing ones and the members of the groups they are missing in
    look: set[int] = set()
    for m in todo:
        look.update(m.culprit_ranks)
        look.update(by_name[m.pg].ranks if m.pg in by_name else ())
    latest: dict[int, tuple[str, int] | None] = {}
    skips: dict[int, tuple[str, int]] = {}  # rank -> (group, seq) it skipped
    seen_tl: dict[int, list[tuple[str, int]]] = {}
    for r in sorted(look):
        d = ds.dumps.get(r)
        if d is None or not 0 <= d.timeline < len(ds.timelines):
            continue
        tl = ds.timelines[d.timeline]
        if id(tl) not in seen_tl:
            at = latest[id(tl)] = last_of(tl)
            found: list[tuple[str, int]] = []
            if at is not None and len(memo) < 64:
                for name, gi in tl.groups.items():
                    if name != at[0] and gi.seqs and name in by_name:
                        c = gi.seqs[-1] + 1
                        if order(name, c, at[0], at[1]) == "g":
                            found.append((name, c))
            seen_tl[id(tl)] = found
        for place in seen_tl[id(tl)]:
            skips.setdefault(r, place)
    skipped_in = set(skips.values())
    member_sets = {g: set(by_name[g].ranks) for g, _ in skipped_in}

    for m in todo:
        # a 'missing' mismatch is at the collective the absent ranks never enqueued; one about
        # ranks without a dump, at the last collective those with a dump agree on
        nodump = any(g.description == "(no dump)" for g in m.groups)
        want = m.seq + 1 if nodump else m.seq
        here = sorted(r for r, (g, c) in skips.items() if g == m.pg and c == want)
        if here:
            m.kind = "skipped"
            m.reasoning += (f" Across groups: rank(s) {_fold(here)} skipped #{skips[here[0]][1]} "
                            "of this group: their latest collective is "
                            + ", ".join(f"group {latest_of(ds, r, latest)}" for r in here[:4])
                            + ", which the other ranks issue only after it; the other "
                            "member(s) of this group wait for them.")
            m.blocked_elsewhere = sorted(r for r in m.culprit_ranks if r not in here)
            m.culprit_ranks = here
            continue
        blocked: dict[int, tuple[str, int]] = {}
        for r in m.culprit_ranks:
            d = ds.dumps.get(r)
            at = latest.get(id(ds.timelines[d.timeline])) if d is not None else None
            if (at is not None and at[0] != m.pg and order(m.pg, m.seq, at[0], at[1]) == "h"
                    and incomplete(*at)):
                blocked[r] = at  # it waits in an earlier collective of another group
                continue
            for g, c in skipped_in:  # a member of a group whose collective another skipped
                if (g != m.pg and r in member_sets[g] and r not in skips
                        and order(g, c, m.pg, m.seq) == "g"):
                    blocked[r] = (g, c)
                    break
        if not blocked:
            continue
        m.reasoning += " Across groups: " + "; ".join(
            f"rank(s) {_fold(rs)} {'wait' if all(r in ds.dumps for r in rs) else 'must wait'} "
            f"in group {h} #{d}, which the other ranks issue before this one"
            + (f" and which rank(s) {_fold(sorted(s for s, p in skips.items() if p == (h, d)))} "
               "skipped" if (h, d) in skipped_in else "")
            + ": blocked there, not a culprit here" for (h, d), rs in _by_place(blocked)) + "."
        m.blocked_elsewhere = sorted(blocked)
        m.culprit_ranks = [r for r in m.culprit_ranks if r not in blocked]


def latest_of(ds: DumpSet, r: int, latest: dict[int, tuple[str, int] | None]) -> str:
    at = latest.get(id(ds.timelines[ds.dumps[r].timeline]))
    return f"{at[0]} #{at[1]}" if at else "?"


def _by_place(ranks: dict[int, tuple[str, int]]) -> list[tuple[tuple[str, int], list[int]]]:
    out: dict[tuple[str, int], list[int]] = defaultdict(list)
    for r, at in sorted(ranks.items()):
        out[at].append(r)
    return sorted(out.items())


class SeqMap(Mapping[int, list[Entry]]):
    """One timeline's collectives in one group: seq -> its entries (several when coalesced),
    built as ``Entry`` objects only when read; ``sids`` gives their static ids for free."""

    def __init__(self, tl: Timeline, pg: str) -> None:
        self.tl = tl
        gi = tl.groups.get(pg)
        self._gi = gi
        self._pos = gi.positions() if gi is not None else {}
        self.first = gi.seqs[0] if gi is not None and gi.seqs else None
        self.last = gi.seqs[-1] if gi is not None and gi.seqs else None
        self._cache: dict[int, list[Entry]] = {}

    def _range(self, seq: int) -> array[int] | None:
        k = self._pos.get(seq)
        if k is None or self._gi is None:
            return None
        return self._gi.order[self._gi.starts[k]:self._gi.starts[k + 1]]

    def sids(self, seq: int) -> tuple[int, ...] | None:
        idx = self._range(seq)
        return None if idx is None else pick(self.tl.sid, idx)

    def key(self) -> bytes:
        """Equal for timelines that recorded the same collectives in this group."""
        gi = self._gi
        if gi is None:
            return b""
        return b"".join((gi.seqs.tobytes(), b"|", gi.starts.tobytes(), b"|",
                         packed("i", pick(self.tl.sid, gi.order)).tobytes(), b"|",
                         packed("i", pick(self.tl.state, gi.order)).tobytes()))

    def __getitem__(self, seq: int) -> list[Entry]:
        got = self._cache.get(seq)
        if got is None:
            idx = self._range(seq)
            if idx is None:
                raise KeyError(seq)
            got = self._cache[seq] = [self.tl.entry(i) for i in idx]
        return got

    def __contains__(self, seq: object) -> bool:
        return seq in self._pos

    def __iter__(self) -> Iterator[int]:
        return iter(self._gi.seqs if self._gi is not None else ())

    def __len__(self) -> int:
        return len(self._pos)


PerTimeline = list[tuple[list[int], SeqMap]]


def _per_timeline(ds: DumpSet, pg: _Pg, skip: set[int]) -> PerTimeline:
    """The group's members by what they recorded in it: timelines whose collectives in this
    group are the same (a pipeline job's stages differ elsewhere) are merged into one."""
    members = set(pg.ranks)
    merged: dict[bytes, tuple[list[int], SeqMap]] = {}
    for tl in ds.timelines:
        rs = [r for r in tl.ranks if r in members and r not in skip]
        if not rs:
            continue
        sm = SeqMap(tl, pg.name)
        got = merged.get(key := sm.key())
        if got is None:
            merged[key] = (rs, sm)
        else:
            got[0].extend(rs)
    return [(sorted(rs), sm) for rs, sm in merged.values()]


def _analyze_collectives(ds: DumpSet, pg: _Pg, frames: int,
                         skip: set[int]) -> tuple[Mismatch | None, GroupSummary]:
    per_tl = _per_timeline(ds, pg, skip)
    summary = GroupSummary(pg.name, pg.desc, pg.ranks, pg.membership, None, None)
    with_entries = [sm for _, sm in per_tl if sm]
    if not with_entries:
        return None, summary
    start = max(sm.first for sm in with_entries if sm.first is not None)
    end = max(sm.last for sm in with_entries if sm.last is not None)
    summary.compared_from, summary.compared_to = start, end
    all_seqs = sorted({s for sm in with_entries for s in sm if s >= start})
    size = len(pg.ranks)
    sig_of: dict[tuple[int, ...], tuple[object, ...]] = {}
    err_of: dict[int, str | None] = {}
    statics = ds.statics
    for seq in all_seqs:
        present: dict[tuple[object, ...], list[tuple[list[int], SeqMap]]] = defaultdict(list)
        absent: list[int] = []
        syntax: list[tuple[list[int], SeqMap, str]] = []
        for rs, sm in per_tl:
            sids = sm.sids(seq)
            if sids is None:
                if sm.last is None or seq > sm.last:
                    absent.extend(rs)
                continue
            sig = sig_of.get(sids)
            if sig is None:
                sig = sig_of[sids] = tuple(signature(statics[i]) for i in sids)
            present[sig].append((rs, sm))
            for i in sids:
                if i not in err_of:
                    err_of[i] = syntax_error(statics[i], size)
                if err_of[i]:
                    syntax.append((rs, sm, err_of[i] or ""))
                    break
        if syntax:
            culprits = sorted(r for rs, _, _ in syntax for r in rs)
            groups = [_sig_group(rs, sm[seq], frames) for rs, sm, _ in syntax]
            why = "; ".join(f"rank(s) {_fold(rs)}: {err}" for rs, _, err in syntax)
            return Mismatch(pg.name, pg.desc, seq, "syntax", culprits,
                            f"the entry breaks the collective's own shape/dtype rule: {why}",
                            groups), summary
        if len(present) == 1 and not absent:
            (only,) = present
            first = only[0] if only else None
            if isinstance(first, tuple) and first[0] in ALL_TO_ALL:
                m = _alltoall_check(pg, seq, _entries_at(present[only], seq), frames)
                if m is not None:
                    return m, summary
            continue
        found = {sig: _entries_at(items, seq) for sig, items in present.items()}
        if len(present) == 1 and absent:
            return _missing(pg, seq, found, absent, per_tl, frames), summary
        return _divergence(pg, seq, found, absent, per_tl, frames), summary
    nodump = sorted(r for r in pg.ranks if r not in ds.dumps)
    if nodump:
        last = [(rs, sm[end]) for rs, sm in per_tl if end in sm]
        rs, ents = _merge(last)
        why = (f"every rank with a dump agrees up to collective #{end} ({ents[0].op}), which "
               f"rank(s) {_fold(rs)} enqueued; rank(s) {_fold(nodump)} left no dump (dead, "
               "frozen, or mldebug.fr.enable() not called there), so if the job hangs they "
               "are the only candidates for holding it up.") + _died_early(ds, rs, ents, nodump)
        return Mismatch(pg.name, pg.desc, end, "missing", nodump, why,
                        [_sig_group(rs, ents, frames),
                         SignatureGroup(nodump, "(no dump)")]), summary
    return None, summary


_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def _died_early(ds: DumpSet, rs: list[int], ents: list[Entry], nodump: list[int]) -> str:
    """When every rank with a dump ended before its collective's timeout - SIGTERMed (the
    launcher stopping them because another rank ended) or with its connection reset by a
    peer - the ranks without a dump did not hang: they died, in a way that runs no Python.
    Which of them caused it, these dumps cannot tell."""
    e = ents[0]
    gone = [r for r in rs if any(p in (ds.dumps[r].reason or "") for p in _PEER_GONE)]
    lost = (f" Rank(s) {_fold(gone)} lost a connection to a peer ('Connection closed by peer' "
            f"or reset): a process at the other end ended, so rank(s) {_fold(nodump)} exited or "
            "died rather than hang." if gone else "")
    if e.time_created_ns is None or not e.timeout_ms:
        return lost
    how: set[str] = set()
    for r in rs:
        d = ds.dumps[r]
        reason = d.reason or ""
        gap = d.dumped_at - e.time_created_ns / 1e9 if d.dumped_at is not None else None
        if gap is None or not 0 <= gap < 0.9 * e.timeout_ms / 1000:
            return lost
        if reason == "SIGTERM":
            how.add("terminated by SIGTERM, what a launcher sends when another rank ended")
        elif any(p in reason for p in _PEER_GONE):
            how.add("a peer's connection reset")
        else:
            return lost
    which = ("Which of them caused it cannot be told from these dumps (gloo aborts a rank "
             "that receives too many bytes: the one that sent them may die with it): their "
             "exit signals and the job's log"
             if len(nodump) > 1 else "What killed it cannot be told from these dumps: its "
             "exit signal and the job's log")
    return (f" They did not hang: rank(s) {_fold(rs)} ended ({'; '.join(sorted(how))}) "
            f"before #{e.seq}'s {e.timeout_ms / 1000:.0f} s timeout, so rank(s) "
            f"{_fold(nodump)} died without running Python: a crash in C++, such as gloo's "
            "abort when a rank receives more bytes than it expects (a size mismatch), a "
            f"segfault or a SIGKILL. {which} (gloo's 'Received data size doesn't match "
            "expected size', read by 'mldebug log') would tell; on NCCL the recorder holds the "
            "sizes.")


def _entries_at(items: list[tuple[list[int], SeqMap]],
                seq: int) -> list[tuple[list[int], list[Entry]]]:
    return [(rs, sm[seq]) for rs, sm in items]


def _fold(rs: Sequence[int]) -> str:
    from mldebug.render import fold_ints

    return fold_ints(rs)


def _sig_group(rs: list[int], ents: list[Entry], frames: int) -> SignatureGroup:
    desc = " + ".join(describe(e) for e in ents)
    site = call_site(ents[0], frames) if ents else []
    state = ents[-1].state if ents else None
    return SignatureGroup(sorted(rs), desc, site, state)


def _merge(items: list[tuple[list[int], list[Entry]]]) -> tuple[list[int], list[Entry]]:
    rs = sorted(x for group, _ in items for x in group)
    return rs, items[0][1]


def _missing(pg: _Pg, seq: int, present: dict[tuple[object, ...], list[tuple[list[int], list[Entry]]]],
             absent: list[int], per_tl: PerTimeline,
             frames: int) -> Mismatch:
    (items,) = present.values()
    rs, ents = _merge(items)
    absent = sorted(absent)
    absent_set = set(absent)
    op = ents[0].op
    groups = [_sig_group(rs, ents, frames), SignatureGroup(absent, "(not enqueued)")]
    last = {}
    for trs, sm in per_tl:
        for r in trs:
            if r in absent_set:
                last[r] = sm.last
    last_txt = ", ".join(f"rank {r}: #{v}" if v is not None else f"rank {r}: none"
                         for r, v in sorted(last.items())[:8])
    if len(rs) < len(absent):
        why = (f"only rank(s) {_fold(rs)} enqueued collective #{seq} ({op}); the other "
               f"{len(absent)} ranks never did (their last collective in this group: "
               f"{last_txt}). Minority vote: the {len(rs)} rank(s) that issued it made an "
               f"extra call.")
        return Mismatch(pg.name, pg.desc, seq, "missing", rs, why, groups)
    if len(rs) == len(absent):
        decided = call_site_tiebreak(seq, [rs, absent], per_tl)
        if decided is not None:
            culprits, evidence, began = decided
            extra = culprits == rs
            why = (f"rank(s) {_fold(rs)} enqueued collective #{seq} ({op}) and wait in it; "
                   f"rank(s) {_fold(absent)} never enqueued it (last collective in this group: "
                   f"{last_txt}). A tie on counts, decided by the call sites: {evidence} "
                   + (f"Rank(s) {_fold(rs)} issued an extra call at #{began}; the sequences "
                      f"only part at #{seq}." if extra else
                      f"Rank(s) {_fold(absent)} skipped or added a call at #{began}."))
            m = Mismatch(pg.name, pg.desc, seq, "missing", culprits, why, groups)
            m.began_at = began
            return m
    tie = " (a tie: equally, the others may have issued one call too many)" if len(rs) == len(absent) else ""
    why = (f"rank(s) {_fold(rs)} enqueued collective #{seq} ({op}) and wait in it; rank(s) "
           f"{_fold(absent)} never enqueued it (last collective in this group: {last_txt}): "
           f"they skipped it or are stuck before it{tie}.")
    return Mismatch(pg.name, pg.desc, seq, "missing", absent, why, groups)


def _site(ents: list[Entry]) -> tuple[str, ...]:
    """Where one position was called from: the innermost user frame of each entry."""
    return tuple(next((str(f) for f in e.frames if not is_torch_frame(f)), "") for e in ents)


def call_site_tiebreak(seq: int, sides: list[list[int]],
                       per_tl: PerTimeline,
                       ) -> tuple[list[int], str, int] | None:
    """Break a tie between two equally large sides by where their calls came from.

    Going back from ``seq``, find the first position k where the two sides' call sites
    differ (the divergence may have begun before the op types differ). The side whose call
    site at k issued no other collective in this group - on its own ranks or the others' -
    is the one that made the odd call; the other side's site at k is a line the first side
    also reaches (its regular pattern). Returns (culprit ranks, the evidence in words, k),
    or None when the frames do not decide (no frames, no difference, or both sites unique).
    """
    if len(sides) != 2:
        return None
    maps = []
    for side in sides:
        sm = next((m for rs, m in per_tl if side[0] in rs), None)
        if sm is None:
            return None
        maps.append(sm)
    a, b = maps
    common = sorted(k for k in a if k in b and k <= seq)
    diff = [k for k in common if _site(a[k]) != _site(b[k]) and all(_site(a[k]) + _site(b[k]))]
    if not diff:
        return None
    k = diff[0]
    uses: dict[tuple[str, ...], set[int]] = defaultdict(set)
    for i, sm in enumerate(maps):
        for q, ents in sm.items():
            uses[_site(ents)].add(i * (1 << 40) + q)
    odd = [i for i, sm in enumerate(maps) if len(uses[_site(sm[k])]) == 1]
    if len(odd) != 1:
        return None
    i = odd[0]
    other = 1 - i
    where = _site(maps[i][k])[0]
    theirs = _site(maps[other][k])[0]
    also = sorted(q for q, ents in maps[i].items() if _site(ents) == _site(maps[other][k]))
    evidence = (f"rank(s) {_fold(sides[i])}'s #{k} was called from {where}, a line that issued "
                f"no other collective in this group on any rank, while rank(s) "
                f"{_fold(sides[other])}'s #{k} came from {theirs}"
                + (f", which rank(s) {_fold(sides[i])} also reach at "
                   f"{', '.join(f'#{q}' for q in also[:4])}." if also else "."))
    return sorted(sides[i]), evidence, k


def _divergence(pg: _Pg, seq: int,
                present: dict[tuple[object, ...], list[tuple[list[int], list[Entry]]]],
                absent: list[int], per_tl: PerTimeline,
                frames: int) -> Mismatch:
    merged = sorted(((sig, *_merge(items)) for sig, items in present.items()),
                    key=lambda t: (-len(t[1]), t[1][0]))
    top_sig, top_rs, top_ents = merged[0]
    kind = min((_sig_kind(top_sig, sig) for sig, _, _ in merged[1:]),
               key=lambda k: _KIND_ORDER[k])
    groups = [_sig_group(rs, ents, frames) for _, rs, ents in merged]
    if absent:
        groups.append(SignatureGroup(sorted(absent), "(not enqueued)"))
    what = "; ".join(f"rank(s) {_fold(rs)}: {' + '.join(describe(e) for e in ents)}"
                     for _, rs, ents in merged)
    tied = [t for t in merged if len(t[1]) == len(top_rs)]
    if len(tied) == 1:
        culprits = sorted(r for _, rs, _ in merged[1:] for r in rs)
        why = (f"{len(top_rs)} rank(s) agree on {describe(top_ents[0])}; minority vote names "
               f"the rest ({what}).")
    else:
        extra = _extra_call(seq, tied, per_tl)
        if extra is not None:
            culprits = extra
            why = (f"no majority ({what}); rank(s) {_fold(extra)} issued an extra call: their "
                   f"next collective is the one the others issued at #{seq} (equally, the "
                   "others skipped one).")
        else:
            decided = (call_site_tiebreak(seq, [rs for _, rs, _ in tied], per_tl)
                       if len(tied) == 2 and len(merged) == 2 else None)
            if decided is not None:
                culprits, evidence, _ = decided
                why = f"no majority ({what}); a tie on counts, decided by the call sites: {evidence}"
            else:
                culprits = sorted(r for _, rs, _ in merged for r in rs)
                why = f"no majority ({what}); cannot tell which side is wrong."
    if absent:
        why += f" Rank(s) {_fold(sorted(absent))} never enqueued #{seq}."
    began = _began_at(seq, top_rs, culprits, per_tl)
    if began is not None:
        why += (f" The culprit's call sites already differ from the others' from collective "
                f"#{began} on: the divergence probably began there.")
    m = Mismatch(pg.name, pg.desc, seq, kind, culprits, why, groups)
    m.began_at = began
    return m


def _began_at(seq: int, majority: list[int], culprits: list[int],
              per_tl: PerTimeline) -> int | None:
    """The latest earlier seq where the culprit's call sites differ from the majority's.

    An extra or missing call of the same op and size looks like the others' until the op
    types differ further on; where the call sites first disagree is where it began.
    """
    if not culprits or not majority or set(culprits) & set(majority):
        return None
    maj = next((sm for rs, sm in per_tl if majority[0] in rs), None)
    cul = next((sm for rs, sm in per_tl if culprits[0] in rs), None)
    if maj is None or cul is None:
        return None

    def differ(k: int) -> bool:
        a, b = maj[k], cul[k]
        return bool(a[0].frames and b[0].frames) and [e.frames for e in a] != [e.frames for e in b]

    k = seq - 1
    while k in maj and k in cul and not differ(k):
        k -= 1
    if not (k in maj and k in cul):
        return None
    while k - 1 in maj and k - 1 in cul and differ(k - 1):
        k -= 1
    return k


def _extra_call(seq: int, tied: list[tuple[tuple[object, ...], list[int], list[Entry]]],
                per_tl: PerTimeline,
                span: int = 4) -> list[int] | None:
    """In a tie, the side whose timeline from #seq+1 on repeats another side's from #seq."""
    def sigs(rank: int, start: int) -> list[tuple[object, ...]]:
        sm: Mapping[int, list[Entry]] = next((m for rs, m in per_tl if rank in rs), {})
        out: list[tuple[object, ...]] = []
        for k in range(start, start + span):
            if k not in sm:
                break
            out.append(tuple(signature(e) for e in sm[k]))
        return out

    extra: list[int] = []
    for sig, rs, _ in tied:
        ahead = sigs(rs[0], seq + 1)
        if not ahead:
            continue
        for other_sig, ors, _ in tied:
            if other_sig == sig:
                continue
            theirs = sigs(ors[0], seq)[: len(ahead)]
            if theirs == ahead[: len(theirs)] and theirs:
                extra.extend(rs)
                break
    if extra and len(extra) < sum(len(rs) for _, rs, _ in tied):
        return sorted(extra)
    return None


def _alltoall_check(pg: _Pg, seq: int, items: list[tuple[list[int], list[Entry]]],
                    frames: int) -> Mismatch | None:
    tin = tout = 0
    for rs, ents in items:
        e = ents[0]
        tin += len(rs) * sum(_numel(s) for s in e.input_sizes)
        tout += len(rs) * sum(_numel(s) for s in e.output_sizes)
    if tin == tout:
        return None
    rs, ents = _merge(items)
    return Mismatch(pg.name, pg.desc, seq, "size", rs,
                    f"{ents[0].op}: total input numel {tin} != total output numel {tout} across "
                    "the group; any rank may hold the wrong split sizes",
                    [_sig_group(r, e, frames) for r, e in items])


def _analyze_p2p(ds: DumpSet, pg: _Pg, frames: int) -> Mismatch | None:
    """Pair each rank's sends to a peer with that peer's receives from it, in order; the
    first pair that is missing or disagrees on size or dtype is the finding. Compared by
    static id (ids of equal send and receive shapes are equal), so the 1.6 million send/recv
    entries of a 1,024-stage pipeline job cost a few array comparisons per pair."""
    members = sorted(pg.ranks)
    statics = ds.statics
    # static id -> id of what must match on the other side (a send's input sizes and dtypes,
    # a receive's output ones), as a list indexed by static id
    shape_id: dict[tuple[object, ...], int] = {}
    shape_of = [shape_id.setdefault(
        (st.input_sizes, frozenset(st.input_dtypes)) if st.op == "send"
        else (st.output_sizes, frozenset(st.output_dtypes)), len(shape_id)) for st in statics]
    # (src, dst) -> (timeline, entry indices): a rank's entries live in one timeline
    sends: dict[tuple[int, int], tuple[Timeline, array[int]]] = {}
    recvs: dict[tuple[int, int], tuple[Timeline, array[int]]] = {}
    for tl in ds.timelines:
        gi = tl.groups.get(pg.name)
        if gi is None or not gi.p2p:
            continue
        for r in tl.ranks:
            for (send, peer_local), idx in gi.p2p.items():
                if not 0 <= peer_local < len(members):
                    continue
                peer = members[peer_local]
                if send:
                    sends[(r, peer)] = (tl, idx)
                else:
                    recvs[(peer, r)] = (tl, idx)

    def shapes(side: tuple[Timeline, array[int]] | None) -> tuple[int, ...]:
        if side is None:
            return ()
        tl, idx = side
        return pick(shape_of, pick(tl.sid, idx))

    def entries(side: tuple[Timeline, array[int]] | None) -> Sequence[Entry]:
        return EntryView(*side) if side is not None else []

    issues: list[Mismatch] = []
    for pair in sorted(sends.keys() | recvs.keys()):
        src, dst = pair
        a_ids, b_ids = shapes(sends.get(pair)), shapes(recvs.get(pair))
        if a_ids == b_ids:
            continue
        s_ents, rv = entries(sends.get(pair)), entries(recvs.get(pair))
        for i in range(max(len(s_ents), len(rv))):
            if i < len(s_ents) and i < len(rv) and a_ids[i] == b_ids[i]:
                continue
            if i >= len(s_ents) or i >= len(rv):
                # one side posted more than the other: the other skipped one, or it has an extra
                if i >= len(s_ents):
                    op, other, toward, back, poster, peer, e, theirs = (
                        "recv", "send", "from", "to", dst, src, rv[i], len(s_ents))
                else:
                    op, other, toward, back, poster, peer, e, theirs = (
                        "send", "recv", "to", "from", src, dst, s_ents[i], len(rv))
                issues.append(Mismatch(pg.name, pg.desc, e.p2p_seq, "p2p", [peer], (
                    f"rank {poster} posted {op} #{i + 1} {toward} rank {peer}, which never "
                    f"posted the matching {other} (it posted {theirs}): rank {peer} skipped a "
                    f"{other}, or rank {poster} has an extra {op}."),
                    [_sig_group([poster], [e], frames),
                     SignatureGroup([peer], f"(no matching {other} {back} {poster})")], p2p=True))
                break
            a, b = s_ents[i], rv[i]
            if a.input_sizes != b.output_sizes or set(a.input_dtypes) != set(b.output_dtypes):
                issues.append(Mismatch(pg.name, pg.desc, a.p2p_seq, "p2p", [src, dst], (
                    f"send #{i + 1} from rank {src} ({describe(a)}) and the matching recv on "
                    f"rank {dst} ({describe(b)}) disagree on size or dtype."),
                    [_sig_group([src], [a], frames), _sig_group([dst], [b], frames)], p2p=True))
                break
    if not issues:
        return None
    return min(issues, key=lambda m: m.seq)


def _lags(ds: DumpSet, pg: _Pg, summary: GroupSummary, skip: set[int]) -> list[Lag]:
    enq: dict[int, int] = {}
    done: dict[int, int | None] = {}
    members = set(pg.ranks)  # membership tests per rank: a set, not the list (16k ranks)
    completed = ds.states.index("completed") if "completed" in ds.states else -1
    for tl in ds.timelines:
        gi = tl.groups.get(pg.name)
        whole_gloo = False  # every collective since #1 recorded, on gloo
        if gi is None or not gi.order:
            ids: set[int] = set()
            last_e = last_c = None
        else:
            used = set(pick(tl.sid, gi.order))
            ids = {i for i in (ds.statics[s].pg_id for s in used) if i is not None}
            whole_gloo = gi.seqs[0] == 1 and all(ds.statics[s].backend == "gloo" for s in used)
            last_e = gi.seqs[-1]
            last_c = next((tl.seq[i] for i in reversed(gi.order) if tl.state[i] == completed),
                          None)
        for r in tl.ranks:
            if r not in members or r in skip:
                continue
            dump = ds.dumps[r]
            st = None
            for key in [str(i) for i in ids] + ([str(pg.pg_id)] if pg.pg_id is not None else []) + [pg.name]:
                if key in dump.pg_status:
                    st = dump.pg_status[key]
                    break
            e_val = st.last_enqueued if st and st.last_enqueued is not None else last_e
            if e_val is None:
                continue
            c_val = st.last_completed if st and st.last_completed is not None else last_c
            if whole_gloo and last_e is not None and e_val > last_e:
                # gloo's pg_status counts its send/recv too, which it never records: a
                # pipeline stage that receives as well as sends is "ahead" by its receives
                e_val = last_e
                c_val = min(c_val, last_e) if c_val is not None else None
            enq[r] = e_val
            done[r] = c_val
            if c_val is not None and c_val < e_val:
                summary.waiting_in[r] = c_val + 1
    if not enq:
        return []
    top = max(enq.values())
    return [Lag(pg.name, pg.desc, r, v, top - v, done.get(r))
            for r, v in sorted(enq.items()) if v < top]
