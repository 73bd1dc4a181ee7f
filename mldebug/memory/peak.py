"""``mldebug mem peak -- CMD``: the peak memory of a command's whole process tree.

``/usr/bin/time -f %M`` reports the largest single process it waited for (ru_maxrss), so a
launcher that starts launchers that start the workers under-reports. Here the command runs in
a fresh child memory cgroup (v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``), which
counts every descendant however deep; where no cgroup can be made, the tree is sampled with
psutil. Either way the report says which method was used and what it can miss.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from mldebug.errors import MldebugError
from mldebug.findings import Finding, Severity
from mldebug.memory import cgroup
from mldebug.memory.model import report_dict
from mldebug.memory.units import fmt_bytes


@dataclass
class PeakReport:
    cmd: list[str]
    method: str  # "cgroup-v1" | "cgroup-v2" | "sampling"
    method_note: str
    peak: int | None
    largest_process: int  # ru_maxrss of the waited-for descendants: what /usr/bin/time shows
    wall: float
    user: float
    sys: float
    exit_code: int
    signal: str | None = None
    oom_kills: int | None = None
    samples: int = 0
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return report_dict(self, "mldebug.mem.peak/1")


def tree_rss(root: int) -> int:
    """Bytes resident in ``root`` and all its descendants now (0 when it is gone)."""
    import psutil

    try:
        p = psutil.Process(root)
        procs = [p, *p.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for q in procs:
        try:
            total += q.memory_info().rss
        except psutil.Error:
            continue
    return total


class _Sampler(threading.Thread):
    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peak = 0
        self.samples = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, tree_rss(self.pid))
            self.samples += 1
            self.stop.wait(self.interval)


def run_peak(cmd: list[str], method: str = "auto", interval: float = 0.05) -> PeakReport:
    """Run ``cmd`` to completion and measure its tree (collection: the only I/O here)."""
    group: cgroup.Group | None = None
    why_not = ""
    if method in ("auto", "cgroup"):
        try:
            group = cgroup.create("peak")
        except cgroup.CgroupUnavailable as e:
            if method == "cgroup":
                raise MldebugError(f"no cgroup can be used: {e}.",
                                   "Run as root, or use --method sampling.") from None
            why_not = str(e)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()

    def enter() -> None:  # in the child, before exec: join the fresh group
        if group is not None:
            group.add(os.getpid())

    try:
        proc = subprocess.Popen(cmd, preexec_fn=enter if group is not None else None)
    except OSError as e:
        if group is not None:
            group.remove()
        raise MldebugError(f"cannot run {cmd[0]}: {e.strerror}.",
                           "Check the command name and PATH.") from None
    sampler = None
    if group is None:
        sampler = _Sampler(proc.pid, interval)
        sampler.start()
    while True:
        try:
            rc = proc.wait()
            break
        except KeyboardInterrupt:  # the terminal sent SIGINT to the command too; let it end
            continue
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if sampler is not None:
        sampler.stop.set()
        sampler.join()
    if group is not None:
        peak, ooms = group.peak(), group.oom_kills()
        leftover = group.pids()
        removed = group.remove()
        method_used = f"cgroup-v{group.version}"
        note = (f"a fresh memory cgroup ({'memory.max_usage_in_bytes' if group.version == 1 else 'memory.peak'}"
                "): every process of the tree however deep, anonymous memory and page cache it "
                "charged; exact, no sampling")
        if not removed and leftover:
            note += (f"; {len(leftover)} process(es) outlived the command and keep "
                     f"{group.path} (left in place, not killed)")
        samples = 0
    else:
        assert sampler is not None
        peak, ooms, samples = sampler.peak, None, sampler.samples
        method_used = "sampling"
        note = (f"psutil sampling of the tree's RSS every {interval:g}s ({why_not or 'asked for'}): "
                "misses spikes shorter than the interval and processes that leave the tree; "
                "shared pages count once per process")
    sig = None
    exit_code = rc
    if rc < 0:
        sig = signal.Signals(-rc).name
        exit_code = 128 - rc
    rep = PeakReport(cmd=cmd, method=method_used, method_note=note, peak=peak,
                     largest_process=after.ru_maxrss * 1024, wall=round(wall, 3),
                     user=round(after.ru_utime - before.ru_utime, 3),
                     sys=round(after.ru_stime - before.ru_stime, 3), exit_code=exit_code,
                     signal=sig, oom_kills=ooms, samples=samples)
    rep.findings = findings(rep)
    return rep


def findings(rep: PeakReport) -> list[Finding]:
    """OOM kills, a SIGKILL that looks like one, and the /usr/bin/time under-report (pure)."""
    out: list[Finding] = []
    if rep.oom_kills:
        out.append(Finding(
            Severity.ERROR, f"the kernel OOM-killed {rep.oom_kills} process(es) of the tree",
            f"The tree peaked at {fmt_bytes(rep.peak)}; a CPU OOM kill leaves only 'Killed' "
            "in the job's log.",
            "Lower the memory use (fewer DataLoader workers, smaller prefetch, mmap the "
            "dataset) or ask the scheduler for more memory (--mem) - check the cgroup limit "
            "with: mldebug mem probe", code="mem-oom-killed"))
    elif rep.signal == "SIGKILL":
        out.append(Finding(
            Severity.WARNING, "the command was killed by SIGKILL",
            f"The tree peaked at {fmt_bytes(rep.peak)}. SIGKILL with no message is what the "
            "OOM killer does; this method cannot see its events.",
            "Check 'dmesg | grep -i oom' (or journalctl -k) on this host; rerun as root for "
            "the cgroup method, which counts OOM kills.", code="mem-sigkill"))
    if rep.peak and rep.largest_process and rep.largest_process < 0.8 * rep.peak:
        out.append(Finding(
            Severity.INFO,
            f"the largest single process reached {fmt_bytes(rep.largest_process)}, the whole "
            f"tree {fmt_bytes(rep.peak)}",
            "/usr/bin/time -f %M reports the former (ru_maxrss of one process), so it "
            "under-reports launchers, DataLoader workers and multi-rank jobs.",
            "Size memory requests by the tree's peak.", code="mem-tree-vs-process"))
    return out
