"""``mldebug mem top``: every rank's memory on this host, a host list or a SLURM job.

Collection runs ``mldebug.memory.node`` on each node through the fan-out (one function,
``collect_top``); analysis is pure: per-job spread, the ranks whose memory grows during
``--watch`` (the leak) and the ranks far above the others (the imbalance).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from statistics import median, median_low
from typing import Any

from mldebug.fanout import FanoutOptions, NodeJob, NodeResult, run
from mldebug.findings import Finding, Severity
from mldebug.memory.model import JobMemory, RankMemory, TopReport
from mldebug.memory.units import fmt_bytes

NODE_MODULES = ("mldebug.nodekit", "mldebug.dist", "mldebug.ranks", "mldebug.memory.node")
NODE_SCHEMA = {"host": str, "processes": list}
MiB = 1024**2
GiB = 1024**3
LEAK_RATE = 1 * MiB  # bytes/s a rank must grow by, at least, to be called leaking
LEAK_GROWTH = 16 * MiB  # and in total over the watch
IMBALANCE_RATIO = 1.5
IMBALANCE_BYTES = 1 * GiB


@dataclasses.dataclass
class NodeArgs:
    """The arguments of ``mldebug/memory/node.py`` (``fanout.to_argv`` makes its argv)."""

    watch: float = 0.0
    pid: int | None = None
    pattern: str | None = None
    slurm_job: str | None = None


def collect_top(target: FanoutOptions, *, watch: float = 0.0, pid: int | None = None,
                pattern: str | None = None) -> list[NodeResult]:
    """One document per node (the only fan-out call of the memory package)."""
    args = NodeArgs(watch, pid, pattern, target.slurm_job)
    if target.is_local:
        from mldebug.fanout import to_argv
        from mldebug.memory import node

        doc = node.collect(node.parser().parse_args(to_argv(args)))
        return [NodeResult(doc["host"], data=doc)]
    return run(NodeJob(NODE_MODULES, args, NODE_SCHEMA),
               dataclasses.replace(target, timeout=target.timeout + watch))


def _slope(points: Sequence[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    den = sum((t - mx) ** 2 for t, _ in points)
    return sum((t - mx) * (v - my) for t, v in points) / den if den else 0.0


def _rank_memory(host: str, p: dict[str, Any]) -> RankMemory | None:
    samples = p.get("samples") or []
    if not samples:
        return None
    ident = p.get("identity") or {}
    job = str(ident.get("run_id") or ident.get("launcher") or "?")
    first, last = samples[0], samples[-1]

    def gpu(s: list[Any]) -> int | None:
        return sum(int(v) for v in s[3].values()) if len(s) > 3 and s[3] else None

    r = RankMemory(host=host, pid=int(p["pid"]), rank=ident.get("rank"),
                   local_rank=ident.get("local_rank"), job=job, rss=int(last[1]),
                   uss=last[2], gpu=gpu(last), rss_first=int(first[1]), gpu_first=gpu(first),
                   seconds=float(last[0]) - float(first[0]))
    r.rss_rate = _slope([(float(s[0]), float(s[1])) for s in samples])
    r.gpu_rate = _slope([(float(s[0]), float(gpu(s) or 0)) for s in samples])
    r.samples = [(float(s[0]), int(s[1]), gpu(s)) for s in samples]
    return r


def _fold(ranks: list[RankMemory]) -> str:
    from mldebug.render import fold_ints

    known = [r.rank for r in ranks if r.rank is not None]
    return fold_ints(known) if known else ",".join(f"pid {r.pid}" for r in ranks[:3])


def _hosts(ranks: list[RankMemory]) -> tuple[str, ...]:
    return tuple(sorted({r.host for r in ranks}))  # folded when rendered (findings.fold_hosts)


def analyze_top(results: Sequence[NodeResult], watch: float = 0.0, rows: int = 10) -> TopReport:
    """Per-job spread and findings from the node documents (pure)."""
    rep = TopReport(watch=watch, rows=rows, hosts=[r.host for r in results])
    for res in results:
        if res.data is None:
            rep.unanswered[res.host] = res.error or "no answer"
            continue
        host = str(res.data.get("host") or res.host)
        rep.gpu_source = rep.gpu_source or res.data.get("gpu_source")
        for p in res.data.get("processes") or []:
            rm = _rank_memory(host, p)
            if rm is not None:
                rep.processes.append(rm)
    rep.processes.sort(key=lambda r: (r.job, r.rank if r.rank is not None else -1, r.host, r.pid))
    by_job: dict[str, list[RankMemory]] = defaultdict(list)
    for r in rep.processes:
        by_job[r.job].append(r)
    for job, ranks in by_job.items():
        rss = sorted(r.rss for r in ranks)
        gpus = sorted(r.gpu for r in ranks if r.gpu is not None)
        rep.jobs.append(JobMemory(job, len(ranks), sorted({r.host for r in ranks}), rss[0],
                                  int(median(rss)), rss[-1],
                                  int(median(gpus)) if gpus else None, gpus[-1] if gpus else None))
        if watch > 0:
            rep.findings += _leaks(job, ranks, "rss")
            rep.findings += _leaks(job, ranks, "gpu")
        rep.findings += _imbalance(job, ranks, "rss")
        rep.findings += _imbalance(job, ranks, "gpu")
    if rep.unanswered:
        reasons = sorted(set(rep.unanswered.values()))
        rep.findings.append(Finding(
            Severity.WARNING, f"{len(rep.unanswered)} node(s) did not answer",
            "; ".join(reasons[:3]), "Check that the nodes are up and reachable over ssh "
            "(or raise --timeout).", code="mem-node-unanswered",
            hosts=tuple(sorted(rep.unanswered))))
    if not rep.processes and not rep.unanswered:
        rep.findings.append(Finding(
            Severity.INFO, "no rank processes found",
            "Looked for Python processes whose environment carries a rank (RANK, SLURM_PROCID, "
            "OMPI_COMM_WORLD_RANK, PMI_RANK).",
            "Pass --pid PID (the launcher) or --pattern REGEX for processes without a rank.",
            code="mem-no-ranks"))
    return rep


_WHAT = {"rss": ("CPU memory (RSS)", "rss_rate", "rss_first", "rss"),
         "gpu": ("GPU memory", "gpu_rate", "gpu_first", "gpu")}


def _leaks(job: str, ranks: list[RankMemory], metric: str) -> list[Finding]:
    label, rate_attr, first_attr, last_attr = _WHAT[metric]
    rates = [abs(getattr(r, rate_attr)) for r in ranks]
    typical = median_low(rates) if rates else 0.0  # low median: one leaker of two is not typical
    floor = LEAK_RATE if typical >= LEAK_RATE else max(LEAK_RATE, 3 * typical)
    growing = [r for r in ranks
               if getattr(r, rate_attr) >= floor
               and (getattr(r, last_attr) or 0) - (getattr(r, first_attr) or 0) >= LEAK_GROWTH]
    if not growing:
        return []
    names = {id(r) for r in growing}
    for r in growing:
        r.leak = True
    others = [abs(getattr(r, rate_attr)) for r in ranks if id(r) not in names]
    typical = median_low(others) if others else typical
    growing.sort(key=lambda r: -getattr(r, rate_attr))
    top = growing[0]
    everyone = len(growing) == len(ranks) and len(ranks) > 1
    who = "every rank" if everyone else f"rank {_fold(growing)}"
    return [Finding(
        Severity.WARNING,
        f"{who} of job {job}: {label} grows {getattr(top, rate_attr) / MiB:.1f} MiB/s"
        + ("" if everyone else " - a leak on that rank"),
        f"rank {top.rank} ({top.host}, pid {top.pid}): {fmt_bytes(getattr(top, first_attr))} -> "
        f"{fmt_bytes(getattr(top, last_attr))} in {top.seconds:.1f}s; "
        + (f"the other ranks grow {typical / MiB:.1f} MiB/s (median)." if others else
           "all ranks grow alike: the leak is in code every rank runs."),
        "Sample that rank with mldebug.see_memory_usage() around forward/backward/step, or record "
        "a snapshot there (mldebug.memory.record) and run 'mldebug mem report'; look for tensors "
        "kept across steps (lists of outputs or losses, caches, hooks).",
        code=f"mem-{metric}-leak", hosts=_hosts(growing))]


def _imbalance(job: str, ranks: list[RankMemory], metric: str) -> list[Finding]:
    label, _, _, last_attr = _WHAT[metric]
    values = [(r, getattr(r, last_attr)) for r in ranks if getattr(r, last_attr) is not None]
    if len(values) < 3:
        return []
    mid = median(v for _, v in values)
    high = [r for r, v in values if v > IMBALANCE_RATIO * mid and v - mid >= IMBALANCE_BYTES]
    if not high:
        return []
    high.sort(key=lambda r: -(getattr(r, last_attr) or 0))
    top = high[0]
    return [Finding(
        Severity.WARNING,
        f"rank {_fold(high)} of job {job} uses far more {label} than the others",
        f"rank {top.rank} ({top.host}): {fmt_bytes(getattr(top, last_attr))} against a median "
        f"of {fmt_bytes(mid)} over {len(values)} ranks.",
        "An uneven split: rank 0 doing extra work (logging, evaluation, checkpoint gathering), "
        "uneven pipeline stages or unbalanced data (long sequences on one rank). Move the extra "
        "work off that rank or rebalance, else it OOMs first.",
        code=f"mem-{metric}-imbalance", hosts=_hosts(high))]
