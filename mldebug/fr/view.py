"""The flight recorder as a picture: one lane per distinct timeline (ranks that recorded the
same entries folded into one, as ``fr analyze --all`` folds them; a click unfolds a lane into
its ranks), collectives along the entry axis or the time axis, the first mismatch of each
group marked with both call sites on hover, each lane's last enqueued and last completed
entry; and the stragglers' heat map (rank x collective lateness, the named stragglers on top,
the clock-skew correction per host).

Everything comes from the loaded DumpSet and its Analysis: nothing is re-analysed here. The
entries travel as one character per entry (op kind x state) so 1,024 distinct timelines of
2,000 entries stay a few megabytes.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from itertools import repeat
from operator import add, sub
from typing import Any

from mldebug.findings import findings_to_json
from mldebug.fr.model import NOT_RECORDED, Analysis, DumpSet, Timeline
from mldebug.htmlview import page
from mldebug.render import fold_ints

# one character per entry: kind * 4 + state; 80 characters that JSON and HTML leave alone
ALPHA = ("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
         "!#$%()*+,-.:;=?@[]^_")
MAX_KINDS = len(ALPHA) // 4  # 20: op x group kinds drawn in their own colour, the rest "other"
STATES = ("completed", "started", "scheduled", "other")
DETAIL_ENTRIES = 200_000  # up to this many entries in all: seqs and times for hover/time axis
HEAT = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # lateness bins
HEAT_MAX_MS = 10_000.0
HEAT_COLUMNS = 400  # the latest matched collectives in the heat map (the statistics: up to 1,000)


def _hosts(ds: DumpSet, ranks: list[int]) -> str:
    from mldebug.findings import fold_hosts

    hs = {ds.dumps[r].host for r in ranks if ds.dumps[r].host}
    return fold_hosts(sorted(h for h in hs if h)) if hs else ""


def _label(ranks: list[int]) -> str:
    return (f"ranks {fold_ints(ranks)}" if len(ranks) > 1 else f"rank {ranks[0]}") if ranks else "-"


def _lane_last(tl: Timeline, states: bytearray) -> list[dict[str, Any]]:
    """Per group: the last enqueued and last completed collective (seq and entry index)."""
    out = []
    for pg, gi in tl.groups.items():
        if not gi.order:
            continue
        enq_i = max(gi.order)
        done_i = next((i for i in sorted(gi.order, reverse=True) if states[i] == 0), -1)
        out.append({"pg": pg, "enq": tl.seq[enq_i] if gi.seqs else None, "enq_i": enq_i,
                    "done": tl.seq[done_i] if done_i >= 0 else None, "done_i": done_i})
    return out


def _states(ds: DumpSet, tl: Timeline, state_of: bytes) -> bytearray:
    """Each entry's state index (a byte); an entry the recorder left "scheduled" (gloo never
    updates them) counts as completed up to the group's last completed collective in the
    dump's pg_status, as the analysis reads it."""
    states = bytearray(map(state_of.__getitem__, tl.state))
    status = ds.dumps[tl.ranks[0]].pg_status if tl.ranks else {}
    done = {k: v.last_completed for k, v in status.items()
            if v.last_completed is not None and v.last_completed >= 0}
    if not done or not states.strip(b"\0"):
        return states
    statics = ds.statics
    for i, st in enumerate(states):
        if st:
            sc = statics[tl.sid[i]]
            last = done.get(str(sc.pg_id)) if not sc.is_p2p else None
            if last is not None and tl.seq[i] <= last:
                states[i] = 0
    return states


