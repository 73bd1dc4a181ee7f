"""Read NCCL_DEBUG=INFO output and say what NCCL chose, where it complained, what it ran.

Line format from NCCL's ``ncclDebugLog`` (src/debug.cc)::

    host:pid:tid [cudaDev] NCCL INFO <message>
    host:pid:tid [cudaDev] file.cc:123 NCCL WARN <message>          (older)
    [2025-01-01 12:00:00] host:pid:tid [0] file.cc:123 (func) NCCL WARN <message>  (newer)

optionally behind a launcher prefix (torchrun ``[rank3]:`` / ``[default3]:``, ``srun -l``
``3: ``). Messages we read (NCCL's own strings): ``NCCL version X``, ``NET/<plugin> : Using
[0]if:addr<0> ...; OOB if:addr``, ``Bootstrap : Using ...``, ``Using network <name>``,
``<VAR> set by environment to <value>``, ``comm 0x.. rank R nranks N ... - Init START`` /
``- Init COMPLETE``, and with NCCL_DEBUG_SUBSYS=COLL ``<Op>: opCount <hex> sendbuff ...``.

``parse_text`` is pure (text -> ``ParsedLog``); ``analyze`` turns parsed logs into a report
with findings; ``load`` is the only function that reads files.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mldebug.errors import UsageError
from mldebug.findings import Finding, Severity

LAUNCHER_PREFIX = re.compile(r"^(?:\[(?:rank|default|RANK )?(?P<r1>\d+)\]:\s?|(?P<r2>\d+): )")
TIMESTAMP = re.compile(r"^\[[^\]]*\d\d:\d\d:\d\d[^\]]*\]\s*")
LINE = re.compile(
    r"^(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"(?:[\d.]+ )?(?:(?P<src>\S+:\d+)(?: \([^)]*\))? )?NCCL (?P<level>INFO|WARN|TRACE|CALL) ?"
    r"(?P<msg>.*)$")
VERSION = re.compile(r"^NCCL version (?P<v>\S+)")
NET = re.compile(r"^NET/(?!Plugin\b)(?P<plugin>[\w.-]+)\s*: Using (?P<rest>.*)$")
BOOTSTRAP = re.compile(r"^Bootstrap\s*: Using (?P<rest>.*)$")
USING_NETWORK = re.compile(r"^Using network (?P<name>\S+)")
ENVSET = re.compile(r"^(?P<var>[A-Z][A-Z0-9_]+) set by environment to (?P<value>.*)$")
INIT = re.compile(r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+)"
                  r"(?P<rest>.*?) - Init (?P<what>START|COMPLETE)")
COMMID = re.compile(r"commId (?P<id>0x[0-9a-fA-F]+)")
COLL = re.compile(r"^(?P<op>[A-Za-z]+): opCount (?P<opc>[0-9a-fA-F]+) ")
ITEM = re.compile(r"\[(?P<idx>\d+)\](?P<item>[^\s\[;]+)")

BAD_SOCKET_IFACES = ("lo", "docker", "virbr", "veth", "br-")


@dataclass
class NetChoice:
    plugin: str  # IB, Socket, FastSocket, GPUDirectTCPX, ...
    interfaces: list[str]  # names: mlx5_0, eth0 ...
    items: list[str]  # as printed: mlx5_0:1/IB, eth0:10.0.0.1<0>
    oob: str | None = None


@dataclass
class CommInit:
    comm: str
    rank: int
    nranks: int
    comm_id: str | None = None
    started: bool = False
    completed: bool = False


@dataclass
class ProcessLog:
    """Everything one process (host:pid) logged."""

    host: str
    pid: int
    sources: list[str] = field(default_factory=list)
    launcher_rank: int | None = None
    devices: set[int] = field(default_factory=set)
    version: str | None = None
    nets: list[NetChoice] = field(default_factory=list)
    bootstrap: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    comms: list[CommInit] = field(default_factory=list)
    warns: list[str] = field(default_factory=list)
    coll: dict[int, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    @property
    def key(self) -> str:
        return f"{self.host}:{self.pid}"

    @property
    def rank(self) -> int | None:
        if self.launcher_rank is not None:
            return self.launcher_rank
        world = max(self.comms, key=lambda c: c.nranks, default=None)
        return world.rank if world else None

    @property
    def label(self) -> str:
        r = self.rank
        return f"rank {r} ({self.key})" if r is not None else self.key

    @property
    def transport(self) -> str | None:
        if self.nets:
            return self.nets[0].plugin
        return self.networks[0] if self.networks else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host, "pid": self.pid, "rank": self.rank, "sources": self.sources,
            "devices": sorted(self.devices), "nccl_version": self.version,
            "transport": self.transport,
            "net": [{"plugin": n.plugin, "interfaces": n.interfaces, "items": n.items,
                     "oob": n.oob} for n in self.nets],
            "bootstrap": self.bootstrap, "env": self.env,
            "comms": [c.__dict__ for c in self.comms],
            "warnings": len(self.warns),
            "collectives": {op: sum(c[op] for c in self.coll.values())
                            for op in sorted({o for c in self.coll.values() for o in c})},
        }


@dataclass
class ParsedLog:
    source: str
    processes: dict[str, ProcessLog] = field(default_factory=dict)
    lines: int = 0
    nccl_lines: int = 0


def _iface_name(item: str) -> str:
    return item.split(":", 1)[0].split("<", 1)[0].split("/", 1)[0]


def parse_text(text: str, source: str = "<text>", split: re.Pattern[str] | None = None) -> ParsedLog:
    """Parse one log (a file's text); ``split`` starts a new COLL slice on each matching line."""
    log = ParsedLog(source)
    slice_no = 0
    for raw in text.splitlines():
        log.lines += 1
        line = raw.rstrip("\r")
        if split is not None and split.search(line):
            slice_no += 1
        prank: int | None = None
        m = LAUNCHER_PREFIX.match(line)
        if m:
            prank = int(m["r1"] or m["r2"])
            line = line[m.end():]
        line = TIMESTAMP.sub("", line, count=1)
        m = LINE.match(line)
        if not m:
            continue
        log.nccl_lines += 1
        key = f"{m['host']}:{m['pid']}"
        proc = log.processes.get(key)
        if proc is None:
            proc = log.processes[key] = ProcessLog(m["host"], int(m["pid"]), [source])
        if prank is not None:
            proc.launcher_rank = prank
        proc.devices.add(int(m["dev"]))
        msg = m["msg"].strip()
        if m["level"] == "WARN":
            proc.warns.append(msg)
            continue
        _parse_info(proc, msg, slice_no)
    return log


def _parse_info(proc: ProcessLog, msg: str, slice_no: int) -> None:
    m: re.Match[str] | None
    if m := COLL.match(msg):
        proc.coll[slice_no][m["op"]] += 1
    elif m := VERSION.match(msg):
        proc.version = m["v"]
    elif m := NET.match(msg):
        rest, _, oob = m["rest"].partition("; OOB ")
        items = [i["item"] for i in ITEM.finditer(rest)]
        proc.nets.append(NetChoice(m["plugin"], [_iface_name(i) for i in items], items,
                                   oob.strip() or None))
    elif m := BOOTSTRAP.match(msg):
        items = [i["item"] for i in ITEM.finditer(m["rest"])] or m["rest"].split()
        proc.bootstrap = [_iface_name(i) for i in items]
    elif m := USING_NETWORK.match(msg):
        proc.networks.append(m["name"])
    elif m := ENVSET.match(msg):
        proc.env[m["var"]] = m["value"].strip().rstrip(".")
    elif m := INIT.search(msg):
        cid = COMMID.search(m["rest"])
        existing = next((c for c in proc.comms if c.comm == m["comm"]), None)
        if existing is None:
            existing = CommInit(m["comm"], int(m["rank"]), int(m["nranks"]))
            proc.comms.append(existing)
        if cid:
            existing.comm_id = cid["id"]
        if m["what"] == "START":
            existing.started = True
        else:
            existing.completed = True


def load(paths: Sequence[str | Path], split: str | None = None) -> list[ParsedLog]:
    """Read log files (a directory means every file in it)."""
    pattern = None
    if split:
        try:
            pattern = re.compile(split)
        except re.error as e:
            raise UsageError(f"--split {split!r} is not a valid regular expression ({e}).",
                             "Pass e.g. --split 'iteration: '.") from None
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(f for f in p.iterdir() if f.is_file())
        elif p.is_file():
            files.append(p)
        else:
            raise UsageError(f"{p} does not exist.",
                             "Pass NCCL log files, e.g. the NCCL_DEBUG_FILE outputs or a job log.")
    if not files:
        raise UsageError("no log files found.", "Pass files or a directory that holds them.")
    return [parse_text(f.read_text(errors="replace"), str(f), pattern) for f in files]


# ------------------------------------------------------------------ analysis
@dataclass
class WarnGroup:
    message: str
    processes: list[str]
    count: int

    def to_dict(self) -> dict[str, Any]:
        return {"message": self.message, "processes": self.processes, "count": self.count}


@dataclass
class CommSummary:
    comm_id: str
    nranks: int
    completed: list[int]
    started_not_completed: list[int]
    absent: list[int]

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


@dataclass
class NcclLogReport:
    files: list[str]
    processes: list[ProcessLog]
    comms: list[CommSummary]
    warnings: list[WarnGroup]
    collectives: dict[int, dict[str, int]]  # slice -> op -> count (all processes)
    findings: list[Finding]
    split: bool = False

    def to_dict(self) -> dict[str, Any]:
        from mldebug.findings import findings_to_json

        return {
            "files": self.files,
            "findings": findings_to_json(self.findings),
            "processes": [p.to_dict() for p in self.processes],
            "communicators": [c.to_dict() for c in self.comms],
            "warnings": [w.to_dict() for w in self.warnings],
            "collectives": {str(k): v for k, v in self.collectives.items()},
        }


_NORMALISE = [(re.compile(r"0x[0-9a-fA-F]+"), "0x…"), (re.compile(r"<\d+>"), "<…>")]


def _normalise(msg: str) -> str:
    for pat, rep in _NORMALISE:
        msg = pat.sub(rep, msg)
    return msg


def _merge(logs: Sequence[ParsedLog]) -> list[ProcessLog]:
    merged: dict[str, ProcessLog] = {}
    for log in logs:
        for key, p in log.processes.items():
            if key not in merged:
                merged[key] = p
                continue
            m = merged[key]
            m.sources += [s for s in p.sources if s not in m.sources]
            m.devices |= p.devices
            m.version = m.version or p.version
            m.nets += p.nets
            m.bootstrap = m.bootstrap or p.bootstrap
            m.networks += p.networks
            m.env.update(p.env)
            m.comms += p.comms
            m.warns += p.warns
            for s, c in p.coll.items():
                m.coll[s].update(c)
            if m.launcher_rank is None:
                m.launcher_rank = p.launcher_rank
    procs = list(merged.values())
    procs.sort(key=lambda p: (p.rank if p.rank is not None else 1 << 30, p.host, p.pid))
    return procs


def _labels(procs: Iterable[ProcessLog]) -> str:
    procs = list(procs)
    ranks = [p.rank for p in procs]
    if all(r is not None for r in ranks) and len(procs) > 3:
        from mldebug.render import fold_ints

        return "ranks " + fold_ints(r for r in ranks if r is not None)
    return ", ".join(p.label for p in procs)


def _comm_summaries(procs: Sequence[ProcessLog]) -> list[CommSummary]:
    groups: dict[str, list[CommInit]] = defaultdict(list)
    nranks: dict[str, int] = {}
    for p in procs:
        ordinal: Counter[int] = Counter()
        for c in p.comms:
            key = c.comm_id or f"#{ordinal[c.nranks]} of size {c.nranks}"
            ordinal[c.nranks] += 1
            groups[key].append(c)
            nranks[key] = c.nranks
    out = []
    for key, comms in groups.items():
        done = sorted({c.rank for c in comms if c.completed})
        stuck = sorted({c.rank for c in comms if c.started and not c.completed} - set(done))
        seen = {c.rank for c in comms}
        absent = sorted(set(range(nranks[key])) - seen)
        out.append(CommSummary(key, nranks[key], done, stuck, absent))
    return out


def analyze(logs: Sequence[ParsedLog]) -> NcclLogReport:
    procs = _merge(logs)
    findings: list[Finding] = []
    if not procs:
        findings.append(Finding(
            Severity.WARNING, "no NCCL debug lines found",
            "None of the files has lines like 'host:pid:tid [0] NCCL INFO ...'.",
            "rerun with NCCL_DEBUG=INFO (and NCCL_DEBUG_FILE=/path/nccl.%h.%p.log), then pass "
            "those files.", "nccl-log-empty"))
    findings += _version_findings(procs)
    findings += _net_findings(procs)
    comms = _comm_summaries(procs)
    findings += _init_findings(comms)
    warns = _warn_groups(procs)
    for w in warns:
        findings.append(Finding(
            Severity.WARNING, f"NCCL WARN: {w.message}",
            f"printed {w.count} time(s) by {len(w.processes)} process(es): "
            + ", ".join(w.processes[:8]) + (" ..." if len(w.processes) > 8 else ""),
            _warn_fix(w.message), "nccl-log-warn"))
    coll: dict[int, Counter[str]] = defaultdict(Counter)
    for p in procs:
        for s, c in p.coll.items():
            coll[s].update(c)
    return NcclLogReport(
        files=[log.source for log in logs], processes=procs, comms=comms, warnings=warns,
        collectives={s: dict(sorted(c.items())) for s, c in sorted(coll.items())},
        findings=findings)


def _version_findings(procs: Sequence[ProcessLog]) -> list[Finding]:
    versions: dict[str, list[ProcessLog]] = defaultdict(list)
    for p in procs:
        if p.version:
            versions[p.version].append(p)
    if len(versions) > 1:
        return [Finding(
            Severity.ERROR, "processes run different NCCL versions",
            "; ".join(f"{v}: {_labels(ps)}" for v, ps in versions.items()),
            "use one environment (container image / venv) on every node.",
            "nccl-log-version-mismatch")]
    return []


def _net_findings(procs: Sequence[ProcessLog]) -> list[Finding]:
    out: list[Finding] = []
    bad_by_iface: dict[str, list[ProcessLog]] = defaultdict(list)
    bond_ib: dict[str, list[ProcessLog]] = defaultdict(list)
    for p in procs:
        for net in p.nets:
            for name in net.interfaces:
                if net.plugin == "IB":
                    if "bond" in name:
                        bond_ib[name].append(p)
                elif name == "lo" or name.startswith(BAD_SOCKET_IFACES[1:]):
                    bad_by_iface[name].append(p)
        for name in p.bootstrap:
            if name == "lo" or name.startswith(BAD_SOCKET_IFACES[1:]):
                if p not in bad_by_iface[name]:
                    bad_by_iface[name].append(p)
    for name, ps in bad_by_iface.items():
        out.append(Finding(
            Severity.WARNING, f"NCCL uses interface {name} (loopback/container/virtual)",
            f"{_labels(ps)} chose {name}; other nodes cannot reach it, so a multi-node job "
            "hangs at init or runs slowly.",
            f"export NCCL_SOCKET_IFNAME=^{name} (or name the right NIC, e.g. =eth0)",
            "nccl-log-iface-virtual"))
    for name, ps in bond_ib.items():
        out.append(Finding(
            Severity.WARNING, f"NCCL/IB includes the bond device {name}",
            f"{_labels(ps)} use {name} next to the IB HCAs; this usually lowers bandwidth.",
            f"export NCCL_IB_HCA=^{name}", "nccl-log-ib-bond"))
    ib = [p for p in procs if p.transport == "IB"]
    sock = [p for p in procs if p.transport == "Socket"]
    if ib and sock:
        out.append(Finding(
            Severity.ERROR, "some processes use TCP sockets while others use InfiniBand",
            f"Socket: {_labels(sock)}; IB: {_labels(ib)}. The job runs at socket speed or "
            "fails to connect.",
            "on the socket nodes check the HCAs are visible (ibv_devinfo, /dev/infiniband in "
            "containers, libibverbs installed) and NCCL_IB_DISABLE is unset.",
            "nccl-log-socket-vs-ib"))
    for p in sock:
        names = [n for net in p.nets for n in net.interfaces]
        if (names and all(n.startswith("ib") for n in names)) or \
                p.env.get("NCCL_IB_DISABLE", "0") not in ("0", ""):
            out.append(Finding(
                Severity.WARNING, "NCCL uses TCP sockets although InfiniBand is present",
                f"{p.label}: NET/Socket over {', '.join(names) or '?'}"
                + (" with NCCL_IB_DISABLE set" if "NCCL_IB_DISABLE" in p.env else "")
                + "; IB verbs would be much faster.",
                "unset NCCL_IB_DISABLE; make sure libibverbs and /dev/infiniband are available.",
                "nccl-log-socket-with-ib", (p.host,)))
            break
    hint = _plugin_hint(procs)
    if hint is not None:
        out.append(hint)
    out += _odd_interfaces(procs)
    return out


def _plugin_hint(procs: Sequence[ProcessLog]) -> Finding | None:
    """The book's case: a socket plugin (e.g. NET/FastSocket) over ib* NICs on an IB cluster."""
    for p in procs:
        for net in p.nets:
            if net.plugin not in ("IB", "Socket") and any(n.startswith("ib") for n in net.interfaces):
                return Finding(
                    Severity.HINT, f"NCCL loaded the {net.plugin} network plugin over ib* interfaces",
                    f"{p.label}: NET/{net.plugin} : Using {' '.join(net.items)}. Right on clouds "
                    "that ship this plugin; on an InfiniBand cluster expect NET/IB instead.",
                    "if you have IB HCAs, remove the plugin from LD_LIBRARY_PATH or set NCCL_NET=IB.",
                    "nccl-log-plugin")
    return None


def _odd_interfaces(procs: Sequence[ProcessLog]) -> list[Finding]:
    choice: dict[str, tuple[str, ...]] = {}
    for p in procs:
        if p.nets:
            choice[p.key] = (p.nets[0].plugin, *p.nets[0].interfaces)
    if len(set(choice.values())) < 2:
        return []
    counts = Counter(choice.values())
    majority, _ = counts.most_common(1)[0]
    by_key = {p.key: p for p in procs}
    odd = [by_key[k] for k, v in choice.items() if v != majority]
    detail = "; ".join(
        f"{_labels([by_key[k] for k, v in choice.items() if v == c])}: NET/{c[0]} "
        + ",".join(c[1:]) for c in counts)
    return [Finding(
        Severity.WARNING, "processes chose different network interfaces than the rest",
        detail, "make the nodes' NICs and NCCL_SOCKET_IFNAME / NCCL_IB_HCA uniform, "
        "or exclude the odd nodes.", "nccl-log-odd-interfaces",
        tuple(sorted({p.host for p in odd})))]


def _init_findings(comms: Sequence[CommSummary]) -> list[Finding]:
    from mldebug.render import fold_ints

    out = []
    for c in comms:
        if c.started_not_completed:
            out.append(Finding(
                Severity.ERROR,
                f"rank(s) {fold_ints(c.started_not_completed)} never completed init of "
                f"communicator {c.comm_id} ({c.nranks} ranks)",
                f"Init START was logged but no Init COMPLETE; completed: "
                f"{fold_ints(c.completed) or 'none'}.",
                "those ranks hang in bootstrap/transport setup: look at their WARN lines and "
                "NET choice; check firewalls and NCCL_SOCKET_IFNAME between the nodes.",
                "nccl-log-init-incomplete"))
        if c.absent and (c.completed or c.started_not_completed):
            out.append(Finding(
                Severity.WARNING,
                f"no init lines from rank(s) {fold_ints(c.absent)} of communicator "
                f"{c.comm_id} ({c.nranks} ranks)",
                "Those ranks never reached NCCL init, or their logs are not among the files.",
                "pass every rank's log (NCCL_DEBUG_FILE=...%h.%p); if they are all there, the "
                "missing ranks died or hung before init_process_group's first collective.",
                "nccl-log-init-absent"))
    return out


def _warn_groups(procs: Sequence[ProcessLog]) -> list[WarnGroup]:
    groups: dict[str, WarnGroup] = {}
    for p in procs:
        for msg in p.warns:
            key = _normalise(msg)
            g = groups.get(key)
            if g is None:
                g = groups[key] = WarnGroup(msg, [], 0)
            g.count += 1
            if p.label not in g.processes:
                g.processes.append(p.label)
    return sorted(groups.values(), key=lambda g: -len(g.processes))


def _warn_fix(msg: str) -> str:
    low = msg.lower()
    if "connect" in low or "socket" in low or "bootstrap" in low:
        return ("a connection between nodes failed: check NCCL_SOCKET_IFNAME selects a NIC every "
                "node can reach, and firewalls.")
    if "ibv_" in low or "net/ib" in low:
        return "an InfiniBand verbs call failed: check ibstat link state and memlock limits."
    if "cuda" in low:
        return "a CUDA call failed inside NCCL: look for an earlier CUDA error or OOM."
    if "shm" in low or "/dev/shm" in low:
        return "shared memory failed: enlarge /dev/shm (docker --shm-size=1g)."
    return "search the message in the NCCL issue tracker; rerun with NCCL_DEBUG_SUBSYS=INIT,NET,ENV."
