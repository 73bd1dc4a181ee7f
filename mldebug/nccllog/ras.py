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
