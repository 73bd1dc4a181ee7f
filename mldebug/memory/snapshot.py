"""PyTorch CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``) read offline.

The file is a pickle from another machine, so it is decoded with the flight recorder's
restricted unpickler (plain containers, numbers and strings only) after a size check. The
schema is ``torch.cuda.memory._snapshot``'s: ``segments`` (each with ``blocks``) and
``device_traces`` (one list of trace entries per device, with the actions alloc,
free_requested, free_completed, segment_alloc, segment_free, oom, snapshot and ``frames``).
Analysis walks each trace once (plus once up to the peak) and keeps per-site totals, so a
trace of a million events costs seconds, not the browser tab the online viewer needs.
"""

from __future__ import annotations

import os
import pickle
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mldebug.errors import MldebugError
from mldebug.findings import Finding, Severity
from mldebug.memory.model import (
    CompareReport,
    DeviceMemory,
    Oom,
    SegmentUse,
    Site,
    SiteChange,
    SnapshotReport,
)
from mldebug.memory.units import fmt_bytes

DEFAULT_MAX_BYTES = 8 * 1024**3
NO_STACK = "<no stack recorded>"
NO_PYTHON = "<no Python frame>"
BEFORE_TRACE = "<allocated before the trace started>"
TORCH_PARTS = ("/torch/", "/site-packages/torch", "/dist-packages/torch", "/_dynamo/",
               "/_inductor/", "<frozen ")


