"""Turn parsed NCCL logs into a report: merge processes, group what repeats, run the rules.

Pure and linear in the number of processes and WARN kinds (dicts and sets only), so 8,192
ranks cost about eight times 1,024. Identical WARN kinds are one finding with a folded host
list; identical process rows are one table row.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from mldebug.findings import Finding, Severity, sort_findings
from mldebug.nccllog import catalogue
from mldebug.nccllog.catalogue import Classified
from mldebug.nccllog.model import (
    CommInit,
    CommSummary,
    NcclLogReport,
    ParsedLog,
    ProcessGroup,
    ProcessLog,
    Signal,
    WarnGroup,
    normalise,
)
from mldebug.nccllog.rules import RULES, Context, hosts_text, origin_note, warn_fix

MAX_ABSENT_SPAN = 1 << 20  # do not enumerate absent ranks of absurd communicator sizes


def _merge(logs: Sequence[ParsedLog], tracebacks: bool = False) -> list[ProcessLog]:
    merged: dict[str, ProcessLog] = {}
    for log in logs:
        for key, p in (log.tracebacks if tracebacks else log.processes).items():
            m = merged.get(key)
            if m is None:
                merged[key] = p
                continue
            m.sources += [s for s in p.sources if s not in m.sources]
            m.devices |= p.devices
            m.version = m.version or p.version
            m.cuda_driver = m.cuda_driver or p.cuda_driver
            m.plugin = m.plugin or p.plugin
            m.nets += p.nets[: max(0, 8 - len(m.nets))]
            m.bootstrap = m.bootstrap or p.bootstrap
            m.bootstrap_items = m.bootstrap_items or p.bootstrap_items
            m.networks += [n for n in p.networks if n not in m.networks]
            m.env.update(p.env)
            for addr, comm in p.comms.items():
                m.comms.setdefault(addr, comm)
            for msg in p.warns:
                if normalise(msg) not in m.warn_counts:
                    m.warns.append(msg)
            m.warn_counts.update(p.warn_counts)
            for k, v in p.warn_src.items():
                m.warn_src.setdefault(k, v)
            for k, v in p.warn_context.items():
                m.warn_context.setdefault(k, v)
            for k, v in p.warn_origin.items():
                m.warn_origin.setdefault(k, v)
            m.gdr_disabled += [h for h in p.gdr_disabled if h not in m.gdr_disabled]
            m.gid_link_local = m.gid_link_local or p.gid_link_local
            m.mtu = m.mtu or p.mtu
            m.first_time = m.first_time or p.first_time
            m.last_time = p.last_time or m.last_time
            for sl, cnt in p.coll.items():
                m.coll[sl].update(cnt)
            if m.launcher_rank is None:
                m.launcher_rank = p.launcher_rank
    procs = list(merged.values())
    procs.sort(key=lambda p: (p.rank if p.rank is not None else 1 << 30, p.host, p.pid))
    return procs


def _comm_summaries(procs: Sequence[ProcessLog]) -> list[CommSummary]:
    groups: dict[str, list[tuple[CommInit, ProcessLog]]] = defaultdict(list)
    nranks: dict[str, int] = {}
    for p in procs:
        ordinal: Counter[int] = Counter()
        for c in p.comms.values():
            key = c.comm_id or f"#{ordinal[c.nranks]} of size {c.nranks}"
            ordinal[c.nranks] += 1
            groups[key].append((c, p))
            nranks[key] = c.nranks
    out = []
    for key, members in groups.items():
        done = {c.rank for c, _ in members if c.completed}
        stuck = {c.rank: p for c, p in members if c.started and not c.completed
                 and c.rank not in done}
        seen = {c.rank for c, _ in members}
        n = nranks[key]
        absent = sorted(set(range(n)) - seen) if n <= MAX_ABSENT_SPAN else []
        out.append(CommSummary(key, n, sorted(done), sorted(stuck), absent,
                               [stuck[r].key for r in sorted(stuck)]))
    return out


def _warn_groups(procs: Sequence[ProcessLog]) -> list[WarnGroup]:
    groups: dict[str, WarnGroup] = {}
    seen: dict[str, set[str]] = defaultdict(set)
    hosts: dict[str, set[str]] = defaultdict(set)
    for p in procs:
        first = {normalise(m): m for m in p.warns}
        for key, n in p.warn_counts.items():
            g = groups.get(key)
            if g is None:
                g = groups[key] = WarnGroup(first.get(key, key), [], 0, key=key,
                                            source=p.warn_src.get(key, ""),
                                            context=p.warn_context.get(key, ""),
                                            origin=p.warn_origin.get(key, ""))
            elif not p.warn_origin.get(key):
                g.origin = ""  # an NCCL WARN line of some process said it too
            g.count += n
            if p.version and p.version not in g.versions and len(g.versions) < 16:
                g.versions.append(p.version)
            if p.key not in seen[key]:
                seen[key].add(p.key)
                g.processes.append(p.label)
                hosts[key].add(p.host)
    for key, g in groups.items():
        g.hosts = sorted(hosts[key])
    return sorted(groups.values(), key=lambda g: -len(g.processes))


def _process_groups(procs: Sequence[ProcessLog]) -> list[ProcessGroup]:
    """Rows equal apart from rank/host/pid, folded into one row each (first-seen order)."""
    rows: dict[tuple[str, str, str, str, str], list[ProcessLog]] = {}
    seen: dict[tuple[str, ...], str] = {}  # interface lists repeat across processes
    for p in procs:
        net = p.net
        ifaces = ""
        if net:
            items = tuple(net.items)
            ifaces = seen.get(items) or seen.setdefault(
                items, " ".join(normalise(i) for i in items))
        key = (p.version or "", p.transport or "", ifaces, ",".join(p.bootstrap),
               "warn" if p.warn_counts else "")
        rows.setdefault(key, []).append(p)
    out = []
    for key, ps in rows.items():
        ranks = [p.rank for p in ps if p.rank is not None]
        out.append(ProcessGroup(ranks=sorted(ranks), hosts=sorted({p.host for p in ps}),
                                count=len(ps), devices=sorted({d for p in ps for d in p.devices}),
                                version=key[0], transport=key[1],
                                interfaces=" ".join(ps[0].net.items) if ps[0].net else "",
                                bootstrap=key[3],
                                warnings=sum(sum(p.warn_counts.values()) for p in ps)))
    return out


def analyze(logs: Sequence[ParsedLog]) -> NcclLogReport:
    procs = _merge(logs)
    signals: dict[str, Signal] = {}
    for log in logs:
        for kind, sig in log.signals.items():
            if kind in signals:
                signals[kind].count += sig.count
            else:
                signals[kind] = sig
    bare = list(dict.fromkeys(v for log in logs for v in log.bare_versions))
    comms = _comm_summaries(procs)
    tracebacks = _merge(logs, tracebacks=True)
    warns = _warn_groups(procs + tracebacks)
    ctx = Context(procs, warns, signals, comms, bare)
    findings: list[Finding] = []
    for rule in RULES:
        findings += rule(ctx)
    cat: catalogue.Catalogue | None = None  # loaded when a WARN needs it (~10 ms)
    # WARN kinds printed from one format with one class and cause (a socket path or a peer
    # differs) are one finding
    by_format: dict[tuple[str, str, str], list[tuple[WarnGroup, Classified]]] = {}
    for w in warns:
        if w.key in ctx.explained:
            continue
        cat = cat or catalogue.load()
        cls = cat.describe(w.message, w.source, w.context,
                           w.versions[0] if w.versions else None)
        if cls is not None:
            fmt = cls.entry.format if cls.entry is not None else w.key
            by_format.setdefault((cls.component, fmt, cls.cause or ""), []).append((w, cls))
            continue
        findings.append(Finding(
            Severity.WARNING, f"NCCL WARN: {w.message[:200]}",
            f"printed {w.count} time(s) by {len(w.processes)} process(es): "
            + (", ".join(w.processes) if len(w.processes) <= 3
               else f"{len(w.processes)} processes on {hosts_text(w.hosts)}")
            + origin_note([w]),
            warn_fix(w.message), "nccl-log-warn", tuple(w.hosts)))
    findings += [_catalogued(group) for group in by_format.values()]
    findings += _reader_findings(logs, signals, warns)
    findings += _input_findings(logs, procs, findings)
    coll: dict[int, Counter[str]] = defaultdict(Counter)
    for p in procs:
        for s, c in p.coll.items():
            coll[s].update(c)
    return NcclLogReport(
        files=[log.source for log in logs], processes=procs, comms=comms, warnings=warns,
        collectives={s: dict(sorted(c.items())) for s, c in sorted(coll.items())},
        findings=sort_findings(findings), groups=_process_groups(procs),
        lines=sum(log.lines for log in logs), nccl_lines=sum(log.nccl_lines for log in logs),
        tracebacks=tracebacks)


# failure texts a GPU without kernels in this NCCL explains (versions.findings)
_NO_KERNEL = ("no kernel image", "named symbol not found", "maxSharedMem",
              "unhandled cuda error", "ncclUnhandledCudaError", "invalid device function")


def _reader_findings(logs: Sequence[ParsedLog], signals: dict[str, Signal],
                     warns: Sequence[WarnGroup]) -> list[Finding]:
    """NCCL version x GPU (versions.py), NCCL DIAG reports (diag.py), RAS documents (ras.py):
    each only when a file holds what it reads."""
    out: list[Finding] = []
    if any(log.gpus for log in logs):
        from mldebug.nccllog import versions

        failed = [w.message for w in warns if any(n in w.message for n in _NO_KERNEL)]
        failed += [e for k in ("no kernel for gpu", "unhandled cuda error")
                   if k in signals for e in signals[k].examples]
        uses = []
        for log in logs:
            procs = list(log.processes.values()) + list(log.tracebacks.values())
            vs = {(p.version, p.host, p.label) for p in procs if p.version}
            seen = {v for v, _, _ in vs}
            vs |= {(v, "(no host in line)", "bare version line") for v in log.bare_versions
                   if v not in seen}
            if len({versions.parse_version(v) for v, _, _ in vs}) != 1:
                continue  # several NCCL builds in one file: which ran on that GPU is unknown
            for cc, evidence in log.gpus.items():
                uses += [(v, cc, evidence, host, label) for v, host, label in vs]
        out += versions.findings(uses, failed)
    diag_lines = [d for log in logs for d in log.diag]
    if diag_lines:
        from mldebug.nccllog import diag

        out += diag.findings(diag_lines)
    ras_items = [d for log in logs for d in log.ras]
    if ras_items:
        from mldebug.nccllog import ras

        out += ras.findings(ras_items)
    return out


def _catalogued(group: list[tuple[WarnGroup, Classified]]) -> Finding:
    """WARN kinds no rule explained, printed from one NCCL format string, described from
    NCCL's source catalogue."""
    w, cls = group[0]
    names = list(dict.fromkeys(n for g, _ in group for n in g.processes))
    hosts = sorted({h for g, _ in group for h in g.hosts})
    count = sum(g.count for g, _ in group)
    where = (f"printed {count} time(s) by {len(names)} process(es): "
             + (", ".join(names) if len(names) <= 3
                else f"{len(names)} processes on {hosts_text(hosts)}")
             + (f" ({len(group)} variants of the message)" if len(group) > 1 else "")
             + origin_note([g for g, _ in group]))
    src = ""
    if cls.entry is not None:
        src = (f"\nNCCL source: {', '.join(cls.entry.files[:3])}, format "
               f"'{cls.entry.format[:160]}' (NCCL {cls.entry.version_text}).")
    how = {"values": "by the values in the message",
           "source file": f"by NCCL's source file {w.source}",
           "context": "by what NCCL was setting up just before"}.get(cls.how)
    cond = ""
    if cls.condition is not None:  # the condition in NCCL's source decided the cause
        versions = sorted({v for g, _ in group for v in g.versions})
        cond = (f"\nDecided by: {cls.condition.evidence}."
                + (f" NCCL here: {', '.join(versions[:4])}." if versions
                   else " The log does not show the NCCL version: check it (NCCL version line)."
                   if cls.condition.rule.kind == "version" else ""))
    return Finding(
        Severity.WARNING, f"NCCL WARN ({cls.title}): {w.message[:200]}",
        where + (f"\nLikely cause: {cls.cause}." if cls.cause else "") + cond
        + (f"\nJust before it: {w.context[:200]}" if w.context else "")
        + (f"\nComponent decided {how}." if how else "") + src,
        cls.fix, f"nccl-log-{cls.component}", tuple(hosts))


