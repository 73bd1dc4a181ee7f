"""``hang --watch`` as a picture: per job, each group of ranks (same stack, hosts folded) at
the first dump and at the second, with its state - stuck (the same stack), spinning (a new
stack, the same innermost user frame) or progressing (elsewhere) - and the suspects named.
From the hang Report only."""

from __future__ import annotations

from typing import Any

from mldebug.findings import findings_to_json, fold_hosts
from mldebug.hang.model import Process, Report, main_thread
from mldebug.htmlview import page
from mldebug.render import fold_ints


def _where(p: Process, later: bool) -> str:
    from mldebug.hang.analyze import where

    threads = p.threads_later if later else p.threads
    t = main_thread(threads or [], p.pid)
    return where(t.frames) if t is not None else "(no stack)"


def hang_data(report: Report, title: str) -> dict[str, Any]:
    jobs = []
    for job in report.jobs:
        by_key = {(p.host, p.pid): p for p in job.processes}
        suspects = {(s.host, s.pid) for s in job.suspects}
        rows: list[dict[str, Any]] = []
        for g in job.groups:
            members = [by_key[k] for k in g.pids if k in by_key]
            first = sorted({_where(p, False) for p in members})
            later = sorted({_where(p, True) for p in members if p.threads_later is not None})
            state = g.state or "one dump"
            if g.state == "moving":
                state = "spinning" if later == first else "progressing"
            rows.append({"ranks": fold_ints(g.ranks) if g.ranks else
                         ", ".join(f"{h}:{pid}" for h, pid in g.pids[:4]),
                         "n": len(g.pids), "hosts": fold_hosts(sorted(set(g.hosts))),
                         "collective": g.collective or "", "first": first[:3],
                         "later": later[:3], "state": state,
                         "suspect": any(k in suspects for k in g.pids)})
        rows.sort(key=lambda r: (not r["suspect"], -int(r["n"])))
        jobs.append({"key": job.key, "verdict": job.verdict.title, "kind": job.kind.value,
                     "world": job.world_size, "missing": fold_ints(job.missing_ranks),
                     "suspects": [{"rank": s.rank, "host": s.host, "pid": s.pid,
                                   "reason": s.reason, "site": s.call_site or ""}
                                  for s in job.suspects[:64]],
                     "rows": rows})
    return {"title": title, "watch": report.watch, "jobs": jobs,
            "findings": findings_to_json(report.findings)[:20],
            "errors": [f"{e.host}: {e.error}" for e in report.errors[:20]]}


_CSS = """.st{display:inline-block;padding:1px 7px;border-radius:3px;color:#fff;font-weight:600}
.st-stuck{background:#c0392b}.st-spinning{background:#e67e22}.st-progressing{background:#2e7d32}
.st-mixed{background:#8e44ad}.st-one{background:#888}td.loc{font:11px monospace}
tr.suspect td{background:#fdecea}"""
_BODY = """<div id="summary" class="card"></div><div id="jobs"></div><div id="findings"></div>"""
_JS = r"""
document.getElementById("summary").textContent = D.watch !== null && D.watch !== undefined ?
  "two dumps " + D.watch + " s apart: stuck = same stack, spinning = new stack at the same line, progressing = elsewhere" : "one dump (no --watch)";
const jb = document.getElementById("jobs");
for (const j of D.jobs) { const c = h("div", "card job");
  add(c, h("b", j.kind === "ok" ? "" : "bad", "job " + (j.key || "(this job)") + ": " + j.verdict));
  if (j.missing) add(c, h("div", "bad", "missing ranks " + j.missing));
  for (const s of j.suspects) add(c, h("div", "suspect bad", "suspect rank " + s.rank + " (" + s.host + (s.pid === null ? ", no process" : ", pid " + s.pid) + "): " + s.reason + (s.site ? " at " + s.site : "")));
  const t = h("table"); add(t, add(h("tr"), h("th", "", "ranks"), h("th", "", "hosts"), h("th", "", "t = 0"), h("th", "", "t = " + (D.watch || 0) + " s"), h("th", "", "state")));
  for (const r of j.rows) { const tr = h("tr", r.suspect ? "suspect" : "");
    const st = h("span", "st st-" + (r.state === "one dump" ? "one" : r.state), r.state);
    add(tr, h("td", "", r.ranks + " (" + r.n + ")"), h("td", "", r.hosts), h("td", "loc", r.first.join("\n")),
      h("td", "loc", r.later.join("\n") || "-"), add(h("td"), st)); t.appendChild(tr); }
  c.appendChild(t); jb.appendChild(c); }
findings(document.getElementById("findings"), D.findings);
"""


def hang_html(report: Report, title: str = "mldebug hang --watch") -> str:
    return page(title, "hang", hang_data(report, title), _JS, _BODY, _CSS)
