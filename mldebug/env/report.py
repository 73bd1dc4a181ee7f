"""Assemble the ``mldebug env`` report (pure) and render it (rich or JSON).

Findings come first (errors, warnings, hints), then the facts: one compact block for a single
node, or for many nodes the differences as a table with the odd nodes highlighted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mldebug.env.diff import DiffRow, diff, hosts_label, merge_findings
from mldebug.env.facts import NodeFacts
from mldebug.env.rules import check, socket_selection
from mldebug.findings import Finding, Severity, findings_to_json, sort_findings
from mldebug.hosts import collapse
from mldebug.redact import redact_value

if TYPE_CHECKING:
    from rich.console import Console

SCHEMA = 1
MAX_VALUES = 6  # distinct values shown per differing fact


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
    findings += unreachable_findings(unreachable or {})
    return EnvReport(list(nodes), dict(unreachable or {}), sort_findings(findings), rows)


def unreachable_findings(unreachable: dict[str, str]) -> list[Finding]:
    """One finding per reason (the host's own name taken out of it), hosts folded."""
    by_reason: dict[str, list[str]] = {}
    for host, why in unreachable.items():
        by_reason.setdefault(why.replace(host, "<host>"), []).append(host)
    return [Finding(Severity.ERROR,
                    f"no facts from {hosts[0] if len(hosts) == 1 else f'{len(hosts)} nodes'}",
                    f"{collapse(hosts)}: {why}",
                    "check the node is up and reachable over ssh, then rerun.",
                    "node-unreachable", tuple(hosts))
            for why, hosts in sorted(by_reason.items(), key=lambda kv: -len(kv[1]))]


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
         + (", container" if n.os.get("container") else "")
         + (f", {n.os['glibc']}" if n.os.get("glibc") else "")),
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
    packages = n.raw.get("packages")
    if isinstance(packages, dict) and packages:
        lines.append(("packages", ", ".join(f"{k} {v}" for k, v in sorted(packages.items()))))
    for k, v in n.env.items():
        lines.append((k, redact(k, v)))
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
        table = Table(title="Differences across nodes (majority value first, the odd ones in "
                      "red)", title_justify="left")
        table.add_column("fact / variable")
        table.add_column("value", overflow="fold")
        table.add_column("nodes", overflow="fold")
        table.add_column("#", justify="right")
        for row in report.differences:
            distinct = row.distinct()
            for i, (value, hosts) in enumerate(distinct[:MAX_VALUES]):
                style = "" if i == 0 else "bold red"
                table.add_row(row.key if i == 0 else "", Text(value, style=style),
                              Text(hosts_label(hosts, i == 0), style=style), str(len(hosts)))
            if len(distinct) > MAX_VALUES:
                rest = distinct[MAX_VALUES:]
                table.add_row("", Text(f"... {len(rest)} more values", style="dim"),
                              Text(collapse([h for _, hs in rest for h in hs]), style="dim"),
                              str(sum(len(hs) for _, hs in rest)))
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


# ------------------------------------------------------------------ --markdown
def redact(name: str, value: str) -> str:
    """The value, or '<redacted>' when the name or the value looks like a secret
    (``mldebug.redact``'s one rule)."""
    return redact_value(name, value)


def _package(n: NodeFacts, name: str) -> str | None:
    packages = n.raw.get("packages")
    return str(packages.get(name)) if isinstance(packages, dict) and name in packages else None


def markdown(report: EnvReport) -> str:
    """The block to paste into a bug report: versions, hardware, variables, findings.

    Like ``python -m torch.utils.collect_env`` and ``accelerate env``, plus NCCL, the GPU
    topology and mldebug's findings. Values that look like tokens or passwords are redacted.
    """
    out = ["<details><summary>mldebug env --markdown</summary>", ""]
    n = report.nodes[0] if report.nodes else None
    if n is not None:
        t, g, o = n.torch, n.gpus, n.os
        gpus = ", ".join(f"{c} x {name}" for name, c in sorted(
            {str(d.get("name")): sum(1 for e in g.get("devices") or [] if e.get("name") == d.get("name"))
             for d in g.get("devices") or []}.items())) or "none" + (f" ({g['note']})" if g.get("note") else "")
        rows = [
            ("nodes", f"{len(report.nodes)}" + (f" (+{len(report.unreachable)} unreachable)"
                                                 if report.unreachable else "")
             + (f": {collapse([x.host for x in report.nodes])}" if len(report.nodes) > 1 else "")),
            ("OS", f"{o.get('name')} (kernel {o.get('kernel')}, {o.get('machine') or '?'})"
             + (", in a container" if o.get("container") else "")),
            ("glibc", str(o.get("glibc") or "?")),
            ("CPU", f"{o.get('cpu_model') or '?'} ({o.get('cpus')} CPUs)"),
            ("Python", f"{n.python.get('version')} ({n.python.get('executable')})"),
            ("torch", str(t.get("version") or t.get("status") or "?")),
            ("CUDA (torch build)", str(t.get("cuda") or ("none" if t.get("version") else "?"))),
            ("cuDNN", str(t.get("cudnn") or _package(n, "nvidia-cudnn-cu12")
                          or "? (--torch-import reads it)")),
            ("NCCL", str(t.get("nccl") or "?")),
            ("NVIDIA driver", str(g.get("driver") or "none")),
            ("GPUs", gpus),
        ]
        out += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
        packages = n.raw.get("packages")
        if isinstance(packages, dict) and packages:
            out += ["", "Packages: " + ", ".join(f"{k} {v}" for k, v in sorted(packages.items()))]
        topo = n.raw.get("topology")
        if topo:
            out += ["", "GPU topology (`nvidia-smi topo -m`):", "", "```", str(topo).rstrip(), "```"]
        if n.env:
            out += ["", "Environment variables set:", "", "```"]
            out += [f"{k}={redact(k, v)}" for k, v in n.env.items()]
            out += ["```"]
    if report.differences:
        out += ["", "Differences across nodes:", ""]
        out += [f"- {row.key}: {row.summary()}" for row in report.differences]
    out += ["", "Findings:", ""]
    if not report.findings:
        out.append("- none")
    for f in report.findings:
        hosts = f" [{collapse(list(f.hosts))}]" if f.hosts and len(report.nodes) > 1 else ""
        out.append(f"- **{f.severity.value}** {f.title}{hosts} (`{f.code}`)")
    out += ["", "</details>", ""]
    return "\n".join(out)