def _input_findings(logs: Sequence[ParsedLog], procs: Sequence[ProcessLog],
                    findings: Sequence[Finding]) -> list[Finding]:
    out = []
    unparsed = sum(log.unparsed_nccl for log in logs)
    if not procs and not findings and not any(log.bare_versions for log in logs) \
            and not all(log.binary for log in logs):
        out.append(Finding(
            Severity.WARNING, "no NCCL debug lines found",
            "None of the files has lines like 'host:pid:tid [0] NCCL INFO ...'.",
            "rerun with NCCL_DEBUG=INFO (and NCCL_DEBUG_FILE=/path/nccl.%h.%p.log), then pass "
            "those files.", "nccl-log-empty"))
    if unparsed:
        example = next(e for log in logs for e in log.unparsed_examples)
        out.append(Finding(
            Severity.INFO, f"{unparsed} NCCL line(s) in an unknown shape were read as text",
            f"e.g. {example[:200]}", "if mldebug misreads them, report the line shape.",
            "nccl-log-unknown-shape"))
    odd = [log for log in logs if log.binary and not log.nccl_lines]
    if odd:
        out.append(Finding(
            Severity.WARNING, f"{len(odd)} input file(s) are not text logs",
            ", ".join(f"{log.source} ({log.binary})" for log in odd[:5]),
            "decompress compressed logs first (zcat FILE | mldebug nccl-log -); leave binary "
            "files out.", "nccl-log-not-text"))
    nul = [log for log in logs if log.nul_bytes]
    if nul:
        out.append(Finding(
            Severity.INFO, f"NUL bytes skipped in {len(nul)} input file(s)",
            "; ".join(f"{log.source}: {log.nul_bytes} NUL bytes from line {log.nul_line}"
                      for log in nul[:5]) + " (a crashed node's unwritten blocks?); the lines "
            "after them were read.", "nothing to do: the lines around them are read.",
            "nccl-log-nul-bytes"))
    long_lines = sum(log.long_lines for log in logs)
    cut = [log.source for log in logs if log.truncated]
    if long_lines or cut:
        out.append(Finding(
            Severity.INFO, "part of the input was not read",
            (f"{long_lines} line(s) longer than 64 KiB were cut. " if long_lines else "")
            + (f"Stopped at the size bound in {', '.join(cut)}." if cut else ""),
            "split huge logs per process (NCCL_DEBUG_FILE=...%h.%p).", "nccl-log-input-bound"))
    return out

