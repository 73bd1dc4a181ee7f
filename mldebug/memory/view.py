"""``mem top --watch`` as a picture: every rank's RSS (and GPU memory when known) over the
watch, one line per rank, hosts folded in the legend, the ranks a leak finding names drawn
thick and red on top. From the TopReport (its per-rank samples) only."""

from __future__ import annotations

from typing import Any

from mldebug.findings import findings_to_json, fold_hosts
from mldebug.htmlview import page
from mldebug.memory.model import TopReport


def mem_data(rep: TopReport, title: str) -> dict[str, Any]:
    t0 = min((s[0] for p in rep.processes for s in p.samples), default=0.0)
    lines = []
    for p in rep.processes:
        lines.append({"rank": p.rank, "host": p.host, "pid": p.pid, "job": p.job,
                      "t": [round(s[0] - t0, 3) for s in p.samples],
                      "rss": [s[1] for s in p.samples],
                      "gpu": [s[2] for s in p.samples] if any(s[2] is not None
                                                              for s in p.samples) else None,
                      "rate": p.rss_rate, "leak": p.leak})
    hosts: dict[str, list[int]] = {}
    for p in rep.processes:
        hosts.setdefault(p.host, []).append(p.rank if p.rank is not None else -1)
    return {"title": title, "watch": rep.watch, "lines": lines,
            "hosts": fold_hosts(sorted(hosts)), "nhosts": len(hosts),
            "findings": findings_to_json(rep.findings)[:20]}


_BODY = """<div id="summary" class="card"></div><div id="findings"></div>
<canvas id="cv" width="1100" height="460"></canvas><div id="legend"></div>"""
_JS = r"""
const L = D.lines;
document.getElementById("summary").textContent = L.length + " rank process(es) on " + D.nhosts + " host(s) (" + D.hosts + "), watched " + D.watch + " s";
findings(document.getElementById("findings"), D.findings);
function fmt(b){const u=["B","KiB","MiB","GiB","TiB"];let i=0;while(b>=1024&&i<4){b/=1024;i++;}return (i?b.toFixed(1):b.toFixed(0))+" "+u[i];}
const cv = document.getElementById("cv"), g = cv.getContext("2d");
const X0 = 80, Y0 = 15, PW = cv.width - X0 - 20, PH = cv.height - Y0 - 35;
let tmax = 0.001, vmin = Infinity, vmax = 0;
for (const l of L) for (let i = 0; i < l.t.length; i++) { tmax = Math.max(tmax, l.t[i]); vmin = Math.min(vmin, l.rss[i]); vmax = Math.max(vmax, l.rss[i]); }
if (!isFinite(vmin)) vmin = 0; const pad = Math.max(1, (vmax - vmin) * 0.08); vmin = Math.max(0, vmin - pad); vmax += pad;
const X = t => X0 + PW * t / tmax, Y = v => Y0 + PH - PH * (v - vmin) / (vmax - vmin);
g.strokeStyle = "#000"; g.beginPath(); g.moveTo(X0, Y0); g.lineTo(X0, Y0 + PH); g.lineTo(X0 + PW, Y0 + PH); g.stroke();
g.fillStyle = "#000"; g.font = "11px sans-serif";
for (let q = 0; q <= 4; q++) { const v = vmin + (vmax - vmin) * q / 4; g.fillText(fmt(v), 4, Y(v) + 4); }
g.fillText("seconds", X0 + PW / 2, cv.height - 6); g.fillText("0", X0, Y0 + PH + 14); g.fillText(tmax.toFixed(1), X0 + PW - 20, Y0 + PH + 14);
const order = L.map((l, i) => i).sort((a, b) => (L[a].leak - L[b].leak));
for (const i of order) { const l = L[i]; g.strokeStyle = l.leak ? "#d62728" : "rgba(90,110,140,0.55)"; g.lineWidth = l.leak ? 3 : 1.2;
  g.beginPath(); l.t.forEach((t, k) => k ? g.lineTo(X(t), Y(l.rss[k])) : g.moveTo(X(t), Y(l.rss[k]))); g.stroke();
  if (l.leak && l.t.length) { g.fillStyle = "#d62728"; g.font = "bold 12px sans-serif"; g.fillText("rank " + l.rank, X(l.t[l.t.length - 1]) - 50, Y(l.rss[l.rss.length - 1]) - 6); } }
const leg = document.getElementById("legend"), byHost = {};
for (const l of L) (byHost[l.host] = byHost[l.host] || []).push(l);
for (const [host, ls] of Object.entries(byHost)) { const d = h("div", "card host");
  add(d, h("b", "", host + ": ranks " + fold(ls.filter(l => l.rank !== null).map(l => l.rank))));
  for (const l of ls.filter(l => l.leak)) add(d, h("div", "bad leak", "rank " + l.rank + " (pid " + l.pid + ") grows " + (l.rate / 1048576).toFixed(1) + " MiB/s: " + fmt(l.rss[0]) + " -> " + fmt(l.rss[l.rss.length - 1])));
  const others = ls.filter(l => !l.leak); if (others.length) add(d, h("div", "muted", others.length + " other rank(s): " + others.map(l => "rank " + l.rank + " " + fmt(l.rss[l.rss.length - 1])).slice(0, 16).join(", ")));
  leg.appendChild(d); }
cv.addEventListener("mousemove", ev => { const b = cv.getBoundingClientRect(), x = ev.clientX - b.left, y = ev.clientY - b.top;
  let best = null, bd = 12; for (const l of L) l.t.forEach((t, k) => { const d = Math.hypot(X(t) - x, Y(l.rss[k]) - y); if (d < bd) { bd = d; best = [l, k]; } });
  tip(ev, best ? "rank " + best[0].rank + " (" + best[0].host + ", pid " + best[0].pid + ") at " + best[0].t[best[1]] + " s: RSS " + fmt(best[0].rss[best[1]]) : ""); });
cv.addEventListener("mouseleave", ev => tip(ev, ""));
"""


def mem_html(rep: TopReport, title: str = "mldebug mem top --watch") -> str:
    return page(title, "mem", mem_data(rep, title), _JS, _BODY)
