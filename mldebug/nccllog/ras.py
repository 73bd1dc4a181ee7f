"""NCCL's RAS client output read into findings: the JSON document of ``ncclras -f json``
(NCCL 2.28.7+, src/ras/client_support.cc ``rasDumpCommsToJSON``) and the monitor-mode
``PEER_DEAD`` lines (2.29+). Pure apart from ``sniff``/``read_doc``, which take bytes.

The JSON document (fields as NCCL writes them)::

    {"nccl_version": "2.29.1", "cuda_runtime_version": 13000, "cuda_driver_version": 13000,
     "timestamp": "2025-12-19 13:06:53", "communicators_count": 1,
     "communicators": [{"hash": "0x..", "secondary_hash": "0x..:0x..", "size": 2,
        "ranks_count": 1, "missing_ranks_count": 1,
        "ranks": [{"rank": 0, "host": "172.16.64.245", "pid": 1524344, "cuda_dev": 0,
                   "nvml_dev": 0, "status": {"init_state": 0, "async_error": 0,
                   "finalize_called": false, "destroy_flag": false, "abort_flag": false},
                   "collective_counts": {"Broadcast": 0, ..., "AllReduce": 0}}],
        "missing_ranks": [{"rank": 1, "host": ..., "pid": ..., "cuda_dev": 1, "nvml_dev": 1,
                           "status": {"unresponsive": true, "considered_dead": false}}]}],
     "ras": {"collection_time_sec": 0.000, "timeouts_count": 0}}

``init_state``/``async_error`` are ncclResult_t values (0 success, 7 in progress). A finding
names the ranks the document lists, nothing more: RAS's view at the time of the query.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from mldebug.findings import Finding, Severity
from mldebug.render import fold_ints

MAX_DOC = 64 << 20  # a RAS document of 16,384 ranks is about 10 MiB
MAX_COMMS = 1 << 16
MAX_RANKS = 1 << 20  # rank entries read per document
RESULTS = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError",
           3: "ncclInternalError", 4: "ncclInvalidArgument", 5: "ncclInvalidUsage",
           6: "ncclRemoteError", 7: "ncclInProgress"}
PEER_DEAD = re.compile(r"PEER_DEAD: Process (?P<pid>\d{1,10}) on node (?P<host>[^\s]{1,200}) "
                       r"managing GPUs? (?P<gpus>[\d, ]{1,200})")


@dataclass
class RasRank:
    rank: int
    host: str
    pid: int
    cuda_dev: int | None
    init_state: int = 0
    async_error: int = 0
    abort: bool = False
    counts: dict[str, int] = field(default_factory=dict)


@dataclass
class RasMissing:
    rank: int
    host: str
    pid: int
    cuda_dev: int | None
    unresponsive: bool
    dead: bool


@dataclass
class RasComm:
    hash: str
    size: int
    ranks: list[RasRank]
    missing: list[RasMissing]


@dataclass
class RasDoc:
    source: str
    version: str | None
    timestamp: str | None
    comms: list[RasComm]
    timeouts: int = 0


@dataclass
class Unreadable:
    source: str
    reason: str


class NotRas(ValueError):
    """The data is not a RAS JSON document (the reason is the message)."""


def sniff(head: bytes) -> bool:
    """Whether the start of a file looks like a RAS JSON document."""
    text = head.lstrip()
    return text.startswith(b"{") and b'"nccl_version"' in text[:4096]


def _int(v: Any, default: int = -1) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and abs(v) < 1 << 62 else default


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _str(v: Any) -> str:
    return v[:200] if isinstance(v, str) else ""


def read_doc(data: bytes, source: str) -> RasDoc:
    """A RAS JSON document from bytes (bounded: size, nesting - JSON nests at most 5 deep
    here - and entry counts); ``NotRas`` with the reason otherwise."""
    if len(data) > MAX_DOC:
        raise NotRas(f"{len(data):,} bytes, over the {MAX_DOC:,}-byte bound")
    depth = 0
    for ch in data[:1 << 20].translate(None, delete=bytes(set(range(256)) - set(b"{}[]"))):
        depth += 1 if ch in b"{[" else -1
        if depth > 32:
            raise NotRas("nested over 32 levels deep")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise NotRas(f"not valid JSON ({str(e)[:80]})") from None
    if not isinstance(doc, dict) or "communicators" not in doc:
        raise NotRas("no 'communicators' list")
    comms_raw = doc.get("communicators")
    if not isinstance(comms_raw, list):
        raise NotRas("'communicators' is not a list")
    comms = []
    budget = MAX_RANKS
    for c in comms_raw[:MAX_COMMS]:
        if not isinstance(c, dict):
            continue
        ranks = []
        for r in c.get("ranks") or []:
            if not isinstance(r, dict) or budget <= 0:
                continue
            budget -= 1
            st = _dict(r.get("status"))
            counts = _dict(r.get("collective_counts"))
            ranks.append(RasRank(_int(r.get("rank")), _str(r.get("host")), _int(r.get("pid")),
                                 _int(r.get("cuda_dev"), -1), _int(st.get("init_state"), 0),
                                 _int(st.get("async_error"), 0), st.get("abort_flag") is True,
                                 {str(k)[:40]: _int(v, 0) for k, v in list(counts.items())[:32]}))
        missing = []
        for r in c.get("missing_ranks") or []:
            if not isinstance(r, dict) or budget <= 0:
                continue
            budget -= 1
            st = _dict(r.get("status"))
            missing.append(RasMissing(_int(r.get("rank")), _str(r.get("host")),
                                      _int(r.get("pid")), _int(r.get("cuda_dev"), -1),
                                      st.get("unresponsive") is True,
                                      st.get("considered_dead") is True))
        comms.append(RasComm(_str(c.get("hash")) or "?", _int(c.get("size"), 0), ranks, missing))
    ras = _dict(doc.get("ras"))
    return RasDoc(source, _str(doc.get("nccl_version")) or None, _str(doc.get("timestamp"))
                  or None, comms, _int(ras.get("timeouts_count"), 0))


def _where(host: str, pid: int, dev: int | None) -> str:
    return (f"pid {pid} on {host or '?'}" if pid >= 0 else f"on {host or '?'}") \
        + (f", GPU {dev}" if dev is not None and dev >= 0 else "")


def findings(items: list[Any]) -> list[Finding]:
    """Findings of what the parser kept: ``RasDoc``s, ``Unreadable``s and PEER_DEAD lines."""
    out: list[Finding] = []
    docs = [d for d in items if isinstance(d, RasDoc)]
    for t in (d for d in items if isinstance(d, RasText)):
        out += _text_findings(t)
    dead_lines = [d for d in items if isinstance(d, str)]
    for bad in (d for d in items if isinstance(d, Unreadable)):
        out.append(Finding(
            Severity.WARNING, f"{bad.source} looks like a RAS JSON document but was not read",
            bad.reason + ".", "pass the complete output of `ncclras -f json` (or the text log).",
            "nccl-log-ras-unreadable"))
    for doc in docs:
        when = f" (RAS at {doc.timestamp})" if doc.timestamp else ""
        found = []
        for c in doc.comms:
            found += _comm_findings(doc, c, when)
        if not found:
            n = sum(len(c.ranks) for c in doc.comms)
            found.append(Finding(
                Severity.INFO, f"RAS: {len(doc.comms)} communicator(s), all {n} rank(s) answered"
                f" with no error{when}", f"{doc.source}: NCCL {doc.version or '?'}.",
                "nothing to fix in what RAS saw; if the job hangs, query again: a rank that "
                "stops answering shows up as missing.", "nccl-log-ras-ok"))
        out += found
        if doc.timeouts:
            out.append(Finding(
                Severity.INFO, f"RAS hit {doc.timeouts} timeout(s) while collecting{when}",
                f"{doc.source}: some processes answered slowly or not at all.",
                "repeat the query: RAS routes around unresponsive processes once it knows them.",
                "nccl-log-ras-timeouts"))
    peers = []
    for line in dead_lines or []:
        m = PEER_DEAD.search(line)
        if m is not None:
            peers.append((m["host"], int(m["pid"]), m["gpus"].strip(), line.strip()[:200]))
    if peers:
        uniq = sorted(set(p[:3] for p in peers))
        out.append(Finding(
            Severity.ERROR, "RAS declared " + ", ".join(f"process {pid} on {host} (GPU {g})"
                                                        for host, pid, g in uniq[:4])
            + (f" and {len(uniq) - 4} more" if len(uniq) > 4 else "") + " dead",
            peers[0][3] + "\nRAS could not reach the process over its network for 60 s.",
            "look at that process first: its own log, dmesg / Xid on that node (a crash, OOM "
            "kill or stopped process).", "nccl-log-ras-dead",
            tuple(sorted({p[0] for p in peers}))))
    return out


def _comm_findings(doc: RasDoc, c: RasComm, when: str) -> list[Finding]:
    out = []
    hosts = tuple(sorted({m.host for m in c.missing if m.host}))
    if c.missing:
        dead = [m for m in c.missing if m.dead]
        unresp = [m for m in c.missing if m.unresponsive and not m.dead]
        other = [m for m in c.missing if not m.dead and not m.unresponsive]
        parts = []
        for what, ms in (("considered dead", dead), ("unresponsive", unresp),
                         ("reachable but not a member", other)):
            if ms:
                parts.append(f"{what}: " + "; ".join(
                    f"rank {m.rank} ({_where(m.host, m.pid, m.cuda_dev)})" for m in ms[:8])
                    + (f" and {len(ms) - 8} more" if len(ms) > 8 else ""))
        ranks = sorted(m.rank for m in c.missing)
        out.append(Finding(
            Severity.ERROR if dead or unresp else Severity.WARNING,
            f"RAS: rank(s) {fold_ints(ranks)} of communicator {c.hash} (size {c.size}) are "
            f"missing{when}",
            f"{doc.source}: " + "\n".join(parts) + f"\n{len(c.ranks)} of {c.size} ranks answered.",
            "look at the missing ranks' processes first (their logs, dmesg / Xid on their "
            "nodes); 'unresponsive' during init or teardown can be transient: repeat the query.",
            "nccl-log-ras-missing", hosts))
    bad = [r for r in c.ranks if r.async_error not in (0, 7) or r.init_state not in (0, 7)
           or r.abort]
    if bad:
        desc = "; ".join(
            f"rank {r.rank} ({_where(r.host, r.pid, r.cuda_dev)}): "
            + ", ".join(x for x in [
                f"async error {RESULTS.get(r.async_error, r.async_error)}"
                if r.async_error not in (0, 7) else "",
                f"init {RESULTS.get(r.init_state, r.init_state)}"
                if r.init_state not in (0, 7) else "", "aborted" if r.abort else ""] if x)
            for r in bad[:8])
        out.append(Finding(
            Severity.ERROR, f"RAS: rank(s) {fold_ints(sorted(r.rank for r in bad))} of "
            f"communicator {c.hash} report an NCCL error{when}", f"{doc.source}: {desc}",
            "read the NCCL WARN lines of those ranks (NCCL_DEBUG=WARN at least): the first one "
            "names the failure.", "nccl-log-ras-error", tuple(sorted({r.host for r in bad}))))
    behind = _behind(c)
    if behind:
        op, top, late = behind
        out.append(Finding(
            Severity.WARNING, f"RAS: rank(s) {fold_ints([r.rank for r in late])} of communicator "
            f"{c.hash} issued fewer {op} calls than the others{when}",
            f"{doc.source}: most ranks are at {top} {op} calls; "
            + "; ".join(f"rank {r.rank} ({_where(r.host, r.pid, r.cuda_dev)}) at "
                        f"{r.counts.get(op, 0)}" for r in late[:8]),
            "the ranks behind are where to look (py-spy / `mldebug hang` on them): the others "
            "wait for them in the next collective.", "nccl-log-ras-behind",
            tuple(sorted({r.host for r in late}))))
    return out


def _behind(c: RasComm) -> tuple[str, int, list[RasRank]] | None:
    """The collective whose count a minority of the ranks that answered is behind on."""
    if len(c.ranks) < 2:
        return None
    for op in sorted({k for r in c.ranks for k in r.counts}):
        counts = [r.counts.get(op, 0) for r in c.ranks]
        top = max(counts)
        late = [r for r in c.ranks if r.counts.get(op, 0) < top]
        if late and len(late) * 2 < len(c.ranks):
            return op, top, sorted(late, key=lambda r: r.rank)
    return None


# ------------------------------------------------------------------ the text report
# `ncclras` (default text format; src/ras/client_support.cc): after 'Communicators... (0.01s)'
# come 'Errors' and 'Warnings' sections whose entries are a header (DEAD, INCOMPLETE,
# TIMEOUT, or '#<group>-<index> (<hash>) <STATUS>' for one communicator) and indented lines.
TEXT_START = "Communicators... ("
MAX_TEXT_LINES = 20_000
_COMM_HEAD = re.compile(r"#(?P<id>\d{1,9}-\d{1,9}) \((?P<hash>[0-9a-fA-F]{1,16})\) "
                        r"(?P<status>[A-Z][A-Z,]{1,60})$")
_RANK_LINE = re.compile(r"Rank (?P<rank>\d{1,10}) -- GPU (?P<gpu>\d{1,4}) managed by process "
                        r"(?P<pid>\d{1,10}) on node (?P<host>\S{1,200})")
_PROC_LINE = re.compile(r"Process (?P<pid>\d{1,10}) on node (?P<host>\S{1,200}) managing GPUs? "
                        r"(?P<gpus>[\d,]{1,200})")
_MISSING_LIST = re.compile(r"The missing ranks?: (?P<list>[\d, ]{1,4000})")
_LAUNCHED = re.compile(r"(?P<n>\d{1,10}) ranks? ha(?:ve|s) launched up to operation "
                       r"(?P<op>\d{1,20})")
_DIFF_OP = re.compile(r"ranks have different (?P<op>\w{1,40}) operation counts")
_SECTIONS = ("DEAD", "INCOMPLETE", "TIMEOUT", "MISMATCH", "ERROR")


@dataclass
class _TextComm:
    id: str
    hash: str
    status: str
    ranks: list[tuple[int, int, int, str]] = field(default_factory=list)  # rank gpu pid host
    missing: list[int] = field(default_factory=list)
    op: str | None = None
    launched: list[tuple[int, int]] = field(default_factory=list)  # (ranks, operation)
    lines: list[str] = field(default_factory=list)


@dataclass
class RasText:
    """The last text report of a file (a log of periodic queries keeps the newest)."""

    source: str
    version: str | None = None  # 'NCCL version 2.26.2 compiled with CUDA 12.6' above it
    lines: int = 0
    dead: list[tuple[int, str, str]] = field(default_factory=list)  # pid host gpus
    incomplete: list[tuple[int, str, str]] = field(default_factory=list)
    comms: list[_TextComm] = field(default_factory=list)
    section: str = ""

    def feed(self, raw: str) -> None:
        line = raw.strip()
        if not line or self.lines >= MAX_TEXT_LINES:
            return
        self.lines += 1
        if line in _SECTIONS:
            self.section = line
            return
        if (m := _COMM_HEAD.match(line)) is not None:
            self.comms.append(_TextComm(m["id"], m["hash"], m["status"]))
            self.section = "comm"
            return
        if self.section in ("DEAD", "INCOMPLETE") and (m := _PROC_LINE.search(line)):
            (self.dead if self.section == "DEAD" else self.incomplete).append(
                (int(m["pid"]), m["host"], m["gpus"]))
            return
        if self.section != "comm" or not self.comms:
            return
        c = self.comms[-1]
        if len(c.lines) < 64:
            c.lines.append(line[:200])
        if (m := _RANK_LINE.search(line)) is not None and len(c.ranks) < 4096:
            c.ranks.append((int(m["rank"]), int(m["gpu"]), int(m["pid"]), m["host"]))
        elif (m := _MISSING_LIST.search(line)) is not None:
            c.missing += [int(x) for x in re.findall(r"\d{1,10}", m["list"])][:4096]
        elif (m := _LAUNCHED.search(line)) is not None:
            c.launched.append((int(m["n"]), int(m["op"])))
        elif (m := _DIFF_OP.search(line)) is not None:
            c.op = m["op"]


def _vtuple(v: str | None) -> tuple[int, ...] | None:
    m = re.match(r"(\d{1,3})\.(\d{1,3})\.(\d{1,4})", v or "")
    return tuple(int(x) for x in m.groups()) if m else None


def _text_findings(t: RasText) -> list[Finding]:
    out = []
    for pid, host, gpus in t.dead:
        out.append(Finding(
            Severity.ERROR, f"RAS: process {pid} on {host} (GPU {gpus}) is considered dead",
            f"{t.source}: RAS could not reach it over the RAS network for 60 s.",
            "look at that process first: its own log, dmesg / Xid on that node (a crash, OOM "
            "kill or stopped process).", "nccl-log-ras-dead", (host,)))
    dead_pids = {pid for pid, _, _ in t.dead}
    garbled = False  # NCCL < 2.29.2: communicators after one with missing ranks are misread
    v = _vtuple(t.version)
    for c in t.comms:
        if garbled:
            out.append(Finding(
                Severity.INFO, f"RAS: communicator #{c.id} ({c.hash}) {c.status} is not "
                "trusted", f"{t.source}: NCCL {t.version}'s RAS client misreads every "
                "communicator listed after one with missing ranks (NVIDIA/nccl#1762: "
                "rasClientRunComms skipped the missing-rank entries; fixed in 2.29.2).\n"
                + "\n".join(c.lines[:3]), "upgrade NCCL to 2.29.2 or newer for RAS reports of "
                "jobs with missing ranks; the first such communicator above is read correctly.",
                "nccl-log-ras-known-bug"))
            continue
        if "INCOMPLETE" in c.status and v is not None and (2, 26, 2) <= v < (2, 29, 2):
            garbled = True
        if "INCOMPLETE" in c.status:
            ranks = sorted({r for r, *_ in c.ranks} | set(c.missing))
            procs = sorted({(pid, host) for _, _, pid, host in c.ranks})
            where = "; ".join(f"rank {r} (GPU {g}, pid {pid} on {h})"
                              for r, g, pid, h in c.ranks[:8])
            if not where:
                where = "; ".join(f"process {pid} on {host} (GPU {g})"
                                  for pid, host, g in t.incomplete[:8])
            dead = any(pid in dead_pids for pid, _ in procs)
            out.append(Finding(
                Severity.ERROR if dead else Severity.WARNING,
                f"RAS: communicator #{c.id} ({c.hash}) is missing data from "
                + (f"rank(s) {fold_ints(ranks)}" if ranks else "some ranks"),
                f"{t.source}: " + "\n".join(c.lines[:6]) + (f"\n{where}" if where else ""),
                "look at the missing ranks' processes (their logs, py-spy / `mldebug hang`, "
                "dmesg on their nodes); during init or teardown this can be transient: repeat "
                "the query.", "nccl-log-ras-missing", tuple(sorted({h for _, h in procs}))))
        if "MISMATCH" in c.status and len(c.launched) >= 2:
            out.append(_mismatch(t, c))
    if not out and t.comms == [] and t.lines:
        out.append(Finding(
            Severity.INFO, "RAS reported no errors and no warnings",
            f"{t.source}: every communicator's status is as RAS expects at the time of the "
            "query.", "nothing to fix in what RAS saw; a hang that RAS does not see is inside "
            "the ranks (py-spy / `mldebug hang`, the flight recorder).", "nccl-log-ras-ok"))
    return out


def _mismatch(t: RasText, c: _TextComm) -> Finding:
    """Operation counts differ: RAS lists the ranks of the smaller (outlier) group."""
    op = c.op or "collective"
    listed = sorted({r for r, *_ in c.ranks})
    groups = sorted(c.launched, key=lambda g: g[1])
    low, high = groups[0], groups[-1]
    owner = [g for g in c.launched if g[0] == len(listed)]
    detail = f"{t.source}: " + "\n".join(c.lines[:8])
    if listed and len(owner) == 1 and owner[0] == high:
        others = sum(n for n, o in c.launched if o < high[1])
        title = (f"RAS: {others} rank(s) of communicator #{c.id} ({c.hash}) are behind in {op} "
                 f"(up to operation {low[1]}, ranks {fold_ints(listed)} at {high[1]})")
        detail += (f"\nRAS lists only the ranks ahead ({fold_ints(listed)}): they wait in "
                   f"operation {high[1]} for the {others} others, which are the ones to look at.")
        hosts: tuple[str, ...] = ()
    elif listed and len(owner) == 1 and owner[0] == low:
        title = (f"RAS: rank(s) {fold_ints(listed)} of communicator #{c.id} ({c.hash}) are "
                 f"behind in {op} (up to operation {low[1]}, the others at {high[1]})")
        hosts = tuple(sorted({h for *_, h in c.ranks}))
    else:
        title = (f"RAS: ranks of communicator #{c.id} ({c.hash}) have launched different "
                 f"numbers of {op} operations ({low[1]} to {high[1]})")
        hosts = ()
    return Finding(Severity.WARNING, title, detail,
                   "query again: a count that stays behind is the straggler; look at those "
                   "ranks with py-spy / `mldebug hang` (the flight recorder shows the collective "
                   "they are in).", "nccl-log-ras-mismatch", hosts)