def load(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """The snapshot dict; a clear error for a missing, huge, unsafe or foreign file."""
    from mldebug.safeload import DeepNesting, UnsafePickle, safe_loads, sniff_pickle

    p = Path(path)
    try:
        # O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting forever
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        raise MldebugError(f"cannot open the snapshot {p}: {e.strerror}.",
                           "Pass the file torch.cuda.memory._dump_snapshot() wrote "
                           "(a symlink is not followed).") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise MldebugError(f"{p} is not a regular file (a device, FIFO or directory).",
                               "Pass the file torch.cuda.memory._dump_snapshot() wrote.")
        size = st.st_size
        if size > max_bytes:
            raise MldebugError(f"{p} is {fmt_bytes(size)}, over the {fmt_bytes(max_bytes)} limit.",
                               "Record fewer steps or a smaller max_entries, or raise --max-size.")
        head = f.read(2)  # sniffed before the whole file is read: a pickle or JSON
        if head and not (sniff_pickle(head) or head.lstrip()[:1] in (b"{", b"[")
                         or head[:1].isspace()):
            raise MldebugError(f"{p} is not a PyTorch memory snapshot (neither a pickle nor "
                               "JSON).", "Pass a file written by "
                               "torch.cuda.memory._dump_snapshot().")
        data = head + f.read(max_bytes + 1 - len(head))
    if not data:
        raise MldebugError(f"{p} is empty (the rank died while dumping?).",
                           "Dump again; mldebug.memory.record() writes one file per rank.")
    try:
        doc = safe_loads(data)
    except UnsafePickle as e:
        raise MldebugError(f"refused {p}: the pickle asks for the Python object '{e}', which a "
                           "memory snapshot never contains.",
                           "Do not open it with pickle.load; it may run code.") from None
    except DeepNesting as e:
        raise MldebugError(f"refused {p}: {e}; a memory snapshot never nests tuples, and "
                           "hashing these would crash this process.",
                           "Do not open it with pickle.load either.") from None
    except (EOFError, pickle.UnpicklingError, ValueError, IndexError, UnicodeDecodeError,
            MemoryError, RecursionError) as e:  # RecursionError: JSON nested absurdly deep
        raise MldebugError(f"{p} is truncated or not a snapshot ({type(e).__name__}: "
                           f"{str(e)[:80]}).", "Dump it again; check the disk was not full.") from None
    del data
    if isinstance(doc, list):  # very old dumps: the segments only
        doc = {"segments": doc, "device_traces": []}
    if not isinstance(doc, dict) or not isinstance(doc.get("segments"), list):
        raise MldebugError(f"{p} is not a PyTorch memory snapshot (no 'segments' list).",
                           "Pass a file written by torch.cuda.memory._dump_snapshot().")
    return doc


# -- allocation sites ------------------------------------------------------------------------
def is_user_frame(filename: str) -> bool:
    """A Python frame outside torch (C++ frames and torch internals are folded away)."""
    if not filename.endswith(".py"):
        return False
    return not any(part in filename for part in TORCH_PARTS)


def frame_label(f: dict[str, Any]) -> str:
    filename = str(f.get("filename", "?"))
    short = "/".join(filename.rsplit("/", 2)[-2:])
    return f"{short}:{f.get('line', '?')} {f.get('name', '?')}"


class SiteTable:
    """Interns allocation sites: frames -> small int id, cached per frame object."""

    def __init__(self) -> None:
        self.names: list[str] = [NO_STACK, NO_PYTHON, BEFORE_TRACE]
        self._ids: dict[str, int] = {n: i for i, n in enumerate(self.names)}
        self._frame: dict[int, int] = {}  # id(frame dict) -> site id, or -1 when folded
        self._keep: list[Any] = []  # keeps the frames alive so their ids stay unique

    def intern(self, name: str) -> int:
        i = self._ids.get(name)
        if i is None:
            i = self._ids[name] = len(self.names)
            self.names.append(name)
        return i

    def of(self, frames: Any) -> int:
        if not frames:
            return 0
        cache = self._frame
        for f in frames:
            sid = cache.get(id(f))
            if sid is None:
                if isinstance(f, dict) and is_user_frame(str(f.get("filename", ""))):
                    sid = self.intern(frame_label(f))
                else:
                    sid = -1
                cache[id(f)] = sid
                self._keep.append(f)
            if sid >= 0:
                return sid
        return 1


# -- one device's trace ----------------------------------------------------------------------
@dataclass
class Replay:
    """The result of walking one trace: per-event sites and the running totals."""

    device: int
    events: int
    site_of: list[int] = field(default_factory=list)  # site id per event (-1: not an alloc)
    peak_allocated: int = 0
    peak_event: int | None = None
    peak_reserved: int = 0
    end_allocated: int = 0
    end_reserved: int = 0
    before_trace: int = 0
    reserved_start: int = 0
    live: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # addr -> (size, site, ev)
    ooms: list[Oom] = field(default_factory=list)
    skipped: int = 0


def _num(v: Any) -> int:
    return v if type(v) is int else 0


def replay(trace: Sequence[Any], device: int, sites: SiteTable, final_allocated: int | None,
           final_reserved: int | None) -> Replay:
    """Walk one device's trace: allocated/reserved over time, peak, what is live at the end."""
    # net change over the trace, to place the start: what the segments hold at the end minus it
    net_alloc = net_seg = 0
    pending: set[int] = set()  # free requested, not yet completed
    for e in trace:
        if type(e) is not dict:
            continue
        a = e.get("action")
        if a == "alloc":
            net_alloc += _num(e.get("size"))
        elif a == "free_requested":
            net_alloc -= _num(e.get("size"))
            pending.add(_num(e.get("addr")))
        elif a == "free_completed":
            addr = _num(e.get("addr"))
            if addr in pending:
                pending.discard(addr)
            else:  # the recorder skipped free_requested
                net_alloc -= _num(e.get("size"))
        elif a == "segment_alloc":
            net_seg += _num(e.get("size"))
        elif a == "segment_free":
            net_seg -= _num(e.get("size"))
    r = Replay(device, len(trace))
    r.before_trace = max(0, (final_allocated - net_alloc) if final_allocated is not None else 0)
    r.reserved_start = max(0, (final_reserved - net_seg) if final_reserved is not None else 0)
    allocated, reserved = r.before_trace, r.reserved_start
    peak, peak_ev, peak_res = allocated, None, reserved
    live = r.live
    pending.clear()
    site_of = r.site_of
    append = site_of.append
    of = sites.of
    for i, e in enumerate(trace):
        if type(e) is not dict:
            r.skipped += 1
            append(-1)
            continue
        a = e.get("action")
        if a == "alloc":
            size = _num(e.get("size"))
            sid = of(e.get("frames"))
            append(sid)
            live[_num(e.get("addr"))] = (size, sid, i)
            allocated += size
            if allocated > peak:
                peak, peak_ev = allocated, i
            continue
        append(-1)
        if a == "free_requested":
            addr = _num(e.get("addr"))
            got = live.pop(addr, None)
            allocated -= got[0] if got is not None else _num(e.get("size"))
            pending.add(addr)
        elif a == "free_completed":
            addr = _num(e.get("addr"))
            if addr in pending:
                pending.discard(addr)
            else:  # no free_requested recorded (skip_actions)
                got = live.pop(addr, None)
                allocated -= got[0] if got is not None else _num(e.get("size"))
        elif a == "segment_alloc":
            reserved += _num(e.get("size"))
            peak_res = max(peak_res, reserved)
        elif a == "segment_free":
            reserved -= _num(e.get("size"))
        elif a == "oom":
            r.ooms.append(Oom(device, i, _num(e.get("size")),
                              e.get("device_free") if type(e.get("device_free")) is int else None,
                              allocated, reserved, sites.names[of(e.get("frames"))]))
    r.peak_allocated, r.peak_event, r.peak_reserved = peak, peak_ev, peak_res
    r.end_allocated, r.end_reserved = allocated, reserved
    return r


def sites_at(trace: Sequence[Any], r: Replay, upto: int | None) -> dict[int, int]:
    """Bytes live per site just after event ``upto`` (None: before the trace)."""
    per: dict[int, int] = {2: r.before_trace} if r.before_trace else {}
    if upto is None:
        return per
    live: dict[int, tuple[int, int]] = {}
    pending: set[int] = set()
    site_of = r.site_of
    for i in range(upto + 1):
        e = trace[i]
        sid = site_of[i]
        if sid >= 0:
            live[_num(e.get("addr"))] = (_num(e.get("size")), sid)
            per[sid] = per.get(sid, 0) + _num(e.get("size"))
            continue
        if type(e) is not dict:
            continue
        a = e.get("action")
        if a == "free_requested" or a == "free_completed":
            addr = _num(e.get("addr"))
            if a == "free_completed" and addr in pending:
                pending.discard(addr)
                continue
            if a == "free_requested":
                pending.add(addr)
            got = live.pop(addr, None)
            if got is not None:
                per[got[1]] -= got[0]
            elif 2 in per:
                per[2] -= _num(e.get("size"))
    return per


# -- whole snapshot --------------------------------------------------------------------------
def _segment_uses(segments: list[Any]) -> list[SegmentUse]:
    out = []
    for s in segments:
        if not isinstance(s, dict):
            continue
        allocated = largest = 0
        blocks = s.get("blocks") or []
        for b in blocks:
            if not isinstance(b, dict):
                continue
            size = _num(b.get("size"))
            if b.get("state") == "active_allocated":
                allocated += size
            elif b.get("state") == "inactive":
                largest = max(largest, size)
        if not blocks:
            allocated = _num(s.get("allocated_size"))
        out.append(SegmentUse(_num(s.get("device")), _num(s.get("address")),
                              _num(s.get("total_size")), allocated, largest, len(blocks)))
    return out


def analyze(doc: dict[str, Any], file: str = "", top: int = 10) -> SnapshotReport:
    """The report: peak, top sites at peak, never-freed allocations, fragmentation, OOMs."""
    segs = _segment_uses(doc.get("segments") or [])
    rep = SnapshotReport(file=file, segments=len(segs))
    rep.reserved = sum(s.total for s in segs)
    rep.allocated = sum(s.allocated for s in segs)
    used = [s for s in segs if s.allocated]
    rep.largest_free = max((s.largest_free for s in segs), default=0)
    rep.stranded = sum(s.free for s in used)
    rep.worst_segments = sorted(segs, key=lambda s: -s.free)[:top]
    traces = doc.get("device_traces")
    if not isinstance(traces, list):
        traces = []
    rep.has_trace = any(isinstance(t, list) and t for t in traces)
    sites = SiteTable()
    for dev, trace in enumerate(traces):
        if not isinstance(trace, list) or not trace:
            continue
        dsegs = [s for s in segs if s.device == dev]
        r = replay(trace, dev, sites, sum(s.allocated for s in dsegs) if segs else None,
                   sum(s.total for s in dsegs) if segs else None)
        rep.skipped_events += r.skipped
        rep.devices.append(_device_memory(trace, r, sites, top))
    rep.findings = findings(rep)
    return rep


def _device_memory(trace: Sequence[Any], r: Replay, sites: SiteTable, top: int) -> DeviceMemory:
    dm = DeviceMemory(device=r.device, events=r.events, peak_allocated=r.peak_allocated,
                      peak_event=r.peak_event, peak_reserved=r.peak_reserved,
                      end_allocated=r.end_allocated, end_reserved=r.end_reserved,
                      before_trace=r.before_trace, ooms=r.ooms)
    at_peak = sites_at(trace, r, r.peak_event)
    dm.top_at_peak = [Site(sites.names[s], b) for s, b in
                      sorted(at_peak.items(), key=lambda kv: -kv[1]) if b > 0][:top]
    groups: dict[int, Site] = {}
    for size, sid, ev in r.live.values():
        g = groups.get(sid)
        if g is None:
            groups[sid] = Site(sites.names[sid], size, 1, ev, ev)
        else:
            g.bytes += size
            g.count += 1
            g.first_event = min(g.first_event or ev, ev)
            g.last_event = max(g.last_event or ev, ev)
    never = sorted(groups.values(), key=lambda s: -s.bytes)
    dm.never_freed = never[:top]
    n = max(1, r.events)
    for s in never:
        # left behind again and again over a good part of the trace, and not small
        spread = ((s.last_event or 0) - (s.first_event or 0)) / n
        if (s.count >= 3 and spread >= 0.25 and (s.last_event or 0) >= n // 2
                and s.bytes >= 0.01 * max(1, r.end_allocated)):
            dm.leak_sites.append(s)
    return dm


FRAG_FIX = ("Let the allocator grow segments instead of carving new ones: "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or call torch.cuda.empty_cache() "
            "between phases with very different tensor sizes).")


def findings(rep: SnapshotReport) -> list[Finding]:
    """Findings from a snapshot report (pure)."""
    out: list[Finding] = []
    if not rep.has_trace:
        out.append(Finding(Severity.HINT, "the snapshot has no allocation trace",
                           "Only the final state (segments) was saved: there is no peak, no "
                           "timeline and no leak analysis.",
                           "Record the trace: torch.cuda.memory._record_memory_history("
                           "max_entries=100000) before the steps (or mldebug.memory.record()).",
                           code="mem-no-trace"))
    for d in rep.devices:
        for o in d.ooms:
            cached_free = o.reserved - o.allocated
            if cached_free >= o.requested:
                why = (f"{fmt_bytes(cached_free)} was reserved but free in the cache - enough for "
                       "the request, but not in one piece: fragmentation.")
                fix = FRAG_FIX
            else:
                top = ", ".join(f"{s.site} {fmt_bytes(s.bytes)}" for s in d.top_at_peak[:3])
                why = f"The largest holders at the peak: {top}."
                fix = ("Lower the batch size or sequence length, use activation checkpointing, "
                       "or free what the largest sites hold (see the top sites above).")
            free = "" if o.device_free is None else f", {fmt_bytes(o.device_free)} free on the device"
            out.append(Finding(
                Severity.ERROR,
                f"CUDA out of memory on device {o.device}: {fmt_bytes(o.requested)} requested at "
                f"{o.site}",
                f"At event {o.event}: {fmt_bytes(o.allocated)} allocated, "
                f"{fmt_bytes(o.reserved)} reserved{free}. {why}", fix, code="mem-oom"))
        for s in d.leak_sites:
            site = s.site
            out.append(Finding(
                Severity.WARNING,
                f"leak suspect on device {d.device}: {site} keeps {fmt_bytes(s.bytes)} "
                f"({s.count} allocations never freed)",
                f"Allocated from event {s.first_event} to {s.last_event} of {d.events} and still "
                "held at the end of the trace: memory that grows with every step or layer.",
                "Look for a reference kept across steps at that line (a list of outputs or "
                "losses, a cache, a hook or autograd.Function saving tensors); keep .item() or "
                ".detach() copies instead.", code="mem-leak-suspect"))
    free_all = rep.reserved - rep.allocated
    if rep.reserved and rep.stranded >= 0.25 * rep.reserved and rep.stranded >= 64 * 1024**2:
        out.append(Finding(
            Severity.WARNING,
            f"fragmentation: {fmt_bytes(rep.stranded)} of {fmt_bytes(rep.reserved)} reserved is "
            f"free inside segments that are partly in use (largest free block "
            f"{fmt_bytes(rep.largest_free)})",
            f"{rep.segments} segments, {fmt_bytes(free_all)} free in all; a segment is returned to "
            "CUDA only when all of it is free, and a request larger than the largest free block "
            "needs a new cudaMalloc although the cache holds the memory.", FRAG_FIX,
            code="mem-fragmentation"))
    if rep.skipped_events:
        out.append(Finding(Severity.INFO, f"{rep.skipped_events} trace entries were not "
                           "dicts and were skipped", "", "Check the snapshot was not edited.",
                           code="mem-bad-events"))
    return out


# -- compare ---------------------------------------------------------------------------------
def held_by_site(doc: dict[str, Any]) -> tuple[dict[str, int], str]:
    """Bytes held at the end per site: from the segments' blocks (their frames), else the trace."""
    sites = SiteTable()
    per: dict[str, int] = {}
    has_frames = False
    for s in doc.get("segments") or []:
        for b in (s.get("blocks") or []) if isinstance(s, dict) else []:
            if isinstance(b, dict) and b.get("state") == "active_allocated":
                frames = b.get("frames")
                has_frames = has_frames or bool(frames)
                name = sites.names[sites.of(frames)]
                per[name] = per.get(name, 0) + _num(b.get("size"))
    if has_frames:
        return per, "segments"
    traces = doc.get("device_traces") or []
    if any(isinstance(t, list) and t for t in traces):
        per = {}
        for dev, trace in enumerate(traces):
            if isinstance(trace, list) and trace:
                r = replay(trace, dev, sites, None, None)
                for size, sid, _ in r.live.values():
                    name = sites.names[sid]
                    per[name] = per.get(name, 0) + size
        return per, "trace"
    return per, "segments"


def compare(a: dict[str, Any], b: dict[str, Any], name_a: str = "A", name_b: str = "B",
            top: int = 15) -> CompareReport:
    """What grew between two snapshots, by site (pure)."""
    pa, src_a = held_by_site(a)
    pb, src_b = held_by_site(b)
    ua, ub = _segment_uses(a.get("segments") or []), _segment_uses(b.get("segments") or [])
    rep = CompareReport(name_a, name_b, sum(s.allocated for s in ua), sum(s.allocated for s in ub),
                        sum(s.total for s in ua), sum(s.total for s in ub),
                        source=src_a if src_a == src_b else f"{src_a}/{src_b}")
    changes = [SiteChange(s, pa.get(s, 0), pb.get(s, 0)) for s in {*pa, *pb}]
    changes = [c for c in changes if c.delta]
    changes.sort(key=lambda c: (-c.delta, c.site))
    grown = [c for c in changes if c.delta > 0]
    shrunk = sorted((c for c in changes if c.delta < 0), key=lambda c: c.delta)
    rep.changes = grown[:top] + shrunk[:max(3, top // 3)]
    total = rep.allocated_after - rep.allocated_before
    if grown and total > 0:
        g = grown[0]
        out = Finding(
            Severity.WARNING if g.delta >= 0.1 * max(1, rep.allocated_before) else Severity.INFO,
            f"{g.site} holds {fmt_bytes(g.delta)} more in {name_b} than in {name_a}",
            f"Allocated memory went {fmt_bytes(rep.allocated_before)} -> "
            f"{fmt_bytes(rep.allocated_after)} ({fmt_bytes(total, signed=True)}); this site "
            f"accounts for {100 * g.delta / total:.0f}% of the growth.",
            "If both snapshots were taken at the same point of different steps, that site "
            "keeps tensors across steps: drop the reference (or keep .detach()/.item()).",
            code="mem-grew")
        rep.findings.append(out)
    return rep
