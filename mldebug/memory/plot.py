"""The active-memory timeline of a snapshot, stacked by allocation site: PNG/SVG through
matplotlib, or one self-contained HTML file (data and drawing script inline, no network) that
opens on an offline cluster - unlike ``_memory_viz trace_plot``, whose page loads its viewer
from a CDN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mldebug.errors import MldebugError, UsageError
from mldebug.memory.snapshot import SiteTable, _num, replay, sites_at
from mldebug.memory.units import fmt_bytes

OTHER = "other sites"


@dataclass
class Timeline:
    """Bytes live per site at ``points`` event indices (one device; at most ``len(points)``)."""

    device: int
    events: int
    points: list[int] = field(default_factory=list)
    sites: list[str] = field(default_factory=list)  # the stacked series, largest first
    series: list[list[int]] = field(default_factory=list)  # series[k][j]: site k at points[j]
    peak: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "events": self.events, "points": self.points,
                "sites": self.sites, "series": self.series, "peak": self.peak}


def timeline(doc: dict[str, Any], device: int | None = None, width: int = 1500,
             top: int = 12) -> Timeline:
    """Sample the per-site live bytes at ``width`` evenly spaced events; the ``top`` sites at
    the peak get a series each, the rest are summed into one."""
    traces = doc.get("device_traces") or []
    devs = [d for d, t in enumerate(traces) if isinstance(t, list) and t]
    if not devs:
        raise MldebugError("the snapshot has no allocation trace, so there is no timeline.",
                           "Record one: torch.cuda.memory._record_memory_history(max_entries="
                           "100000) before the steps (or use mldebug.memory.record()).")
    if device is None:
        device = devs[0]
    elif device not in devs:
        raise UsageError(f"device {device} has no trace in this snapshot.",
                         f"Pick one of: {', '.join(map(str, devs))}.")
    trace = traces[device]
    sites = SiteTable()
    segs = [s for s in doc.get("segments") or [] if isinstance(s, dict)
            and _num(s.get("device")) == device]
    final = sum(_num(b.get("size")) for s in segs for b in s.get("blocks") or []
                if isinstance(b, dict) and b.get("state") == "active_allocated")
    r = replay(trace, device, sites, final if segs else None, None)
    at_peak = sites_at(trace, r, r.peak_event)
    ranked = [s for s, b in sorted(at_peak.items(), key=lambda kv: -kv[1]) if b > 0][:top]
    slot = {s: k for k, s in enumerate(ranked)}
    other = len(ranked)
    n = len(trace)
    step = max(1, n // width)
    cur = [0] * (other + 1)
    if r.before_trace:
        cur[slot.get(2, other)] += r.before_trace
    tl = Timeline(device, n, peak=r.peak_allocated,
                  sites=[sites.names[s] for s in ranked] + [OTHER])
    cols: list[list[int]] = []
    live: dict[int, tuple[int, int]] = {}
    pending: set[int] = set()
    site_of = r.site_of
    for i, e in enumerate(trace):
        sid = site_of[i]
        if sid >= 0:
            size = _num(e.get("size"))
            k = slot.get(sid, other)
            live[_num(e.get("addr"))] = (size, k)
            cur[k] += size
        elif type(e) is dict:
            a = e.get("action")
            if a == "free_requested" or a == "free_completed":
                addr = _num(e.get("addr"))
                if a == "free_completed" and addr in pending:
                    pending.discard(addr)
                else:
                    if a == "free_requested":
                        pending.add(addr)
                    got = live.pop(addr, None)
                    if got is not None:
                        cur[got[1]] -= got[0]
                    else:
                        cur[slot.get(2, other)] -= _num(e.get("size"))
        if i % step == 0 or i == r.peak_event or i == n - 1:
            tl.points.append(i)
            cols.append(list(cur))
    tl.series = [[c[k] for c in cols] for k in range(other + 1)]
    if not any(tl.series[-1]):
        tl.sites.pop()
        tl.series.pop()
    return tl


def write(tl: Timeline, out: Path, title: str) -> str:
    """Write ``out`` by its suffix: .png / .svg (matplotlib) or .html (self-contained)."""
    suffix = out.suffix.lower()
    if suffix == ".html":
        out.write_text(html(tl, title))
        return "html"
    if suffix not in (".png", ".svg"):
        raise UsageError(f"cannot tell the format of {out.name}.",
                         "Name the output .png, .svg or .html.")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MldebugError("PNG/SVG plots need matplotlib, which is not installed.",
                           "pip install 'mldebug[plot]', or write .html (no dependency).") from None
    fig, ax = plt.subplots(figsize=(12, 5.5), dpi=110)
    gib = 1024.0**3
    unit, div = ("GiB", gib) if tl.peak >= gib else ("MiB", 1024.0**2)
    ax.stackplot(tl.points, [[v / div for v in s] for s in tl.series],
                 labels=[_short(s) for s in tl.sites], linewidth=0)
    ax.set_xlabel("allocator event")
    ax.set_ylabel(f"active memory ({unit})")
    ax.set_title(f"{title}: device {tl.device}, peak {fmt_bytes(tl.peak)}")
    ax.set_xlim(0, max(1, tl.events - 1))
    ax.legend(loc="upper left", fontsize=7, framealpha=0.85)
    fig.tight_layout()
    fig.savefig(out, format=suffix[1:], metadata=_no_version_metadata(suffix))
    plt.close(fig)
    return suffix[1:]


def _no_version_metadata(suffix: str) -> dict[str, Any]:
    # matplotlib writes its version into the file; keep outputs comparable across machines
    return {"Software": None} if suffix == ".png" else {"Creator": None, "Date": None}


def _short(site: str, n: int = 60) -> str:
    return site if len(site) <= n else "..." + site[-n + 3:]


_HTML = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>body{font:13px sans-serif;margin:16px}#tip{position:absolute;background:#fff;
border:1px solid #888;padding:4px;pointer-events:none;display:none;white-space:pre}
#legend div{margin:2px 0}#legend span{display:inline-block;width:12px;height:12px;
margin-right:6px;vertical-align:middle}</style></head><body>
<h3 id="title"></h3><canvas id="c" width="1100" height="480"></canvas>
<div id="legend"></div><div id="tip"></div>
<script>
const D = __DATA__;
const C = ["#4e79a7","#f28e2b","#e15759","#76b7b2","#59a14f","#edc948","#b07aa1","#ff9da7",
           "#9c755f","#bab0ac","#86bcb6","#d37295","#8cd17d"];
function fmt(b){const u=["B","KiB","MiB","GiB","TiB"];let i=0;while(b>=1024&&i<4){b/=1024;i++;}
  return (i?b.toFixed(2):b.toFixed(0))+" "+u[i];}
document.getElementById("title").textContent = D.title + " - device " + D.device +
  ", peak " + fmt(D.peak) + ", " + D.events + " events";
const cv = document.getElementById("c"), g = cv.getContext("2d");
const L = 70, R = 10, T = 10, B = 30, W = cv.width - L - R, H = cv.height - T - B;
const n = D.points.length, tot = new Array(n).fill(0);
for (const s of D.series) for (let j = 0; j < n; j++) tot[j] += s[j];
const ymax = Math.max(1, ...tot), xmax = Math.max(1, D.events - 1);
const X = i => L + W * i / xmax, Y = v => T + H - H * v / ymax;
let base = new Array(n).fill(0);
D.series.forEach((s, k) => {
  const top = base.map((b, j) => b + s[j]);
  g.beginPath(); g.moveTo(X(D.points[0]), Y(base[0]));
  for (let j = 0; j < n; j++) g.lineTo(X(D.points[j]), Y(top[j]));
  for (let j = n - 1; j >= 0; j--) g.lineTo(X(D.points[j]), Y(base[j]));
  g.closePath(); g.fillStyle = C[k % C.length]; g.fill(); base = top;
  const d = document.createElement("div"), sw = document.createElement("span");
  sw.style.background = C[k % C.length]; d.appendChild(sw);
  d.appendChild(document.createTextNode(D.sites[k] + "  (at peak " +
    fmt(s[D.points.indexOf(D.peak_event)] || 0) + ")"));
  document.getElementById("legend").appendChild(d);
});
g.strokeStyle = "#000"; g.beginPath(); g.moveTo(L, T); g.lineTo(L, T + H); g.lineTo(L + W, T + H);
g.stroke(); g.fillStyle = "#000";
for (let q = 0; q <= 4; q++) { g.fillText(fmt(ymax * q / 4), 2, Y(ymax * q / 4) + 4); }
g.fillText("allocator event", L + W / 2 - 30, cv.height - 6);
const tip = document.getElementById("tip");
cv.addEventListener("mousemove", ev => {
  const r = cv.getBoundingClientRect(), x = ev.clientX - r.left;
  let j = 0; while (j < n - 1 && X(D.points[j + 1]) < x) j++;
  const rows = D.sites.map((s, k) => [D.series[k][j], s]).filter(a => a[0] > 0)
    .sort((a, b) => b[0] - a[0]).slice(0, 8).map(a => fmt(a[0]) + "  " + a[1]);
  tip.textContent = "event " + D.points[j] + ": " + fmt(tot[j]) + "\\n" + rows.join("\\n");
  tip.style.left = (ev.pageX + 12) + "px"; tip.style.top = (ev.pageY + 12) + "px";
  tip.style.display = "block";
});
cv.addEventListener("mouseleave", () => { tip.style.display = "none"; });
</script></body></html>
"""


def html(tl: Timeline, title: str) -> str:
    """One page, no external resource: the data as inline JSON, drawn on a canvas."""
    data = dict(tl.to_dict(), title=title,
                peak_event=max(range(len(tl.points)),
                               key=lambda j: sum(s[j] for s in tl.series)) if tl.points else 0)
    data["peak_event"] = tl.points[data["peak_event"]] if tl.points else 0
    # the shared escaping (mldebug.htmlview): no '</script>' and no 'scheme://' can appear
    # in the page, whatever the file names in the snapshot say
    from mldebug.htmlview import embed, esc

    return _HTML.replace("__TITLE__", esc(title)).replace("__DATA__", embed(data))
