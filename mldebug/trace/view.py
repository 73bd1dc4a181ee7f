"""``trace show`` as a picture: the ranks' rings side by side (ranks with the same recorded
path folded into one column), aligned on the shared event where a rank's path left the others'
(else on the last event every column recorded), with the divergence marked. From the
TraceReport only: nothing is re-analysed."""

from __future__ import annotations

from typing import Any

from mldebug.findings import findings_to_json
from mldebug.htmlview import SEQ_STEP_US, page, trace_event_doc, trace_event_process
from mldebug.render import fold_ints
from mldebug.trace.model import TraceReport

BEFORE = 40  # events shown before the anchor
MAX_COLUMNS = 48


def align(report: TraceReport) -> dict[str, Any]:
    """Columns of folded ranks, each a list of (row, event index) on one shared row axis."""
    locs: dict[tuple[str, int, str], int] = {}
    loc_list: list[dict[str, Any]] = []
    folded: dict[tuple[tuple[str, int, str], ...], list[Any]] = {}
    for t in report.traces:
        folded.setdefault(tuple(e.key for e in t.events), []).append(t)
    cols = sorted(folded.values(), key=lambda ts: (-len(ts), ts[0].label))[:MAX_COLUMNS]
    common: set[tuple[str, int, str]] | None = None
    for ts in cols:
        keys = {e.key for e in ts[0].events}
        common = keys if common is None else common & keys
    div = next((d for d in report.divergences if d.branch is not None), None)
    anchor_key = div.branch.key if div is not None and div.branch is not None else None
    if anchor_key is None and cols and common:
        anchor_key = next((e.key for e in reversed(cols[0][0].events) if e.key in common), None)
    anchors = []
    for ts in cols:
        ev = ts[0].events
        anchors.append(next((i for i in range(len(ev) - 1, -1, -1) if ev[i].key == anchor_key),
                            len(ev) - 1))
    before = min(BEFORE, max(anchors, default=0))
    out_cols = []
    for ts, anchor in zip(cols, anchors, strict=True):
        ev = ts[0].events
        ranks = sorted(t.rank for t in ts if t.rank is not None)
        label = (f"ranks {fold_ints(ranks)}" if len(ranks) > 1 else f"rank {ranks[0]}"
                 if ranks else ", ".join(t.label for t in ts[:3]))
        hosts = sorted({t.host for t in ts})
        mine = [d for d in report.divergences if set(d.labels) & {t.label for t in ts}]
        cells = []
        left_row = branch_row = None
        for i in range(max(0, anchor - before), len(ev)):
            e = ev[i]
            k = locs.get(e.key)
            if k is None:
                k = locs[e.key] = len(loc_list)
                loc_list.append({"file": e.file, "line": e.line, "func": e.func, "text": e.text,
                                 "where": e.where})
            row = i - anchor + before
            cells.append((row, k))
            for d in mine:
                if e.key == d.left_at.key and i > anchor - 1 and left_row is None:
                    left_row = row
                if d.branch is not None and i == anchor and e.key == d.branch.key:
                    branch_row = row
        out_cols.append({"label": label, "ranks": ranks, "hosts": hosts, "cells": cells,
                         "anchor_row": before if ev else None, "left_row": left_row,
                         "branch_row": branch_row, "divergent": bool(mine),
                         "kind": ts[0].kind, "reason": ts[0].reason})
    return {"locs": loc_list, "columns": out_cols, "anchor": before,
            "omitted_columns": max(0, len(folded) - MAX_COLUMNS)}


def trace_data(report: TraceReport, title: str) -> dict[str, Any]:
    al = align(report)
    return dict(al, title=title, ranks=len(report.traces),
                findings=findings_to_json(report.findings), errors=report.errors[:50],
                divergences=[{"ranks": fold_ints(d.ranks) if d.ranks else ", ".join(d.labels),
                              "branch": d.branch.describe() if d.branch else None,
                              "left_at": d.left_at.describe(), "others": fold_ints(d.others)}
                             for d in report.divergences])


