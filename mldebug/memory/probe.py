"""``mldebug mem probe``: how much memory can really be allocated, found safely.

The book's one-liners (allocate 1 GiB at a time until something breaks) run here in a child
process that touches every page, marks itself the OOM killer's first choice
(oom_score_adj 1000), stops at ``--max`` (default: 10% of available memory - on the GPU, of
the device's free memory - or 4 GiB, whichever is smaller, and never above the cgroup limit:
the node is shared) and, when a cgroup can be made, is confined to ``--max`` plus headroom. The
parent reads one line per step, so the last success survives whatever ends the child.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from mldebug.errors import MldebugError
from mldebug.findings import Finding, Severity
from mldebug.memory import cgroup
from mldebug.memory.model import report_dict
from mldebug.memory.units import fmt_bytes

MiB = 1024**2
GiB = 1024**3
HEADROOM = 64 * MiB
DEFAULT_SHARE = 10  # the default --max takes at most 1/10 of what is available ...
DEFAULT_CAP = 4 * GiB  # ... and never more than this
MEMINFO = "/proc/meminfo"

_CHILD_CPU = r"""
import sys
step, maximum = int(sys.argv[1]), int(sys.argv[2])
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
except OSError:
    pass
keep, total = [], 0
print("READY", flush=True)
while total + step <= maximum:
    try:
        b = bytearray(step)
        b[::4096] = b"\x01" * len(range(0, step, 4096))
    except MemoryError:
        print("MEMERR", total, flush=True)
        sys.exit(3)
    keep.append(b)
    total += step
    print("OK", total, flush=True)
print("MAX", total, flush=True)
"""

_CHILD_CUDA = r"""
import sys
step, maximum = int(sys.argv[1]), int(sys.argv[2])
import torch
if not torch.cuda.is_available():
    print("NOCUDA", flush=True)
    sys.exit(4)