def fr_data(ds: DumpSet, a: Analysis, title: str,
            since: dict[str, int] | None = None) -> dict[str, Any]:
    """What the page draws, from the loaded dumps and their analysis."""
    statics = ds.statics
    kinds: dict[tuple[str, str], int] = {}
    kind_of: list[int] = []
    for st in statics:
        op = "send/recv" if st.is_p2p else st.op
        key = (op, st.pg_name)
        if key not in kinds and len(kinds) < MAX_KINDS - 1:
            kinds[key] = len(kinds)
        kind_of.append(kinds.get(key, MAX_KINDS - 1))
    state_of = bytes(STATES.index(s) if s in STATES[:3] else 3 for s in ds.states)
    kind4 = bytes(4 * k for k in kind_of)
    p2p_of = bytes(st.is_p2p for st in statics)
    table = bytes.maketrans(bytes(range(len(ALPHA))), ALPHA.encode("ascii"))
    total = sum(len(tl) for tl in ds.timelines)
    detail = total <= DETAIL_ENTRIES
    lanes = []
    tmin = None
    has_time = False
    for tl in ds.timelines:
        states = _states(ds, tl, state_of)
        # one character per entry, built in C: kind*4 (a byte per static id) + state, then
        # mapped onto ALPHA
        cells = bytes(map(add, map(kind4.__getitem__, tl.sid), states)).translate(
            table).decode("ascii")
        ranks = sorted(tl.ranks)
        lane: dict[str, Any] = {
            "ranks": ranks, "label": _label(ranks), "hosts": _hosts(ds, ranks),
            "cells": cells, "last": _lane_last(tl, states),
            "per_rank": [{"rank": r, "host": ds.dumps[r].host or "", "pid": ds.dumps[r].pid,
                          "status": {k: [v.last_enqueued, v.last_completed]
                                     for k, v in ds.dumps[r].pg_status.items()}}
                         for r in ranks[:256]]}
        if detail:
            lane["seq"] = [pq if p else q for q, pq, p in
                           zip(tl.seq, tl.p2p_seq, map(p2p_of.__getitem__, tl.sid), strict=True)]
            starts = [c if c > 0 else None for c in tl.created]
            if any(s is not None for s in starts):
                has_time = True
                ends = [(c if c != NOT_RECORDED and s is not None and c >= s else s)
                        for c, s in zip(list(tl.completed) + [NOT_RECORDED] * (len(tl) - len(tl.completed)),
                                        starts, strict=False)]
                lane["_t"] = (starts, ends)
                lo = min(s for s in starts if s is not None)
                tmin = lo if tmin is None else min(tmin, lo)
        lanes.append(lane)
    for lane in lanes:
        t = lane.pop("_t", None)
        if t is not None and tmin is not None:
            starts, ends = t
            lane["t0"] = [-1 if s is None else round((s - tmin) / 1000) for s in starts]
            lane["t1"] = [-1 if e is None else round((e - tmin) / 1000) for e in ends]
    lane_of = {r: i for i, tl in enumerate(ds.timelines) for r in tl.ranks}
    marks = []
    for m in a.mismatches:
        at: dict[str, int] = {}
        gap: dict[str, int] = {}
        involved = {lane_of[r] for g in m.groups for r in g.ranks if r in lane_of}
        for i, tl in enumerate(ds.timelines):
            gi = tl.groups.get(m.pg)
            if gi is None or (m.p2p and i not in involved):  # a send/recv: its two ranks
                continue
            if m.p2p:
                hit = next((k for idx in gi.p2p.values() for k in idx
                            if tl.p2p_seq[k] == m.seq), None)
            else:
                pos = gi.positions().get(m.seq)
                hit = gi.order[gi.starts[pos]] if pos is not None else None
            if hit is not None:
                at[str(i)] = hit
            elif not m.p2p and gi.order:
                gap[str(i)] = max(gi.order) + 1  # never enqueued: where it would come
        marks.append({"pg": m.pg, "pg_desc": m.pg_desc, "seq": m.seq, "kind": m.kind,
                      "p2p": m.p2p, "culprits": m.culprit_ranks, "culprit_text":
                      fold_ints(m.culprit_ranks), "reasoning": m.reasoning,
                      "began_at": m.began_at, "at": at, "gap": gap,
                      "culprit_lanes": sorted({lane_of[r] for r in m.culprit_ranks
                                               if r in lane_of}),
                      "groups": [g.to_dict() for g in m.groups]})
    groups = [{"pg": g.pg, "desc": g.desc, "ranks": fold_ints(g.ranks), "n": len(g.ranks),
               "membership": g.membership, "from": g.compared_from, "to": g.compared_to,
               "waiting": {str(s): fold_ints([r for r, q in g.waiting_in.items() if q == s])
                           for s in sorted(set(g.waiting_in.values()))}} for g in a.groups]
    return {
        "title": title, "ranks": fold_ints(a.ranks), "nranks": len(a.ranks),
        "world": a.world_size, "timelines": a.timelines, "missing": fold_ints(a.missing_ranks),
        "kinds": [{"op": op, "pg": pg} for (op, pg) in kinds] + (
            [{"op": "other", "pg": ""}] if len(kinds) == MAX_KINDS - 1 else []),
        "alpha": ALPHA, "states": list(STATES), "lanes": lanes, "has_time": has_time,
        "marks": marks, "groups": groups, "culprits": fold_ints(a.culprits),
        "findings": findings_to_json(a.findings), "notes": a.notes,
        "problems": [p.to_dict() for p in a.problems[:50]],
        "stragglers": straggler_data(ds, a, since),
    }


