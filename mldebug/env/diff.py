"""Compare the facts of many nodes: what differs, which nodes are the odd ones out.

Pure: takes ``NodeFacts`` and returns ``DiffRow``s plus findings. A value held by fewer
nodes than the most common value marks those nodes as odd (ties: every node not holding the
first most-common value). Variables that differ by design (RANK, LOCAL_RANK, ...) are skipped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mldebug.env import ifname
from mldebug.env.facts import NodeFacts
from mldebug.env.rules import socket_selection
from mldebug.findings import Finding, Severity
from mldebug.hosts import collapse

# Differ between nodes by design.
PER_NODE_ENV = {"RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "ROLE_RANK", "SLURM_PROCID",
                "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_NODEID", "SLURM_LOCALID"}

MISSING = "(unset)"
MAX_ENV_LINES = 20


@dataclass
class DiffRow:
    key: str
    values: dict[str, str]  # host -> value
    odd: list[str] = field(default_factory=list)  # hosts holding a minority value

    def distinct(self) -> list[tuple[str, list[str]]]:
        """(value, hosts holding it), the majority value first, then by count."""
        by_value: dict[str, list[str]] = {}
        for host, value in self.values.items():
            by_value.setdefault(value, []).append(host)
        return sorted(by_value.items(), key=lambda kv: -len(kv[1]))  # stable: first seen on ties

    def summary(self, limit: int = 6) -> str:
        """'value [node[1-30]]; other [node31]' - folded hosts, readable at any node count."""
        parts = [f"{v} [{hosts_label(hs, i == 0)}]" for i, (v, hs) in enumerate(self.distinct())]
        more = len(parts) - limit
        return "; ".join(parts[:limit]) + (f"; and {more} more values" if more > 0 else "")

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "values": self.values, "odd": self.odd,
                "distinct": [{"value": v, "hosts": collapse(hs), "count": len(hs)}
                             for v, hs in self.distinct()]}


def hosts_label(hosts: list[str], majority: bool = False, width: int = 60) -> str:
    """Folded host list; the majority's, when long, as 'the other N nodes' (the odd ones
    are the interesting part and are listed next to it)."""
    text = collapse(hosts)
    return f"the other {len(hosts)} nodes" if majority and len(text) > width else text


def _fmt_bytes(n: Any) -> str:
    return f"{int(n) / 2**30:.1f}G" if isinstance(n, int) else "?"


# key -> (how to read it from a node, severity when it differs, why it matters)
FIELDS: dict[str, tuple[Callable[[NodeFacts], str], Severity, str]] = {
    "torch": (lambda f: str(f.torch.get("version") or f.torch.get("status") or "?"),
              Severity.ERROR, "ranks built against different torch versions can disagree "
              "on collective semantics and pickled objects"),
    "nccl": (lambda f: str(f.torch.get("nccl") or "?"), Severity.ERROR,
             "different NCCL versions across nodes can hang or corrupt collectives"),
    "torch.cuda": (lambda f: str(f.torch.get("cuda") or f.torch.get("hip") or "none"),
                   Severity.WARNING, "torch builds for different CUDA versions"),
    "driver": (lambda f: str(f.gpus.get("driver") or "?"), Severity.WARNING,
               "GPU driver versions differ"),
    "gpus": (lambda f: ", ".join(sorted({str(d.get("name")) for d in f.gpus.get("devices") or []}))
             + f" x{len(f.gpus.get('devices') or [])}" if f.gpus.get("devices") else "none",
             Severity.WARNING, "nodes have different GPUs"),
    "python": (lambda f: str(f.python.get("version") or "?"), Severity.WARNING,
               "Python versions differ"),
    "kernel": (lambda f: str(f.os.get("kernel") or "?"), Severity.HINT, "kernels differ"),
    "interfaces": (lambda f: ",".join(i.name for i in f.interfaces if i.usable) or "none",
                   Severity.WARNING, "nodes have different network interfaces"),
    "nccl socket ifaces": (lambda f: ",".join(socket_selection(f) or []) or "none",
                           Severity.WARNING, "NCCL would use different interfaces on different "
                           "nodes"),
    "ib devices": (lambda f: ",".join(f.ib_devices) or "none", Severity.WARNING,
                   "nodes have different InfiniBand HCAs"),
    "nccl ib ports": (lambda f: _ib_selection(f), Severity.WARNING,
                      "NCCL_IB_HCA selects different HCA ports on different nodes"),
    "/dev/shm": (lambda f: _fmt_bytes(f.limits.get("shm_bytes")), Severity.WARNING,
                 "/dev/shm sizes differ"),
    "memlock": (lambda f: "unlimited" if f.limits.get("memlock_soft") is None
                else str(f.limits.get("memlock_soft")), Severity.HINT,
                "locked-memory limits differ"),
}


def _ib_selection(f: NodeFacts) -> str:
    ports = [(p.device, p.port) for p in f.ib_ports]
    value = f.env.get("NCCL_IB_HCA")
    chosen = ifname.select_ports(ifname.parse(value), ports) if value else ports
    return ",".join(f"{d}:{p}" for d, p in chosen) or "none"


def _odd(values: dict[str, str]) -> list[str]:
    counts = Counter(values.values())
    majority = counts.most_common(1)[0][0]
    return [h for h, v in values.items() if v != majority]


def diff(nodes: Sequence[NodeFacts]) -> tuple[list[DiffRow], list[Finding]]:
    """Rows for every fact or variable that is not the same on all nodes, and findings."""
    rows: list[DiffRow] = []
    findings: list[Finding] = []
    if len(nodes) < 2:
        return rows, findings
    for key, (read, severity, why) in FIELDS.items():
        values = {n.host: read(n) for n in nodes}
        if len(set(values.values())) > 1:
            row = DiffRow(key, values, _odd(values))
            rows.append(row)
            findings.append(Finding(
                severity, f"{key} differs across nodes",
                f"{why}: {row.summary()}",
                _fix_for(key), f"env-diff-{key.replace(' ', '-').replace('/', '').replace('.', '-')}",
                tuple(row.odd)))
    names = sorted({k for n in nodes for k in n.env} - PER_NODE_ENV)
    env_rows = []
    for name in names:
        values = {n.host: n.env.get(name, MISSING) for n in nodes}
        if len(set(values.values())) > 1:
            env_rows.append(DiffRow(name, values, _odd(values)))
    rows.extend(env_rows)
    if env_rows:
        odd = sorted({h for r in env_rows for h in r.odd})
        findings.append(Finding(
            Severity.WARNING, f"{len(env_rows)} environment variable(s) differ across nodes",
            "\n".join(f"{r.key}: {r.summary()}" for r in env_rows[:MAX_ENV_LINES])
            + (f"\n... and {len(env_rows) - MAX_ENV_LINES} more variables"
               if len(env_rows) > MAX_ENV_LINES else ""),
            "set them the same way on every node (job script or launcher), not in per-node "
            "shell profiles.", "env-diff-variables", tuple(odd)))
    return rows, findings


def _fix_for(key: str) -> str:
    if key in ("torch", "nccl", "torch.cuda", "python"):
        return "install the same environment on every node (one container image or a shared venv)."
    if key == "nccl ib ports":
        return "set NCCL_IB_HCA so that it selects the same HCA ports everywhere."
    if key == "nccl socket ifaces":
        return "set NCCL_SOCKET_IFNAME to a value that selects the same interfaces everywhere."
    if key == "driver":
        return "upgrade the nodes to one driver version."
    return "make the nodes uniform, or exclude the odd ones from the job."


def merge_findings(per_node: Sequence[Sequence[Finding]]) -> list[Finding]:
    """Same finding on many nodes -> one finding listing the hosts (first-seen order)."""
    merged: dict[tuple[str, str, str, str, str], dict[str, None]] = {}  # insertion-ordered
    for findings in per_node:
        for f in findings:
            key = (f.severity.value, f.code, f.title, f.detail, f.fix)
            hosts = merged.setdefault(key, {})
            for h in f.hosts:
                hosts[h] = None
    return [Finding(Severity(k[0]), k[2], k[3], k[4], k[1], tuple(hs)) for k, hs in merged.items()]
