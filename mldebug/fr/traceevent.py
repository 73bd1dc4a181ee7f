"""Chrome trace-event JSON (the format Perfetto and chrome://tracing open, and torch.profiler
writes): one process per rank, one complete slice ("ph": "X") per collective or recorded
call, and flow events ("s" / "t" / "f") that link the same collective (or the ranks' last
common call) across ranks.

Fields as the Trace Event Format document defines them (JSON object form): ``traceEvents``,
``displayTimeUnit``, ``otherData``; per event ``name``, ``cat``, ``ph``, ``ts`` (microseconds),
``dur``, ``pid``, ``tid``, ``args``; metadata events ``process_name`` / ``thread_name`` /
``process_sort_index``; flow events carry ``id`` and bind to the slice around their ``ts``
(``"bp": "e"`` on steps and ends).
"""

from __future__ import annotations

from typing import Any

from mldebug.fr.model import NOT_RECORDED, Analysis, DumpSet
from mldebug.htmlview import SEQ_STEP_US, trace_event_doc, trace_event_process

MAX_SLICES = 400_000  # beyond: one rank per distinct timeline, plus every culprit/straggler
MAX_FLOW_EVENTS = 200_000


def fr_trace(ds: DumpSet, a: Analysis) -> str:
    """The dumps as a trace: rank = process, process group = thread, entry = slice."""
    ranks = sorted(ds.dumps)
    total = sum(ds.dumps[r].entry_count for r in ranks)
    omitted: list[int] = []
    if total > MAX_SLICES:
        must = set(a.culprits) | {s.rank for s in a.stragglers}
        must |= {r + d for r in a.culprits for d in (-1, 1)}  # a culprit's neighbours (p2p peers)
        keep = {r for r in must if r in ds.dumps}
        budget = MAX_SLICES - sum(ds.dumps[r].entry_count for r in keep)
        for r in sorted({min(tl.ranks) for tl in ds.timelines if tl.ranks} - keep):
            if ds.dumps[r].entry_count > budget:
                break
            keep.add(r)
            budget -= ds.dumps[r].entry_count
        omitted = [r for r in ranks if r not in keep]
        ranks = sorted(keep & set(ds.dumps))
    created = [ds.dumps[r].created for r in ranks]
    firsts = [min((t for t in col if t > 0), default=0) for col in created]
    t0 = min((t for t in firsts if t > 0), default=0)
    timed = t0 > 0
    pg_tid: dict[str, int] = {}
    events: list[dict[str, Any]] = []
    culprits = set(a.culprits)
    # (pg, p2p?, seq) -> [(rank, ts)] for the flows
    where: dict[tuple[str, bool, int], list[tuple[int, int, int]]] = {}
    for r in ranks:
        d = ds.dumps[r]
        tl = ds.timelines[d.timeline] if d.timeline >= 0 else None
        name = f"rank {r}" + (f" ({d.host})" if d.host else "") + (
            " - culprit" if r in culprits else "")
        events += trace_event_process(r, name, r)
        if tl is None:
            continue
        times = d.created
        prev_end = -1
        for i in range(len(tl)):
            st = ds.statics[tl.sid[i]]
            tid = pg_tid.setdefault(st.pg_name, len(pg_tid))
            if timed and i < len(times) and times[i] > 0:
                ts = max((times[i] - t0) // 1000, prev_end + 1)
                done = tl.completed[i] if i < len(tl.completed) else NOT_RECORDED
                dur = max(1, (done - times[i]) // 1000) if done != NOT_RECORDED and \
                    done >= times[i] else 1
            else:
                ts, dur = i * SEQ_STEP_US, SEQ_STEP_US * 8 // 10
            prev_end = ts
            p2p = st.is_p2p
            seq = tl.p2p_seq[i] if p2p else tl.seq[i]
            label = st.profiling_name.split(":", 1)[-1] or st.op
            args: dict[str, Any] = {"seq": seq, "group": st.pg_name, "state":
                                    ds.states[tl.state[i]], "op": st.op}
            if st.input_sizes:
                args["input_sizes"] = [list(s) for s in st.input_sizes]
            if st.frames:
                args["call_site"] = [str(f) for f in st.frames[:6]]
            events.append({"name": f"{label} #{seq}", "cat": "p2p" if p2p else "collective",
                           "ph": "X", "ts": ts, "dur": dur, "pid": r, "tid": tid, "args": args})
            if not p2p:
                where.setdefault((st.pg_name, p2p, seq), []).append((r, tid, ts))
    for pg, tid in pg_tid.items():
        desc = next((st.pg_desc for st in ds.statics if st.pg_name == pg), "")
        for r in ranks:
            events.append({"name": "thread_name", "ph": "M", "pid": r, "tid": tid,
                           "args": {"name": f"group {pg}" + (f" ({desc})" if desc else "")}})
    flows = 0
    fid = 0
    for (pg, _p2p, seq), hits in where.items():
        if len(hits) < 2 or flows + len(hits) > MAX_FLOW_EVENTS:
            continue
        fid += 1
        hits.sort(key=lambda h: (h[2], h[0]))  # a flow runs forward in time
        for k, (r, tid, ts) in enumerate(hits):
            ph = "s" if k == 0 else "f" if k == len(hits) - 1 else "t"
            ev: dict[str, Any] = {"name": f"group {pg} #{seq}", "cat": "match", "ph": ph,
                                  "id": fid, "ts": ts, "pid": r, "tid": tid}
            if ph != "s":
                ev["bp"] = "e"
            events.append(ev)
        flows += len(hits)
    return trace_event_doc(events, {"tool": "mldebug fr analyze", "axis": "time" if timed else "sequence",
                         "ranks_omitted": len(omitted),
                         "culprit_ranks": a.culprits})