def _bins(top_ms: float) -> list[float]:
    """Upper bounds (ns) of the lateness bins 1.. of ``HEAT``: log scale up to ``top_ms``."""
    n = len(HEAT) - 1
    return [math.expm1((k + 0.5) / n * math.log1p(top_ms)) * 1e6 for k in range(1, n)]


def straggler_data(ds: DumpSet, a: Analysis, since: dict[str, int] | None = None,
                   max_groups: int = 3, columns: int = HEAT_COLUMNS) -> dict[str, Any] | None:
    """The heat map: per group (the largest ``max_groups``), rank x collective lateness
    behind the median rank over the latest ``columns`` matched collectives, from the arrival
    times, clock shifts and medians the straggler analysis computed (``Analysis.arrivals``)."""
    if not a.straggler_window:
        return None
    from mldebug.fr.stragglers import MIN_COLLECTIVES

    named = [st.to_dict() for st in a.stragglers]
    order = {st.rank: i for i, st in enumerate(a.stragglers)}
    maps: list[dict[str, Any]] = []
    heat = bytes.maketrans(bytes(range(len(HEAT))), HEAT.encode("ascii"))
    for arr in sorted(a.arrivals, key=lambda x: -len(x.matched.ranks) * len(x.matched.seqs)):
        if len(maps) >= max_groups:
            break
        m, shift, mids = arr.matched, arr.shift, arr.mids
        first = max(0, len(m.seqs) - columns)
        mids = mids[first:]
        hosts = [ds.dumps[r].host or "" for r in m.ranks]
        # lateness in ns, per rank, over the shown columns
        late = [list(map(sub, map(sub, times[first:], repeat(sh)), mids))
                for times, sh in zip(m.times, shift, strict=True)]
        pos = sorted(v for row in late for v in row if v > 0)  # the scale: p99, not one outlier
        top = min(HEAT_MAX_MS, max(1.0, pos[int(0.99 * (len(pos) - 1))] / 1e6 if pos else 1.0))
        bounds = [0.0, *_bins(top)]  # <= 0: on time (bin 0)
        rows = sorted(range(len(m.ranks)),
                      key=lambda i: (order.get(m.ranks[i], 1 << 30), m.ranks[i]))
        offsets: dict[str, float] = {}
        for h, sh in zip(hosts, shift, strict=True):
            offsets.setdefault(h, sh)
        maps.append({
            "pg": arr.pg, "seqs": [m.seqs[first], m.seqs[-1]], "n": len(m.seqs) - first,
            "of": len(m.seqs), "ranks": [m.ranks[i] for i in rows],
            "hosts": [hosts[i] for i in rows], "top_ms": top,
            "cells": [bytes(map(bisect_left, repeat(bounds), late[i])).translate(heat)
                      .decode("ascii") for i in rows],
            "offsets": [{"host": h, "ms": round(v / 1e6, 3)} for h, v in sorted(offsets.items())],
        })
    return {"window": a.straggler_window, "named": named, "min": MIN_COLLECTIVES,
            "heat": HEAT, "maps": maps}


_CSS = """#lanes{display:flex;align-items:flex-start;max-height:78vh;overflow:auto;
border:1px solid #ccc}#labels{flex:0 0 220px}#wrap{position:relative}
.mark{position:absolute;top:0;color:#c0392b;font:bold 11px monospace;white-space:nowrap;
pointer-events:auto;cursor:help}#legend span{margin-right:10px}
.strag{color:#c0392b;font-weight:600}"""