if maximum == 0:  # the default bound: 10% of the device's free memory, at most the cap
    free = torch.cuda.mem_get_info()[0]
    maximum = min(free // int(sys.argv[3]), int(sys.argv[4]))
    step = max(1, min(step, maximum))
    print("BOUND", maximum, step, free, flush=True)
keep, total = [], 0
print("READY", torch.cuda.get_device_name(0), flush=True)
while total + step <= maximum:
    try:
        keep.append(torch.empty(step, dtype=torch.uint8, device="cuda").fill_(1))
    except torch.OutOfMemoryError as e:
        print("CUDAOOM", total, str(e).splitlines()[0][:300], flush=True)
        sys.exit(3)
    total += step
    print("OK", total, flush=True)
print("MAX", total, flush=True)
"""


@dataclass
class ProbeReport:
    device: str
    allocated: int  # the last successful total
    step: int
    maximum: int
    max_from: str  # "--max" | "10% of available memory" | "the 4 GiB default cap" |
    # "the cgroup limit" | "10% of the device's free memory"
    stopped_by: str  # "max" | "oom-killer" | "cgroup-limit" | "memory-error" | "cuda-oom" | "error"
    message: str = ""
    available: int | None = None
    cgroup_limit: int | None = None
    cgroup_path: str | None = None
    cgroup_usage_before: int | None = None
    guarded: bool = False  # ran in a child cgroup confined to max + headroom
    bound: int | None = None  # the default --max used (None: --max was given)
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return report_dict(self, "mldebug.mem.probe/1")


def mem_available(meminfo: str) -> int | None:
    """MemAvailable of a /proc/meminfo text, in bytes (None when it has no such line)."""
    for line in meminfo.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() == "MemAvailable":
            parts = rest.split()
            try:
                return int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
            except (IndexError, ValueError):
                return None
    return None


def default_max(available: int, cgroup_limit: int | None = None) -> tuple[int, str]:
    """The default --max and where it comes from (pure): 10% of ``available`` or 4 GiB,
    whichever is smaller, and never above the cgroup limit (a probe past it only kills
    itself). A shared node is never taken whole by default."""
    bound, frm = available // DEFAULT_SHARE, "10% of available memory"
    if bound > DEFAULT_CAP:
        bound, frm = DEFAULT_CAP, "the 4 GiB default cap"
    if cgroup_limit is not None and cgroup_limit < bound:
        bound, frm = cgroup_limit, "the cgroup limit"
    return bound, frm


def _available() -> int:
    try:
        with open(MEMINFO) as f:
            got = mem_available(f.read())
    except OSError:
        got = None
    if got is None:  # not Linux, or a kernel without MemAvailable
        import psutil

        got = int(psutil.virtual_memory().available)
    return got


def probe(device: str = "cpu", step: int | None = None, maximum: int | None = None) -> ProbeReport:
    """Run the probe child and say what stopped it (collection + a pure verdict)."""
    available = _available() if device == "cpu" else None
    lim, lim_path = cgroup.limit() if device == "cpu" else (None, None)
    usage_before = cgroup.usage_of(lim_path) if lim_path is not None else None
    bound: int | None = None
    if maximum is not None:
        max_from = "--max"
    elif device == "cuda":  # the child computes the bound from the device's free memory
        maximum, max_from = 0, "10% of the device's free memory"
    else:
        assert available is not None
        maximum, max_from = default_max(available, lim)
        bound = maximum
    if step is None:
        step = GiB if device == "cuda" else max(16 * MiB, min(GiB, maximum // 32 // MiB * MiB))
    if step <= 0 or (maximum <= 0 and not (device == "cuda" and max_from != "--max")):
        raise MldebugError("--step and --max must be positive.", "e.g. --step 1GiB --max 64GiB")
    guard = None
    if device == "cpu":
        try:
            guard = cgroup.create("probe")
            guard.set_limit(maximum + HEADROOM)
        except (cgroup.CgroupUnavailable, OSError):
            if guard is not None:
                guard.remove()
            guard = None
    rep = ProbeReport(device, 0, step, maximum, max_from, "?", available=available,
                      cgroup_limit=lim, cgroup_path=str(lim_path) if lim_path else None,
                      cgroup_usage_before=usage_before, guarded=guard is not None, bound=bound)
    src = _CHILD_CPU if device == "cpu" else _CHILD_CUDA
    g = guard

    def enter() -> None:
        if g is not None:
            g.add(__import__("os").getpid())

    proc = subprocess.Popen([sys.executable, "-c", src, str(step), str(maximum),
                             str(DEFAULT_SHARE), str(DEFAULT_CAP)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, preexec_fn=enter if g else None)
    last = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        last = line.strip() or last
        if line.startswith("OK "):
            rep.allocated = int(line.split()[1])
        elif line.startswith("BOUND "):  # the CUDA child's default bound
            rep.maximum = rep.bound = int(line.split()[1])
            rep.step = int(line.split()[2])
            if rep.bound == DEFAULT_CAP:
                rep.max_from = "the 4 GiB default cap"
    err = proc.stderr.read() if proc.stderr else ""
    rc = proc.wait()
    if guard is not None:
        guard.remove()
    word = last.split(" ", 2)
    if word[0] == "MAX":
        rep.stopped_by = "max"
    elif word[0] == "MEMERR":
        rep.stopped_by, rep.message = "memory-error", "MemoryError: the allocation was refused"
    elif word[0] == "CUDAOOM":
        rep.stopped_by, rep.message = "cuda-oom", word[2] if len(word) > 2 else ""
    elif word[0] == "NOCUDA" or "No module named 'torch'" in err:
        raise MldebugError("the CUDA probe needs torch with a CUDA device, and there is none "
                           "here.", "Run it on a GPU node, or probe --device cpu.")
    elif rc == -9:
        near_limit = lim is not None and rep.allocated + step + (usage_before or 0) >= 0.8 * lim
        rep.stopped_by = "cgroup-limit" if near_limit else "oom-killer"
        rep.message = "killed by SIGKILL (the OOM killer)"
    else:
        rep.stopped_by = "error"
        rep.message = (err.strip().splitlines() or [f"exit code {rc}"])[-1][:300]
    rep.findings = findings(rep)
    return rep


def findings(rep: ProbeReport) -> list[Finding]:
    """What the probe means for a job here (pure)."""
    got = fmt_bytes(rep.allocated)
    if rep.stopped_by == "cgroup-limit":
        return [Finding(
            Severity.WARNING,
            f"{got} could be allocated: the cgroup limit of {fmt_bytes(rep.cgroup_limit)} "
            f"({rep.cgroup_path}) stopped it",
            f"The OOM killer ended the probe at the limit (the group already used "
            f"{fmt_bytes(rep.cgroup_usage_before)} before it started). Tools like top show the "
            f"whole node ({fmt_bytes(rep.available)} available), not this limit.",
            "Fit the job under the limit, or ask the scheduler for more memory (e.g. SLURM "
            "--mem / --mem-per-gpu).", code="mem-probe-cgroup-limit")]
    if rep.stopped_by == "cuda-oom":
        return [Finding(Severity.INFO, f"{got} could be allocated on the GPU before a CUDA OOM",
                        rep.message, "Compare with the device's total: other processes (vLLM, "
                        "another rank) may hold the rest (nvidia-smi).", code="mem-probe-cuda")]
    if rep.stopped_by == "oom-killer":
        return [Finding(Severity.WARNING, f"{got} could be allocated before the OOM killer "
                        "stopped the probe", rep.message,
                        "That is the real ceiling for a process here; check dmesg for the "
                        "kill record.", code="mem-probe-oom")]
    if rep.stopped_by == "memory-error":
        return [Finding(Severity.WARNING, f"{got} could be allocated before a MemoryError",
                        "The kernel or a ulimit refused the allocation (overcommit settings, "
                        "ulimit -v).", "Check ulimit -v and vm.overcommit_memory.",
                        code="mem-probe-refused")]
    if rep.stopped_by == "max":
        return [Finding(Severity.INFO, f"{got} allocated and touched; stopped at the maximum "
                        f"({rep.max_from})", "", "Pass a larger --max to probe further (by default it "
                        "takes at most 10% of available memory or 4 GiB).",
                        code="mem-probe-max")]
    return [Finding(Severity.ERROR, f"the probe failed after {got}", rep.message,
                    "Run it again; report the message if it persists.", code="mem-probe-error")]
