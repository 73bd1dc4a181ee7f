"""Plain dataclasses for the memory reports: snapshot analysis, comparison, top, peak, probe."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mldebug.findings import Finding, findings_to_json


def report_dict(report: Any, fmt: str) -> dict[str, Any]:
    """A report dataclass as JSON-ready data: its fields, findings most severe first, format."""
    d = asdict(report)
    d["findings"] = findings_to_json(report.findings)
    d["format"] = fmt
    return d


@dataclass
class Site:
    """Bytes attributed to one allocation site (the first user frame, torch frames folded)."""

    site: str
    bytes: int
    count: int = 0
    first_event: int | None = None
    last_event: int | None = None


@dataclass
class Oom:
    """One 'oom' trace event with the allocator's state at that moment."""

    device: int
    event: int
    requested: int
    device_free: int | None
    allocated: int
    reserved: int
    site: str


@dataclass
class SegmentUse:
    """One cudaMalloc'd segment: reserved vs in use, and its largest free block."""

    device: int
    address: int
    total: int
    allocated: int
    largest_free: int
    blocks: int

    @property
    def free(self) -> int:
        return self.total - self.allocated


@dataclass
class DeviceMemory:
    """What one device's trace says: peak, sites at peak, never-freed allocations, OOMs."""

    device: int
    events: int
    peak_allocated: int = 0
    peak_event: int | None = None
    peak_reserved: int = 0
    end_allocated: int = 0
    end_reserved: int = 0
    before_trace: int = 0  # bytes allocated before the first recorded event
    top_at_peak: list[Site] = field(default_factory=list)
    never_freed: list[Site] = field(default_factory=list)
    leak_sites: list[Site] = field(default_factory=list)
    ooms: list[Oom] = field(default_factory=list)


@dataclass
class SnapshotReport:
    """``mldebug mem report``: one snapshot file analysed."""

    file: str
    devices: list[DeviceMemory] = field(default_factory=list)
    reserved: int = 0
    allocated: int = 0
    segments: int = 0
    largest_free: int = 0
    stranded: int = 0  # free bytes inside segments that also hold live blocks
    worst_segments: list[SegmentUse] = field(default_factory=list)
    has_trace: bool = True
    skipped_events: int = 0
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return report_dict(self, "mldebug.mem.report/1")


@dataclass
class SiteChange:
    site: str
    before: int
    after: int

    @property
    def delta(self) -> int:
        return self.after - self.before


@dataclass
class CompareReport:
    """``mldebug mem compare``: what is held at the end of B that was not at the end of A."""

    before: str
    after: str
    allocated_before: int
    allocated_after: int
    reserved_before: int
    reserved_after: int
    changes: list[SiteChange] = field(default_factory=list)
    source: str = "segments"  # where the per-site figures come from
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = report_dict(self, "mldebug.mem.compare/1")
        for c, dc in zip(self.changes, d["changes"], strict=True):
            dc["delta"] = c.delta
        return d


@dataclass
class RankMemory:
    """One rank process's memory: the last sample and the growth rate over the watch."""

    host: str
    pid: int
    rank: int | None
    local_rank: int | None
    job: str
    rss: int
    uss: int | None
    gpu: int | None  # bytes over all its GPUs (None: no GPU information)
    rss_first: int
    gpu_first: int | None
    seconds: float  # how long it was watched
    rss_rate: float = 0.0  # bytes per second (least squares over the samples)
    gpu_rate: float = 0.0
    leak: bool = False  # a leak finding names this rank
    # (seconds, RSS, GPU bytes or None) per sample: the HTML view's lines (not in --json)
    samples: list[tuple[float, int, int | None]] = field(default_factory=list, repr=False)


@dataclass
class JobMemory:
    """The ranks of one job (run id / launcher) and their spread."""

    job: str
    ranks: int
    hosts: list[str]
    rss_min: int
    rss_median: int
    rss_max: int
    gpu_median: int | None
    gpu_max: int | None


@dataclass
class TopReport:
    """``mldebug mem top``: every rank's memory across nodes, with findings."""

    processes: list[RankMemory] = field(default_factory=list)
    jobs: list[JobMemory] = field(default_factory=list)
    watch: float = 0.0
    rows: int = 10
    hosts: list[str] = field(default_factory=list)
    unanswered: dict[str, str] = field(default_factory=dict)  # host -> why
    gpu_source: str | None = None
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = report_dict(self, "mldebug.mem.top/1")
        for p in d["processes"]:
            p.pop("samples", None)
        return d
