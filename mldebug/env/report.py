"""Assemble the ``mldebug env`` report (pure) and render it (rich or JSON).

Findings come first (errors, warnings, hints), then the facts: one compact block for a single
node, or for many nodes the differences as a table with the odd nodes highlighted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mldebug.env.diff import DiffRow, diff, merge_findings
from mldebug.env.facts import NodeFacts
from mldebug.env.rules import check, socket_selection
from mldebug.findings import Finding, Severity, findings_to_json, sort_findings

if TYPE_CHECKING:
    from rich.console import Console

SCHEMA = 1


@dataclass
class EnvReport:
    nodes: list[NodeFacts]
    unreachable: dict[str, str] = field(default_factory=dict)  # host -> why
    findings: list[Finding] = field(default_factory=list)
    differences: list[DiffRow] = field(default_factory=list)

    @property
    def has_errors(self) -> bool:
        return any(f.severity is Severity.ERROR for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "findings": findings_to_json(self.findings),
            "differences": [r.to_dict() for r in self.differences],
            "unreachable": self.unreachable,
            "nodes": [{**n.raw, "host": n.host, "hostname": n.raw.get("host")}
                      for n in self.nodes],
        }


def build_report(nodes: Sequence[NodeFacts], unreachable: dict[str, str] | None = None) -> EnvReport:
    """Run every rule on every node, merge identical findings, add the cross-node diff."""
    findings = merge_findings([check(n) for n in nodes])
    rows, diff_findings = diff(nodes)
    findings += diff_findings
    for host, why in (unreachable or {}).items():
        findings.append(Finding(Severity.ERROR, f"no facts from {host}", why,
                                "check the node is up and reachable over ssh, then rerun.",
                                "node-unreachable", (host,)))
    return EnvReport(list(nodes), dict(unreachable or {}), sort_findings(findings), rows)


# ------------------------------------------------------------------ rendering
def _size(n: Any) -> str:
    if not isinstance(n, int):
        return "unlimited" if n is None else "?"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def fact_lines(n: NodeFacts) -> list[tuple[str, str]]:
    """Facts of one node as (label, value) pairs, in reading order."""
    t = n.torch
    if t.get("status") == "ok":
        torch = f"{t.get('version')}"
        extra = []
        if t.get("cuda"):
            extra.append(f"CUDA {t['cuda']}")
        if t.get("hip"):
            extra.append(f"HIP {t['hip']}")
        if not t.get("cuda") and not t.get("hip"):
            extra.append("CPU-only build")
        extra.append(f"NCCL {t.get('nccl') or 'n/a'}")
        if t.get("backends"):
            extra.append("backends: " + ",".join(k for k, v in t["backends"].items() if v))
        torch += " (" + ", ".join(extra) + ")"
    else:
        torch = f"{t.get('status', '?')}: {t.get('error', '')}".strip(": ")
    g = n.gpus
    if g.get("devices"):
        names = sorted({str(d.get("name")) for d in g["devices"]})
        gpus = f"{len(g['devices'])} x {', '.join(names)}, driver {g.get('driver')}"
    else:
        gpus = "no GPU" + (f" ({g['note']})" if g.get("note") else "")
    ifaces = ", ".join(
        f"{i.name}[{i.kind}]" + (f"={i.addresses[0]}" if i.addresses else "")
        + ("" if i.running else " (down)") for i in n.interfaces) or "none"
    ib = ", ".join(f"{p.device}:{p.port}/{p.link_layer or '?'} {p.state}" for p in n.ib_ports)
    lim = n.limits
    pt = n.ptrace
    scope = pt.get("yama_ptrace_scope")
    ptrace = (f"yama scope {scope}" if scope is not None else "no yama") + \
        (", CAP_SYS_PTRACE" if pt.get("cap_sys_ptrace") else ", no CAP_SYS_PTRACE")
    spy = n.py_spy
    py_spy = (f"{spy.get('path')} ({spy.get('version')})" if spy.get("runs")
              else ("missing" if not spy.get("path") else f"{spy.get('path')} (does not run)"))
    core = f"ulimit -c {_size(lim.get('core_soft')) if lim.get('core_soft') else '0'}, " \
        f"core_pattern {n.core.get('pattern')}"
    lines = [
        ("host", n.host),
        ("os", f"{n.os.get('name')}, kernel {n.os.get('kernel')}, {n.os.get('cpus')} CPUs"
         + (", container" if n.os.get("container") else "")),
        ("python", f"{n.python.get('version')} ({n.python.get('executable')})"),
        ("torch", torch),
        ("gpus", gpus),
        ("interfaces", ifaces),
        ("nccl sockets", ", ".join(socket_selection(n) or []) or "none"),
        ("infiniband", ib or "none"),
        ("/dev/shm", _size(lim.get("shm_bytes"))),
        ("memlock", _size(lim.get("memlock_soft"))),
        ("cgroup memory", _size(lim.get("cgroup_memory_bytes"))),
        ("ptrace", ptrace),
        ("py-spy", py_spy),
        ("core dumps", core),
    ]
    if n.master_addr:
        lines.append(("MASTER_ADDR", f"{n.master_addr.get('host')} -> "
                      + (", ".join(n.master_addr.get("addresses") or []) or "unresolved")))
    for p in n.ports:
        lines.append(("port", f"{p.get('target')}: "
                      + ("open" if p.get("open") else f"closed ({p.get('error')})")))
    for k, v in n.env.items():
        lines.append((k, v))
    return lines


def render(report: EnvReport, console: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    from mldebug.findings import render_findings

    counts = {s: sum(1 for f in report.findings if f.severity is s) for s in Severity}
    console.print(Text(
        f"mldebug env: {len(report.nodes)} node(s)"
        + (f", {len(report.unreachable)} unreachable" if report.unreachable else "")
        + f" - {counts[Severity.ERROR]} error(s), {counts[Severity.WARNING]} warning(s), "
        f"{counts[Severity.HINT]} hint(s)", style="bold"))
    render_findings(report.findings, console)
    if report.differences:
        console.print()
        table = Table(title="Differences across nodes (odd values in red)", title_justify="left")
        table.add_column("fact / variable")
        hosts = [n.host for n in report.nodes]
        for h in hosts:
            table.add_column(h)
        for row in report.differences:
            cells = [Text(row.values.get(h, "?"), style="bold red" if h in row.odd else "")
                     for h in hosts]
            table.add_row(row.key, *cells)
        console.print(table)
    if len(report.nodes) == 1:
        console.print()
        table = Table(show_header=False, box=None, pad_edge=False, title="Facts",
                      title_justify="left")
        table.add_column(style="cyan", no_wrap=True)
        table.add_column(overflow="fold")
        for k, v in fact_lines(report.nodes[0]):
            table.add_row(k, Text(v))
        console.print(table)
    elif report.nodes:
        same = [(k, v) for k, v in fact_lines(report.nodes[0])
                if k in ("torch", "python", "gpus", "os")
                and all(dict(fact_lines(n)).get(k) == v for n in report.nodes[1:])]
        if same:
            console.print()
            console.print(Text("Same on every node:", style="bold"))
            for k, v in same:
                console.print(f"  {k}: {v}")