_CSS = """#grid td{font:11px monospace;white-space:nowrap;max-width:360px;overflow:hidden;
text-overflow:ellipsis;padding:1px 5px}#grid td.anchor{background:#fff5cc}
#grid td.left{background:#f8c9c4;font-weight:700}#grid th.div{color:#c0392b}"""
_BODY = """<div id="summary" class="card"></div><div id="divs"></div><div id="findings"></div>
<h3>Recorded paths, aligned on the last common call (yellow); red: where a rank left the
others' path</h3><table id="grid"></table>"""
_JS = r"""
document.getElementById("summary").textContent = D.ranks + " rank ring(s) in " + D.columns.length +
  " column(s) (ranks with the same path folded)" + (D.omitted_columns ? "; " + D.omitted_columns + " more not shown" : "");
const dv = document.getElementById("divs");
for (const d of D.divergences) { const c = h("div", "card divergence");
  add(c, h("b", "bad", "rank(s) " + d.ranks + " left the others' path at " + d.left_at),
    h("div", "", (d.branch ? "after " + d.branch + "; " : "") + (d.others ? "ranks " + d.others + " never reached it" : "")));
  dv.appendChild(c); }
findings(document.getElementById("findings"), D.findings);
const grid = document.getElementById("grid"), hr = h("tr"); add(hr, h("th", "", ""));
for (const c of D.columns) { const th = h("th", c.divergent ? "div" : "", c.label + (c.hosts.length ? " (" + c.hosts.slice(0, 3).join(",") + (c.hosts.length > 3 ? ",..." : "") + ")" : ""));
  th.title = c.kind + " ring, written on: " + c.reason; hr.appendChild(th); }
grid.appendChild(hr);
let maxRow = 0; for (const c of D.columns) for (const [r] of c.cells) if (r > maxRow) maxRow = r;
const at = D.columns.map(c => { const m = new Map(); for (const [r, k] of c.cells) m.set(r, k); return m; });
for (let r = 0; r <= maxRow; r++) { const tr = h("tr"); add(tr, h("td", "muted", r === D.anchor ? "\u25b6" : String(r - D.anchor)));
  D.columns.forEach((c, j) => { const k = at[j].get(r); const L = k === undefined ? null : D.locs[k];
    const td = h("td", r === c.left_row ? "left" : r === c.anchor_row ? "anchor" : "", L ? L.where + (L.text ? "  " + L.text : "") : "");
    if (L) td.title = L.file + ":" + L.line + " in " + L.func + (L.text ? "\n" + L.text : "") + (r === c.left_row ? "\nleft the others' path here" : "");
    if (r === c.left_row) td.id = "left" + j;
    tr.appendChild(td); });
  grid.appendChild(tr); }
"""


def trace_html(report: TraceReport, title: str = "mldebug trace show") -> str:
    return page(title, "trace", trace_data(report, title), _JS, _BODY, _CSS)


def trace_trace(report: TraceReport) -> str:
    """``trace show``'s rings as a trace: rank = process, recorded call = slice, the rings
    aligned on the last call every rank recorded (a flow links it across ranks)."""
    cols = align(report)
    events: list[dict[str, Any]] = []
    anchor_hits: list[tuple[int, int]] = []
    for pid, col in enumerate(cols["columns"]):
        events += trace_event_process(pid, col["label"], pid)
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"name": "main thread"}})
        for row, k in col["cells"]:
            loc = cols["locs"][k]
            ts = row * SEQ_STEP_US
            events.append({"name": loc["func"], "cat": "call", "ph": "X", "ts": ts,
                           "dur": SEQ_STEP_US * 8 // 10, "pid": pid, "tid": 0,
                           "args": {"file": loc["file"], "line": loc["line"], "text": loc["text"],
                                    "left_here": bool(col.get("left_row") == row)}})
        if col.get("anchor_row") is not None:
            anchor_hits.append((pid, col["anchor_row"] * SEQ_STEP_US))
    for k, (pid, ts) in enumerate(anchor_hits if len(anchor_hits) > 1 else []):
        ph = "s" if k == 0 else "f" if k == len(anchor_hits) - 1 else "t"
        ev: dict[str, Any] = {"name": "last common call", "cat": "match", "ph": ph, "id": 1,
                              "ts": ts, "pid": pid, "tid": 0}
        if ph != "s":
            ev["bp"] = "e"
        events.append(ev)
    return trace_event_doc(events, {"tool": "mldebug trace show", "axis": "sequence (aligned)"})
