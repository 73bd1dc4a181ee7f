"""What ``mldebug pdb list`` reports: the open debugger sessions across nodes (plain data)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mldebug.findings import Finding, findings_to_json

SCHEMA = "mldebug.pdb.list/1"


@dataclass(frozen=True)
class Session:
    """One open session: a rank stopped in a debugger, waiting for ``mldebug pdb connect``."""

    host: str
    pid: int
    port: int
    kind: str = "pdb"  # pdb | post-mortem | debugpy
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    run_id: str | None = None
    slurm_job: str | None = None
    file: str | None = None
    line: int | None = None
    function: str | None = None

    @property
    def target(self) -> str:
        """What ``mldebug pdb connect`` takes to reach exactly this session."""
        return f"{self.host}:{self.port}"

    @property
    def where(self) -> str:
        return f"{self.file or '?'}:{self.line if self.line is not None else '?'}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["target"] = self.target
        return d


@dataclass(frozen=True)
class Skipped:
    """A registration file a node did not trust or found stale, with why."""

    host: str
    file: str
    reason: str


@dataclass(frozen=True)
class NodeError:
    host: str
    reason: str


@dataclass
class SessionList:
    sessions: list[Session] = field(default_factory=list)
    errors: list[NodeError] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "sessions": [s.to_dict() for s in self.sessions],
            "errors": [asdict(e) for e in self.errors],
            "skipped": [asdict(s) for s in self.skipped],
            "hosts": self.hosts,
            "findings": findings_to_json(self.findings),
        }