_BODY = """<div id="summary" class="card"></div><div id="culprit" class="bad"></div>
<div id="findings"></div><h3>Collectives per distinct timeline</h3>
<div><label id="axisbox" style="display:none"><input type="checkbox" id="axis"> time axis
(enqueue to completion)</label> <span class="muted">click a lane to unfold its ranks; hover
for the entry; red: the first mismatch of a group; E / C: last enqueued / last completed</span>
</div><div id="legend"></div><div id="marks"></div>
<div id="lanes"><div id="labels"></div><div id="wrap"><canvas id="cv"></canvas></div></div>
<h3>Process groups</h3><div id="groups"></div><div id="strag"></div>"""

_JS = r"""
const sum = document.getElementById("summary");
sum.textContent = D.nranks + " dump(s), ranks " + D.ranks + (D.world ? ", world size " + D.world : "")
  + ", " + D.timelines + " distinct timeline(s)" + (D.missing ? "; no dump from ranks " + D.missing : "");
if (D.culprits) document.getElementById("culprit").textContent = "Culprit rank(s): " + D.culprits;
findings(document.getElementById("findings"), D.findings);
const leg = document.getElementById("legend");
D.kinds.forEach((k, i) => { const s = h("span"); const sw = h("span", "sw");
  sw.style.background = PALETTE[i % PALETTE.length];
  add(s, sw, document.createTextNode(k.op + (k.pg ? " (group " + k.pg + ")" : ""))); leg.appendChild(s); });
add(leg, h("span", "muted", "  solid: completed, pale: started, outline: scheduled"));
const code = {}; for (let i = 0; i < D.alpha.length; i++) code[D.alpha[i]] = i;
function rgb(hex) { return [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16)); }
const COL = D.kinds.map((_, i) => rgb(PALETTE[i % PALETTE.length]));
const open = new Set();
let rows = [];
function layout() { rows = []; D.lanes.forEach((l, i) => { rows.push({lane: i, rank: null});
  if (open.has(i)) for (const p of l.per_rank) rows.push({lane: i, rank: p}); }); }
const maxN = Math.max(1, ...D.lanes.map(l => l.cells.length));
const W = Math.max(600, Math.min(1200, maxN * Math.max(1, Math.floor(1400 / maxN))));
let H = D.lanes.length > 200 ? 8 : 16; const TOP = 14;
const cv = document.getElementById("cv"), g = cv.getContext("2d");
const timeAxis = () => document.getElementById("axis").checked;
let tmax = 1; for (const l of D.lanes) if (l.t1) for (const v of l.t1) if (v > tmax) tmax = v;
function xOf(l, i) { if (timeAxis() && l.t0) { const a = l.t0[i], b = l.t1[i];
    if (a < 0) return [-1, -1]; const x0 = Math.floor(a / tmax * (W - 2));
    return [x0, Math.max(x0 + 1, Math.floor(b / tmax * (W - 2)))]; }
  const n = maxN; return [Math.floor(i * W / n), Math.max(Math.floor(i * W / n) + 1, Math.floor((i + 1) * W / n))]; }
function draw() {
  layout(); cv.width = W; cv.height = TOP + rows.length * H;
  const img = g.createImageData(W, cv.height), px = img.data;
  rows.forEach((row, r) => { const l = D.lanes[row.lane], y0 = TOP + r * H, cells = l.cells;
    const bg = row.rank ? 250 : 255;
    for (let y = y0; y < y0 + H; y++) for (let x = 0; x < W; x++) { const o = (y * W + x) * 4;
      px[o] = px[o + 1] = px[o + 2] = bg; px[o + 3] = 255; }
    for (let i = 0; i < cells.length; i++) { const c = code[cells[i]], k = c >> 2, s = c & 3;
      const [x0, x1] = xOf(l, i); if (x0 < 0) continue; const col = COL[k] || [120, 120, 120];
      const f = s === 0 ? 1 : s === 1 ? 0.55 : 0.2;
      for (let y = y0 + 1; y < y0 + H - 1; y++) for (let x = x0; x < x1 && x < W; x++) {
        const o = (y * W + x) * 4, edge = s >= 2 && (y === y0 + 1 || y === y0 + H - 2);
        const ff = edge ? 1 : f;
        px[o] = 255 - (255 - col[0]) * ff; px[o + 1] = 255 - (255 - col[1]) * ff;
        px[o + 2] = 255 - (255 - col[2]) * ff; } } });
  g.putImageData(img, 0, 0);
  g.font = "bold " + Math.max(7, H - 4) + "px monospace";
  rows.forEach((row, r) => { const l = D.lanes[row.lane], y0 = TOP + r * H;
    for (const last of l.last) { for (const [idx, ch, col] of [[last.enq_i, "E", "#000"], [last.done_i, "C", "#2e7d32"]]) {
      if (idx < 0) continue; const [x0] = xOf(l, idx); if (x0 < 0) continue;
      g.fillStyle = col; g.fillRect(x0, y0, 1, H); if (H >= 12) g.fillText(ch, x0 + 2, y0 + H - 3); } }
    for (const m of D.marks) { const idx = m.at[String(row.lane)], gap = m.gap[String(row.lane)];
      if (idx !== undefined) { const [x0, x1] = xOf(l, idx); g.strokeStyle = "#e00"; g.lineWidth = 2; g.setLineDash([]);
        g.strokeRect(x0 - 2, y0 + 0.5, x1 - x0 + 4, H - 1); }
      else if (gap !== undefined) { const x0 = gapX(l, gap); g.strokeStyle = "#e00"; g.lineWidth = 2;
        g.setLineDash([3, 2]); g.strokeRect(x0, y0 + 0.5, Math.max(6, W / maxN), H - 1); g.setLineDash([]);
        if (H >= 12) { g.fillStyle = "#e00"; g.fillText("missing #" + m.seq, x0 + Math.max(6, W / maxN) + 3, y0 + H - 3); } } } });
  const lab = document.getElementById("labels"); lab.textContent = "";
  const pad = h("div"); pad.style.height = TOP + "px"; lab.appendChild(pad);
  rows.forEach((row) => { const l = D.lanes[row.lane];
    const d = h("div", "lbl", row.rank ? "   rank " + row.rank.rank + (row.rank.host ? " " + row.rank.host : "")
      : (open.has(row.lane) ? "\u25be " : (l.ranks.length > 1 ? "\u25b8 " : "  ")) + l.label + (l.hosts ? " " + l.hosts : ""));
    d.style.height = d.style.lineHeight = H + "px"; d.style.fontSize = Math.min(11, H - 1) + "px";
    d.dataset.lane = row.lane; if (D.marks.some(m => m.culprit_lanes.includes(row.lane))) d.classList.add("bad");
    d.addEventListener("click", () => { if (open.has(row.lane)) open.delete(row.lane); else open.add(row.lane); draw(); });
    d.addEventListener("mousemove", ev => tip(ev, laneText(l, row.rank)));
    d.addEventListener("mouseleave", ev => tip(ev, ""));
    lab.appendChild(d); });
  placeMarks();
}
function laneText(l, p) { let t = (p ? "rank " + p.rank + " " + p.host + (p.pid ? " pid " + p.pid : "") : l.label + (l.hosts ? " on " + l.hosts : "")) + "\n" + l.cells.length + " entries";
  for (const x of l.last) t += "\ngroup " + x.pg + ": last enqueued #" + x.enq + ", last completed " + (x.done === null ? "none" : "#" + x.done);
  return t; }
function entryText(l, i) { const c = code[l.cells[i]], k = D.kinds[c >> 2] || {op: "other", pg: ""};
  let t = k.op + (k.pg ? " group " + k.pg : "") + (l.seq ? " #" + l.seq[i] : " (entry " + i + ")") + " [" + D.states[c & 3] + "]";
  if (l.t0 && l.t0[i] >= 0) t += "\nenqueued +" + (l.t0[i] / 1000).toFixed(3) + " ms, done +" + (l.t1[i] / 1000).toFixed(3) + " ms";
  return t; }
function markText(m) { let t = "group " + m.pg + " collective #" + m.seq + ": " + m.kind + " mismatch, culprit rank(s) " + m.culprit_text;
  for (const gr of m.groups) t += "\n\nranks " + fold(gr.ranks) + ": " + gr.what + (gr.state ? " [" + gr.state + "]" : "") + (gr.call_site.length ? "\n  " + gr.call_site.join("\n  ") : "");
  return t; }
function gapX(l, gap) { if (gap < l.cells.length) return xOf(l, gap)[0];
  if (timeAxis() && l.t1) { return xOf(l, l.cells.length - 1)[1] + 2; }
  return Math.min(W - 4, Math.floor(gap * W / maxN)); }
function placeMarks() { const wrap = document.getElementById("wrap");
  for (const e of wrap.querySelectorAll(".mark")) e.remove();
  D.marks.forEach((m) => { const withAt = m.culprit_lanes.filter(k => m.at[String(k)] !== undefined);
    const lane = withAt.length ? withAt[0] : Number(Object.keys(m.at)[0]); if (Number.isNaN(lane)) return;
    const idx = m.at[String(lane)]; if (idx === undefined) return; const [x0] = xOf(D.lanes[lane], idx);
    const r = rows.findIndex(x => x.lane === lane && !x.rank);
    const e = h("div", "mark", "\u25bc #" + m.seq); e.style.left = x0 + "px"; e.style.top = (TOP + r * H - 13) + "px";
    e.addEventListener("mousemove", ev => tip(ev, markText(m))); e.addEventListener("mouseleave", ev => tip(ev, ""));
    wrap.appendChild(e); }); }
const mk = document.getElementById("marks");
D.marks.forEach((m, i) => { const d = h("div", "card"); d.id = "mismatch" + i;
  add(d, h("b", "bad", "Group " + m.pg + (m.pg_desc ? " (" + m.pg_desc + ")" : "") + ", " + (m.p2p ? "p2p " : "") + "collective #" + m.seq + ": " + m.kind + " mismatch; culprit rank(s) " + m.culprit_text),
    h("div", "", m.reasoning));
  for (const gr of m.groups) add(d, h("div", "muted", "ranks " + fold(gr.ranks) + ": " + gr.what + (gr.call_site.length ? "  at " + gr.call_site[0] : "")));
  d.title = markText(m); mk.appendChild(d); });
cv.addEventListener("mousemove", ev => { const b = cv.getBoundingClientRect();
  const x = ev.clientX - b.left, r = Math.floor((ev.clientY - b.top - TOP) / H), row = rows[r];
  if (!row) return tip(ev, ""); const l = D.lanes[row.lane];
  let best = -1; for (let i = 0; i < l.cells.length; i++) { const [x0, x1] = xOf(l, i); if (x >= x0 && x < x1 + 1) { best = i; break; } }
  let t = laneText(l, row.rank); if (best >= 0) t = entryText(l, best) + "\n" + t;
  for (const m of D.marks) if (m.at[String(row.lane)] === best) t = markText(m) + "\n\n" + t;
  tip(ev, t); });
cv.addEventListener("mouseleave", ev => tip(ev, ""));
if (D.has_time && D.lanes.some(l => l.t0)) { document.getElementById("axisbox").style.display = "";
  document.getElementById("axis").addEventListener("change", draw); }
const gt = h("table"); add(gt, add(h("tr"), h("th", "", "group"), h("th", "", "ranks"), h("th", "", "collectives compared"), h("th", "", "waiting in")));
for (const gr of D.groups) add(gt, add(h("tr"), h("td", "", gr.pg + " (" + (gr.desc || "-") + ")"), h("td", "", gr.ranks + " [" + gr.membership + "]"),
  h("td", "", gr.from === null ? "-" : "#" + gr.from + " to #" + gr.to),
  h("td", "", Object.entries(gr.waiting).map(([s, rs]) => "#" + s + ": ranks " + rs).join("; ") || "-")));
document.getElementById("groups").appendChild(gt);
draw();
""" + r"""
const S = D.stragglers;
if (S) { const box = document.getElementById("strag");
  add(box, h("h3", "", "Stragglers over " + S.window + " matched collective(s)"));
  const named = h("div", "card"); named.id = "stragglers";
  if (S.named.length) for (const s of S.named) add(named, h("div", "strag", "rank " + s.rank + (s.host ? " (" + s.host + ")" : "") + ": last at " + s.times_last + " of " + s.collectives + " collectives, median " + s.late_ms_median.toFixed(1) + " ms late, p90 " + s.late_ms_p90.toFixed(1) + " ms"));
  else add(named, h("div", "", S.window >= S.min ? "no straggler: no rank is consistently last" : "too few collectives to judge"));
  box.appendChild(named);
  for (const m of S.maps) {
    const hv = {}; for (let i = 0; i < S.heat.length; i++) hv[S.heat[i]] = i === 0 ? 0 : Math.expm1(i / (S.heat.length - 1) * Math.log1p(m.top_ms));
    const sk = h("div", "card"); sk.className = "card skew";
    add(sk, h("b", "", "Clock-skew correction (group " + m.pg + "): each host's clock aligned to " + (m.offsets[0].host || "the first host") + " by the median gap between the hosts' earliest arrivals"));
    for (const o of m.offsets) add(sk, h("div", "", (o.host || "(host unknown)") + ": " + (o.ms >= 0 ? "+" : "") + o.ms.toFixed(3) + " ms subtracted" + (m.offsets.length === 1 ? " (one host: nothing to correct)" : "")));
    box.appendChild(sk);
    add(box, h("div", "muted", "group " + m.pg + ": lateness behind the median rank at collectives #" + m.seqs[0] + "-#" + m.seqs[1] + " (the latest " + m.n + " of " + m.of + "), white = on time, darkest = " + m.top_ms.toFixed(1) + " ms late (log scale); stragglers on top"));
    const wrap = h("div"); wrap.style.display = "flex"; const labs = h("div"); labs.style.flex = "0 0 170px";
    const RH = m.ranks.length > 200 ? 3 : 14, c = h("canvas"); const CW = Math.max(1, Math.floor(900 / m.n));
    c.width = Math.max(200, m.n * CW); c.height = m.ranks.length * RH; const cg = c.getContext("2d");
    const im = cg.createImageData(c.width, c.height), p = im.data;
    m.cells.forEach((row, r) => { for (let i = 0; i < row.length; i++) { const b = S.heat.indexOf(row[i]) / (S.heat.length - 1);
      const col = [255 - 40 * b, 255 - 230 * b, 255 - 230 * b];
      for (let y = r * RH; y < (r + 1) * RH; y++) for (let x = i * CW; x < (i + 1) * CW; x++) { const o = (y * c.width + x) * 4;
        p[o] = col[0]; p[o + 1] = col[1]; p[o + 2] = col[2]; p[o + 3] = 255; } } });
    cg.putImageData(im, 0, 0);
    const namedSet = new Set(S.named.map(s => s.rank));
    if (RH >= 10) m.ranks.forEach((r, i) => {
      const d = h("div", namedSet.has(r) ? "lbl strag" : "lbl", "rank " + r + " " + (m.hosts[i] || ""));
      d.style.height = d.style.lineHeight = RH + "px"; d.style.fontSize = Math.min(11, RH) + "px"; labs.appendChild(d); });
    c.addEventListener("mousemove", ev => { const b = c.getBoundingClientRect(); const r = Math.floor((ev.clientY - b.top) / RH), i = Math.floor((ev.clientX - b.left) / CW);
      if (r < 0 || r >= m.ranks.length || i < 0 || i >= m.n) return tip(ev, "");
      tip(ev, "rank " + m.ranks[r] + " (" + m.hosts[r] + ") at collective " + (i + 1) + " of " + m.n + ": ~" + hv[m.cells[r][i]].toFixed(1) + " ms behind the median rank"); });
    c.addEventListener("mouseleave", ev => tip(ev, ""));
    add(wrap, labs, c); box.appendChild(wrap); } }
"""


def fr_html(ds: DumpSet, a: Analysis, title: str = "mldebug fr",
            since: dict[str, int] | None = None) -> str:
    return page(title, "fr", fr_data(ds, a, title, since), _JS, _BODY, _CSS)
